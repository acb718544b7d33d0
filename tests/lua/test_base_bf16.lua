-- train.base_dtype=bf16: a LoRA model's frozen base keeps its blocks' linear weights only in
-- bf16 (f32 accumulation; embeddings, head, norms, biases f32). Log-probs and adapter gradients
-- against the f32 base, the f32 copy freed (model:memory()), what a bf16 base refuses, and
-- LoRA SFT + RL with base_dtype=bf16 resuming bit for bit.
--
-- Tolerances, from bf16's 8-bit significand (round to nearest: relative error u = 2^-9):
--   * against an f32 model whose weights were first rounded to bf16 (the same numbers), the
--     widening path (set_decode_pack(false): x exact) differs only in summation order:
--     f32 rounding, ~1e-6 here; asserted 2e-5 on log-probs, 1e-4 relative on gradients;
--   * the AVX512-BF16 path also rounds x to bf16, and against the original f32 weights w is
--     rounded too: each product term then carries <= 2u relative error with random signs, so
--     a linear output errs by ~u |y| (the errors average over k), and these compound over
--     the 2 layers' 7 products and the adapters' chain rule. Asserted: 4u = 7.8e-3 absolute
--     on log-probs (measured ~0.8u), 6u = 1.2e-2 relative (2-norm) on each adapter gradient
--     (measured ~2.5u, the gradient of the last layers' small terms being the noisiest).
-- A wrong panel offset or a wrong pair order moves log-probs by O(1) (random weights of std
-- 0.02 into 320-wide sums) and fails all of these by far; using f32 weights would make the
-- results bit-equal to the f32 base, which the "differs at all" checks catch.
local T = require("clrt.test")
local ffi = require("ffi")
local bit = require("bit")

local U = 2 ^ -9
-- hidden 128 and intermediate 320: several 48-wide panels, a narrower last one (320 = 6 x 48
-- + 32) and two 240-row blocks in the widened products.
local CFG = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 96, hidden_size = 128, intermediate_size = 320,
  num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 64,
  rms_norm_eps = 1e-6, tie_word_embeddings = true }
local LIN = { "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj" }

local flat = T.floats

local function max_diff(a, b)
  local fa, fb, d = flat(a), flat(b), 0
  for i = 1, #fa do d = math.max(d, math.abs(fa[i] - fb[i])) end
  return d
end

local function rel_err(a, e)
  local fa, fe, dn, en = flat(a), flat(e), 0, 0
  for i = 1, #fe do dn = dn + (fa[i] - fe[i]) ^ 2; en = en + fe[i] ^ 2 end
  return math.sqrt(dn) / math.sqrt(en), en
end

local function is_linear(name)
  for _, l in ipairs(LIN) do if name:find("%." .. l .. "%.weight$") then return true end end
  return false
end

-- Rounds the linear weights of m to bf16 in place (nearest even), as the bf16 base holds them.
local function round_linears(m)
  local u32 = ffi.typeof("uint32_t *")
  for name, t in pairs(m:params()) do
    if is_linear(name) then
      local p = ffi.cast(u32, t:data_ptr())
      for i = 0, t:numel() - 1 do
        local u = p[i]
        u = u + 0x7fff + bit.band(bit.rshift(u, 16), 1)
        p[i] = bit.band(u, 0xffff0000)
      end
    end
  end
  m:params_changed()
end

local toks = {}
for b = 1, 3 do
  toks[b] = {}
  for t = 1, 24 do toks[b][t] = (b * 37 + t * 11) % CFG.vocab_size end
end
local dlogp = clrt.tensor.full({ 3, 23 }, -1 / 69)

