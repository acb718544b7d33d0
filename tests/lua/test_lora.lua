-- test_lora.lua — LoRA adapters against the independent PyTorch LoRA
-- (tests/reference/lora_ref.py): log-probs and every adapter gradient, a PEFT folder written by
-- Python loaded by clrt, finite differences through the dropout, adapters-off = the base, a
-- frozen base, PEFT's names/shapes/config fields on save, `clrt merge`, and bad input; the
-- output layer's and the embedding's adapters (lm_head, embed_tokens) included, tied and untied.
local T = require("clrt.test")
local ffi = require("ffi")
local tensor = clrt.tensor
local json = require("clrt.json")
local src = T.source_dir()
package.path = src .. "/tests/?.lua;" .. package.path
local fixtures = src .. "/tests/fixtures"
local CASES = { qwen2_all = "qwen2_tied", qwen3_some = "qwen3_qknorm",
  -- lm_head and embed_tokens (with a block target), over a tied base and an untied one
  qwen2_head_embed = "qwen2_tied", qwen3_head_embed = "qwen3_qknorm",
  -- Phi-3's fused qkv_proj / gate_up_proj (one adapter each), Mistral's sliding window
  phi3_fused_all = "phi3_fused", mistral_some = "mistral_window" }
local bin = os.getenv("CLRT_BIN") or arg[-1]

local flat = T.floats

