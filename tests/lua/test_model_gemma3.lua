-- test_model_gemma3.lua — Gemma3ForCausalLM against the independent PyTorch reference
-- (tests/reference/gemma3_ref.py, fixture by make_gemma3_fixtures.py): log-probs, every
-- gradient, KV-cache decode past the sliding window and the reference's greedy continuation (on
-- the tiny model and on the same with both soft-cappings), LoRA (finite differences, merge), save/load in Hugging Face's names, the config forms
-- (sliding_window_pattern, layer_types, transformers 5's rope_parameters) and what is refused.
local T = require("clrt.test")
local ffi = require("ffi")
local tensor = clrt.tensor
local json = require("clrt.json")
local fixtures = T.source_dir() .. "/tests/fixtures/model/"
local dir = fixtures .. "gemma3_tiny"
local flat = T.floats

local function expected(d) return clrt.safetensors.load((d or dir) .. "/expected.safetensors") end
local function config() return json.decode(clrt.files.read(dir .. "/config.json")) end

local function max_diff(a, b)
  local fa, fb, d = flat(a), flat(b), 0
  T.eq(#fa, #fb, "element count")
  for i = 1, #fa do d = math.max(d, math.abs(fa[i] - fb[i])) end
  return d
end

-- A model of the fixture's weights under another config.json (same tensors, linked).
local function with_config(edit)
  local d = T.tmpdir() .. "/g3"
  os.execute(("mkdir -p %q && ln -s %q %q"):format(d, dir .. "/model.safetensors", d .. "/model.safetensors"))
  local cfg = config()
  edit(cfg)
  local f = assert(io.open(d .. "/config.json", "w"))
  f:write(json.encode(cfg))
  f:close()
  return d
end

local function log_softmax(z, V)
  local mx, s, out = -math.huge, 0, {}
  for v = 0, V - 1 do mx = math.max(mx, z[v]) end
  for v = 0, V - 1 do s = s + math.exp(z[v] - mx) end
  for v = 0, V - 1 do out[v + 1] = z[v] - mx - math.log(s) end
  return out
end

for _, name in ipairs({ "gemma3_tiny", "gemma3_softcap" }) do
  local fdir = fixtures .. name
  local cfg = json.decode(clrt.files.read(fdir .. "/config.json"))
  T.case(name .. ": log-probs match PyTorch within 1e-4 (rows longer than the sliding window)", function()
    local m = clrt.model.load(fdir)
    local e = expected(fdir)
    T.ok(e.tokens:size(2) > cfg.sliding_window, "the batch is longer than the window")
    local d = max_diff(m:logprobs(e.tokens, { lengths = e.lengths }), e.lp)
    T.ok(d <= 1e-4, "max |lp - ref| = " .. d)
  end)

  T.case(name .. ": padded rows equal unpadded ones", function()
    local m = clrt.model.load(fdir)
    local e = expected(fdir)
    local lp = m:logprobs(e.tokens, { lengths = e.lengths, grad = false })
    local toks, lens = e.tokens:totable(), e.lengths:totable()
    for b = 1, #toks do
      local row = {}
      for t = 1, lens[b] do row[t] = toks[b][t] end
      local one = m:logprobs({ row }, { grad = false })
      for t = 1, lens[b] - 1 do T.near(one:get(1, t), lp:get(b, t), { atol = 2e-5 }, ("row %d pos %d"):format(b, t)) end
    end
  end)

  T.case(name .. ": every gradient matches PyTorch within 1e-3 (logits kept, and recomputed)", function()
    for _, keep_mb in ipairs({ 256, 0 }) do
      local m = clrt.model.load(fdir, { keep_logits_mb = keep_mb })
      local e = expected(fdir)
      m:zero_grad()
      m:logprobs(e.tokens, { lengths = e.lengths })
      m:backward(e.dlogp)
      local g, n = m:grads(), 0
      for _, name in ipairs(m.names) do
        local ref = e["grad." .. name]
        T.ok(ref, "reference has grad." .. name)
        local fa, fe = flat(g[name]), flat(ref)
        local dn, en, scale = 0, 0, 0
        for i = 1, #fe do
          dn, en, scale = dn + (fa[i] - fe[i]) ^ 2, en + fe[i] ^ 2, math.max(scale, math.abs(fe[i]))
        end
        T.ok(en > 0, name .. ": reference gradient is all zero (the test could not fail)")
        T.ok(math.sqrt(dn) <= 1e-3 * math.sqrt(en), ("%s: |g - ref| = %.3g, |ref| = %.3g"):format(name, math.sqrt(dn), math.sqrt(en)))
        for i = 1, #fe do
          if math.abs(fa[i] - fe[i]) > 1e-3 * scale then
            T.ok(false, ("%s[%d]: expected %.7g, got %.7g"):format(name, i, fe[i], fa[i]))
            break
          end
        end
        n = n + 1
      end
      T.eq(n, 1 + 13 * 4 + 1, "one gradient per parameter (tied head)")
    end
  end)

  T.case(name .. ": a row of 150 tokens (past the kernels' first query block): log-probs and every gradient", function()
    local m = clrt.model.load(fdir)
    local e = expected(fdir)
    local d = max_diff(m:logprobs(e.long_tokens), e.long_lp)
    T.ok(d <= 1e-4, "max |lp - ref| = " .. d)
    m:zero_grad()
    m:logprobs(e.long_tokens)
    m:backward(e.long_dlogp)
    local g = m:grads()
    for _, pname in ipairs(m.names) do
      local fa, fe = flat(g[pname]), flat(e["long_grad." .. pname])
      local dn, en = 0, 0
      for i = 1, #fe do dn, en = dn + (fa[i] - fe[i]) ^ 2, en + fe[i] ^ 2 end
      T.ok(en > 0 and math.sqrt(dn) <= 1e-3 * math.sqrt(en), ("%s: |g - ref| = %.3g, |ref| = %.3g"):format(pname, math.sqrt(dn), math.sqrt(en)))
    end
  end)

  T.case(name .. ": KV-cache decode past the window equals the full recompute at every step", function()
    local m = clrt.model.load(fdir)
    local V = m.config.vocab_size
    local d = m:decoder(2, 40)
    local logits = ffi.new("float[?]", 2 * V)
    local seq = { 3, 17, 5, 9 }
    d:prefill(1, ffi.new("int32_t[4]", seq), #seq, logits)
    for step = 1, 12 do   -- positions 4 .. 15: the window (5) slides over the cache
      local rows = {}
      for v = 0, V - 1 do rows[v + 1] = { unpack(seq) }; rows[v + 1][#seq + 1] = v end
      local lp = m:logprobs(rows, { grad = false })
      local slow = {}
      for v = 0, V - 1 do slow[v + 1] = lp:get(v + 1, #seq) end
      T.near(log_softmax(logits + V, V), slow, { atol = 1e-4 }, "decode step " .. step)
      local tok = (step * 37) % V
      seq[#seq + 1] = tok
      d:decode(1, ffi.new("int32_t[1]", { 1 }), ffi.new("int32_t[1]", { tok }), logits)
    end
  end)

  T.case(name .. ": greedy generate equals PyTorch's greedy continuation (20 tokens past a window of 5)", function()
    local m = clrt.model.load(fdir)
    local e = expected(fdir)
    T.ok(e.greedy_gap:get(1) > 1e-3, "the reference's top-2 gaps leave f32 room: " .. e.greedy_gap:get(1))
    local res = m:generate({ e.prompt:totable() }, { temperature = 0, max_new_tokens = e.greedy:numel() })
    T.eq(res[1].tokens, e.greedy:totable())
  end)
end

T.case("config forms: layer_types and transformers 5's rope_parameters give the same model", function()
  local e = expected()
  local base = clrt.model.load(dir):logprobs(e.tokens, { lengths = e.lengths, grad = false })
  local lt = with_config(function(c)
    c.sliding_window_pattern = nil
    c.layer_types = { "sliding_attention", "sliding_attention", "full_attention", "sliding_attention" }
  end)
  T.eq(max_diff(clrt.model.load(lt):logprobs(e.tokens, { lengths = e.lengths, grad = false }), base), 0, "layer_types")
  local rp = with_config(function(c)
    c.rope_parameters = { full_attention = { rope_type = "linear", factor = 2.0, rope_theta = c.rope_theta },
      sliding_attention = { rope_type = "default", rope_theta = c.rope_local_base_freq } }
    c.rope_theta, c.rope_scaling, c.rope_local_base_freq = nil, nil, nil
  end)
  T.eq(max_diff(clrt.model.load(rp):logprobs(e.tokens, { lengths = e.lengths, grad = false }), base), 0, "rope_parameters")
end)

T.case("refused by name: bad soft-caps, a non-periodic layer_types, another activation, device=cuda", function()
  local function refuses(edit, msg)
    local d = with_config(edit)
    T.raises(function() clrt.model.load(d) end, msg)
  end
  refuses(function(c) c.final_logit_softcapping = -1 end, "final_logit_softcapping' must be positive or null")
  refuses(function(c) c.attn_logit_softcapping = 0 end, "attn_logit_softcapping' must be positive or null")
  refuses(function(c)
    c.layer_types = { "full_attention", "sliding_attention", "full_attention", "sliding_attention" }
  end, "layer_types' entry 2 is 'sliding_attention', but clrt runs a periodic layout")
  refuses(function(c) c.hidden_activation = "gelu" end, "hidden_activation' is 'gelu'")
  local m = clrt.model.load(dir)
  T.raises(function() m:to("cuda") end, "Gemma3ForCausalLM runs on the cpu only")
  T.eq(m:device(), "cpu")
end)

T.case("save writes Hugging Face's names and config; load(save(m)) is bit-identical", function()
  local m = clrt.model.load(dir)
  local out = T.tmpdir() .. "/saved"
  m:save(out)
  local info = clrt.safetensors.info(out .. "/model.safetensors")
  for _, n in ipairs({ "model.layers.0.pre_feedforward_layernorm.weight", "model.layers.3.post_feedforward_layernorm.weight",
    "model.layers.2.post_attention_layernorm.weight", "model.layers.1.self_attn.q_norm.weight" }) do
    T.ok(info[n], "saved " .. n)
  end
  T.ok(not info["lm_head.weight"], "tied: no lm_head")
  local cfg = json.decode(clrt.files.read(out .. "/config.json"))
  T.eq(cfg.architectures[1], "Gemma3ForCausalLM")
  T.eq(cfg.sliding_window, 5)
  local m2 = clrt.model.load(out)
  for _, n in ipairs(m.names) do
    T.ok(ffi.string(m:params()[n]:data_ptr(), m:params()[n]:numel() * 4) ==
      ffi.string(m2:params()[n]:data_ptr(), m2:params()[n]:numel() * 4), n .. " differs after save/load")
  end
  -- a new model's norms start at 0 (the (1 + w) identity), saved as Gemma 3
  local c = config()
  local fresh = clrt.model.new(c, { seed = 2 })
  T.eq(fresh:params()["model.layers.1.pre_feedforward_layernorm.weight"]:get(1), 0)
end)

-- LoRA: sum(lp * w) by central differences in a few adapter elements, the embedding's included
-- (its adapter sits inside Gemma's sqrt(hidden) scale, so a merge is exact).
T.case("LoRA: finite differences agree with the adapter gradients; a merge equals base + adapter", function()
  local m = clrt.model.load(dir)
  m:add_lora({ r = 2, alpha = 4, targets = { "q_proj", "o_proj", "down_proj", "embed_tokens" }, seed = 1 })
  local g = tensor.generator(5)
  for _, name in ipairs(m.lora_names) do
    local t = m:lora_params()[name]
    if name:find("lora_B") or name:find("lora_embedding_A") then t:copy_(tensor.randn(t:shape(), { generator = g }) * 0.2) end
  end
  local e = expected()
  local toks = e.tokens
  local w = e.dlogp
  local function objective()
    local a, b, s = flat(m:logprobs(toks, { lengths = e.lengths, grad = false })), flat(w), 0
    for i = 1, #a do s = s + a[i] * b[i] end
    return s
  end
  m:zero_grad()
  m:logprobs(toks, { lengths = e.lengths })
  m:backward(w)
  local grads, checked = m:lora_grads(), 0
  for name, idx in pairs({ ["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"] = { 0, 9 },
    ["base_model.model.model.layers.2.self_attn.o_proj.lora_B.weight"] = { 1, 30 },
    ["base_model.model.model.layers.3.mlp.down_proj.lora_A.weight"] = { 4 },
    ["base_model.model.model.embed_tokens.lora_embedding_B"] = { 0, 21 } }) do
    local p = ffi.cast("float *", m:lora_params()[name]:data_ptr())
    local gp = flat(grads[name])
    for _, i in ipairs(idx) do
      local x0, eps = p[i], 1e-2
      p[i] = x0 + eps
      local up = objective()
      p[i] = x0 - eps
      local dn = objective()
      p[i] = x0
      local fd = (up - dn) / (2 * eps)
      T.ok(math.abs(fd) > 1e-5, name .. ": the objective moves")
      T.ok(math.abs(fd - gp[i + 1]) <= 2e-2 * math.abs(fd) + 2e-4, ("%s[%d]: fd %.6g, backward %.6g"):format(name, i, fd, gp[i + 1]))
      checked = checked + 1
    end
  end
  T.eq(checked, 7)
  local before = m:logprobs(toks, { lengths = e.lengths, grad = false })
  m:merge_adapter()
  T.ok(max_diff(m:logprobs(toks, { lengths = e.lengths, grad = false }), before) < 2e-5, "merged = base + adapter")
end)
T.run()