-- A LoRA model over CFG's random weights (rounded: bf16-exact), adapters with B non-zero so
-- both A and B get gradients.
local function model(opts)
  local m = clrt.model.new(CFG, { seed = 7 })
  if opts.round then round_linears(m) end
  m:add_lora({ r = 4, alpha = 8, seed = 3 })
  local g = clrt.tensor.generator(5)
  for _, name in ipairs(m.lora_names) do
    local t = m:lora_params()[name]
    if name:find("lora_B") then t:copy_((clrt.tensor.rand(t:shape(), { generator = g }) - 0.5) * 0.1) end
  end
  if opts.bf16 then m:set_base_dtype("bf16") end
  if opts.nodot then m:set_decode_pack(false) end
  return m
end

local function run(m)
  local lp = m:logprobs(toks)
  m:zero_grad()
  m:backward(dlogp)
  local g = {}
  for _, name in ipairs(m.lora_names) do g[name] = m:lora_grads()[name]:clone() end
  return lp, g
end

local function compare(got_lp, got_g, want_lp, want_g, lp_tol, g_tol, what)
  local d = max_diff(got_lp, want_lp)
  T.ok(d <= lp_tol, ("%s: log-probs differ by %.3g > %.3g"):format(what, d, lp_tol))
  local worst, wname = 0, ""
  for name, e in pairs(want_g) do
    local r, en = rel_err(got_g[name], e)
    T.ok(en > 0, what .. ": zero reference gradient for " .. name .. " (the test could not fail)")
    if r > worst then worst, wname = r, name end
  end
  T.ok(worst <= g_tol, ("%s: gradient %s off by %.3g relative > %.3g"):format(what, wname, worst, g_tol))
  return d, worst
end

T.case("bf16 base = f32 over the same (bf16-rounded) weights: widened path to f32 rounding, bf16 dot within 4u", function()
  for _, nodot in ipairs({ true, false }) do
    local ref_lp, ref_g = run(model({ round = true, nodot = nodot }))
    local lp, g = run(model({ round = true, bf16 = true, nodot = nodot }))
    if nodot then
      compare(lp, g, ref_lp, ref_g, 2e-5, 1e-4, "widened (x exact)")
    else
      local d = compare(lp, g, ref_lp, ref_g, 4 * U, 6 * U, "bf16 dot")
      io.stderr:write(("  bf16 dot vs f32 on the same weights: max |dlp| %.3g\n"):format(d))
    end
  end
end)

T.case("bf16 base vs the original f32 base: within 4u on log-probs, 6u on adapter gradients; not equal", function()
  local ref_lp, ref_g = run(model({}))
  for _, nodot in ipairs({ false, true }) do
    local lp, g = run(model({ bf16 = true, nodot = nodot }))
    local d, r = compare(lp, g, ref_lp, ref_g, 4 * U, 6 * U, nodot and "widened" or "bf16 dot")
    T.ok(d > 0 and r > 0, "bit-equal to the f32 base: the f32 weights were used")
    io.stderr:write(("  %s vs f32 base: max |dlp| %.3g, gradient rel %.3g\n"):format(nodot and "widened" or "bf16 dot", d, r))
  end
end)

T.case("the reference (adapters off) reads the same bf16 base", function()
  local m32, m16 = model({}), model({ bf16 = true })
  m32:set_adapters(false); m16:set_adapters(false)
  local bare = clrt.model.new(CFG, { seed = 7 })
  local want = bare:logprobs(toks, { grad = false })
  T.eq(max_diff(m32:logprobs(toks, { grad = false }), want), 0, "f32 adapters off = base")
  local d = max_diff(m16:logprobs(toks, { grad = false }), want)
  T.ok(d > 0 and d <= 4 * U, "bf16 reference vs f32 base: " .. d)
end)

