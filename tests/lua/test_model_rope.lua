-- test_model_rope.lua — long-context RoPE (yarn, longrope/su, dynamic NTK) against the
-- independent PyTorch restatement of transformers' modeling_rope_utils
-- (tests/reference/rope_ref.py; fixtures by make_rope_fixtures.py): the inverse frequencies
-- and attention factors of each config (the published ones of tests/fixtures/hf_configs among
-- them) at call lengths below and past original_max_position_embeddings (up to 131072), and tiny models' log-probs and every
-- gradient over a batch within the original context and a row past it (for dynamic, past
-- max_position_embeddings). The tables are what the CUDA kernels read too (hf_checks.py
-- compares a GPU run against transformers itself).
local T = require("clrt.test")
local ffi = require("ffi")
local json = require("clrt.json")
local C = require("clrt.core.ffi").C
local fixtures = T.source_dir() .. "/tests/fixtures/model/"
local flat = T.floats

local function max_diff(a, b)
  local fa, fb, d = flat(a), flat(b), 0
  T.eq(#fa, #fb, "element count")
  for i = 1, #fa do d = math.max(d, math.abs(fa[i] - fb[i])) end
  return d
end

local variants = json.decode(clrt.files.read(fixtures .. "rope_variants.json"))
local names = {}
for name in pairs(variants) do names[#names + 1] = name end
table.sort(names)

-- A config at a size that allocates in a moment: RoPE reads head_dim, the positions and the
-- scaling keys only, so the head stays as published and everything else shrinks.
local function shrunk(cfg)
  local c = {}
  for k, v in pairs(cfg) do c[k] = v end
  c.head_dim = cfg.head_dim or cfg.hidden_size / cfg.num_attention_heads
  c.hidden_size, c.intermediate_size, c.num_hidden_layers = 32, 32, 1
  c.num_attention_heads, c.num_key_value_heads, c.vocab_size = 1, 1, 64
  return c
end

-- f32 both sides. torch's f32 pow (vectorised on the CPU, powf on CUDA: transformers' own
-- bits differ by device) and the C library's may part by an ulp, so each pair is held to an
-- ulp, and the pairs as a whole to bit equality but for a few percent: inverse frequencies
-- made in double (one rounding where transformers has two) match far fewer. Dynamic NTK past
-- max_position_embeddings raises a grown f32 base to a power first: a few ulps there.
T.case("inverse frequencies and attention factors equal transformers' formulas at every call length", function()
  local exact, total = 0, 0
  for _, name in ipairs(names) do
    local v = variants[name]
    local m = clrt.model.new(shrunk(v.config), { seed = 1 })
    local half = m._c.rope_dim / 2
    local inv, af = ffi.new("float[?]", half), ffi.new("double[1]")
    for _, call in ipairs(v.calls) do
      T.eq(C.clrt_model_rope_inv_freq(m.ptr, call.seq_len, inv, af), 0)
      local rs = type(v.config.rope_scaling) == "table" and v.config.rope_scaling or {}
      local dyn = rs.rope_type == "dynamic" and call.seq_len > v.config.max_position_embeddings
      local rtol = dyn and 1e-6 or 1.2e-7
      for i = 1, half do
        local want, got = ffi.new("float[1]", tonumber(call.inv_freq[i]))[0], inv[i - 1]
        T.ok(math.abs(got - want) <= rtol * math.abs(want),
          ("%s, seq_len %d, pair %d: inv_freq %.9g, transformers %.9g"):format(name, call.seq_len, i - 1, got, want))
        if not dyn then
          total = total + 1
          if got == want then exact = exact + 1 end
        end
      end
      T.ok(math.abs(af[0] - call.attention_factor) <= 1e-7 * call.attention_factor,
        ("%s, seq_len %d: attention factor %.9g, transformers %.9g"):format(name, call.seq_len, af[0], call.attention_factor))
    end
  end
  print(("  %d of %d inverse frequencies bit-equal to PyTorch's"):format(exact, total))
  T.ok(exact >= 0.97 * total, ("%d of %d bit-equal"):format(exact, total))
end)

T.case("the variants differ from plain RoPE where transformers' do (the check above can fail)", function()
  local v = variants.rope_longrope
  local short, long = v.calls[2], v.calls[#v.calls]
  T.ok(short.inv_freq[3] ~= long.inv_freq[3], "longrope: the long factors past original_max_position_embeddings")
  T.ok(v.calls[1].attention_factor > 1.1, "longrope's attention factor sqrt(1 + ln 4 / ln 32)")
  local d = variants.dynamic_128
  T.eq(d.calls[2].inv_freq, d.calls[1].inv_freq, "dynamic: unchanged within max_position_embeddings")
  T.ok(d.calls[#d.calls].inv_freq[2] ~= d.calls[1].inv_freq[2], "dynamic: the base grows past it")
end)

for _, name in ipairs({ "rope_yarn", "rope_longrope", "rope_dynamic", "rope_partial" }) do
  local dir = fixtures .. name
  T.case(name .. ": log-probs and every gradient against PyTorch, within the original context and past it", function()
    local m = clrt.model.load(dir)
    local e = clrt.safetensors.load(dir .. "/expected.safetensors")
    for _, tag in ipairs({ "short", "long" }) do
      local tokens = e[tag .. "_tokens"]
      local d = max_diff(m:logprobs(tokens), e[tag .. "_lp"])
      T.ok(d <= 1e-4, ("%s %s: max |lp - ref| = %.3g"):format(name, tag, d))
      m:zero_grad()
      m:logprobs(tokens)
      m:backward(e[tag .. "_dlogp"])
      local g = m:grads()
      for _, pname in ipairs(m.names) do
        local fa, fe = flat(g[pname]), flat(e[tag .. "_grad." .. pname])
        local dn, en = 0, 0
        for i = 1, #fe do dn, en = dn + (fa[i] - fe[i]) ^ 2, en + fe[i] ^ 2 end
        T.ok(math.sqrt(dn) <= 1e-3 * math.sqrt(en) + 1e-9,
          ("%s %s %s: |g - ref| = %.3g, |ref| = %.3g"):format(name, tag, pname, math.sqrt(dn), math.sqrt(en)))
      end
    end
  end)
end

T.case("longrope: the pad token's embedding row gets no gradient (nn.Embedding padding_idx)", function()
  local dir = fixtures .. "rope_longrope"
  local m = clrt.model.load(dir)
  local e = clrt.safetensors.load(dir .. "/expected.safetensors")
  m:zero_grad()
  m:logprobs(e.short_tokens)
  m:backward(e.short_dlogp)
  local row0 = flat(m:grads()["model.embed_tokens.weight"])
  local C_ = m._c.hidden_size
  local nz0, nz1 = 0, 0
  for i = 1, C_ do
    nz0 = nz0 + math.abs(row0[i])
    nz1 = nz1 + math.abs(row0[C_ + i])
  end
  local used1 = false
  for b = 1, 2 do
    for t = 1, e.short_tokens:size(2) do used1 = used1 or e.short_tokens:get(b, t) == 1 end
  end
  T.eq(e.short_tokens:get(1, 4), 0, "the pad id is looked up")
  T.eq(nz0, 0, "row 0 (pad_token_id, looked up at [1, 4])")
  T.ok(used1 and nz1 > 0, "another looked-up row (id 1) has a gradient")
end)

T.case("LoRA on embed_tokens: the pad column of lora_embedding_A gets no gradient (PEFT's padding_idx)", function()
  local dir = fixtures .. "rope_longrope"
  local m = clrt.model.load(dir)
  m:add_lora({ r = 4, alpha = 8, targets = { "embed_tokens" }, seed = 3 })
  -- B starts at zero (PEFT), so A's gradient would be zero anyway: give B values first
  for name, t in pairs(m:lora_params()) do
    if name:find("lora_embedding_B", 1, true) then
      for i = 1, t:size(1) do for j = 1, t:size(2) do t:set(i, j, 0.01 * ((i * 7 + j * 3) % 11 - 5)) end end
    end
  end
  m:params_changed()
  local e = clrt.safetensors.load(dir .. "/expected.safetensors")
  m:zero_grad()
  m:logprobs(e.short_tokens)
  m:backward(e.short_dlogp)
  local gA
  for name, t in pairs(m:lora_grads()) do if name:find("lora_embedding_A", 1, true) then gA = t end end
  local col0, col1 = 0, 0
  for i = 1, gA:size(1) do
    col0 = col0 + math.abs(gA:get(i, 1))
    col1 = col1 + math.abs(gA:get(i, 2))
  end
  T.eq(col0, 0, "column 0 (pad_token_id 0, looked up)")
  T.ok(col1 > 0, "column 1 (looked up) has a gradient")
end)

T.case("a decode past the switch length: a prefill of the whole row equals logprobs over it", function()
  -- transformers picks a call's frequencies by its own length; a one-call prefill is one call
  -- (dynamic's switch lies past max_position_embeddings, beyond which generate refuses to go)
  for _, name in ipairs({ "rope_longrope", "rope_partial" }) do
    local m = clrt.model.load(fixtures .. name)
    local e = clrt.safetensors.load(fixtures .. name .. "/expected.safetensors")
    local n = e.long_tokens:size(2)
    local prompt = {}
    for i = 1, n - 1 do prompt[i] = e.long_tokens:get(1, i) end
    local r = m:generate({ prompt }, { max_new_tokens = 1, temperature = 0, top_logprobs = 1 })
    -- the model's log-probability of the last token after the prompt, from logprobs' row
    local lp = flat(e.long_lp)
    local full = flat(m:logprobs({ prompt }))
    T.ok(math.abs(full[#full] - lp[#prompt - 1]) <= 1e-4, name .. ": logprobs over the prompt")
    -- the greedy token is the argmax of the cached forward's logits, so equal to the row's next
    -- token's chance only through the same tables: compare its log-probability with logprobs
    local ext = {}
    for i = 1, #prompt do ext[i] = prompt[i] end
    ext[#ext + 1] = r[1].tokens[1]
    local lfull = flat(m:logprobs({ ext }))
    T.ok(math.abs(r[1].model_logprobs[1].lp - lfull[#lfull]) <= 1e-4,
      ("%s: the decode's lp %.6g against logprobs' %.6g"):format(name, r[1].model_logprobs[1].lp, lfull[#lfull]))
  end
end)

T.run()