local function max_diff(a, b)
  local fa, fb, d = flat(a), flat(b), 0
  assert(#fa == #fb)
  for i = 1, #fa do d = math.max(d, math.abs(fa[i] - fb[i])) end
  return d
end

local function same_bits(a, b)
  local n = a:numel()
  return n == b:numel() and ffi.C.memcmp(a:contiguous():data_ptr(), b:contiguous():data_ptr(), 4 * n) == 0
end
pcall(ffi.cdef, "int memcmp(const void *a, const void *b, size_t n);")

local function grad_close(a, e, rtol, what)
  local fa, fe = flat(a), flat(e)
  local dn, en = 0, 0
  for i = 1, #fe do dn = dn + (fa[i] - fe[i]) ^ 2; en = en + fe[i] ^ 2 end
  dn, en = math.sqrt(dn), math.sqrt(en)
  T.ok(en > 0, what .. ": reference gradient is all zero (the test could not fail)")
  T.ok(dn <= rtol * en, ("%s: |g - ref| = %.3g > %g * |ref| = %.3g"):format(what, dn, rtol, rtol * en))
end

local function load(case, opts)
  opts = opts or {}
  opts.adapter = fixtures .. "/lora/" .. case
  return clrt.model.load(fixtures .. "/model/" .. CASES[case], opts)
end
local function expected(case) return clrt.safetensors.load(fixtures .. "/lora/" .. case .. "/expected.safetensors") end

for case, base in pairs(CASES) do
  T.case(case .. ": a PEFT folder written by Python loads; log-probs match PyTorch within 1e-4", function()
    local m, e = load(case), expected(case)
    local lp = m:logprobs(e.tokens, { lengths = e.lengths, grad = false })
    T.ok(max_diff(lp, e.lp) < 1e-4, "lp differs from the reference by " .. max_diff(lp, e.lp))
    T.ok(max_diff(e.lp, e.lp_base) > 0.05, "the adapter changes the log-probs (else the test is blind)")
  end)

  T.case(case .. ": every adapter gradient matches PyTorch (rtol 1e-3); the base gets none", function()
    local m, e = load(case), expected(case)
    local lp = m:logprobs(e.tokens, { lengths = e.lengths })
    T.ok(max_diff(lp, e.lp) < 1e-4, "kept forward lp")
    m:zero_grad()
    m:backward(e.dlogp)
    local g, n = m:lora_grads(), 0
    for _, name in ipairs(m.lora_names) do
      grad_close(g[name], e["grad." .. name], 1e-3, name)
      n = n + 1
    end
    T.ok(n > 0 and n == #m.lora_names)
    local okg, err = pcall(function() return m:grads() end)
    T.ok(not okg and tostring(err):find("frozen"), "base gradients are refused: " .. tostring(err))
    local adapter_bytes = 0
    for _, t in pairs(g) do adapter_bytes = adapter_bytes + t:numel() * 4 end
    -- the gradient arena holds the adapters' (16-float aligned) and nothing of the base
    T.ok(m:memory().grads < adapter_bytes + 64 * #m.lora_names, "grad arena " .. m:memory().grads)
  end)

  T.case(case .. ": adapters off give the bare base, bit for bit; on again, the adapted model", function()
    local m, e = load(case), expected(case)
    local bare = clrt.model.load(fixtures .. "/model/" .. base)
    local want = bare:logprobs(e.tokens, { lengths = e.lengths, grad = false })
    m:set_adapters(false)
    T.eq(m:adapters_enabled(), false)
    T.ok(same_bits(m:logprobs(e.tokens, { lengths = e.lengths, grad = false }), want), "adapters off = base")
    T.ok(max_diff(want, e.lp_base) < 1e-4, "the base matches PyTorch's base")
    m:set_adapters(true)
    T.ok(max_diff(m:logprobs(e.tokens, { lengths = e.lengths, grad = false }), e.lp) < 1e-4, "on again")
  end)

  T.case(case .. ": clrt merge writes a folder whose log-probs equal base + adapter", function()
    local out = T.tmpdir() .. "/merged"
    local cmd = ("%s merge %s %s %s 2>&1"):format(bin, fixtures .. "/model/" .. base, fixtures .. "/lora/" .. case, out)
    local f = assert(io.popen(cmd))
    local text = f:read("*a")
    local okc = f:close()
    T.ok(okc, "clrt merge failed: " .. text)
    local merged, e = clrt.model.load(out), expected(case)
    T.eq(merged.lora, nil)
    local lp = merged:logprobs(e.tokens, { lengths = e.lengths, grad = false })
    T.ok(max_diff(lp, e.lp) < 1e-4, "merged lp vs reference: " .. max_diff(lp, e.lp))
    local m = load(case)
    local lpa = m:logprobs(e.tokens, { lengths = e.lengths, grad = false })
    T.ok(max_diff(lp, lpa) < 2e-5, "merged vs base+adapter in clrt: " .. max_diff(lp, lpa))
    -- an adapter beside the output layer or the embedding of a tied base unties the merge
    local acfg = json.decode(clrt.files.read(fixtures .. "/lora/" .. case .. "/adapter_config.json"))
    local sides = false
    for _, t in ipairs(acfg.target_modules) do sides = sides or t == "lm_head" or t == "embed_tokens" end
    local tied = json.decode(clrt.files.read(fixtures .. "/model/" .. base .. "/config.json")).tie_word_embeddings
    local mcfg = json.decode(clrt.files.read(out .. "/config.json"))
    T.eq(mcfg.tie_word_embeddings, tied and not sides, "tie_word_embeddings of the merged model")
    T.eq(clrt.safetensors.info(out .. "/model.safetensors")["lm_head.weight"] ~= nil, not (tied and not sides),
      "lm_head.weight written when the merged model is untied")
  end)
end

local TINY = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 40, hidden_size = 24, intermediate_size = 40,
  num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 32,
  rms_norm_eps = 1e-6, tie_word_embeddings = true }
local TOKS = { { 1, 5, 9, 3, 7, 2, 8 }, { 4, 6, 11, 30, 2, 1, 0 } }

local UNTIED = {}
for k, v in pairs(TINY) do UNTIED[k] = v end
UNTIED.tie_word_embeddings = false

-- B random (and the embedding's A, which PEFT starts at zero), so every gradient is exercised.
local function tiny(lora, cfg)
  local m = clrt.model.new(cfg or TINY, { seed = 7 })
  m:add_lora(lora)
  local g = tensor.generator(99)
  for _, name in ipairs(m.lora_names) do   -- in order: the same values every run
    local t = m:lora_params()[name]
    if name:find("lora_B") or name:find("lora_embedding_A") then t:copy_(tensor.randn(t:shape(), { generator = g }) * 0.2) end
  end
  return m
end

-- sum(lp * w) in double precision
local function objective(lp, w)
  local a, b, s = flat(lp), flat(w), 0
  for i = 1, #a do s = s + a[i] * b[i] end
  return s
end

-- Central difference of objective in parameter `name`'s element i (0-based), dropout masks
-- held by the step, against the backward's gradient gp; returns the difference.
local function fd_agrees(m, w, name, i, gp, eps)
  local p = ffi.cast("float *", m:lora_params()[name]:data_ptr())
  local x0 = p[i]
  p[i] = x0 + eps; m:set_lora_dropout_step(17)
  local up = objective(m:logprobs(TOKS), w)
  p[i] = x0 - eps; m:set_lora_dropout_step(17)
  local dn = objective(m:logprobs(TOKS), w)
  p[i] = x0
  local fd = (up - dn) / (2 * eps)
  T.ok(math.abs(fd - gp[i + 1]) <= 2e-2 * math.max(1e-2, math.abs(fd)) + 2e-4,
    ("%s[%d]: finite difference %.6g, backward %.6g"):format(name, i, fd, gp[i + 1]))
  return fd
end

T.case("finite differences agree with the adapter gradients, dropout on (masks fixed by the step)", function()
  local m = tiny({ r = 3, alpha = 6, dropout = 0.25, seed = 3 })
  local w = tensor.randn({ 2, 6 }, { seed = 5 })
  m:set_lora_dropout_step(17)
  local lp = m:logprobs(TOKS)
  m:zero_grad()
  m:backward(w)
  local g = m:lora_grads()
  local checked, eps = 0, 1e-2
  for _, name in ipairs({ "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
    "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight",
    "base_model.model.model.layers.1.self_attn.o_proj.lora_A.weight",
    "base_model.model.model.layers.0.mlp.gate_proj.lora_B.weight" }) do
    local gp = flat(g[name])
    for _, i in ipairs({ 0, 5, 11 }) do
      fd_agrees(m, w, name, i, gp, eps)
      checked = checked + 1
    end
  end
  T.eq(checked, 12)
  local _ = lp
end)

local SIDES = { "q_proj", "lm_head", "embed_tokens" }
for label, cfg in pairs({ tied = TINY, untied = UNTIED }) do
  T.case(label .. ": finite differences agree with the lm_head and embed_tokens adapters' gradients, dropout on", function()
    local m = tiny({ r = 3, alpha = 6, dropout = 0.25, seed = 3, targets = SIDES }, cfg)
    local w = tensor.randn({ 2, 6 }, { seed = 5 })
    m:set_lora_dropout_step(17)
    m:logprobs(TOKS)
    m:zero_grad()
    m:backward(w)
    local g = m:lora_grads()
    local checked, eps = 0, 1e-2
    -- embedding_A [3, 40]: columns of tokens that have a target (1, 5, 9, 11), rows 0 and 2
    for name, idx in pairs({ ["base_model.model.lm_head.lora_A.weight"] = { 0, 7, 20 },
      ["base_model.model.lm_head.lora_B.weight"] = { 2, 16, 100 },
      ["base_model.model.model.embed_tokens.lora_embedding_A"] = { 1, 5, 80 + 9, 80 + 11 },
      ["base_model.model.model.embed_tokens.lora_embedding_B"] = { 0, 13, 50 } }) do
      local gp = flat(g[name])
      for _, i in ipairs(idx) do
        local fd = fd_agrees(m, w, name, i, gp, eps)
        T.ok(math.abs(fd) > 1e-5, ("%s[%d]: the objective moves (else the check is blind)"):format(name, i))
        checked = checked + 1
      end
    end
    T.eq(checked, 13)
  end)

  T.case(label .. ": lm_head and embed_tokens adapters: PEFT names and shapes, save -> load -> merge, decode", function()
    local m = tiny({ r = 3, alpha = 6, targets = SIDES }, cfg)
    local dir = T.tmpdir() .. "/adapter"
    m:save_adapter(dir)
    local acfg = json.decode(clrt.files.read(dir .. "/adapter_config.json"))
    T.eq(table.concat(acfg.target_modules, ","), "q_proj,lm_head,embed_tokens")
    -- PEFT's layout (peft/tuners/lora/layer.py): Linear lora_A.weight [r, in], lora_B.weight
    -- [out, r]; Embedding lora_embedding_A [r, num_embeddings], lora_embedding_B [dim, r]
    local info = clrt.safetensors.info(dir .. "/adapter_model.safetensors")
    local want = { ["base_model.model.lm_head.lora_A.weight"] = "3x24", ["base_model.model.lm_head.lora_B.weight"] = "40x3",
      ["base_model.model.model.embed_tokens.lora_embedding_A"] = "3x40",
      ["base_model.model.model.embed_tokens.lora_embedding_B"] = "24x3" }
    local n = 0
    for _ in pairs(info) do n = n + 1 end
    T.eq(n, 4 + 2 * 2, "q_proj's A and B in 2 layers, and the four above")
    for name, shape in pairs(want) do
      T.ok(info[name], name .. " saved")
      T.eq(info[name] and table.concat(info[name].shape, "x"), shape, name)
    end
    local lp = m:logprobs(TOKS, { grad = false })
    local bare = clrt.model.new(cfg, { seed = 7 })
    T.ok(max_diff(lp, bare:logprobs(TOKS, { grad = false })) > 1e-3, "the adapters change the model")
    local m2 = clrt.model.new(cfg, { seed = 7 })
    m2:load_adapter(dir)
    T.ok(same_bits(m2:logprobs(TOKS, { grad = false }), lp), "load round-trips")
    m2:merge_adapter()
    T.eq(m2.config.tie_word_embeddings, false, "the merge unties")
    T.ok(m2:params()["lm_head.weight"] ~= nil, "lm_head.weight of its own")
    local out = T.tmpdir() .. "/merged"
    m2:save(out)
    local merged = clrt.model.load(out)
    T.ok(max_diff(merged:logprobs(TOKS, { grad = false }), lp) < 2e-5, "merged = base + adapter: " ..
      max_diff(merged:logprobs(TOKS, { grad = false }), lp))
    -- decode (the KV-cache path) runs both adapters too: its temperature-1 log-probs are the
    -- training forward's
    local prompt = { 1, 5, 9, 3 }
    local r = m:generate({ prompt }, { temperature = 1, max_new_tokens = 4, seed = 2 })[1]
    local row = {}
    for _, t in ipairs(prompt) do row[#row + 1] = t end
    for _, t in ipairs(r.tokens) do row[#row + 1] = t end
    local full = flat(m:logprobs({ row }, { grad = false }))
    T.eq(#r.logprobs, 4)
    for i, l in ipairs(r.logprobs) do
      T.ok(math.abs(l - full[#prompt + i - 1]) < 1e-4, ("decode lp %d: %.6g vs %.6g"):format(i, l, full[#prompt + i - 1]))
    end
  end)
end

T.case("dropout: training forwards draw masks from (seed, step); scoring forwards use none", function()
  local m = tiny({ r = 2, alpha = 4, dropout = 0.3, seed = 1 })
  local plain = m:logprobs(TOKS, { grad = false })
  m:set_lora_dropout_step(4)
  local a = m:logprobs(TOKS)
  T.eq(m:lora_dropout_step(), 5, "a kept forward advances the step")
  m:set_lora_dropout_step(4)
  T.ok(same_bits(m:logprobs(TOKS), a), "same step, same masks")
  T.ok(max_diff(m:logprobs(TOKS), a) > 1e-4, "the next step draws other masks")
  T.ok(max_diff(a, plain) > 1e-4, "dropout changes a training forward")
  T.ok(same_bits(m:logprobs(TOKS, { grad = false }), plain), "scoring has no dropout")
  local m0 = tiny({ r = 2, alpha = 4, dropout = 0, seed = 1 })
  T.ok(same_bits(m0:logprobs(TOKS), m0:logprobs(TOKS, { grad = false })), "dropout 0: training = scoring")
end)

T.case("the optimizer walks the adapters only: the base stays bit-identical", function()
  local m = tiny({ r = 4, alpha = 8, dropout = 0.1 })
  local before = {}
  for name, t in pairs(m:params()) do before[name] = t:clone() end
  local opt = clrt.optim.adamw(m, { lr = 1e-2 })
  T.eq(#opt.names, #m.lora_names)
  local A0 = m:lora_params()["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]:clone()
  for _ = 1, 3 do
    local lp = m:logprobs(TOKS)
    m:zero_grad()
    m:backward(tensor.ones(lp:shape()) * -0.1)
    opt:step()
  end
  for name, t in pairs(m:params()) do T.ok(same_bits(t, before[name]), name .. " changed") end
  T.ok(not same_bits(m:lora_params()["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"], A0),
    "the adapters trained")
  T.eq(opt:memory(), 2 * m:memory().grads, "moments sized like the adapters")
end)

T.case("save_adapter writes PEFT's config fields, tensor names and shapes; load round-trips", function()
  local m = tiny({ r = 4, alpha = 16, dropout = 0.05, targets = { "q_proj", "v_proj", "down_proj" } })
  local dir = T.tmpdir() .. "/adapter"
  m:save_adapter(dir, { base = "Qwen/Qwen2.5-0.5B-Instruct" })
  local cfg = json.decode(clrt.files.read(dir .. "/adapter_config.json"))
  T.eq(cfg.peft_type, "LORA"); T.eq(cfg.task_type, "CAUSAL_LM"); T.eq(cfg.r, 4); T.eq(cfg.lora_alpha, 16)
  T.eq(cfg.lora_dropout, 0.05); T.eq(cfg.bias, "none"); T.eq(cfg.fan_in_fan_out, false)
  T.eq(cfg.use_rslora, false); T.eq(cfg.inference_mode, true); T.eq(cfg.modules_to_save, json.null)
  T.eq(cfg.base_model_name_or_path, "Qwen/Qwen2.5-0.5B-Instruct")
  T.eq(table.concat(cfg.target_modules, ","), "q_proj,v_proj,down_proj")
  local info = clrt.safetensors.info(dir .. "/adapter_model.safetensors")
  local n = 0
  for _ in pairs(info) do n = n + 1 end
  T.eq(n, 2 * 3 * 2, "A and B for 3 targets x 2 layers")
  local HD, KVD = 4 * 6, 2 * 6
  local function shape(name) return table.concat(info["base_model.model.model.layers." .. name].shape, "x") end
  T.eq(shape("0.self_attn.q_proj.lora_A.weight"), "4x24")    -- [r, in]
  T.eq(shape("0.self_attn.q_proj.lora_B.weight"), HD .. "x4")
  T.eq(shape("1.self_attn.v_proj.lora_B.weight"), KVD .. "x4")  -- [out, r]
  T.eq(shape("1.mlp.down_proj.lora_A.weight"), "4x40")
  T.eq(shape("1.mlp.down_proj.lora_B.weight"), "24x4")
  T.eq(info["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].dtype, "F32")
  local m2 = clrt.model.new(TINY, { seed = 7 })
  m2:load_adapter(dir)
  T.ok(same_bits(m2:logprobs(TOKS, { grad = false }), m:logprobs(TOKS, { grad = false })), "round trip")
end)

T.case("bad adapters and settings are refused with the reason", function()
  local m = clrt.model.new(TINY, { seed = 7 })
  local function refused(f, pat)
    local okc, err = pcall(f)
    T.ok(not okc and tostring(err):find(pat, 1, true), ("expected an error with '%s', got %s"):format(pat, tostring(err)))
  end
  refused(function() m:add_lora({ r = 0 }) end, "r must be a positive integer")
  refused(function() m:add_lora({ dropout = 1 }) end, "dropout must be in [0, 1)")
  refused(function() m:add_lora({ targets = { "lm_head.weight" } }) end, "unknown target 'lm_head.weight'")
  refused(function() m:add_lora({ targets = { "qproj" } }) end, "unknown target 'qproj'")
  local dir = T.tmpdir()
  local good = tiny({ r = 2 })
  good:save_adapter(dir .. "/a")
  clrt.files.write_atomic(dir .. "/a/adapter_config.json", (clrt.files.read(dir .. "/a/adapter_config.json"):gsub('"r": 2', '"r": 3')))
  refused(function() clrt.model.new(TINY):load_adapter(dir .. "/a") end, "has shape [2, 24], expected [3, 24]")
  good:save_adapter(dir .. "/b")
  clrt.files.write_atomic(dir .. "/b/adapter_config.json", (clrt.files.read(dir .. "/b/adapter_config.json"):gsub('"LORA"', '"IA3"')))
  refused(function() clrt.model.new(TINY):load_adapter(dir .. "/b") end, "'peft_type' must be \"LORA\"")
  refused(function() clrt.model.new(TINY):load_adapter(dir .. "/none") end, "no adapter_config.json")
  refused(function() m:set_adapters(false) end, "no LoRA adapters")
  -- PEFT's save_embedding_layers copies of the base: accepted when they are the base's own
  local sides = tiny({ r = 2, targets = { "lm_head", "embed_tokens" } })
  sides:save_adapter(dir .. "/c")
  local ts = clrt.safetensors.load(dir .. "/c/adapter_model.safetensors")
  local E = clrt.model.new(TINY, { seed = 7 }):params()["model.embed_tokens.weight"]
  ts["base_model.model.model.embed_tokens.base_layer.weight"] = E:clone()
  ts["base_model.model.lm_head.base_layer.weight"] = E:clone()   -- tied: the head is E
  clrt.safetensors.save(dir .. "/c/adapter_model.safetensors", ts)
  local okl, errl = pcall(function() clrt.model.new(TINY, { seed = 7 }):load_adapter(dir .. "/c") end)
  T.ok(okl, "the base's own embedding copies load: " .. tostring(errl))
  ts["base_model.model.lm_head.base_layer.weight"] = E * 1.5
  clrt.safetensors.save(dir .. "/c/adapter_model.safetensors", ts)
  refused(function() clrt.model.new(TINY, { seed = 7 }):load_adapter(dir .. "/c") end,
    "'base_model.model.lm_head.base_layer.weight' differs from the base's weights")
end)

-- The log-probs and adapter gradients of m (its lora_B and lora_embedding_A set nonzero from
-- a seeded generator), and a check that two such runs agree.
local function lora_lp_grads(m, toks, w)
  local g = tensor.generator(7)
  for _, name in ipairs(m.lora_names) do
    local t = m:lora_params()[name]
    if name:find("lora_B") or name:find("lora_embedding_A") then t:copy_(tensor.randn(t:shape(), { generator = g }) * 0.1) end
  end
  local lp = m:logprobs(toks)
  m:zero_grad()
  m:backward(w)
  local grads = {}
  for name, t in pairs(m:lora_grads()) do grads[name] = t:clone() end
  return lp, grads
end
local function same_lp_grads(lp1, g1, lp2, g2)
  T.ok(max_diff(lp1, lp2) < 1e-5, "lp: " .. max_diff(lp1, lp2))
  for name, t in pairs(g1) do
    local scale = t:abs():max()
    T.ok(scale > 0 and max_diff(t, g2[name]) <= 1e-4 * scale, name .. ": " .. max_diff(t, g2[name]) .. " of " .. scale)
  end
end

T.case("the threaded LoRA products (split over the team) equal one thread's, dropout on", function()
  local cfg = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 64, hidden_size = 64, intermediate_size = 160,
    num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 256,
    rms_norm_eps = 1e-6, tie_word_embeddings = true }
  local toks = (tensor.rand({ 4, 130 }, { seed = 3 }) * 63):to("i32")   -- 520 rows: past the threading threshold
  local w = tensor.randn({ 4, 129 }, { seed = 4 })
  local function run(threads)
    clrt.set_num_threads(threads)
    local m = clrt.model.new(cfg, { seed = 5 })
    m:add_lora({ r = 8, alpha = 16, dropout = 0.1, seed = 6 })
    return lora_lp_grads(m, toks, w)
  end
  local lp1, g1 = run(1)
  local lp2, g2 = run(2)
  clrt.set_num_threads(2)
  same_lp_grads(lp1, g1, lp2, g2)
end)

T.case("the output layer's adapter over blocks of rows and of the vocabulary equals one block", function()
  -- V = 20000 without kept logits: 209-row chunks, so blocks of 256 rows (then 4) by two
  -- vocabulary blocks; with them kept (the default at this size), one block of all rows.
  local cfg = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 20000, hidden_size = 24, intermediate_size = 40,
    num_hidden_layers = 1, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 256,
    rms_norm_eps = 1e-6, tie_word_embeddings = true }
  local toks = (tensor.rand({ 2, 131 }, { seed = 3 }) * 19999):to("i32")
  local w = tensor.randn({ 2, 130 }, { seed = 4 })
  local function run(keep_mb)
    local m = clrt.model.new(cfg, { seed = 5, keep_logits_mb = keep_mb })
    m:add_lora({ r = 4, alpha = 8, dropout = 0.1, seed = 6, targets = { "lm_head", "embed_tokens" } })
    return lora_lp_grads(m, toks, w)
  end
  local lp1, g1 = run(0)
  local lp2, g2 = run(nil)
  same_lp_grads(lp1, g1, lp2, g2)
end)

T.case("clrt serve --adapter answers as base + adapter (greedy), not as the base", function()
  local dir = require("support.tiny_model")(T.tmpdir(), { seed = 4 })
  local m = clrt.model.load(dir)
  m:add_lora({ r = 4, alpha = 64, seed = 2 })
  local g = tensor.generator(3)
  for name, t in pairs(m:lora_params()) do
    if name:find("lora_B") then t:copy_(tensor.randn(t:shape(), { generator = g }) * 0.5) end
  end
  local adir = T.tmpdir() .. "/adapter"
  m:save_adapter(adir, { base = dir })
  local tok = clrt.tokenizer.load(dir)
  local msgs = { { role = "user", content = "hello there, how are you today?" } }
  local want = clrt.chat.generate(m, tok, msgs, { temperature = 0, max_new_tokens = 12 })
  local bare = clrt.chat.generate(clrt.model.load(dir), tok, msgs, { temperature = 0, max_new_tokens = 12 })
  T.ok(want ~= bare, "the adapter changes the greedy reply (else the test is blind)")
  local srv = require("support.serve")(dir, "--adapter " .. adir)
  local body = T.tmpdir() .. "/body.json"
  local f = assert(io.open(body, "w"))
  f:write(require("cjson").encode({ messages = msgs, temperature = 0, max_tokens = 12 }))
  f:close()
  local p = assert(io.popen(("curl -s -m 60 --data-binary @%s -H 'Content-Type: application/json' %s/chat/completions"):format(body, srv.url)))
  local reply = require("cjson").decode(p:read("*a"))
  p:close()
  T.eq(reply.choices[1].message.content, want)
end)

T.run()
