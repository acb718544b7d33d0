-- bench/gguf.lua streams the safetensors file: a model whose embedding alone is ~49 MB
-- converts with the process's peak memory growing by far less than that (the old path read
-- the whole file into one string and copied every tensor out of it: > 2x the file), and the
-- GGUF it writes is parsed back here: every tensor info names its shape and an aligned
-- offset, and the tensor bytes equal the safetensors' bytes (the old path's data, which read
-- them out of the whole file in memory).
local T = require("clrt.test")
local ffi = require("ffi")
local cjson = require("cjson")
package.path = T.source_dir() .. "/tests/?.lua;" .. T.source_dir() .. "/bench/?.lua;" .. package.path

local dir = require("support.tiny_model")(T.tmpdir(), { seed = 4 })
local V, H = 24000, 512
do   -- a larger model over the same tokenizer: the GGUF vocabulary is padded to V
  local m = clrt.model.new({ architectures = { "Qwen2ForCausalLM" }, vocab_size = V, hidden_size = H,
    intermediate_size = 64, num_hidden_layers = 1, num_attention_heads = 4, num_key_value_heads = 2,
    max_position_embeddings = 128, rms_norm_eps = 1e-6, rope_theta = 10000, tie_word_embeddings = true }, { seed = 5 })
  m:save(dir)
  m:free()
end
collectgarbage()

local function file_size(path)
  local f = assert(io.open(path, "rb"))
  local n = f:seek("end")
  f:close()
  return n
end

T.case("a ~49 MB tensor converts in bounded memory", function()
  local out = T.tmpdir() .. "/model.gguf"
  local script = T.tmpdir() .. "/convert.lua"
  local f = assert(io.open(script, "w"))
  f:write(([[
package.path = %q .. "/bench/?.lua;" .. package.path
local function hwm() return tonumber(io.open("/proc/self/status"):read("*a"):match("VmHWM:%%s*(%%d+)")) end
local gguf = require("gguf")
collectgarbage()
local before = hwm()
gguf.write(%q, %q)
print(("peak growth %%d kB"):format(hwm() - before))
]]):format(T.source_dir(), dir, out))
  f:close()
  local bin = os.getenv("CLRT_BIN") or arg[-1]
  local p = io.popen(bin .. " " .. script .. " 2>&1")
  local text = p:read("*a")
  p:close()
  local grew = tonumber(text:match("peak growth (%d+) kB"))
  T.ok(grew, "the conversion ran: " .. text)
  local st = file_size(dir .. "/model.safetensors")
  print(("safetensors %.1f MB, peak memory growth while converting %.1f MB"):format(st / 1e6, grew / 1024))
  -- one 8 MiB piece at a time, plus the vocabulary's strings; the embedding alone is 49 MB
  T.ok(grew * 1024 < 32e6, ("peak memory grew by %d kB"):format(grew))
  T.ok(file_size(out) > st * 0.99, "the GGUF holds the weights")
  os.remove(out)
end)

-- A GGUF reader from the spec (v3): header, key/values skipped by type, tensor infos.
local function parse_gguf(s)
  local pos = 1
  local function take(ctype)
    local v = ffi.cast(ctype .. "*", ffi.cast("const char*", s) + pos - 1)[0]
    pos = pos + ffi.sizeof(ctype)
    return v
  end
  local function str()
    local n = tonumber(take("uint64_t"))
    local v = s:sub(pos, pos + n - 1)
    pos = pos + n
    return v
  end
  local sizes = { [0] = 1, 1, 2, 2, 4, 4, 4, 1, nil, nil, 8, 8, 8 }
  local function skip(ty)
    if ty == 8 then str()
    elseif ty == 9 then
      local et, n = take("uint32_t"), tonumber(take("uint64_t"))
      for _ = 1, n do skip(et) end
    else pos = pos + sizes[ty] end
  end
  assert(s:sub(1, 4) == "GGUF", "magic")
  pos = 5
  assert(take("uint32_t") == 3, "version")
  local nt, nkv = tonumber(take("uint64_t")), tonumber(take("uint64_t"))
  for _ = 1, nkv do str(); skip(take("uint32_t")) end
  local infos = {}
  for i = 1, nt do
    local name, nd = str(), take("uint32_t")
    local dims = {}
    for d = 1, nd do dims[d] = tonumber(take("uint64_t")) end
    infos[i] = { name = name, dims = dims, type = take("uint32_t"), offset = tonumber(take("uint64_t")) }
  end
  local data = pos - 1 + (32 - (pos - 1) % 32) % 32
  return infos, data
end

T.case("the GGUF's tensors are the safetensors' bytes at aligned offsets", function()
  local out = T.tmpdir() .. "/model.gguf"
  require("gguf").write(dir, out)
  local g, st = T.read(out), T.read(dir .. "/model.safetensors")
  local hlen = tonumber(ffi.cast("const uint64_t*", ffi.cast("const char*", st))[0])
  local header = cjson.decode(st:sub(9, 8 + hlen))
  local infos, data = parse_gguf(g)
  local names = { ["token_embd.weight"] = "model.embed_tokens.weight", ["output_norm.weight"] = "model.norm.weight",
    ["blk.0.attn_q.weight"] = "model.layers.0.self_attn.q_proj.weight", ["blk.0.ffn_down.weight"] = "model.layers.0.mlp.down_proj.weight",
    ["blk.0.attn_k.bias"] = "model.layers.0.self_attn.k_proj.bias" }
  T.eq(#infos, 2 + 12, "tensor count of a tied 1-layer Qwen2")
  local checked = 0
  for i, t in ipairs(infos) do
    T.eq(t.offset % 32, 0, t.name .. " aligned")
    T.eq(t.type, 0, t.name .. " is F32")
    if i > 1 then T.ok(t.offset >= infos[i - 1].offset, "offsets grow") end
    local hf = names[t.name]
    if hf then
      local h = header[hf]
      T.eq(t.dims, { h.shape[#h.shape], #h.shape == 2 and h.shape[1] or nil }, t.name .. " dims")
      local a, b = h.data_offsets[1], h.data_offsets[2]
      T.ok(g:sub(data + t.offset + 1, data + t.offset + b - a) == st:sub(8 + hlen + a + 1, 8 + hlen + b),
        t.name .. "'s bytes equal the safetensors'")
      checked = checked + 1
    end
  end
  T.eq(checked, 5)
  local last, bytes = infos[#infos], 4
  for _, d in ipairs(last.dims) do bytes = bytes * d end
  T.eq(#g, data + last.offset + bytes + (32 - bytes % 32) % 32, "the file ends after the last tensor and its padding")
  os.remove(out)
end)

T.run()
