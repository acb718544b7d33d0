-- clrt.tensor — n-dimensional arrays over C storage. A tensor is a cdata handle whose memory
-- the runtime owns; ffi.gc frees the handle (and its share of the storage).
--
-- Lua indices are 1-based everywhere a user sees them (dimensions, positions); the C side is
-- 0-based. Arithmetic ops live in clrt/core/tensor_ops.lua, which adds methods to Tensor.
local ffi = require("ffi")
local core = require("clrt.core.ffi")
local C, check, ok = core.C, core.check, core.ok

local M = {}
local Tensor = {}
M.Tensor = Tensor

local dtypes = { f32 = C.CLRT_F32, bf16 = C.CLRT_BF16, i32 = C.CLRT_I32 }
local dtype_names = { [0] = "f32", [1] = "bf16", [2] = "i32" }
M.dtypes = dtypes

local function dtype_of(name, op)
  if name == nil then return C.CLRT_F32 end
  local d = dtypes[name]
  if not d then error(("%s: unknown dtype '%s' (f32, bf16, i32)"):format(op, tostring(name)), 3) end
  return d
end
M.dtype_of = dtype_of

local function device_of(name, op)
  if name == nil or name == "cpu" then return C.CLRT_CPU end
  if name == "cuda" then return C.CLRT_CUDA end
  error(("%s: unknown device '%s' (cpu, cuda)"):format(op, tostring(name)), 3)
end
M.device_of = device_of

-- Wrap a fresh handle so the GC frees it. Lua holds it as a `clrt_tensor &`, not a pointer:
-- LuaJIT does pointer arithmetic on `ptr + 1` and `ptr - ptr` before it looks at __add or
-- __sub, while a reference gets the metamethods and still passes as a pointer to C.
--
-- The GC sees a handle as a few bytes, not the megabytes of storage it may hold alone, so a
-- loop like `x = x + 1` would pile up garbage storage without limit. New storage is counted
-- here, and once more than max(64 MB, the Lua heap) of it was made since the last cycle, a
-- full collection runs: garbage stays bounded and the GC's cost stays proportional.
local tensor_ref = ffi.typeof("clrt_tensor &")
local fresh_bytes, GC_MIN_BYTES = 0, 64 * 2 ^ 20
local function handle(p)
  local t = ffi.gc(ffi.cast(tensor_ref, p), C.clrt_tensor_free)
  local s = p.storage
  if s ~= nil and s.refcount == 1 then
    fresh_bytes = fresh_bytes + tonumber(s.bytes)
    if fresh_bytes > GC_MIN_BYTES and fresh_bytes > collectgarbage("count") * 1024 then
      fresh_bytes = 0
      collectgarbage()
    end
  end
  return t
end
M.handle = handle
local function wrap(p, level)
  return handle(check(p, (level or 1) + 1))
end
M.wrap = wrap

local function shape_array(shape, op)
  if type(shape) == "number" then shape = { shape } end
  if type(shape) ~= "table" then error(op .. ": shape must be a table of sizes", 3) end
  local n = #shape
  if n > C.CLRT_MAX_DIMS then error(("%s: %d dimensions (at most %d)"):format(op, n, C.CLRT_MAX_DIMS), 3) end
  local arr = ffi.new("int64_t[8]")
  for i = 1, n do
    local s = shape[i]
    if type(s) ~= "number" or s < 0 or s ~= math.floor(s) then
      error(("%s: size %s in dimension %d is not a non-negative integer"):format(op, tostring(s), i), 3)
    end
    arr[i - 1] = s
  end
  return arr, n
end
M.shape_array = shape_array

local function is_tensor(x) return ffi.istype("clrt_tensor", x) end
M.is_tensor = is_tensor

function M.new(shape, dtype, device)
  local arr, n = shape_array(shape, "new")
  return wrap(C.clrt_tensor_new(dtype_of(dtype, "new"), n, arr, device_of(device, "new")), 2)
end

function M.zeros(shape, opts)
  opts = opts or {}
  return M.new(shape, opts.dtype, opts.device)
end

function M.full(shape, value, opts)
  local t = M.zeros(shape, opts)
  ok(C.clrt_tensor_fill_(t, value), 2)
  return t
end

function M.ones(shape, opts) return M.full(shape, 1, opts) end

