-- clrt.model.load(dir, {base_dtype = "bf16", lora = {...} or adapter = DIR}): the frozen base's
-- block linear weights converted to bf16 as the file is read, one f32 tensor at a time, instead
-- of loading the whole model in f32 and converting it (set_base_dtype("bf16")). The result must
-- be the same model bit for bit (log-probs, adapter gradients, the adapters off, the bytes it
-- holds), the load's peak resident memory must fall by about the f32 copy of those weights
-- (measured in child processes), and what needs adapters or the cpu says so.
local T = require("clrt.test")
local ffi = require("ffi")

local bin = os.getenv("CLRT_BIN") or arg[-1]
local src = os.getenv("CLRT_SOURCE_DIR") or "."

-- hidden 128 and intermediate 320: several 48-wide panels and a narrower last one, so a panel
-- written at the wrong offset or from the wrong tensor shows.
local CFG = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 96, hidden_size = 128, intermediate_size = 320,
  num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 64,
  rms_norm_eps = 1e-6, tie_word_embeddings = true }
local LORA = { r = 4, alpha = 8, seed = 3 }

local flat = T.floats

local function same_bits(a, b, what)
  local fa, fb = flat(a), flat(b)
  T.eq(#fa, #fb, what .. ": sizes")
  local bad = 0
  for i = 1, #fa do if fa[i] ~= fb[i] then bad = bad + 1 end end
  T.eq(bad, 0, what .. ": values that differ")
end

local toks = {}
for b = 1, 3 do
  toks[b] = {}
  for t = 1, 24 do toks[b][t] = (b * 37 + t * 11) % CFG.vocab_size end
end
local dlogp = clrt.tensor.full({ 3, 23 }, -1 / 69)

local root = T.tmpdir()
local base = root .. "/base"
clrt.model.new(CFG, { seed = 7 }):save(base)

-- an adapter with B non-zero, so the adapters change the log-probs and A gets gradients too
local adapter = root .. "/adapter"
do
  local m = clrt.model.load(base)
  m:add_lora(LORA)
  local g = clrt.tensor.generator(5)
  for _, name in ipairs(m.lora_names) do
    local t = m:lora_params()[name]
    if name:find("lora_B") then t:copy_((clrt.tensor.rand(t:shape(), { generator = g }) - 0.5) * 0.1) end
  end
  m:save_adapter(adapter)
end

local function run(m)
  local lp = m:logprobs(toks)
  m:zero_grad()
  m:backward(dlogp)
  m:set_adapters(false)
  local bare = m:logprobs(toks, { grad = false })
  m:set_adapters(true)
  return lp, m:lora_grads(), bare
end

local function check_same(direct, converted, what)
  T.eq(direct:base_dtype(), "bf16", what .. ": base dtype")
  local lp1, g1, bare1 = run(direct)
  local lp2, g2, bare2 = run(converted)
  same_bits(lp1, lp2, what .. ": log-probs")
  same_bits(bare1, bare2, what .. ": log-probs with the adapters off")
  for _, name in ipairs(converted.lora_names) do same_bits(g1[name], g2[name], what .. ": gradient " .. name) end
  local m1, m2 = direct:memory(), converted:memory()
  T.eq(m1.params, m2.params, what .. ": params bytes held")
  T.eq(m1.grads, m2.grads, what .. ": grads bytes held")
end

T.case("loaded into bf16 = loaded in f32 then converted, bit for bit (an adapter folder)", function()
  local direct = clrt.model.load(base, { base_dtype = "bf16", adapter = adapter })
  local converted = clrt.model.load(base, { adapter = adapter }):set_base_dtype("bf16")
  check_same(direct, converted, "adapter folder")
end)

T.case("loaded into bf16 = loaded in f32 then converted, bit for bit (new adapters, sharded file)", function()
  -- the same weights in two shards with an index, as large checkpoints come
  local st = require("clrt.safetensors")
  local json = require("clrt.json")
  local files = require("clrt.files")
  local dir = root .. "/sharded"
  files.mkdir_p(dir)
  local m = clrt.model.load(base)
  local parts, map, k = { {}, {} }, {}, 0
  for _, name in ipairs(m.names) do
    k = k + 1
    local shard = k % 2 + 1
    parts[shard][name] = m:params()[name]
    map[name] = ("model-%05d-of-00002.safetensors"):format(shard)
  end
  for i = 1, 2 do st.save(("%s/model-%05d-of-00002.safetensors"):format(dir, i), parts[i], { format = "pt" }) end
  files.write_atomic(dir .. "/model.safetensors.index.json", json.encode({ weight_map = map }))
  files.write_atomic(dir .. "/config.json", files.read(base .. "/config.json"))
  local direct = clrt.model.load(dir, { base_dtype = "bf16", lora = LORA })
  local converted = clrt.model.load(base)
  converted:add_lora(LORA)
  converted:set_base_dtype("bf16")
  check_same(direct, converted, "new adapters")
end)

T.case("the recipes' policy with base_dtype=bf16 loads straight into bf16, as before", function()
  local lora = require("clrt.train.lora")
  local l = { r = 4, alpha = 8, dropout = 0, targets = "q_proj,v_proj,down_proj" }
  local direct = lora.policy(base, nil, l, 3, nil, "bf16")
  local converted = clrt.model.load(base)
  converted:add_lora({ r = 4, alpha = 8, dropout = 0, targets = { "q_proj", "v_proj", "down_proj" }, seed = 3 })
  converted:set_base_dtype("bf16")
  check_same(direct, converted, "lora.policy")
  check_same(lora.policy(base, adapter, l, 3, nil, "bf16"), clrt.model.load(base, { adapter = adapter }):set_base_dtype("bf16"),
    "lora.policy from a checkpoint's adapter")
end)

T.case("base_dtype=bf16 on load needs adapters, the cpu and a known dtype; the base then takes no more files", function()
  T.raises(function() clrt.model.load(base, { base_dtype = "bf16" }) end, "needs adapters")
  T.raises(function() clrt.model.load(base, { base_dtype = "bf16", lora = LORA, device = "cuda" }) end, "cpu only")
  T.raises(function() clrt.model.load(base, { base_dtype = "f16", lora = LORA }) end, "bf16, f32")
  T.raises(function() clrt.model.load(root .. "/nowhere", { base_dtype = "bf16", lora = LORA }) end, "no config.json")
  local m = clrt.model.load(base, { base_dtype = "bf16", lora = LORA })
  T.raises(function() m:save(root .. "/x") end, "base_dtype=bf16")
  T.eq(ffi.C.clrt_model_load_safetensors(m.ptr, base .. "/model.safetensors"), -1, "a second file loaded into a full bf16 base")
  T.ok(ffi.string(ffi.C.clrt_last_error()):find("held in bf16"), "the error says why: " .. ffi.string(ffi.C.clrt_last_error()))
  -- a folder whose file lacks a tensor is refused as in f32
  local files = require("clrt.files")
  local st = require("clrt.safetensors")
  local part = root .. "/partial"
  files.mkdir_p(part)
  files.write_atomic(part .. "/config.json", files.read(base .. "/config.json"))
  local ts = st.load(base .. "/model.safetensors")
  ts["model.layers.1.mlp.down_proj.weight"] = nil
  st.save(part .. "/model.safetensors", ts, { format = "pt" })
  T.raises(function() clrt.model.load(part, { base_dtype = "bf16", lora = LORA }) end, "down_proj.weight' is missing")
end)

-- Peak resident memory of loading a model whose block linear weights are 2 x 32 MiB in f32, in
-- a child process each: f32 then converted holds them whole in f32 (32 MiB of weights more
-- than their bf16 copy, which the conversion writes as it gives the f32 pages back); read
-- straight into bf16 holds one f32 tensor at a time (4 MiB). The other tensors are small.
T.case("the load's peak RSS falls by about the f32 copy of the linear weights", function()
  local big = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 96, hidden_size = 512, intermediate_size = 2048,
    num_hidden_layers = 4, num_attention_heads = 8, num_key_value_heads = 2, max_position_embeddings = 64,
    rms_norm_eps = 1e-6, tie_word_embeddings = true }
  local dir = root .. "/big"
  local m = clrt.model.new(big, { seed = 1 })
  m:save(dir)
  local lin = 0
  for name, t in pairs(m:params()) do if name:find("_proj%.weight$") then lin = lin + t:numel() end end
  m:free()
  local script = root .. "/peak.lua"
  require("clrt.files").write_atomic(script, [[
local dir, how = arg[1], arg[2]
local m
if how == "direct" then m = clrt.model.load(dir, { base_dtype = "bf16", lora = { r = 4 } })
else m = clrt.model.load(dir); m:add_lora({ r = 4 }); m:set_base_dtype("bf16") end
local f = io.open("/proc/self/status"); local s = f:read("*a"); f:close()
print(("peak=%d params=%d"):format(tonumber(s:match("VmHWM:%s+(%d+)")) * 1024, m:memory().params))
]])
  local function peak(how)
    local p = io.popen(("CLRT_SOURCE_DIR='%s' '%s' '%s' '%s' %s 2>&1"):format(src, bin, script, dir, how))
    local out = p:read("*a")
    p:close()
    local pk, held = out:match("peak=(%d+) params=(%d+)")
    T.ok(pk, "child failed: " .. out)
    return tonumber(pk), tonumber(held)
  end
  local p32, h32 = peak("convert")
  local p16, h16 = peak("direct")
  T.eq(h16, h32, "params bytes held")
  local saved, f32_extra = p32 - p16, 2 * lin   -- f32 minus bf16 bytes of the linear weights
  io.stderr:write(("  load peak: f32 then convert %.1f MiB, straight to bf16 %.1f MiB (saved %.1f MiB; the f32 copy's "
    .. "extra over bf16 %.1f MiB)\n"):format(p32 / 2 ^ 20, p16 / 2 ^ 20, saved / 2 ^ 20, f32_extra / 2 ^ 20))
  T.ok(saved >= 0.6 * f32_extra, ("the peak fell by %.1f MiB only, expected about %.1f"):format(saved / 2 ^ 20, f32_extra / 2 ^ 20))
end)

T.run()