T.case("the f32 copy of the frozen linear weights is freed: params memory falls by ~half their bytes", function()
  local m = model({})
  local before = m:memory().params
  local lin, other = 0, 0
  for name, t in pairs(m:params()) do
    if is_linear(name) then lin = lin + t:numel() else other = other + t:numel() end
  end
  local lora_bytes = 0
  for _, t in pairs(m:lora_params()) do lora_bytes = lora_bytes + 4 * t:numel() end
  m:set_base_dtype("bf16")
  T.eq(m:base_dtype(), "bf16")
  local after = m:memory().params
  -- f32 rest + bf16 linears + the adapters (each tensor aligned to 16 elements)
  local want = 4 * other + 2 * lin + lora_bytes
  T.ok(after >= want and after <= want + 64 * 40, ("params %d bytes, expected about %d"):format(after, want))
  T.ok(before - after >= 2 * lin, ("only %d bytes freed of %d"):format(before - after, 2 * lin))
  m:logprobs(toks)   -- and no copy comes back with use (the packed f32 copy stays off)
  m:logprobs(toks, { grad = false })
  T.eq(m:memory().params, after, "a forward made a weight copy")
end)

T.case("what a bf16 base refuses, with errors that say why", function()
  local full = clrt.model.new(CFG, { seed = 7 })
  T.raises(function() full:set_base_dtype("bf16") end, "LoRA", "a full fine-tune")
  T.raises(function() full:set_base_dtype("f16") end, "bf16, f32")
  local lora = require("clrt.train.lora")
  T.raises(function() lora.check_base_dtype("bf16", { r = 0 }, nil, "collabllm_rl") end, "train.lora.r > 0")
  T.raises(function() lora.check_base_dtype("fp8", { r = 4 }, nil, "collabllm_rl") end, "f32 or bf16")
  local m = model({ bf16 = true })
  T.raises(function() return m:params() end, "held in bf16")
  T.raises(function() m:save(T.tmpdir() .. "/x") end, "base_dtype=bf16")
  T.raises(function() m:merge_adapter() end, "base_dtype=bf16")
  T.raises(function() m:set_base_dtype("f32") end, "load it again")
  T.raises(function() m:to("cuda") end, "cpu only")
  m:set_base_dtype("bf16")   -- again: a no-op
  T.ok(m:save_adapter(T.tmpdir() .. "/adapter"), "the adapter still saves")
end)

-- ---- the recipes ----------------------------------------------------------------------------

local data = require("clrt.data")
local config = require("clrt.config")
local files = require("clrt.files")
local sft = require("recipes.collabllm_sft")
local rl = require("recipes.collabllm_rl")
local root = T.tmpdir()
local base

local function comparable(dir)
  local out = {}
  for _, r in ipairs(data.read_jsonl(dir .. "/metrics.jsonl")) do
    local c = {}
    for k, v in pairs(r) do
      if not (k:find("^time") or k == "tokens_per_s" or k == "elapsed" or k == "cpu_seconds") then c[k] = v end
    end
    out[r.step] = c
  end
  return out
end

local LORA = { "train.lora.r=4", "train.lora.alpha=8", "train.lora.dropout=0.1", "train.base_dtype=bf16" }

