-- m:logprobs(tokens, {context = {...}}): a row's leading context tokens (an RL or DPO row's
-- prompt) get no log-probs and no output-layer work. Against the same call without context:
-- the scored positions' values are the same bits, the context's are 0; gradients of a loss on
-- the scored positions match (the output layer's weight gradient sums fewer zero rows); the
-- RL update's rows pass their prompt lengths (clrt.train.update); bad context is an error.
local T = require("clrt.test")
local update = require("clrt.train.update")

local cfg = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 300, hidden_size = 64, intermediate_size = 128,
  num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 256,
  rms_norm_eps = 1e-6, rope_theta = 10000, tie_word_embeddings = true }

-- three rows of different lengths (padded to the longest), prompts of 0, 5 and 17 tokens
local rng = require("clrt.data").rng.new(3)
local function row(n)
  local r = {}
  for i = 1, n do r[i] = rng:next32() % cfg.vocab_size end
  return r
end
local rows = { row(40), row(23), row(31) }
local context = { 0, 5, 17 }
local lengths = { 40, 23, 31 }
local function padded()
  local out = {}
  for b, r in ipairs(rows) do
    out[b] = {}
    for t = 1, 40 do out[b][t] = r[t] or 0 end
  end
  return out
end

local function grads(m)
  local out = {}
  local g = m:grads()
  for i, name in ipairs(m.names) do out[i] = g[name]:totable() end
  return out
end

-- the gradient of sum(w * lp) over the scored positions, w a fixed pattern
local function loss_grad(lp)
  local d = {}
  for b = 1, 3 do
    d[b] = {}
    for t = 1, 39 do d[b][t] = (t >= context[b] and t < lengths[b]) and ((b * 7 + t) % 5 - 2) / 10 or 0 end
  end
  return d
end

for _, mode in ipairs({ "f32", "bf16", "invariant" }) do
  T.case("context skips the prompt's positions: same bits where scored, 0 elsewhere (" .. mode .. ")", function()
    local m = clrt.model.new(cfg, { seed = 11 })
    if mode == "bf16" then m:set_matmul("bf16") end
    if mode == "invariant" then m:set_batch_invariant(true) end
    local full = m:logprobs(padded(), { lengths = lengths })
    m:backward(loss_grad(full))
    local g_full = grads(m)
    m:zero_grad()
    local part = m:logprobs(padded(), { lengths = lengths, context = context })
    m:backward(loss_grad(part))
    local g_part = grads(m)
    local f, p = full:totable(), part:totable()
    local scored, zero = 0, 0
    for b = 1, 3 do
      for t = 1, 39 do
        -- lp index t (1-based) scores token t + 1, at 0-based position t: scored iff t >= context[b]
        if t >= context[b] and t < lengths[b] then
          T.ok(p[b][t] == f[b][t], ("row %d position %d: %.9g vs %.9g"):format(b, t, p[b][t], f[b][t]))
          scored = scored + 1
        else
          T.eq(p[b][t], 0, ("row %d position %d is context or padding"):format(b, t))
          zero = zero + 1
        end
      end
    end
    T.ok(scored > 60 and zero > 20, "both kinds of position were checked")
    local worst = 0
    for i = 1, #g_full do
      local a, c = g_full[i], g_part[i]
      local function walk(x, y)
        if type(x) == "table" then for k = 1, #x do walk(x[k], y[k]) end return end
        local scale = math.max(1e-3, math.abs(x))
        worst = math.max(worst, math.abs(x - y) / scale)
      end
      walk(a, c)
    end
    T.ok(worst < 1e-5, "gradients agree (worst relative difference " .. worst .. ")")
    m:free()
  end)
end

T.case("the update's rows pass their prompt lengths", function()
  local m = clrt.model.new(cfg, { seed = 12 })
  local r = { { ids = rows[1], first = 9 }, { ids = rows[3], first = 17 } }
  local lp = update.logprobs(m, r, false):totable()
  local all = m:logprobs({ rows[1], rows[3] }, { grad = false, lengths = { 40, 31 } }):totable()
  T.eq(lp[1][8], 0, "row 1's prompt is not scored")
  T.ok(lp[1][9] == all[1][9] and lp[1][9] ~= 0, "row 1's first response token is")
  T.eq(lp[2][16], 0)
  T.ok(lp[2][17] == all[2][17] and lp[2][17] ~= 0)
  -- rows without `first` (SFT's) are scored whole
  local whole = update.logprobs(m, { { ids = rows[1] }, { ids = rows[3], first = 4 } }, false):totable()
  T.ok(whole[1][2] ~= 0 and whole[2][2] ~= 0, "no context when a row lacks first")
  m:free()
end)

T.case("bad context: one clear error", function()
  local m = clrt.model.new(cfg, { seed = 13 })
  T.raises(function() m:logprobs({ rows[1] }, { context = { -1 } }) end, "context[1] must be a count >= 0, got -1")
  T.raises(function() m:logprobs({ rows[1], rows[1] }, { context = { 1 } }) end, "context must list one count per row (2 rows)")
  T.raises(function() m:logprobs({ rows[1] }, { context = { 1.5 } }) end, "context[1] must be a count >= 0, got 1.5")
  m:free()
end)

T.run()
