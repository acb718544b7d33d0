-- Shared prefixes (runtime/model/shared_prefix.c): m:logprobs with `context` runs a context
-- that several rows share once, forward and backward. Against the same call with sharing off
-- (rows as they are, the path the PyTorch tests check): log-probs equal (the same bits on a
-- batch-invariant model), gradients of a loss on the scored positions equal within rounding,
-- fewer positions run. Groups of different sizes and context lengths, a row without context,
-- a row whose context matches another's tokens but not its length, a row that is all context,
-- a one-token branch; Qwen2's shape (GQA, QKV bias), Qwen3's (q/k norms), LoRA adapters, bf16
-- products, and the RL update's rows through clrt.train.update.
local T = require("clrt.test")
local update = require("clrt.train.update")

local qwen2 = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 300, hidden_size = 64, intermediate_size = 128,
  num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 256,
  rms_norm_eps = 1e-6, rope_theta = 10000, tie_word_embeddings = true }
local qwen3 = { architectures = { "Qwen3ForCausalLM" }, vocab_size = 300, hidden_size = 64, intermediate_size = 96,
  num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, head_dim = 16,
  max_position_embeddings = 256, rms_norm_eps = 1e-6, rope_theta = 1000000, tie_word_embeddings = false }

local rng = require("clrt.data").rng.new(5)
local function tokens(n)
  local r = {}
  for i = 1, n do r[i] = rng:next32() % qwen2.vocab_size end
  return r