-- arange(n) or arange(start, stop[, step]): [start, stop) like numpy.
function M.arange(a, b, step, opts)
  if type(b) == "table" then opts, b = b, nil end
  if type(step) == "table" then opts, step = step, nil end
  local start, stop = b and a or 0, b or a
  step = step or 1
  if step == 0 then error("arange: step must not be 0", 2) end
  local n = math.max(0, math.ceil((stop - start) / step))
  local t = M.zeros({ n }, opts)
  for i = 0, n - 1 do C.clrt_tensor_set(t, i, start + i * step) end
  return t
end

-- A seeded generator; pass it to rand/randn so every random tensor is reproducible.
function M.generator(seed)
  local g = ffi.new("clrt_rng")
  C.clrt_rng_seed(g, seed or 0)
  return g
end

local default_gen
local function gen_of(opts)
  if opts and opts.generator then return opts.generator end
  if opts and opts.seed then return M.generator(opts.seed) end
  default_gen = default_gen or M.generator(0)
  return default_gen
end

function M.rand(shape, opts)
  local t = M.zeros(shape, opts)
  ok(C.clrt_tensor_rand_(t, gen_of(opts)), 2)
  return t
end

function M.randn(shape, opts)
  local t = M.zeros(shape, opts)
  ok(C.clrt_tensor_randn_(t, gen_of(opts)), 2)
  return t
end

