-- clrt.core.tensor_ops — arithmetic, comparisons, reductions, softmax and matmul on tensors.
-- ops.build(tensor) returns them as three tables for clrt/tensor.lua, the class's file, to
-- take: methods (t:add(b), t:sum(dim), ...), functions (clrt.tensor.add(a, b), where a or b
-- may be a number) and operators (+ - * / ^ and unary -). Every op is one C call
-- (runtime/core/tensor_ops.c).
--
-- Conventions: dimensions are 1-based and may be negative (-1 is the last); positions from
-- argmax/argmin (and the second result of max/min over a dimension) are 1-based i32. A
-- reduction with no dimension returns a Lua number. Comparisons return f32 0/1 tensors.
-- `==` is not overloaded: on cdata it must keep meaning identity (t == nil).
local ffi = require("ffi")
local core = require("clrt.core.ffi")
local C = core.C

local M = {}

local binary = {
  add = C.CLRT_OP_ADD, sub = C.CLRT_OP_SUB, mul = C.CLRT_OP_MUL, div = C.CLRT_OP_DIV,
  pow = C.CLRT_OP_POW, maximum = C.CLRT_OP_MAXIMUM, minimum = C.CLRT_OP_MINIMUM,
  eq = C.CLRT_OP_EQ, ne = C.CLRT_OP_NE, lt = C.CLRT_OP_LT, le = C.CLRT_OP_LE,
  gt = C.CLRT_OP_GT, ge = C.CLRT_OP_GE,
}
local unary = {
  neg = C.CLRT_OP_NEG, abs = C.CLRT_OP_ABS, exp = C.CLRT_OP_EXP, log = C.CLRT_OP_LOG,
  sqrt = C.CLRT_OP_SQRT, tanh = C.CLRT_OP_TANH, sigmoid = C.CLRT_OP_SIGMOID, relu = C.CLRT_OP_RELU,
}
local reduce = {
  sum = C.CLRT_RED_SUM, mean = C.CLRT_RED_MEAN, max = C.CLRT_RED_MAX, min = C.CLRT_RED_MIN,
  argmax = C.CLRT_RED_ARGMAX, argmin = C.CLRT_RED_ARGMIN,
}
M.binary_ops, M.unary_ops, M.reduce_ops = binary, unary, reduce