T.case("a base for the runs (SFT from scratch, full fine-tuning); base_dtype=bf16 without LoRA is refused", function()
  local args = { "run_dir=" .. root .. "/base", "train.steps=4", "train.batch_size=8", "world.conversations=100",
    "arch.hidden_size=32", "arch.intermediate_size=64", "arch.num_hidden_layers=2", "train.val_every=0" }
  local bad = { "train.base_dtype=bf16", "model=" .. root }
  for _, a in ipairs(args) do bad[#bad + 1] = a:gsub("/base$", "/bad") end
  T.raises(function() sft.main(config.parse(sft.defaults, bad, sft.world_config())) end, "needs train.lora.r > 0")
  base = sft.main(config.parse(sft.defaults, args, sft.world_config()))
  T.ok(files.exists(base .. "/model.safetensors"))
end)

T.case("LoRA SFT over a bf16 base: trains, writes the merged model, resumes bit for bit", function()
  if not base then T.skip("needs the base") end
  local function args(dir, extra)
    local a = { "model=" .. base, "run_dir=" .. dir, "train.steps=4", "train.batch_size=8", "train.lr=1e-2",
      "world.conversations=100", "train.val_every=2", "save_every=2" }
    for _, x in ipairs(LORA) do a[#a + 1] = x end
    for _, x in ipairs(extra or {}) do a[#a + 1] = x end
    return a
  end
  sft.main(config.parse(sft.defaults, args(root .. "/sft_straight"), sft.world_config()))
  local a = comparable(root .. "/sft_straight")
  T.ok(a[4].grad_norm > 0, "the adapters get gradients")
  T.ok(files.exists(root .. "/sft_straight/model/model.safetensors"), "the merged model (over the f32 base)")
  sft.main(config.parse(sft.defaults, args(root .. "/sft_stopped", { "stop_after=2" }), sft.world_config()))
  sft.main(sft.parse_args({ "resume=" .. root .. "/sft_stopped" }))
  local b = comparable(root .. "/sft_stopped")
  for step = 1, 4 do T.eq(b[step], a[step], "step " .. step) end
end)

T.case("LoRA RL over a bf16 base (reference = the same bf16 base, adapters off): resumes bit for bit", function()
  if not base then T.skip("needs the base") end
  local function args(dir, extra)
    local a = { "config=" .. rl.world_config_path(), "model=" .. base, "run_dir=" .. dir, "steps=4", "prompts_per_step=4",
      "rollout.n=4", "rollout.num_repeat_rollouts=2", "rollout.max_new_tokens=12", "seed=3", "eval.before=false",
      "eval.after=false", "save_every=2", "sample_every=2", "train.lr=1e-2", "train.kl_coef=0.1" }
    for _, x in ipairs(LORA) do a[#a + 1] = x end
    for _, x in ipairs(extra or {}) do a[#a + 1] = x end
    return a
  end
  rl.main(config.parse(rl.defaults, args(root .. "/rl_straight")))
  local a = comparable(root .. "/rl_straight")
  T.ok(a[3].grad_norm > 0, "the adapters get gradients")
  T.ok(a[4].kl > 0, "the policy moved away from the reference")
  rl.main(config.parse(rl.defaults, args(root .. "/rl_stopped", { "stop_after=2" })))
  rl.main(rl.parse_args({ "resume=" .. root .. "/rl_stopped" }))
  local b = comparable(root .. "/rl_stopped")
  for step = 1, 4 do T.eq(b[step], a[step], "step " .. step) end
end)

T.case("offline DPO with LoRA over a bf16 base: the reference is that base, adapters off; resumes bit for bit", function()
  if not base then T.skip("needs the base") end
  local dpo = require("recipes.collabllm_dpo")
  local function go(dir, extra)
    local a = { "model=" .. base, "run_dir=" .. dir, "steps=3", "prompts_per_step=4", "rollout.n=4",
      "rollout.num_repeat_rollouts=2", "rollout.max_new_tokens=12", "seed=3", "eval.before=false", "eval.after=false",
      "save_every=1", "sample_every=2", "pairs_prompts=8", "min_gap=0", "train.batch_size=4", "train.micro_batch_size=2",
      "train.lr=3e-3", "train.lora.r=4", "train.base_dtype=bf16" }
    for _, x in ipairs(extra or {}) do a[#a + 1] = x end
    return dpo.main(config.parse(dpo.defaults_for("verl", false), a, dpo.world_config()))   -- the world's preset
  end
  go(root .. "/dpo_straight")
  local a = comparable(root .. "/dpo_straight")
  T.near(a[1].loss, math.log(2), 1e-5, "step 1: B = 0, so the policy equals its (bf16) reference")
  T.ok(a[3].loss < a[1].loss, "the DPO loss falls")
  go(root .. "/dpo_stopped", { "stop_after=2" })
  dpo.main(dpo.parse_args({ "resume=" .. root .. "/dpo_stopped" }))
  local b = comparable(root .. "/dpo_stopped")
  for step = 1, 3 do T.eq(b[step], a[step], "step " .. step) end
end)

T.run()