end
local function cat(a, b)
  local r = {}
  for _, x in ipairs(a) do r[#r + 1] = x end
  for _, x in ipairs(b) do r[#r + 1] = x end
  return r
end

-- prompt A (37 tokens) with answers of 12, 30 and 1 tokens; prompt B (21) with 25 and 8; a row
-- with no context; a row with A's first 20 tokens as a 20-token context (another context:
-- not grouped with A's rows); a row that is all context; a last answer to A after them
local pa, pb = tokens(37), tokens(21)
local rows = {
  { ids = cat(pa, tokens(12)), first = 37 },
  { ids = cat(pb, tokens(25)), first = 21 },
  { ids = cat(pa, tokens(30)), first = 37 },
  { ids = tokens(44), first = 0 },
  { ids = cat(pa, tokens(1)), first = 37 },
  { ids = cat(pb, tokens(8)), first = 21 },
  { ids = cat({ unpack(pa, 1, 20) }, tokens(15)), first = 20 },
  { ids = tokens(9), first = 9 },
  { ids = cat(pa, tokens(19)), first = 37 },
}
-- positions a shared forward runs: A once + 12 + 30 + 1 + 19, B once + 25 + 8, the others whole
local shared_positions = 37 + 12 + 30 + 1 + 19 + 21 + 25 + 8 + 44 + 35

local function grads(m)
  local out = {}
  if m.lora_names then   -- the adapters' gradients (the base is frozen)
    local g = m:lora_grads()
    for i, name in ipairs(m.lora_names) do out[i] = g[name]:totable() end
    return out
  end
  local g = m:grads()
  for i, name in ipairs(m.names) do out[i] = g[name]:totable() end
  return out
end

-- a fixed loss on the scored positions: sum of w * lp
local function loss_grad(lp)
  local d = {}
  for b, r in ipairs(rows) do
    d[b] = {}
    for t = 1, lp:size(2) do
      d[b][t] = (t >= r.first and t < #r.ids) and ((b * 7 + t) % 5 - 2) / 10 or 0
    end
  end
  return d
end

local function run(m, share)
  m:set_share_prefix(share)
  m:zero_grad()
  local lp = update.logprobs(m, rows, true)
  local positions = m:logprobs_positions()
  m:backward(loss_grad(lp))
  return lp:totable(), grads(m), positions
end

local function worst_relative(ga, gb)
  local worst, big = 0, 0
  local function walk(x, y)
    if type(x) == "table" then for k = 1, #x do walk(x[k], y[k]) end return end
    big = math.max(big, math.abs(x))
    worst = math.max(worst, math.abs(x - y) / math.max(1e-2, math.abs(x)))
  end
  for i = 1, #ga do walk(ga[i], gb[i]) end
  return worst, big
end

local modes = {
  { name = "Qwen2 f32", cfg = qwen2, lp_tol = 2e-6, grad_tol = 1e-4 },
  { name = "Qwen2 batch invariant", cfg = qwen2, invariant = true, lp_tol = 0, grad_tol = 1e-4 },
  { name = "Qwen3 f32", cfg = qwen3, lp_tol = 2e-6, grad_tol = 1e-4 },
  { name = "Qwen2 bf16 products", cfg = qwen2, bf16 = true, lp_tol = 2e-2, grad_tol = 0.1 },
  { name = "Qwen2 LoRA", cfg = qwen2, lora = true, lp_tol = 2e-6, grad_tol = 1e-4 },
}

for _, mode in ipairs(modes) do
  T.case("a shared context runs once, same log-probs and gradients (" .. mode.name .. ")", function()
    local m = clrt.model.new(mode.cfg, { seed = 21 })
    if mode.invariant then m:set_batch_invariant(true) end
    if mode.bf16 then m:set_matmul("bf16") end
    if mode.lora then
      m:add_lora{ r = 4, alpha = 8, dropout = 0, targets = { "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
        "up_proj", "down_proj" }, seed = 3 }
      -- adapters start with B = 0: give them weights so that every gradient flows
      local g = require("clrt.tensor").generator(99)
      for _, name in ipairs(m.lora_names) do
        local t = m:lora_params()[name]
        if name:find("lora_B") then t:copy_(require("clrt.tensor").randn(t:shape(), { generator = g }) * 0.2) end
      end
    end
    local lp_off, g_off, pos_off = run(m, false)
    local lp_on, g_on, pos_on = run(m, true)
    T.eq(pos_off, #rows * 67, "sharing off: every row padded to the longest (67 tokens)")
    T.eq(pos_on, shared_positions, "sharing on: each shared context once, no padding")
    local scored, worst_lp = 0, 0
    for b, r in ipairs(rows) do
      for t = 1, #lp_off[b] do
        local a, c = lp_off[b][t], lp_on[b][t]
        if t >= r.first and t < #r.ids then
          scored = scored + 1
          T.ok(a ~= 0, ("row %d position %d is scored"):format(b, t))
          worst_lp = math.max(worst_lp, math.abs(a - c))
        else
          T.eq(c, 0, ("row %d position %d is context or padding"):format(b, t))
        end
      end
    end
    T.eq(scored, 12 + 25 + 30 + 43 + 1 + 8 + 15 + 19, "every response token was compared")
    if mode.lp_tol == 0 then
      T.ok(worst_lp == 0, "log-probs are the same bits (largest difference " .. worst_lp .. ")")
    else
      T.ok(worst_lp <= mode.lp_tol, ("log-probs agree within %g (largest difference %g)"):format(mode.lp_tol, worst_lp))
    end
    local worst, big = worst_relative(g_off, g_on)
    T.ok(big > 1e-3, "the gradients are not all zero")
    if mode.bf16 then
      -- bf16 rounds each product's inputs, so sharing moves gradients by bf16's own error: the
      -- shared run must be as close to the f32 gradients as the unshared one is
      local ref = clrt.model.new(mode.cfg, { seed = 21 })
      local _, g_ref = run(ref, false)
      ref:free()
      local e_off, e_on = worst_relative(g_ref, g_off), worst_relative(g_ref, g_on)
      print(("      bf16 against f32: unshared %g, shared %g (relative)"):format(e_off, e_on))
      T.ok(e_on <= 1.5 * e_off + 1e-3, ("shared bf16 gradients are as close to f32's as unshared (%g vs %g)"):format(e_on, e_off))
    end
    print(("      %s: log-probs %g, gradients %g (relative)"):format(mode.name, worst_lp, worst))
    T.ok(worst < mode.grad_tol, ("gradients agree within %g (worst relative difference %g)"):format(mode.grad_tol, worst))
    m:free()
  end)
end

T.case("without a shared context the rows run as they are", function()
  local m = clrt.model.new(qwen2, { seed = 22 })
  local lone = { rows[1], rows[2], rows[4] }
  update.logprobs(m, lone, false)
  T.eq(m:logprobs_positions(), 3 * 49, "no group of two: no packing")
  m:logprobs({ rows[1].ids, rows[3].ids }, { grad = false })
  T.eq(m:logprobs_positions(), 2 * 67, "no context: no packing")
  T.ok(m:share_prefix(), "on by default")
  T.raises(function() m:set_share_prefix(1) end, "expects true or false")
  m:free()
end)

T.run()
