-- test_model.lua — the transformer against the PyTorch reference fixtures
-- (tests/reference/make_model_fixtures.py): log-probs, every gradient, 10 AdamW steps, padding,
-- on-disk dtypes, sharding, save/load round trips and bad checkpoints.
local T = require("clrt.test")
local ffi = require("ffi")
local tensor = clrt.tensor
local fixtures = T.source_dir() .. "/tests/fixtures/model"
local CONFIGS = { "llama_gqa", "qwen2_tied", "qwen3_qknorm", "odd", "mistral_window", "phi3_fused" }

local function expected(name)
  return clrt.safetensors.load(fixtures .. "/" .. name .. "/expected.safetensors", { "adamw" })
end

local flat = T.floats

local function near_tensor(a, e, atol, what)
  local fa, fe = flat(a), flat(e)
  T.eq(#fa, #fe, what .. ": element count")
  for i = 1, #fe do
    if math.abs(fa[i] - fe[i]) > atol or fa[i] ~= fa[i] then
      T.ok(false, ("%s: element %d: expected %.7g, got %.7g (atol %g)"):format(what, i, fe[i], fa[i], atol))
    end
  end
end

-- Gradients: within rtol of the reference by norm, and elementwise against the tensor's scale.
local function grad_close(a, e, rtol, what)
  local fa, fe = flat(a), flat(e)
  local dn, en, scale = 0, 0, 0
  for i = 1, #fe do
    dn = dn + (fa[i] - fe[i]) ^ 2
    en = en + fe[i] ^ 2
    scale = math.max(scale, math.abs(fe[i]))
  end
  dn, en = math.sqrt(dn), math.sqrt(en)
  T.ok(en > 0, what .. ": reference gradient is all zero (the test could not fail)")
  T.ok(dn <= rtol * en, ("%s: |g - ref| = %.3g > %g * |ref| = %.3g"):format(what, dn, rtol, rtol * en))
  for i = 1, #fe do
    if math.abs(fa[i] - fe[i]) > rtol * scale then
      T.ok(false, ("%s[%d]: expected %.7g, got %.7g (scale %.3g)"):format(what, i, fe[i], fa[i], scale))
    end
  end
end

for _, name in ipairs(CONFIGS) do
  T.case(name .. ": log-probs match PyTorch within 1e-4", function()
    local m = clrt.model.load(fixtures .. "/" .. name)
    local e = expected(name)
    local lp = m:logprobs(e.tokens, { lengths = e.lengths })
    near_tensor(lp, e.lp, 1e-4, name .. " lp")
  end)

  T.case(name .. ": padded rows equal unpadded ones", function()
    local m = clrt.model.load(fixtures .. "/" .. name)
    local e = expected(name)
    local lp = m:logprobs(e.tokens, { lengths = e.lengths, grad = false })
    local toks, lens = e.tokens:totable(), e.lengths:totable()
    for b = 1, #toks do
      local row = {}
      for t = 1, lens[b] do row[t] = toks[b][t] end
      local one = m:logprobs({ row }, { grad = false })
      for t = 1, lens[b] - 1 do
        T.near(one:get(1, t), lp:get(b, t), { atol = 2e-5 }, ("row %d pos %d"):format(b, t))
      end
      for t = lens[b], #toks[b] - 1 do T.eq(lp:get(b, t), 0, "padded position is 0") end
    end
  end)

  T.case(name .. ": every gradient matches PyTorch within 1e-3 (logits kept, and recomputed)", function()
   for _, keep_mb in ipairs({ 256, 0 }) do
    local m = clrt.model.load(fixtures .. "/" .. name, { keep_logits_mb = keep_mb })
    local e = expected(name)
    m:zero_grad()
    m:logprobs(e.tokens, { lengths = e.lengths })
    m:backward(e.dlogp)
    local g, n = m:grads(), 0
    for _, pname in ipairs(m.names) do
      local ref = e["grad." .. pname]
      T.ok(ref, "reference has grad." .. pname)
      grad_close(g[pname], ref, 1e-3, pname)
      n = n + 1
    end
    local nref = 0
    for k in pairs(e) do if k:sub(1, 5) == "grad." then nref = nref + 1 end end
    T.eq(n, nref, "one gradient per reference parameter")
   end
  end)

  T.case(name .. ": 10 AdamW steps follow PyTorch's losses within 1e-4", function()
    local m = clrt.model.load(fixtures .. "/" .. name)
    local e, meta = expected(name)
    local hp = require("cjson").decode(meta.adamw)
    local opt = clrt.optim.adamw(m, { lr = hp.lr, betas = hp.betas, eps = hp.eps,
      weight_decay = hp.weight_decay, grad_clip = hp.grad_clip })
    local toks, lens = e.tokens, e.lengths:totable()
    local B, Tn = e.tokens:size(1), e.tokens:size(2)
    local count = 0
    for b = 1, B do count = count + lens[b] - 1 end
    local d = tensor.zeros({ B, Tn - 1 })
    for b = 1, B do for t = 1, lens[b] - 1 do d:set(b, t, -1 / count) end end
    local losses, norms = e.losses:totable(), e.grad_norms:totable()
    for step = 1, 10 do
      m:zero_grad()
      local lp = m:logprobs(toks, { lengths = e.lengths })
      local s = 0
      for b = 1, B do for t = 1, lens[b] - 1 do s = s + lp:get(b, t) end end
      T.near(-s / count, losses[step], { atol = 1e-4 }, "loss at step " .. step)
      m:backward(d)
      local norm = opt:step()
      T.near(norm, norms[step], { atol = 1e-4, rtol = 1e-3 }, "grad norm at step " .. step)
    end
  end)
end

T.case("BF16 and F16 checkpoints load (as f32) and match the rounded weights' log-probs", function()
  for _, dt in ipairs({ "bf16", "f16" }) do
    local dir = fixtures .. "/odd_" .. dt
    local info = clrt.safetensors.info(dir .. "/model.safetensors")
    T.eq(info["model.norm.weight"].dtype, dt:upper())
    local m = clrt.model.load(dir)
    local e = clrt.safetensors.load(dir .. "/expected.safetensors")
    near_tensor(m:logprobs(e.tokens, { lengths = e.lengths, grad = false }), e.lp, 1e-4, dt)
    -- the f32 fixture differs from the rounded one by more than the tolerance somewhere
    local e32 = expected("odd")
    local maxd = 0
    local a, b = flat(e.lp), flat(e32.lp)
    for i = 1, #a do maxd = math.max(maxd, math.abs(a[i] - b[i])) end
    T.ok(maxd > 1e-4, dt .. " rounding changes the log-probs: " .. maxd)
  end
end)

T.case("sharded checkpoint: index.json names the shards", function()
  local dir = fixtures .. "/qwen3_qknorm"
  T.ok(io.open(dir .. "/model.safetensors.index.json"), "fixture is sharded")
  T.ok(not io.open(dir .. "/model.safetensors"), "no single file beside it")
  local m = clrt.model.load(dir)
  T.ok(m:params()["model.layers.1.self_attn.k_norm.weight"], "qk-norm weights loaded")
end)

local function bytes_of(t)
  return ffi.string(t:data_ptr(), t:numel() * 4)
end

T.case("load(save(m)) is bit-identical, for loaded and new models", function()
  for _, src in ipairs({ "qwen2_tied", "odd" }) do
    local m = clrt.model.load(fixtures .. "/" .. src)
    local dir = T.tmpdir() .. "/saved"
    m:save(dir)
    local m2 = clrt.model.load(dir)
    T.eq(#m2.names, #m.names)
    for _, n in ipairs(m.names) do
      T.ok(bytes_of(m:params()[n]) == bytes_of(m2:params()[n]), src .. ": " .. n .. " differs after save/load")
    end
    T.eq(m2.config.hidden_size, m.config.hidden_size)
  end
  local cfg = { vocab_size = 64, hidden_size = 24, intermediate_size = 40, num_hidden_layers = 2,
    num_attention_heads = 2, max_position_embeddings = 32, rms_norm_eps = 1e-6 }
  local m = clrt.model.new(cfg, { seed = 3 })
  local dir = T.tmpdir() .. "/new"
  m:save(dir)
  local m2 = clrt.model.load(dir)
  local toks = { { 1, 5, 9, 2, 63 }, { 7, 7, 7 } }
  local a, b = m:logprobs(toks, { grad = false }), m2:logprobs(toks, { grad = false })
  T.ok(bytes_of(a) == bytes_of(b), "logprobs bit-identical after round trip")
  T.eq(m2.config.architectures[1], "LlamaForCausalLM")
end)

T.case("new: parameter count, names, views share the arena", function()
  local cfg = { vocab_size = 100, hidden_size = 16, intermediate_size = 24, num_hidden_layers = 3,
    num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 32, rms_norm_eps = 1e-5 }
  local m = clrt.model.new(cfg, { seed = 1 })
  local C, I, V, L, KVD = 16, 24, 100, 3, 8
  local per = C + C * C + 2 * KVD * C + C * C + C + 3 * C * I
  T.eq(m:num_params(), 2 * V * C + L * per + C)
  T.ok(m:params()["lm_head.weight"], "untied: lm_head present")
  local p = m:params()["model.norm.weight"]
  T.eq(p:get(1), 1)
  local before = m:logprobs({ { 1, 2, 3 } }, { grad = false }):get(1, 2)
  m:params()["model.norm.weight"]:fill_(2)
  local after = m:logprobs({ { 1, 2, 3 } }, { grad = false }):get(1, 2)
  T.ok(before ~= after, "writing through a params view changes the model")
  local mem = m:memory()
  T.eq(mem.params >= m:num_params() * 4, true)
  local m2 = clrt.model.new(cfg, { seed = 1 })
  T.ok(bytes_of(m2:params()["model.layers.2.mlp.down_proj.weight"]) ==
       bytes_of(clrt.model.new(cfg, { seed = 1 }):params()["model.layers.2.mlp.down_proj.weight"]), "seeded init repeats")
  cfg.tie_word_embeddings = true
  T.ok(not clrt.model.new(cfg):params()["lm_head.weight"], "tied: no lm_head")
end)

T.case("the activation arena grows past max_batch x max_seq and shrinking shapes reuse it", function()
  local e = expected("llama_gqa")
  local m = clrt.model.load(fixtures .. "/llama_gqa", { max_batch = 1, max_seq = 4 })
  local lp1 = m:logprobs({ { 5, 6, 7 } })
  local small = m:memory().activations
  local lp = m:logprobs(e.tokens, { lengths = e.lengths })
  T.ok(m:memory().activations > small, "arena grew")
  near_tensor(lp, e.lp, 1e-4, "after growth")
  m:backward(e.dlogp)
  local again = m:logprobs({ { 5, 6, 7 } }, { grad = false })
  T.near(again:get(1, 2), lp1:get(1, 2), { atol = 1e-6 })
end)

T.case("changing the thread count between forward and backward is safe and exact", function()
  local e = expected("llama_gqa")
  local m = clrt.model.load(fixtures .. "/llama_gqa")
  local before = clrt.num_threads()
  clrt.set_num_threads(1)
  m:zero_grad()
  m:logprobs(e.tokens, { lengths = e.lengths })
  clrt.set_num_threads(4)
  m:backward(e.dlogp)
  clrt.set_num_threads(before)
  grad_close(m:grads()["model.layers.0.self_attn.k_proj.weight"], e["grad.model.layers.0.self_attn.k_proj.weight"], 1e-3, "k_proj")
end)

T.case("free releases the arenas; views stay valid", function()
  local m = clrt.model.load(fixtures .. "/odd")
  local w = m:params()["model.norm.weight"]
  local v = w:get(3)
  local opt = clrt.optim.adamw(m)
  opt:free()
  m:free()
  T.eq(w:get(3), v)
  m:free()   -- twice is harmless
  T.raises(function() m:logprobs({ { 1, 2 } }) end, "used after free()")
  T.raises(function() opt:step() end, "after free()")
end)

T.case("i32 tensor tokens and ragged Lua rows give the same log-probs", function()
  local m = clrt.model.load(fixtures .. "/odd")
  local e = expected("odd")
  local rows, lens = e.tokens:totable(), e.lengths:totable()
  local ragged = {}
  for b = 1, #rows do
    ragged[b] = {}
    for t = 1, lens[b] do ragged[b][t] = rows[b][t] end
  end
  local a = m:logprobs(ragged, { grad = false })
  local b = m:logprobs(e.tokens, { lengths = e.lengths, grad = false })
  T.ok(bytes_of(a) == bytes_of(b), "same bits")
end)

T.case("training through the AVX-512 kernels (packed or packing on the fly, strided backward, blocked output layer) equals the sgemm path", function()
  -- V = 40,000 with no kept logits: the output layer runs in blocks of 200 rows x ~20,800
  -- vocabulary entries (two blocks, the target in either). QKV bias, GQA, tied head. A model
  -- over CLRT_TRAIN_PACK_MAX_MB packs w on the fly, unless a decode made the packed copy (an
  -- RL policy); a small one gets the copy in logprobs. With the copy the logits read it too,
  -- and a second step after new q weights through a view must see it remade.
  -- (A CPU without AVX-512 runs sgemm on both sides: equal, trivially.)
  local cfg = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 40000, hidden_size = 64,
    intermediate_size = 136, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2,
    max_position_embeddings = 64, rms_norm_eps = 1e-6, tie_word_embeddings = true }
  local rows = {}
  math.randomseed(7)
  for b = 1, 4 do
    rows[b] = {}
    for t = 1, 40 + 4 * b do rows[b][t] = math.random(0, 39999) end
  end
  pcall(ffi.cdef, "int setenv(const char *, const char *, int); int unsetenv(const char *);")
  local function run(pack, decode)
    ffi.C.setenv("CLRT_TRAIN_PACK_MAX_MB", decode == "small" and "256" or "0", 1)
    local m = clrt.model.new(cfg, { seed = 3, keep_logits_mb = 0 })
    if not pack then m:set_decode_pack(false) end
    if decode == true then m:generate({ { 1, 2, 3 } }, { temperature = 0, max_new_tokens = 2 }) end
    local lp = m:logprobs(rows)
    m:backward(tensor.full(lp:shape(), -0.01))
    local out = { lp = lp:clone(), grads = {} }
    for name, g in pairs(m:grads()) do out.grads[name] = g:clone() end
    -- new weights through a view (the packed copy must follow), then a second step
    for name, w in pairs(m:params()) do
      if name:find("q_proj.weight", 1, true) then w:copy_(tensor.randn(w:shape(), { seed = 5 })) end
    end
    m:zero_grad()
    out.lp2 = m:logprobs(rows)
    m:backward(tensor.full(out.lp2:shape(), -0.01))
    return m, out
  end
  local ms, s = run(false)
  for _, decode in ipairs({ false, true, "small" }) do
    local mk, k = run(true, decode)
    local how = decode == true and " (decode's packed copy)" or decode and " (small model's packed copy)"
      or " (packed on the fly)"
    near_tensor(k.lp, s.lp, 1e-4, "log-probs" .. how)
    near_tensor(k.lp2, s.lp2, 1e-4, "log-probs after new q weights" .. how)
    T.ok(math.abs(flat(k.lp2)[3] - flat(k.lp)[3]) > 1e-3, "the new q weights changed the log-probs")
    for _, name in ipairs(ms.names) do grad_close(k.grads[name], s.grads[name], 1e-4, name .. how) end
    local gk, gs = mk:grads(), ms:grads()
    for _, name in ipairs(ms.names) do grad_close(gk[name], gs[name], 1e-4, name .. " (second step)" .. how) end
  end
  ffi.C.unsetenv("CLRT_TRAIN_PACK_MAX_MB")
end)

T.case("optimizer state round-trips through safetensors: resumed training is bit-identical", function()
  local dir = T.tmpdir()
  local cfg = { vocab_size = 50, hidden_size = 16, intermediate_size = 32, num_hidden_layers = 1,
    num_attention_heads = 2, max_position_embeddings = 32, rms_norm_eps = 1e-5 }
  local toks = { { 1, 2, 3, 4, 5, 6 }, { 9, 8, 7, 6 } }
  local d = tensor.full({ 2, 5 }, -0.1)
  local function train(m, opt, n)
    for _ = 1, n do
      m:zero_grad()
      m:logprobs(toks)
      m:backward(d)
      opt:step{ lr = 1e-2 }
    end
  end
  local a = clrt.model.new(cfg, { seed = 5 })
  local oa = clrt.optim.adamw(a, { grad_clip = 1 })
  train(a, oa, 3)
  a:save(dir .. "/ckpt")
  oa:save(dir .. "/ckpt/optimizer.safetensors")
  train(a, oa, 2)
  local b = clrt.model.load(dir .. "/ckpt")
  local ob = clrt.optim.adamw(b, { grad_clip = 1 })
  ob:load(dir .. "/ckpt/optimizer.safetensors")
  T.eq(ob:get_step(), 3)
  train(b, ob, 2)
  for _, n in ipairs(a.names) do
    T.ok(bytes_of(a:params()[n]) == bytes_of(b:params()[n]), n .. " differs after resume")
  end
  local sd = ob:state_dict()
  T.eq(sd.step, 5)
  T.ok(sd.exp_avg_sq["model.norm.weight"]:get(1) > 0, "second moment is populated")
end)

T.case("weight decay skips norms and biases by default", function()
  local cfg = { vocab_size = 20, hidden_size = 8, intermediate_size = 16, num_hidden_layers = 1,
    num_attention_heads = 2, max_position_embeddings = 16, rms_norm_eps = 1e-5, attention_bias = true }
  local m = clrt.model.new(cfg, { seed = 2 })
  m:zero_grad()   -- zero gradients: only weight decay moves parameters
  local opt = clrt.optim.adamw(m, { lr = 0.1, weight_decay = 0.5 })
  local w0 = m:params()["model.layers.0.mlp.up_proj.weight"]:get(1, 1)
  opt:step()
  T.near(m:params()["model.layers.0.mlp.up_proj.weight"]:get(1, 1), w0 * (1 - 0.05), { atol = 1e-7 })
  T.eq(m:params()["model.norm.weight"]:get(1), 1)
  T.eq(m:params()["model.layers.0.self_attn.o_proj.bias"]:get(1), 0)
end)

-- ---- bad input -------------------------------------------------------------------------------

local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

local function le64(n)
  local b = {}
  for i = 1, 8 do b[i] = string.char(n % 256); n = math.floor(n / 256) end
  return table.concat(b)
end

local function st_file(header, data)
  return le64(#header) .. header .. (data or "")
end

local odd_cfg = T.read(fixtures .. "/odd/config.json")

-- A model folder with odd's config.json and the given model.safetensors bytes.
local function bad_dir(st_bytes, cfg_text)
  local dir = T.tmpdir()
  write(dir .. "/config.json", cfg_text or odd_cfg)
  if st_bytes then write(dir .. "/model.safetensors", st_bytes) end
  return dir
end

T.case("bad checkpoints: clear errors naming the file and tensor", function()
  local good = T.read(fixtures .. "/odd/model.safetensors")
  local dir = bad_dir(good:sub(1, math.floor(#good / 2)))
  local err = T.raises(function() clrt.model.load(dir) end, "out of range")
  T.ok(err:find(dir .. "/model.safetensors", 1, true), "names the file: " .. err)
  T.ok(err:find("tensor '", 1, true), "names a tensor: " .. err)
  T.raises(function() clrt.model.load(bad_dir(good:sub(1, 5))) end, "too short")
  T.raises(function() clrt.model.load(bad_dir(le64(1e9) .. "{}")) end, "header length 1000000000 runs past the end")
  T.raises(function() clrt.model.load(bad_dir(st_file('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' ..
    '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', ("\0"):rep(12)))) end, "tensors 'a' and 'b' overlap")
  T.raises(function() clrt.model.load(bad_dir(st_file('{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', ("\0"):rep(8)))) end,
    "tensor 'a': data_offsets [0, 16] out of range")
  T.raises(function() clrt.model.load(bad_dir(st_file('{"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}}', "\0\0"))) end,
    "tensor 'w': unknown dtype 'Q4_K'")
  T.raises(function() clrt.model.load(bad_dir(st_file('{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', ("\0"):rep(8)))) end,
    "tensor 'w': data_offsets span 8 bytes but shape and dtype F32 need 12")
  T.raises(function() clrt.model.load(bad_dir(st_file('{"w":', ""))) end, "header is not valid JSON")
  -- a missing tensor
  local src = clrt.safetensors.load(fixtures .. "/odd/model.safetensors")
  src["model.layers.1.mlp.up_proj.weight"] = nil
  local d2 = bad_dir(nil)
  clrt.safetensors.save(d2 .. "/model.safetensors", src)
  T.raises(function() clrt.model.load(d2) end, "tensor 'model.layers.1.mlp.up_proj.weight' is missing")
  -- a shape that disagrees with config.json
  local cfg = odd_cfg:gsub('"intermediate_size": 50', '"intermediate_size": 52')
  T.ok(cfg ~= odd_cfg, "config edited")
  local d3 = bad_dir(good, cfg)
  T.raises(function() clrt.model.load(d3) end, "tensor 'model.layers.0.mlp.down_proj.weight' has shape [36, 50] but config.json implies [36, 52]")
  -- a tensor the architecture does not have
  src = clrt.safetensors.load(fixtures .. "/odd/model.safetensors")
  src["model.layers.0.self_attn.q_norm.weight"] = tensor.ones({ 12 })
  local d4 = bad_dir(nil)
  clrt.safetensors.save(d4 .. "/model.safetensors", src)
  T.raises(function() clrt.model.load(d4) end, "unexpected tensor 'model.layers.0.self_attn.q_norm.weight'")
  T.raises(function() clrt.model.load(T.tmpdir()) end, "no config.json")
  T.raises(function() clrt.model.load(bad_dir(nil)) end, "neither model.safetensors nor")
end)

T.case("bad config.json: missing or wrong-typed keys, unknown rope_scaling", function()
  local function try(edit, needle)
    local cfg = require("cjson").decode(odd_cfg)
    edit(cfg)
    local dir = bad_dir(T.read(fixtures .. "/odd/model.safetensors"), require("cjson").encode(cfg))
    local err = T.raises(function() clrt.model.load(dir) end, needle)
    T.ok(err:find(dir .. "/config.json", 1, true), "names config.json: " .. err)
  end
  try(function(c) c.hidden_size = nil end, "key 'hidden_size' is missing")
  try(function(c) c.num_hidden_layers = "2" end, "key 'num_hidden_layers' must be an integer, got string")
  try(function(c) c.rms_norm_eps = true end, "key 'rms_norm_eps' must be a number, got boolean")
  try(function(c) c.tie_word_embeddings = 1 end, "key 'tie_word_embeddings' must be true or false")
  try(function(c) c.rope_scaling = { rope_type = "mrope", factor = 4 } end, "rope_scaling' has type 'mrope', which clrt does not support")
  try(function(c) c.rope_scaling = { rope_type = "llama3", factor = 4 } end, "key 'rope_scaling.low_freq_factor' is missing")
  try(function(c) c.architectures = { "GPT2LMHeadModel" } end, "GPT2LMHeadModel")
  try(function(c) c.num_key_value_heads = 2 end, "must divide num_attention_heads")
  try(function(c) c.use_sliding_window = true end, "key 'use_sliding_window' is true")
  try(function(c) c.head_dim = 7 end, "key 'head_dim' must be even")
end)

T.case("bad calls: tokens out of range, backward without forward, wrong dlogp shape", function()
  local m = clrt.model.load(fixtures .. "/odd")
  T.raises(function() m:logprobs({ { 1, 2, 101 } }) end, "token 101 at row 1, position 3 is outside the vocabulary [0, 101)")
  T.raises(function() m:logprobs({ { 1, 2, 3 } }, { lengths = { 4 } }) end, "length 4 of row 1 exceeds its 3 tokens")
  T.raises(function() m:logprobs(tensor.zeros({ 1, 3 }, { dtype = "i32" }), { lengths = { 4 } }) end, "length 4 of row 1 is outside [1, 3]")
  T.raises(function() m:logprobs({ { 1, 2, 3 }, { 4 } }, { lengths = { 3, 2 } }) end, "length 2 of row 2 exceeds its 1 tokens")
  T.raises(function() m:backward(tensor.zeros({ 1, 2 })) end, "no forward was kept")
  m:logprobs({ { 1, 2, 3 } }, { grad = false })
  T.raises(function() m:backward(tensor.zeros({ 1, 2 })) end, "no forward was kept")
  m:logprobs({ { 1, 2, 3 } })
  T.raises(function() m:backward(tensor.zeros({ 2, 2 })) end, "dlogp has shape [2, 2]")
end)

T.run()
