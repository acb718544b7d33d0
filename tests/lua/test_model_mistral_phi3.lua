-- test_model_mistral_phi3.lua — MistralForCausalLM and Phi3ForCausalLM beyond the shared
-- fixture checks of test_model.lua / test_decode.lua / test_lora.lua: greedy decode against
-- PyTorch's (tests/reference/make_model_fixtures.py) on sequences longer than the sliding
-- window, that the fixtures see the window at all, Phi-3's fused tensors in and out under
-- Hugging Face's names, LoRA on the fused layers (PEFT's names, the recipes' default targets),
-- a bf16 base over fused tensors, and the config.json keys these architectures read or refuse.
local T = require("clrt.test")
local ffi = require("ffi")
local json = require("clrt.json")
local fixtures = T.source_dir() .. "/tests/fixtures/model"
local WINDOWED = { "mistral_window", "phi3_fused" }

local flat = T.floats

local function expected(name)
  return clrt.safetensors.load(fixtures .. "/" .. name .. "/expected.safetensors")
end

local function config_of(name)
  return json.decode(clrt.files.read(fixtures .. "/" .. name .. "/config.json"))
end

local function max_diff(a, b)
  local fa, fb, d = flat(a), flat(b), 0
  assert(#fa == #fb)
  for i = 1, #fa do d = math.max(d, math.abs(fa[i] - fb[i])) end
  return d
end

local function bytes_of(t) return ffi.string(t:contiguous():data_ptr(), t:numel() * 4) end

for _, name in ipairs(WINDOWED) do
  T.case(name .. ": greedy decode (KV cache) gives PyTorch's tokens past the sliding window", function()
    local e = expected(name)
    local prompt, want = e.greedy_prompt:totable(), table.concat(e.greedy:totable(), ",")
    T.ok(#prompt + e.greedy:numel() > config_of(name).sliding_window, "the sequence outgrows the window")
    local m = clrt.model.load(fixtures .. "/" .. name)
    -- alone, and in a ragged batch beside a longer prompt (other cache slot, other positions)
    local r = m:generate({ prompt }, { temperature = 0, max_new_tokens = e.greedy:numel() })
    T.eq(table.concat(r[1].tokens, ","), want, name .. " greedy")
    local other = { 9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 12 }
    r = m:generate({ other, prompt }, { temperature = 0, max_new_tokens = e.greedy:numel() })
    T.eq(table.concat(r[2].tokens, ","), want, name .. " greedy in a ragged batch")
    -- the f32 CPU decode without the packed weights (another product) agrees too
    m:set_decode_pack(false)
    r = m:generate({ prompt }, { temperature = 0, max_new_tokens = e.greedy:numel() })
    T.eq(table.concat(r[1].tokens, ","), want, name .. " greedy, unpacked weights")
  end)

  T.case(name .. ": the fixture sees the window (the same weights without it score otherwise)", function()
    local e = expected(name)
    local dir = T.tmpdir() .. "/nowindow"
    local m = clrt.model.load(fixtures .. "/" .. name)
    m.config.sliding_window = json.null
    m:save(dir)
    local full = clrt.model.load(dir)
    local d = max_diff(full:logprobs(e.tokens, { lengths = e.lengths, grad = false }), e.lp)
    T.ok(d > 1e-2, ("without the window the log-probs move by %g (the tests above could not tell)"):format(d))
    local r = full:generate({ e.greedy_prompt:totable() }, { temperature = 0, max_new_tokens = e.greedy:numel() })
    T.ok(table.concat(r[1].tokens, ",") ~= table.concat(e.greedy:totable(), ","), "greedy differs without the window")
    -- a window that covers max_position_embeddings is no window
    local cfg = config_of(name)
    cfg.sliding_window = cfg.max_position_embeddings
    T.eq(clrt.model.parse_config(cfg, "cfg").sliding_window, nil)
  end)
end

T.case("Phi-3: qkv_proj and gate_up_proj stay fused under Hugging Face's names and shapes, in and out", function()
  local m = clrt.model.load(fixtures .. "/phi3_fused")
  local cfg = config_of("phi3_fused")
  local H, KV, C, I = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size, cfg.intermediate_size
  local D = C / H
  local p = m:params()
  T.eq(p["model.layers.1.self_attn.qkv_proj.weight"]:shape(), { (H + 2 * KV) * D, C })
  T.eq(p["model.layers.0.mlp.gate_up_proj.weight"]:shape(), { 2 * I, C })
  for _, n in ipairs(m.names) do
    for _, part in ipairs({ "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj" }) do
      T.ok(not n:find("%." .. part .. "%."), "no split name: " .. n)
    end
  end
  local dir = T.tmpdir() .. "/phi3"
  m:save(dir)
  local info = clrt.safetensors.info(dir .. "/model.safetensors")
  local src = clrt.safetensors.info(fixtures .. "/phi3_fused/model.safetensors")
  local names = {}
  for n, v in pairs(src) do
    if n ~= "__metadata__" then
      names[#names + 1] = n
      T.ok(info[n], "saved " .. n)
      T.eq(info[n].shape, v.shape, n .. " shape")
    end
  end
  for n in pairs(info) do T.ok(n == "__metadata__" or src[n], "nothing but the checkpoint's names: " .. n) end
  local saved = json.decode(clrt.files.read(dir .. "/config.json"))
  T.eq(saved.architectures[1], "Phi3ForCausalLM")
  T.eq(saved.sliding_window, cfg.sliding_window)
  local back = clrt.model.load(dir)
  for _, n in ipairs(names) do T.ok(bytes_of(back:params()[n]) == bytes_of(p[n]), n .. " round-trips bit for bit") end
  T.ok(#names > 0)
  -- a gradient lands in the fused tensor's rows: k's block of qkv_proj changes k only
  local e = expected("phi3_fused")
  m:zero_grad()
  m:logprobs(e.tokens, { lengths = e.lengths })
  m:backward(e.dlogp)
  local g = flat(m:grads()["model.layers.0.self_attn.qkv_proj.weight"])
  local ref = flat(e["grad.model.layers.0.self_attn.qkv_proj.weight"])
  local rows = { q = { 0, H * D }, k = { H * D, KV * D }, v = { (H + KV) * D, KV * D } }
  for block, r in pairs(rows) do
    local num, den = 0, 0
    for i = r[1] * C + 1, (r[1] + r[2]) * C do num = num + (g[i] - ref[i]) ^ 2; den = den + ref[i] ^ 2 end
    T.ok(den > 0 and math.sqrt(num) <= 1e-3 * math.sqrt(den), block .. " block of qkv_proj's gradient")
  end
end)

T.case("Mistral: save writes the checkpoint's own names, shapes and window; the reload is bit for bit and scores alike", function()
  local m = clrt.model.load(fixtures .. "/mistral_window")
  local dir = T.tmpdir() .. "/mistral"
  m:save(dir)
  local info = clrt.safetensors.info(dir .. "/model.safetensors")
  local src = clrt.safetensors.info(fixtures .. "/mistral_window/model.safetensors")
  local n = 0
  for name, v in pairs(src) do
    if name ~= "__metadata__" then
      n = n + 1
      T.ok(info[name], "saved " .. name)
      T.eq(info[name] and info[name].shape, v.shape, name .. " shape")
    end
  end
  for name in pairs(info) do T.ok(name == "__metadata__" or src[name], "nothing but the checkpoint's names: " .. name) end
  T.ok(n > 0 and src["model.layers.1.self_attn.k_proj.weight"], "the fixture has Hugging Face's names")
  local saved = json.decode(clrt.files.read(dir .. "/config.json"))
  T.eq(saved.architectures[1], "MistralForCausalLM")
  T.eq(saved.sliding_window, config_of("mistral_window").sliding_window)
  local back = clrt.model.load(dir)
  for name, p in pairs(m:params()) do T.ok(bytes_of(back:params()[name]) == bytes_of(p), name .. " round-trips bit for bit") end
  local e = expected("mistral_window")
  T.ok(max_diff(back:logprobs(e.tokens, { lengths = e.lengths, grad = false }), e.lp) < 1e-4, "the reloaded model scores as PyTorch")
end)

T.case("Phi-3: LoRA on the fused layers: PEFT's names and targets, the recipes' default list, refusals", function()
  local m = clrt.model.load(fixtures .. "/phi3_fused")
  -- what train.lora's default names (every part) means on a fused model: the fused layers
  m:add_lora({ r = 2, targets = { "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj" } })
  T.eq(m.lora.targets, { "qkv_proj", "o_proj", "gate_up_proj", "down_proj" })
  local lp = m:lora_params()
  T.eq(lp["base_model.model.model.layers.0.self_attn.qkv_proj.lora_B.weight"]:shape(), { (4 + 2 * 2) * 12, 2 })
  T.eq(lp["base_model.model.model.layers.1.mlp.gate_up_proj.lora_A.weight"]:shape(), { 2, 48 })
  T.eq(#m.lora_names, 2 * 2 * 4)
  local dir = T.tmpdir() .. "/adapter"
  m:save_adapter(dir)
  local acfg = json.decode(clrt.files.read(dir .. "/adapter_config.json"))
  T.eq(acfg.target_modules, { "qkv_proj", "o_proj", "gate_up_proj", "down_proj" })
  local again = clrt.model.load(fixtures .. "/phi3_fused", { adapter = dir })
  T.eq(again.lora_names, m.lora_names)
  T.raises(function() clrt.model.load(fixtures .. "/phi3_fused"):add_lora({ targets = { "q_proj" } }) end,
    "qkv_proj", "a part of a fused layer alone")
  T.raises(function() clrt.model.load(fixtures .. "/mistral_window"):add_lora({ targets = { "qkv_proj" } }) end,
    "fused layer of Phi-3", "a fused name on a model with the parts")
end)

T.case("Phi-3: fused adapters with dropout: finite differences agree with the gradients (shared A, each B block)", function()
  local m = clrt.model.load(fixtures .. "/phi3_fused")
  m:add_lora({ r = 2, alpha = 4, dropout = 0.3, seed = 9 })
  local g = clrt.tensor.generator(3)
  for _, n in ipairs(m.lora_names) do
    if n:find("lora_B") then m:lora_params()[n]:copy_(clrt.tensor.randn(m:lora_params()[n]:shape(), { generator = g }) * 0.3) end
  end
  local toks = { { 5, 9, 17, 3, 40, 2, 8, 11, 60, 7 }, { 4, 4, 30, 21, 1, 90, 6, 12, 13, 14 } }
  local w = clrt.tensor.randn({ 2, 9 }, { seed = 5 })
  local function objective()
    m:set_lora_dropout_step(17)   -- the same masks every forward
    local lp, s = flat(m:logprobs(toks)), 0
    local fw = flat(w)
    for i = 1, #lp do s = s + lp[i] * fw[i] end
    return s
  end
  objective()
  m:zero_grad()
  m:backward(w)
  local qkv = "base_model.model.model.layers.0.self_attn.qkv_proj.lora_"
  local gu = "base_model.model.model.layers.1.mlp.gate_up_proj.lora_"
  -- A (shared by q, k, v), B's q, k and v rows (96 rows of 2: q 0-47, k 48-71, v 72-95); gate_up's A and up rows
  local probes = { { qkv .. "A.weight", { 0, 37, 95 } }, { qkv .. "B.weight", { 3, 100, 150 } },
    { gu .. "A.weight", { 1, 50 } }, { gu .. "B.weight", { 90, 150 } } }
  local eps = 1e-2
  for _, pr in ipairs(probes) do
    local name = pr[1]
    local gp = flat(m:lora_grads()[name])
    local p = ffi.cast("float *", m:lora_params()[name]:data_ptr())
    for _, i in ipairs(pr[2]) do
      local x0 = p[i]
      p[i] = x0 + eps
      local up = objective()
      p[i] = x0 - eps
      local dn = objective()
      p[i] = x0
      local fd = (up - dn) / (2 * eps)
      T.ok(math.abs(fd - gp[i + 1]) <= 2e-2 * math.max(1e-2, math.abs(fd)) + 2e-4,
        ("%s[%d]: finite difference %.6g, backward %.6g"):format(name, i, fd, gp[i + 1]))
    end
  end
end)

T.case("Phi-3: a bf16 base packs each block of a fused tensor as its own weight", function()
  local e = expected("phi3_fused")
  local adapter = T.tmpdir() .. "/adapter"
  do
    local m = clrt.model.load(fixtures .. "/phi3_fused")
    m:add_lora({ r = 2, seed = 4 })
    local g = clrt.tensor.generator(5)
    for _, n in ipairs(m.lora_names) do
      if n:find("lora_B") then m:lora_params()[n]:copy_(clrt.tensor.randn(m:lora_params()[n]:shape(), { generator = g }) * 0.1) end
    end
    m:save_adapter(adapter)
  end
  local m16 = clrt.model.load(fixtures .. "/phi3_fused", { base_dtype = "bf16", adapter = adapter })
  T.eq(m16:base_dtype(), "bf16")
  local late = clrt.model.load(fixtures .. "/phi3_fused", { adapter = adapter }):set_base_dtype("bf16")
  local rounded = clrt.model.load(fixtures .. "/phi3_fused", { adapter = adapter })
  for n, p in pairs(rounded:params()) do
    if n:match("proj%.weight$") then p:copy_(p:to("bf16"):to("f32")) end
  end
  local a = m16:logprobs(e.tokens, { lengths = e.lengths, grad = false })
  local b = late:logprobs(e.tokens, { lengths = e.lengths, grad = false })
  local r = rounded:logprobs(e.tokens, { lengths = e.lengths, grad = false })
  T.ok(bytes_of(a) == bytes_of(b), "converted while reading = converted after loading")
  T.ok(max_diff(a, r) < 2e-2, "bf16 base vs the f32 model over rounded weights: " .. max_diff(a, r))
end)

T.case("config.json: Phi-3-mini-4k's own keys load; rope_scaling it does not run is refused by name", function()
  -- microsoft/Phi-3-mini-4k-instruct's config.json
  local phi3_mini = json.decode([[{
    "_name_or_path": "Phi-3-mini-4k-instruct", "architectures": ["Phi3ForCausalLM"],
    "attention_dropout": 0.0, "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
      "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"},
    "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
    "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
    "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.2", "use_cache": true,
    "attention_bias": false, "vocab_size": 32064 }]])
  local c = clrt.model.parse_config(phi3_mini, "phi3/config.json")
  T.eq(c.arch, "phi3")
  T.eq(c.sliding_window, 2047)
  T.eq(c.fused_qkv_gate_up, true)
  T.eq(c.head_dim, 96)
  -- the same keys at a small size run
  local small = {}
  for k, v in pairs(phi3_mini) do small[k] = v end
  small.hidden_size, small.intermediate_size, small.num_hidden_layers = 32, 48, 1
  small.num_attention_heads, small.num_key_value_heads, small.vocab_size = 4, 4, 50
  small.sliding_window = 3
  local m = clrt.model.new(small, { seed = 1 })
  T.eq(m:logprobs({ { 1, 2, 3, 4, 5, 6 } }, { grad = false }):size(2), 5)
  T.ok(tostring(m):find("Phi3ForCausalLM"), tostring(m))
  -- Phi-3's long-context variants (longrope, and "su" in older files) load with per-pair
  -- factor lists of head_dim / 2 (test_model_rope.lua checks their rotation); malformed ones are refused
  local function refused(edit, want)
    local cfg = {}
    for k, v in pairs(small) do cfg[k] = v end
    edit(cfg)
    local okp, err = pcall(clrt.model.new, cfg)
    T.ok(not okp and tostring(err):find(want, 1, true), ("expected an error naming %q, got %s"):format(want, tostring(err)))
  end
  refused(function(cfg)
    cfg.rope_scaling = { type = "longrope", long_factor = { 1, 2 }, short_factor = { 1, 1 } }
  end, "rope_scaling.short_factor' must list 4 numbers")
  refused(function(cfg) cfg.rope_scaling = { type = "su", long_factor = { 1, 2, 0, 1 }, short_factor = { 1, 1, 1, 1 } } end,
    "rope_scaling.long_factor' entry 3 must be a positive number")
  local lr = {}
  for k, v in pairs(small) do lr[k] = v end
  lr.rope_scaling = { type = "longrope", long_factor = { 1, 2, 3, 4 }, short_factor = { 1, 1, 1, 1 } }
  T.eq(clrt.model.parse_config(lr, "phi3/config.json").rope_scaling, 4, "longrope loads")
  -- partial rotary (Phi-4-mini's kind; test_model_rope.lua checks its rotation): head_dim 8 at
  -- 0.75 rotates 6; 0.1 would rotate none (int(0.8)), which is refused
  local pr = {}
  for k, v in pairs(small) do pr[k] = v end
  pr.partial_rotary_factor = 0.75
  T.eq(clrt.model.parse_config(pr, "phi3/config.json").rope_dim, 6)
  refused(function(cfg) cfg.partial_rotary_factor = 0.1 end, "partial_rotary_factor")
  refused(function(cfg) cfg.sliding_window = 0 end, "sliding_window")
  refused(function(cfg) cfg.sliding_window = "all" end, "sliding_window")
  refused(function(cfg) cfg.architectures = { "Phi3SmallForCausalLM" } end, "Phi3ForCausalLM")
  -- Mistral 7B v0.1 (window 4096 of 32768) and v0.3 (no window)
  local mistral = { architectures = { "MistralForCausalLM" }, model_type = "mistral", hidden_size = 4096,
    intermediate_size = 14336, num_hidden_layers = 32, num_attention_heads = 32, num_key_value_heads = 8,
    max_position_embeddings = 32768, rms_norm_eps = 1e-5, rope_theta = 10000.0, sliding_window = 4096,
    vocab_size = 32000, tie_word_embeddings = false, hidden_act = "silu" }
  T.eq(clrt.model.parse_config(mistral, "m").sliding_window, 4096)
  mistral.sliding_window = json.null
  T.eq(clrt.model.parse_config(mistral, "m").sliding_window, nil)
  -- other architectures keep ignoring the key (Qwen2 writes one beside use_sliding_window = false)
  local qwen = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 32, intermediate_size = 48,
    num_hidden_layers = 1, num_attention_heads = 4, max_position_embeddings = 64, rms_norm_eps = 1e-6,
    vocab_size = 50, sliding_window = 4, use_sliding_window = false }
  T.eq(clrt.model.parse_config(qwen, "q").sliding_window, nil)
end)

T.case("train_flops counts a query's keys up to the window (T x W rather than T x T)", function()
  local m = clrt.model.load(fixtures .. "/mistral_window")   -- W = 4, 2 layers, 4 heads of 8
  local cfg = config_of("mistral_window")
  local matmul = m:num_params() - cfg.vocab_size * cfg.hidden_size
  local B, Tn = 3, 20
  T.near(m:train_flops(B, Tn), 6 * matmul * B * Tn + 6 * 2 * 4 * 8 * Tn * 4 * B, { rtol = 1e-12 }, "past the window")
  T.near(m:train_flops(B, 3), 6 * matmul * B * 3 + 6 * 2 * 4 * 8 * 3 * 3 * B, { rtol = 1e-12 }, "within it")
end)

T.case("log-probs of one-token rows (no targets) are an empty tensor, not a crash", function()
  local m = clrt.model.load(fixtures .. "/mistral_window")
  local lp = m:logprobs({ { 9 }, { 4 } })
  T.eq(lp:shape(), { 2, 0 })
end)

T.run()
