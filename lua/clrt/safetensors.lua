-- clrt.safetensors — read and write safetensors files as tables of tensors.
--   local t, meta = clrt.safetensors.load("x.safetensors")   -- name -> tensor (f32, or i32 for ints)
--   clrt.safetensors.save("y.safetensors", {w = tensor}, {format = "pt"})
-- Files are memory-mapped and checked (offsets, sizes, dtypes) before anything is read.
local ffi = require("ffi")
local core = require("clrt.core.ffi")
local tensor = require("clrt.tensor")
local C, check, ok = core.C, core.check, core.ok

local M = {}

-- The tensor names in a file, sorted, and its header entries: {dtype =, shape =}.
function M.info(path)
  local st = ffi.gc(check(C.clrt_safetensors_open(path), 2), C.clrt_safetensors_close)
  local out = {}
  for i = 0, C.clrt_safetensors_count(st) - 1 do
    local shape = {}
    for d = 0, C.clrt_safetensors_ndim(st, i) - 1 do shape[d + 1] = tonumber(C.clrt_safetensors_dim(st, i, d)) end
    out[ffi.string(C.clrt_safetensors_name(st, i))] = { dtype = ffi.string(C.clrt_safetensors_dtype(st, i)), shape = shape }
  end
  return out
end

function M.load(path, keys)
  local st = ffi.gc(check(C.clrt_safetensors_open(path), 2), C.clrt_safetensors_close)
  local out = {}
  for i = 0, C.clrt_safetensors_count(st) - 1 do
    out[ffi.string(C.clrt_safetensors_name(st, i))] = tensor.wrap(C.clrt_safetensors_tensor(st, i))
  end
  local meta = {}
  for _, k in ipairs(keys or {}) do
    local v = C.clrt_safetensors_metadata(st, k)
    if v ~= nil then meta[k] = ffi.string(v) end
  end
  return out, meta
end

function M.metadata(path, key)
  local st = ffi.gc(check(C.clrt_safetensors_open(path), 2), C.clrt_safetensors_close)
  local v = C.clrt_safetensors_metadata(st, key)
  return v ~= nil and ffi.string(v) or nil
end

function M.save(path, tensors, metadata)
  local names = {}
  for k in pairs(tensors) do names[#names + 1] = k end
  table.sort(names)
  local n = #names
  local cn = ffi.new("const char *[?]", math.max(n, 1))
  local ct = ffi.new("const clrt_tensor *[?]", math.max(n, 1))
  local hold = {}
  for i, name in ipairs(names) do
    local t = tensors[name]
    if not t:is_contiguous() then t = t:clone() end
    hold[i] = t
    cn[i - 1] = name
    ct[i - 1] = t
  end
  local mk, mv, nm = {}, {}, 0
  for k, v in pairs(metadata or {}) do nm = nm + 1; mk[nm] = k; mv[nm] = tostring(v) end
  local ck = ffi.new("const char *[?]", math.max(nm, 1), mk)
  local cv = ffi.new("const char *[?]", math.max(nm, 1), mv)
  ok(C.clrt_safetensors_write(path, n, cn, ct, nm, ck, cv), 2)
  local _ = { hold, names, mk, mv }
  return path
end

return M