-- from({{1,2},{3,4}}) infers the shape from the nesting; ragged tables are an error.
function M.from(tbl, opts)
  if is_tensor(tbl) then return tbl:clone() end
  if type(tbl) == "number" then tbl = { tbl } end
  if type(tbl) ~= "table" then error("from: expected a (nested) table of numbers, got " .. type(tbl), 2) end
  local shape, node = {}, tbl
  while type(node) == "table" do
    shape[#shape + 1] = #node
    node = node[1]
  end
  local flat = {}
  local function walk(x, d, where)
    if d > #shape then
      if type(x) ~= "number" then error(("from: element %s is a %s, not a number"):format(where, type(x)), 4) end
      flat[#flat + 1] = x
      return
    end
    if type(x) ~= "table" or #x ~= shape[d] then
      error(("from: ragged table at %s: expected %d elements in dimension %d"):format(where, shape[d], d), 4)
    end
    for i = 1, #x do walk(x[i], d + 1, where .. "[" .. i .. "]") end
  end
  walk(tbl, 1, "t")
  local t = M.zeros(shape, opts)
  if t:dtype() == "f32" and C.clrt_tensor_is_contiguous(t) == 1 then
    local p = ffi.cast("float *", C.clrt_tensor_data(t))
    for i = 1, #flat do p[i - 1] = flat[i] end
  else
    for i = 1, #flat do C.clrt_tensor_set(t, i - 1, flat[i]) end
  end
  return t
end

-- ---- methods ---------------------------------------------------------------------------

function Tensor.dim(t) return t.ndim end
function Tensor.numel(t) return tonumber(C.clrt_tensor_numel(t)) end
function Tensor.dtype(t) return dtype_names[t.dtype_id] end
function Tensor.device(t) return t.device_id == C.CLRT_CUDA and "cuda" or "cpu" end
function Tensor.is_contiguous(t) return C.clrt_tensor_is_contiguous(t) == 1 end

function Tensor.shape(t)
  local s = {}
  for i = 0, t.ndim - 1 do s[i + 1] = tonumber(t.dims[i]) end
  return s
end

function Tensor.size(t, d)
  if d == nil then return t:shape() end
  if d < 0 then d = t.ndim + 1 + d end
  if d < 1 or d > t.ndim then error(("size: dimension %d out of range for a %d-d tensor"):format(d, t.ndim), 2) end
  return tonumber(t.dims[d - 1])
end

local function shape_str(t)
  return "[" .. table.concat(t:shape(), ", ") .. "]"
end
M.shape_str = shape_str

-- Element access reads host memory: on a cuda tensor it is an error (one PCIe round trip
-- per element would be a silent slowdown), while item, totable and printing copy the
-- tensor to the cpu first, as PyTorch's .item() and .tolist() do.
local function host_only(t, op)
  if t.device_id == C.CLRT_CUDA then
    error(("%s: the tensor (shape %s) is on cuda; copy it with t:to(\"cpu\") first"):format(op, shape_str(t)), 3)
  end
end
local function on_host(t)
  return t.device_id == C.CLRT_CUDA and t:to("cpu") or t
end

-- Flat 1-based element access over the logical (row-major) order.
function Tensor.get(t, ...)
  host_only(t, "get")
  local idx = select("#", ...) == 1 and (...) or nil
  local flat
  if idx and t.ndim <= 1 then
    flat = idx - 1
  else
    local n = select("#", ...)
    if n ~= t.ndim then
      error(("get: %d indices for a %d-d tensor of shape %s"):format(n, t.ndim, shape_str(t)), 2)
    end
    flat = 0
    for d = 1, n do
      local i = select(d, ...)
      if i < 1 or i > t.dims[d - 1] then
        error(("get: index %d out of range for dimension %d of size %d (shape %s)"):format(i, d, tonumber(t.dims[d - 1]), shape_str(t)), 2)
      end
      flat = flat * tonumber(t.dims[d - 1]) + (i - 1)
    end
  end
  if flat < 0 or flat >= t:numel() then
    error(("get: index %d out of range for %d elements"):format(flat + 1, t:numel()), 2)
  end
  return C.clrt_tensor_get(t, flat)
end

function Tensor.set(t, ...)
  host_only(t, "set")
  local n = select("#", ...)
  local value = select(n, ...)
  local flat
  if n == 2 and t.ndim <= 1 then
    flat = (...) - 1
  else
    if n - 1 ~= t.ndim then
      error(("set: %d indices for a %d-d tensor of shape %s"):format(n - 1, t.ndim, shape_str(t)), 2)
    end
    flat = 0
    for d = 1, n - 1 do
      local i = select(d, ...)
      if i < 1 or i > t.dims[d - 1] then
        error(("set: index %d out of range for dimension %d of size %d (shape %s)"):format(i, d, tonumber(t.dims[d - 1]), shape_str(t)), 2)
      end
      flat = flat * tonumber(t.dims[d - 1]) + (i - 1)
    end
  end
  ok(C.clrt_tensor_set(t, flat, value), 2)
  return t
end

function Tensor.item(t)
  if t:numel() ~= 1 then
    error(("item: tensor of shape %s has %d elements, not 1"):format(shape_str(t), t:numel()), 2)
  end
  return C.clrt_tensor_get(on_host(t), 0)
end

function Tensor.totable(t)
  t = on_host(t)
  local shape = t:shape()
  local flat_i = 0
  local function build(d)
    if d > #shape then
      local v = C.clrt_tensor_get(t, flat_i)
      flat_i = flat_i + 1
      return v
    end
    local out = {}
    for i = 1, shape[d] do out[i] = build(d + 1) end
    return out
  end
  if #shape == 0 then return C.clrt_tensor_get(t, 0) end
  return build(1)
end

-- Views (no copies).
function Tensor.reshape(t, shape, ...)
  if type(shape) == "number" then shape = { shape, ... } end
  -- one -1 is inferred
  local known, hole = 1, nil
  for i, s in ipairs(shape) do
    if s == -1 then
      if hole then error("reshape: more than one -1 in the shape", 2) end
      hole = i
    else
      known = known * s
    end
  end
  if hole then
    shape = { unpack(shape) }
    shape[hole] = known > 0 and math.floor(t:numel() / known) or 0
  end
  local arr, n = shape_array(shape, "reshape")
  local p = C.clrt_tensor_reshape(t, n, arr)
  if p == nil then
    error(("reshape: cannot view shape %s as [%s]: %s"):format(shape_str(t), table.concat(shape, ", "), ffi.string(C.clrt_last_error())), 2)
  end
  return handle(p)
end
Tensor.view = Tensor.reshape

-- narrow(dim, start, len): 1-based dim and start.
function Tensor.narrow(t, dim, start, len)
  return wrap(C.clrt_tensor_narrow(t, dim - 1, start - 1, len), 2)
end

-- slice(dim, first, last): inclusive 1-based range, like string.sub.
function Tensor.slice(t, dim, first, last)
  last = last or t:size(dim)
  return wrap(C.clrt_tensor_narrow(t, dim - 1, first - 1, last - first + 1), 2)
end

function Tensor.transpose(t, d0, d1)
  d0, d1 = d0 or 1, d1 or 2
  return wrap(C.clrt_tensor_transpose(t, d0 - 1, d1 - 1), 2)
end
function Tensor.t(t) return t:transpose(1, 2) end

function Tensor.clone(t) return wrap(C.clrt_tensor_clone(t), 2) end
function Tensor.contiguous(t) return t:is_contiguous() and t or t:clone() end

-- t:to("bf16") converts the dtype; t:to("cuda") / t:to("cpu") copies to a device.
function Tensor.to(t, what)
  if what == "cpu" or what == "cuda" then
    return wrap(C.clrt_tensor_to_device(t, device_of(what, "to")), 2)
  end
  return wrap(C.clrt_tensor_to_dtype(t, dtype_of(what, "to")), 2)
end
function Tensor.cuda(t) return t:to("cuda") end
function Tensor.cpu(t) return t:to("cpu") end
function Tensor.float(t) return t:to("f32") end

function Tensor.copy_(t, src)
  if C.clrt_tensor_copy_(t, src) ~= 0 then
    error(("copy_: %s (destination %s, source %s)"):format(ffi.string(C.clrt_last_error()), shape_str(t), shape_str(src)), 2)
  end
  return t
end

function Tensor.fill_(t, v)
  ok(C.clrt_tensor_fill_(t, v), 2)
  return t
end

function Tensor.data_ptr(t) return C.clrt_tensor_data(t) end
function Tensor.shares_storage(a, b) return a.storage == b.storage end

-- ---- printing ---------------------------------------------------------------------------

local function fmt_num(v, dtype)
  if dtype == "i32" then return ("%d"):format(v) end
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" elseif v == -math.huge then return "-inf" end
  local a = math.abs(v)
  if a ~= 0 and (a >= 1e5 or a < 1e-4) then return ("%.4e"):format(v) end
  return ("%.4f"):format(v)
end

-- Numpy-like text: at most `edge` items at each end of every dimension.
function M.format(t, edge)
  edge = edge or 3
  local on_cuda = t.device_id == C.CLRT_CUDA
  t = on_host(t)
  local shape, dt = t:shape(), t:dtype()
  local strides = {}
  local s = 1
  for d = #shape, 1, -1 do strides[d] = s; s = s * shape[d] end
  local function rec(d, base, indent)
    if d > #shape then return fmt_num(C.clrt_tensor_get(t, base), dt) end
    local n, parts = shape[d], {}
    local function add(i) parts[#parts + 1] = rec(d + 1, base + (i - 1) * strides[d], indent .. " ") end
    if n > 2 * edge + 1 then
      for i = 1, edge do add(i) end
      parts[#parts + 1] = "..."
      for i = n - edge + 1, n do add(i) end
    else
      for i = 1, n do add(i) end
    end
    local sep = d == #shape and ", " or (",\n" .. indent .. " ")
    return "[" .. table.concat(parts, sep) .. "]"
  end
  local body = #shape == 0 and fmt_num(C.clrt_tensor_get(t, 0), dt) or rec(1, 0, "")
  return ("tensor(%s, shape=%s, dtype=%s%s)"):format(body, shape_str(t), dt,
    on_cuda and ", device=cuda" or "")
end

-- One line: shape, dtype and the first few values (used by the REPL).
function M.summary(t)
  t = on_host(t)
  local n, vals = t:numel(), {}
  for i = 0, math.min(n, 6) - 1 do vals[#vals + 1] = fmt_num(C.clrt_tensor_get(t, i), t:dtype()) end
  return ("tensor(shape=%s, dtype=%s, [%s%s])"):format(shape_str(t), t:dtype(), table.concat(vals, ", "), n > 6 and ", ..." or "")
end

local mt = {
  __index = Tensor,
  __tostring = function(t) return M.format(t) end,
  __len = function(t) return t.ndim > 0 and tonumber(t.dims[0]) or 0 end,
}
M.metatable = mt

-- Arithmetic, reductions and matmul extend Tensor (and mt's operators) from their own file.
-- This must run before ffi.metatype: LuaJIT forbids changing a metatype's metatable later.
local has_ops, ops = pcall(require, "clrt.core.tensor_ops")
if has_ops then ops.install(M, Tensor, mt) elseif not tostring(ops):find("module 'clrt.core.tensor_ops' not found", 1, true) then error(ops, 0) end
ffi.metatype("clrt_tensor", mt)

return M