-- `tensor` is clrt/tensor.lua's module table (is_tensor, shape_str, handle, full).
function M.build(tensor)
  local is_tensor, shape_str = tensor.is_tensor, tensor.shape_str
  local Tensor, functions, operators = {}, {}, {}

  local function fail(level) error(ffi.string(C.clrt_last_error()), level + 1) end
  local function result(p, level)
    if p == nil then fail(level + 1) end
    return tensor.handle(p)
  end
  local function bad_operand(name, x, level)
    error(("%s: expected a tensor or a number, got %s"):format(name, type(x)), level + 1)
  end

  -- 1-based (or negative) dimension -> 0-based, with an error naming the op and the shape.
  local function dim0(t, dim, name, level)
    if type(dim) ~= "number" or dim ~= math.floor(dim) then
      error(("%s: dimension must be an integer, got %s"):format(name, tostring(dim)), level + 1)
    end
    local d = dim < 0 and t.ndim + 1 + dim or dim
    if d < 1 or d > t.ndim then
      error(("%s: dimension %s out of range for shape %s (dimensions are 1..%d, or -1 for the last)")
        :format(name, tostring(dim), shape_str(t), t.ndim), level + 1)
    end
    return d - 1
  end
  M.dim0 = dim0

  for name, op in pairs(binary) do
    local function apply(a, b)
      if is_tensor(a) then
        if is_tensor(b) then return result(C.clrt_tensor_binary(op, a, b), 3) end
        if type(b) == "number" then return result(C.clrt_tensor_binary_scalar(op, a, b, 0), 3) end
        bad_operand(name, b, 3)
      elseif type(a) == "number" then
        if is_tensor(b) then return result(C.clrt_tensor_binary_scalar(op, b, a, 1), 3) end
        if type(b) == "number" then error(name .. ": at least one operand must be a tensor (got two numbers)", 3) end
        bad_operand(name, b, 3)
      end
      bad_operand(name, a, 3)
    end
    Tensor[name], functions[name] = apply, apply
    Tensor[name .. "_"] = function(a, b)
      local st
      if is_tensor(b) then st = C.clrt_tensor_binary_(op, a, b)
      elseif type(b) == "number" then st = C.clrt_tensor_binary_scalar_(op, a, b)
      else bad_operand(name .. "_", b, 2) end
      if st ~= 0 then fail(2) end
      return a
    end
  end

  for name, op in pairs(unary) do
    local function apply(a)
      if not is_tensor(a) then error(("%s: expected a tensor, got %s"):format(name, type(a)), 2) end
      return result(C.clrt_tensor_unary(op, a), 2)
    end
    Tensor[name], functions[name] = apply, apply
    Tensor[name .. "_"] = function(a)
      if C.clrt_tensor_unary_(op, a) ~= 0 then fail(2) end
      return a
    end
  end

  operators.__add, operators.__sub, operators.__mul = functions.add, functions.sub, functions.mul
  operators.__div, operators.__pow, operators.__unm = functions.div, functions.pow, functions.neg

  local out = ffi.new("double[1]")
  local function reduce_all(t, op, level)
    if C.clrt_tensor_reduce_all(op, t, out) ~= 0 then fail(level + 1) end
    return out[0]
  end
  local function reduce_dim(t, op, name, dim, keepdim, level)
    return result(C.clrt_tensor_reduce(op, t, dim0(t, dim, name, level + 1), keepdim and 1 or 0), level + 1)
  end
  local function one_based(idx)
    if C.clrt_tensor_binary_scalar_(C.CLRT_OP_ADD, idx, 1) ~= 0 then fail(3) end
    return idx
  end

  -- t:sum() -> number; t:sum(dim[, keepdim]) -> tensor. Likewise mean.
  for _, name in ipairs({ "sum", "mean" }) do
    local op = reduce[name]
    Tensor[name] = function(t, dim, keepdim)
      if dim == nil then return reduce_all(t, op, 2) end
      return reduce_dim(t, op, name, dim, keepdim, 2)
    end
  end
  -- t:max() -> number; t:max(dim[, keepdim]) -> values, positions (1-based).
  for _, pair in ipairs({ { "max", "argmax" }, { "min", "argmin" } }) do
    local name, argname = pair[1], pair[2]
    Tensor[name] = function(t, dim, keepdim)
      if dim == nil then return reduce_all(t, reduce[name], 2) end
      local v = reduce_dim(t, reduce[name], name, dim, keepdim, 2)
      return v, one_based(reduce_dim(t, reduce[argname], name, dim, keepdim, 2))
    end
    -- t:argmax() -> 1-based flat position; t:argmax(dim[, keepdim]) -> 1-based i32 tensor.
    Tensor[argname] = function(t, dim, keepdim)
      if dim == nil then return reduce_all(t, reduce[argname], 2) + 1 end
      return one_based(reduce_dim(t, reduce[argname], argname, dim, keepdim, 2))
    end
  end

  function Tensor.softmax(t, dim)
    return result(C.clrt_tensor_softmax(t, dim0(t, dim or -1, "softmax", 2), 0), 2)
  end
  function Tensor.log_softmax(t, dim)
    return result(C.clrt_tensor_softmax(t, dim0(t, dim or -1, "log_softmax", 2), 1), 2)
  end

  function Tensor.matmul(a, b)
    if not is_tensor(b) then error("matmul: expected a tensor, got " .. type(b), 2) end
    return result(C.clrt_tensor_matmul(a, b), 2)
  end
  functions.matmul = function(a, b)
    if not is_tensor(a) then error("matmul: expected a tensor, got " .. type(a), 2) end
    if not is_tensor(b) then error("matmul: expected a tensor, got " .. type(b), 2) end
    return result(C.clrt_tensor_matmul(a, b), 2)
  end

  -- where(cond, a, b): a and b may be numbers (they take the other operand's dtype).
  local function as_tensor(x, other, name)
    if is_tensor(x) then return x end
    if type(x) ~= "number" then bad_operand(name, x, 3) end
    local dt = is_tensor(other) and other:dtype() or "f32"
    if dt == "i32" and x ~= math.floor(x) then dt = "f32" end
    return tensor.full({}, x, { dtype = dt })
  end
  function functions.where(cond, a, b)
    if not is_tensor(cond) then error("where: condition must be a tensor, got " .. type(cond), 2) end
    local ta, tb = as_tensor(a, b, "where"), as_tensor(b, a, "where")
    return result(C.clrt_tensor_where(cond, ta, tb), 2)
  end
  Tensor.where = functions.where

  function Tensor.masked_fill_(t, mask, value)
    if not is_tensor(mask) then error("masked_fill_: mask must be a tensor, got " .. type(mask), 2) end
    if type(value) ~= "number" then error("masked_fill_: value must be a number, got " .. type(value), 2) end
    if C.clrt_tensor_masked_fill_(t, mask, value) ~= 0 then fail(2) end
    return t
  end
  function Tensor.masked_fill(t, mask, value)
    local c = t:clone()
    if not is_tensor(mask) then error("masked_fill: mask must be a tensor, got " .. type(mask), 2) end
    if type(value) ~= "number" then error("masked_fill: value must be a number, got " .. type(value), 2) end
    if C.clrt_tensor_masked_fill_(c, mask, value) ~= 0 then fail(2) end
    return c
  end
  return { methods = Tensor, functions = functions, operators = operators }
end

return M
