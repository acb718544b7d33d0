-- Every tensor op against a naive loop written here, on 1x1, 7x13x5 and 257x129x65 (and odd
-- matmul sizes), to 1e-5 relative; views and in-place ops write through shared storage;
-- every error path names the op and the shapes.
local T = require("clrt.test")
local ffi = require("ffi")
local C = require("clrt.core.ffi").C
local tensor = clrt.tensor

local SHAPES = { { 1, 1 }, { 7, 13, 5 }, { 257, 129, 65 } }
local RTOL = 1e-5

local function numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

-- A contiguous f32 tensor whose flat element i (0-based) is fn(i).
local function filled(shape, fn, dtype)
  local t = tensor.zeros(shape)
  local p = ffi.cast("float *", t:data_ptr())
  for i = 0, numel(shape) - 1 do p[i] = fn(i) end
  if dtype and dtype ~= "f32" then return t:to(dtype) end
  return t
end

-- Flat values of any tensor (any dtype, any strides) as a Lua array, 0-based.
local function values(t)
  local c = t:to("f32")   -- a contiguous copy, independent of the op under test
  local p = ffi.cast("float *", c:data_ptr())
  local out, n = {}, c:numel()
  for i = 0, n - 1 do out[i] = p[i] end
  return out, n
end

-- x rounded to f32, for references of chained ops (each op rounds its result)
local f32box = ffi.new("float[1]")
local function f32(x) f32box[0] = x; return f32box[0] end

local seed = 0
local function randn(shape)
  seed = seed + 1
  return tensor.randn(shape, { seed = seed })
end
local function positive(shape) return randn(shape):abs() + 0.5 end
-- small integers, so comparisons and integer math see ties
local function ints(shape, k)
  return filled(shape, function(i) return ((i * 7919 + (k or 0)) % 13) - 6 end)
end

-- got (a tensor) against ref(i) for every flat index, |got - ref| <= atol + rtol * scale(i).
local function check(name, got, shape, ref, opts)
  opts = opts or {}
  T.eq(got:shape(), shape, name .. ": shape")
  local rtol, atol = opts.rtol or RTOL, opts.atol or 1e-30
  local v, n = values(got)
  T.eq(n, numel(shape), name .. ": numel")
  for i = 0, n - 1 do
    local e, a = ref(i), v[i]
    local scale = opts.scale and opts.scale(i) or math.abs(e)
    local bad
    if e ~= e then bad = a == a
    elseif e == math.huge or e == -math.huge then bad = a ~= e
    else bad = not (math.abs(a - e) <= atol + rtol * scale) end
    if bad then
      T.ok(false, ("%s: element %d: expected %.9g, got %.9g"):format(name, i, e, a))
    end
  end
end

-- Index of the element of `src` (shape sshape, right-aligned) that broadcasts to flat index i
-- of an output of shape oshape.
local function bcast_index(oshape, sshape)
  local nd, off = #oshape, #oshape - #sshape
  local ostr, sstr = {}, {}
  local o, s = 1, 1
  for d = nd, 1, -1 do
    ostr[d] = o; o = o * oshape[d]
    local sd = sshape[d - off]
    if sd == nil or sd == 1 then sstr[d] = 0 else sstr[d] = s; s = s * sd end
  end
  return function(i)
    local j = 0
    for d = 1, nd do
      local k = math.floor(i / ostr[d]) % oshape[d]
      j = j + k * sstr[d]
    end
    return j
  end
end

local binref = {
  add = function(x, y) return x + y end, sub = function(x, y) return x - y end,
  mul = function(x, y) return x * y end, div = function(x, y) return x / y end,
  pow = function(x, y) return x ^ y end,
  maximum = function(x, y) return x > y and x or y end,
  minimum = function(x, y) return x < y and x or y end,
  eq = function(x, y) return x == y and 1 or 0 end, ne = function(x, y) return x ~= y and 1 or 0 end,
  lt = function(x, y) return x < y and 1 or 0 end, le = function(x, y) return x <= y and 1 or 0 end,
  gt = function(x, y) return x > y and 1 or 0 end, ge = function(x, y) return x >= y and 1 or 0 end,
}
local BINOPS = { "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge" }

-- +1/-1 from the sign of t, to give divisors both signs
local function signs(t) return tensor.where(t:ge(0), 1, -1) end

local function operands(name, ashape, bshape, k)
  if name == "pow" then return positive(ashape), randn(bshape) end
  if name == "div" then return randn(ashape), positive(bshape) * signs(ints(bshape, k)) end
  if binref[name](1, 1) == 1 or binref[name](1, 2) == 1 then return ints(ashape, k), ints(bshape, k + 3) end
  return randn(ashape), randn(bshape)
end


local function check_binary(name, a, b, oshape, label)
  local av, bv = values(a), values(b)
  local ia, ib = bcast_index(oshape, a:shape()), bcast_index(oshape, b:shape())
  local f = binref[name]
  check(label, a[name](a, b), oshape, function(i) return f(av[ia(i)], bv[ib(i)]) end)
end

T.case("binary ops, same shapes (1x1, 7x13x5, 257x129x65)", function()
  for _, shape in ipairs(SHAPES) do
    for k, name in ipairs(BINOPS) do
      local a, b = operands(name, shape, shape, k)
      check_binary(name, a, b, shape, name .. " " .. table.concat(shape, "x"))
    end
  end
end)

T.case("binary ops broadcast like numpy", function()
  local cases = {
    { { 7, 13, 5 }, { 5 } }, { { 7, 13, 5 }, { 13, 1 } }, { { 7, 1, 5 }, { 13, 1 } },
    { { 1 }, { 7, 13, 5 } }, { { 7, 13, 5 }, { 7, 1, 1 } }, { { 257, 129, 65 }, { 129, 65 } },
    { { 257, 1, 65 }, { 1, 129, 1 } },
  }
  for _, c in ipairs(cases) do
    local oshape = {}
    local nd = math.max(#c[1], #c[2])
    for d = 1, nd do
      local x, y = c[1][d - (nd - #c[1])] or 1, c[2][d - (nd - #c[2])] or 1
      oshape[d] = math.max(x, y)
    end
    for k, name in ipairs({ "add", "sub", "mul", "div", "maximum", "lt", "eq" }) do
      local a, b = operands(name, c[1], c[2], k)
      check_binary(name, a, b, oshape, ("%s [%s] [%s]"):format(name, table.concat(c[1], ","), table.concat(c[2], ",")))
    end
  end
end)

T.case("numbers on either side, and the Lua operators", function()
  local shape = { 7, 13, 5 }
  local a = randn(shape)
  local av = values(a)
  local p = positive(shape)
  local pv = values(p)
  check("t + 2.5", a + 2.5, shape, function(i) return av[i] + 2.5 end)
  check("2.5 + t", 2.5 + a, shape, function(i) return av[i] + 2.5 end)
  check("t - 3", a - 3, shape, function(i) return av[i] - 3 end)
  check("3 - t", 3 - a, shape, function(i) return 3 - av[i] end)
  check("t * -2", a * -2, shape, function(i) return av[i] * -2 end)
  check("t / 4", a / 4, shape, function(i) return av[i] / 4 end)
  check("1 / p", 1 / p, shape, function(i) return 1 / pv[i] end)
  check("p ^ 0.5", p ^ 0.5, shape, function(i) return pv[i] ^ 0.5 end)
  check("2 ^ t", 2 ^ a, shape, function(i) return 2 ^ av[i] end)
  check("-t", -a, shape, function(i) return -av[i] end)
  check("t - t", a - a, shape, function() return 0 end)
  check("t * t + t", a * a + a, shape, function(i) return f32(av[i] * av[i]) + av[i] end)
  check("maximum(t, 0)", a:maximum(0), shape, function(i) return math.max(av[i], 0) end)
  check("minimum(0, t)", tensor.minimum(0, a), shape, function(i) return math.min(av[i], 0) end)
  check("gt(t, 0.25)", a:gt(0.25), shape, function(i) return av[i] > 0.25 and 1 or 0 end)
  check("ge(0, t)", tensor.ge(0, a), shape, function(i) return 0 >= av[i] and 1 or 0 end)
end)

local unref = {
  neg = function(x) return -x end, abs = math.abs, exp = math.exp, log = math.log,
  sqrt = math.sqrt, tanh = function(x) local e = math.exp(2 * x); return (e - 1) / (e + 1) end,
  sigmoid = function(x) return 1 / (1 + math.exp(-x)) end, relu = function(x) return x > 0 and x or 0 end,
}

T.case("unary ops on 1x1, 7x13x5, 257x129x65", function()
  for _, shape in ipairs(SHAPES) do
    local a, p = randn(shape) * 3, positive(shape)
    local av, pv = values(a), values(p)
    for name, f in pairs(unref) do
      local x, xv = a, av
      if name == "log" or name == "sqrt" then x, xv = p, pv end
      check(name .. " " .. table.concat(shape, "x"), x[name](x), shape, function(i) return f(xv[i]) end)
    end
  end
end)

T.case("ops on transposed and narrowed views read through strides", function()
  local base = randn({ 13, 7, 5 })
  local v = base:transpose(1, 2)            -- [7, 13, 5], not contiguous
  local n = randn({ 7, 20, 5 }):narrow(2, 4, 13)   -- [7, 13, 5], a window
  T.ok(not v:is_contiguous() and not n:is_contiguous())
  local vv, nv = values(v), values(n)
  local shape = { 7, 13, 5 }
  check("view + view", v + n, shape, function(i) return vv[i] + nv[i] end)
  check("exp(view)", v:exp(), shape, function(i) return math.exp(vv[i]) end)
  check("view * 2", n * 2, shape, function(i) return nv[i] * 2 end)
end)

T.case("in-place ops write through views into the shared storage", function()
  local base = tensor.zeros({ 4, 6 })
  local win = base:narrow(2, 2, 3)          -- columns 2..4 of every row
  win:add_(tensor.from({ 1, 2, 3 }))        -- broadcasts along rows
  win:mul_(2)
  T.eq(base:totable()[3], { 0, 2, 4, 6, 0, 0 })
  local tr = base:t()
  tr:sub_(1)
  T.eq(base:get(1, 1), -1)
  T.eq(base:get(4, 4), 5)
  local a = randn({ 7, 13, 5 })
  local av = values(a)
  a:exp_()
  check("exp_", a, { 7, 13, 5 }, function(i) return math.exp(av[i]) end)
  a:relu_():neg_()
  check("relu_ neg_", a, { 7, 13, 5 }, function(i) return -math.exp(av[i]) end)
  -- a:add_(a:t()) must not read values it has already overwritten
  local sq = filled({ 5, 5 }, function(i) return i end)
  sq:add_(sq:t())
  T.eq(sq:get(2, 3), (1 * 5 + 2) + (2 * 5 + 1))
  T.eq(sq:get(3, 2), (1 * 5 + 2) + (2 * 5 + 1))
end)

-- Naive reduction of flat values over dimension d (1-based) of shape.
local function naive_reduce(v, shape, d, op)
  local outer, inner, n = 1, 1, shape[d]
  for k = 1, d - 1 do outer = outer * shape[k] end
  for k = d + 1, #shape do inner = inner * shape[k] end
  return function(i)   -- i: flat index into the reduced [outer, inner]
    local o, c = math.floor(i / inner), i % inner
    local acc, best, pos = 0, nil, 0
    for j = 0, n - 1 do
      local x = v[(o * n + j) * inner + c]
      acc = acc + x
      local want_max = op == "max" or op == "argmax"
      if best == nil or (want_max and x > best) or (not want_max and x < best) then best, pos = x, j end
    end
    if op == "sum" then return acc end
    if op == "mean" then return acc / n end
    if op == "argmax" or op == "argmin" then return pos + 1 end
    return best
  end
end

T.case("sum/mean/max/min/argmax/argmin over each dimension, keepdim", function()
  for _, shape in ipairs(SHAPES) do
    local a = randn(shape)
    local av = values(a)
    for d = 1, #shape do
      local rshape, kshape = {}, {}
      for k = 1, #shape do
        if k ~= d then rshape[#rshape + 1] = shape[k] end
        kshape[k] = k == d and 1 or shape[k]
      end
      local label = table.concat(shape, "x") .. " dim " .. d
      for _, op in ipairs({ "sum", "mean", "max", "min" }) do
        check(op .. " " .. label, a[op](a, d), rshape, naive_reduce(av, shape, d, op), { atol = 1e-6 })
      end
      check("argmax " .. label, a:argmax(d), rshape, naive_reduce(av, shape, d, "argmax"))
      check("argmin keepdim " .. label, a:argmin(d, true), kshape, naive_reduce(av, shape, d, "argmin"))
      local vals, idx = a:max(d, true)
      check("max keepdim " .. label, vals, kshape, naive_reduce(av, shape, d, "max"))
      check("max positions " .. label, idx, kshape, naive_reduce(av, shape, d, "argmax"))
      T.eq(idx:dtype(), "i32")
    end
    -- negative dims count from the end
    local last = values(a:sum(#shape))
    check("sum dim -1", a:sum(-1), a:sum(#shape):shape(), function(i) return last[i] end)
  end
end)

T.case("reductions over everything return Lua numbers", function()
  T.eq(tensor.ones({ 2, 3 }):sum(), 6)
  for _, shape in ipairs(SHAPES) do
    local a = randn(shape)
    local av, n = values(a)
    local s, mx, mn, amx = 0, -math.huge, math.huge, 0
    for i = 0, n - 1 do
      s = s + av[i]
      if av[i] > mx then mx, amx = av[i], i + 1 end
      mn = math.min(mn, av[i])
    end
    T.near(a:sum(), s, { rtol = RTOL, atol = 1e-6 })
    T.near(a:mean(), s / n, { rtol = RTOL, atol = 1e-9 })
    T.eq(a:max(), mx)
    T.eq(a:min(), mn)
    T.eq(a:argmax(), amx)
    T.eq(type(a:sum()), "number")
  end
end)

T.case("softmax and log_softmax over each dimension", function()
  for _, shape in ipairs(SHAPES) do
    local a = randn(shape) * 4
    local av = values(a)
    local strides, s = {}, 1
    for d = #shape, 1, -1 do strides[d] = s; s = s * shape[d] end
    for d = 1, #shape do
      local n, st = shape[d], strides[d]
      local function ref(i, log)
        local pos = math.floor(i / st) % n
        local base = i - pos * st
        local mx = -math.huge
        for j = 0, n - 1 do mx = math.max(mx, av[base + j * st]) end
        local z = 0
        for j = 0, n - 1 do z = z + math.exp(av[base + j * st] - mx) end
        if log then return av[i] - mx - math.log(z) end
        return math.exp(av[i] - mx) / z
      end
      if numel(shape) < 1e6 or d == #shape then   -- the slow reference is O(n) per element
        local label = table.concat(shape, "x") .. " dim " .. d
        check("softmax " .. label, a:softmax(d), shape, function(i) return ref(i, false) end, { atol = 1e-9 })
        check("log_softmax " .. label, a:log_softmax(d), shape, function(i) return ref(i, true) end, { atol = 1e-6 })
      end
    end
  end
  -- stable for large logits: no inf/nan
  local big = tensor.from({ { 1000, 1001, 1002 }, { -1000, -1001, -1002 } })
  local sm = big:softmax(2)
  T.near(sm:get(1, 3), 1 / (1 + math.exp(-1) + math.exp(-2)), { rtol = 1e-6 })
  T.near(big:log_softmax(2):get(2, 1), -math.log(1 + math.exp(-1) + math.exp(-2)), { rtol = 1e-6 })
end)

-- Naive matmul of flat values: A [M, K] and B [K, N] as functions of (i, k) and (k, j).
local function naive_mm(aget, bget, M, K, N)
  local out, scale = {}, {}
  for i = 0, M - 1 do
    for j = 0, N - 1 do
      local acc, mag = 0, 0
      for k = 0, K - 1 do
        local p = aget(i, k) * bget(k, j)
        acc, mag = acc + p, mag + math.abs(p)
      end
      out[i * N + j], scale[i * N + j] = acc, mag
    end
  end
  return out, scale
end

-- The error of a K-term f32 dot product scales with sum |a_k b_k|, not with the result.
local function check_mm(name, got, shape, ref, scale, offset)
  offset = offset or 0
  check(name, got, shape, function(i) return ref[i - offset] end, { scale = function(i) return scale[i - offset] end })
end

T.case("matmul 2-D on odd sizes, with transposed views (no copy)", function()
  local M, K, N = 257, 129, 65
  local a, b = randn({ M, K }), randn({ K, N })
  local av, bv = values(a), values(b)
  local ref, scale = naive_mm(function(i, k) return av[i * K + k] end, function(k, j) return bv[k * N + j] end, M, K, N)
  check_mm("257x129 @ 129x65", a:matmul(b), { M, N }, ref, scale)
  -- the same product from transposed storage: a = at:t(), b = bt:t()
  local at, bt = a:t():clone(), b:t():clone()
  check_mm("at:t() @ b", at:t():matmul(b), { M, N }, ref, scale)
  check_mm("a @ bt:t()", tensor.matmul(a, bt:t()), { M, N }, ref, scale)
  check_mm("at:t() @ bt:t()", at:t():matmul(bt:t()), { M, N }, ref, scale)
  -- a narrowed view (row stride larger than the row)
  local wide = randn({ M, K + 10 })
  local win = wide:narrow(2, 4, K)
  local wv = values(win)
  local ref2, scale2 = naive_mm(function(i, k) return wv[i * K + k] end, function(k, j) return bv[k * N + j] end, M, K, N)
  check_mm("narrowed @ b", win:matmul(b), { M, N }, ref2, scale2)
  -- 1x1
  local x, y = tensor.from({ { 3 } }), tensor.from({ { -2 } })
  T.eq(x:matmul(y):totable(), { { -6 } })
end)

T.case("matmul with vectors (1-D operands)", function()
  local K, N = 129, 65
  local m, v, w = randn({ K, N }), randn({ K }), randn({ N })
  local mv, vv, wv = values(m), values(v), values(w)
  local ref, scale = naive_mm(function(_, k) return vv[k] end, function(k, j) return mv[k * N + j] end, 1, K, N)
  check_mm("vec @ mat", v:matmul(m), { N }, ref, scale)
  local ref2, scale2 = naive_mm(function(i, k) return mv[i * N + k] end, function(k) return wv[k] end, K, N, 1)
  check_mm("mat @ vec", m:matmul(w), { K }, ref2, scale2)
  local d = 0
  for k = 0, K - 1 do d = d + vv[k] * vv[k] end
  T.near(v:matmul(v):item(), d, { rtol = RTOL })
  T.eq(v:matmul(v):shape(), {})
end)

T.case("batched matmul, broadcast batch dimensions", function()
  -- [3, 57, 29] @ [29, 13]: the batch folds into one sgemm
  local B, M, K, N = 3, 57, 29, 13
  local a, b = randn({ B, M, K }), randn({ K, N })
  local av, bv = values(a), values(b)
  local got = a:matmul(b)
  for bi = 0, B - 1 do
    local ref, scale = naive_mm(function(i, k) return av[(bi * M + i) * K + k] end, function(k, j) return bv[k * N + j] end, M, K, N)
    check_mm("batch " .. bi, got:narrow(1, bi + 1, 1):reshape({ M, N }), { M, N }, ref, scale)
  end
  -- [2, 1, 7, 13] @ [3, 13, 5] -> [2, 3, 7, 5]
  local x, y = randn({ 2, 1, 7, 13 }), randn({ 3, 13, 5 })
  local xv, yv = values(x), values(y)
  local out = x:matmul(y)
  T.eq(out:shape(), { 2, 3, 7, 5 })
  for i = 0, 1 do
    for j = 0, 2 do
      local ref, scale = naive_mm(function(r, k) return xv[(i * 7 + r) * 13 + k] end,
        function(k, c) return yv[(j * 13 + k) * 5 + c] end, 7, 13, 5)
      check_mm(("batch %d,%d"):format(i, j), out:narrow(1, i + 1, 1):narrow(2, j + 1, 1):reshape({ 7, 5 }), { 7, 5 }, ref, scale)
    end
  end
  -- batched with a transposed batch operand: [4, 9, 6] @ [4, 11, 6]:transpose(2, 3)
  local p, q = randn({ 4, 9, 6 }), randn({ 4, 11, 6 })
  local pv, qv = values(p), values(q)
  local pq = p:matmul(q:transpose(2, 3))
  for bi = 0, 3 do
    local ref, scale = naive_mm(function(r, k) return pv[(bi * 9 + r) * 6 + k] end,
      function(k, c) return qv[(bi * 11 + c) * 6 + k] end, 9, 6, 11)
    check_mm("bt " .. bi, pq:narrow(1, bi + 1, 1):reshape({ 9, 11 }), { 9, 11 }, ref, scale)
  end
end)

T.case("bf16 computes in f32 and rounds; i32 stays integer where it can", function()
  local a = randn({ 7, 13, 5 })
  local ab = a:to("bf16")
  local abv = values(ab)   -- the bf16 values, exactly
  local r = ab + ab
  T.eq(r:dtype(), "bf16")
  check("bf16 add", r, { 7, 13, 5 }, function(i) return 2 * abv[i] end, { rtol = 1e-2 })
  check("bf16 exp", ab:exp(), { 7, 13, 5 }, function(i) return math.exp(abv[i]) end, { rtol = 1e-2 })
  T.eq((ab * 0.5):dtype(), "bf16")
  T.eq((ab + a):dtype(), "f32")
  local s = ab:sum(2)
  T.eq(s:dtype(), "bf16")
  check("bf16 sum", s, { 7, 5 }, naive_reduce(abv, { 7, 13, 5 }, 2, "sum"), { rtol = 1e-2, atol = 1e-2 })
  local m = ab:reshape({ 91, 5 }):matmul(ab:reshape({ 7, 65 }):narrow(1, 1, 5))
  T.eq(m:dtype(), "bf16")

  local x = tensor.from({ { 7, -3 }, { 2147483647, 5 } }, { dtype = "i32" })
  local y = tensor.from({ { 2, 4 }, { 1, -5 } }, { dtype = "i32" })
  T.eq((x + y):dtype(), "i32")
  T.eq((x - y):totable(), { { 5, -7 }, { 2147483646, 10 } })
  T.eq((x * y):totable(), { { 14, -12 }, { 2147483647, -25 } })
  T.eq((x + 1):totable()[2][1], -2147483648)   -- wraps, as two's complement does
  T.eq((x / y):dtype(), "f32")
  T.eq((x / y):totable()[1], { 3.5, -0.75 })
  T.eq((x + 0.5):dtype(), "f32")
  T.eq((x:pow(2)):totable()[1], { 49, 9 })
  T.eq(x:lt(y):totable(), { { 0, 1 }, { 0, 0 } })
  T.eq(x:lt(y):dtype(), "f32")
  T.eq((-x):totable()[1], { -7, 3 })
  T.eq(x:abs():totable()[1], { 7, 3 })
  T.eq(x:sum(), 2147483647 + 9)
  T.eq(x:sum(2):totable(), { 4, -2147483644 })   -- int32 sums wrap
  T.eq(x:max(), 2147483647)
  T.eq(x:argmin(), 2)
  T.eq(x:mean(1):dtype(), "f32")
  T.eq(x:exp():dtype(), "f32")
  local xy = x:narrow(1, 1, 1):matmul(y)   -- i32 matmul runs in f32: exact for small values
  T.eq(xy:dtype(), "i32")
  T.eq(xy:totable(), { { 14 - 3, 28 + 15 } })
  local huge = tensor.full({ 2, 2 }, 2e9, { dtype = "i32" })
  T.eq(huge:matmul(huge):totable()[1], { 2147483647, 2147483647 })   -- saturates
  T.eq((-huge):matmul(huge):totable()[2], { -2147483648, -2147483648 })
end)

T.case("where and masked_fill", function()
  local shape = { 7, 13, 5 }
  local a, b, c = randn(shape), randn({ 13, 5 }), ints({ 7, 1, 5 })
  local av, bv, cv = values(a), values(b), values(c)
  local ib, ic = bcast_index(shape, { 13, 5 }), bcast_index(shape, { 7, 1, 5 })
  check("where", tensor.where(c:gt(0), a, b), shape, function(i) return cv[ic(i)] > 0 and av[i] or bv[ib(i)] end)
  check("where scalar", tensor.where(c:gt(0), a, -1), shape, function(i) return cv[ic(i)] > 0 and av[i] or -1 end)
  local m = a:clone()
  m:masked_fill_(a:lt(0), 0)
  check("masked_fill_", m, shape, function(i) return math.max(av[i], 0) end)
  local causal = tensor.ones({ 4, 4 }):masked_fill(tensor.from({ { 0, 1, 1, 1 }, { 0, 0, 1, 1 }, { 0, 0, 0, 1 }, { 0, 0, 0, 0 } }), -math.huge)
  T.eq(causal:softmax(2):totable()[2], { 0.5, 0.5, 0, 0 })
end)

T.case("errors name the op and both shapes", function()
  local a, b = tensor.zeros({ 2, 3 }), tensor.zeros({ 4 })
  T.raises(function() return a + b end, "add: shapes [2, 3] and [4] cannot broadcast")
  T.raises(function() return a - b end, "sub: shapes [2, 3] and [4] cannot broadcast")
  T.raises(function() return b * a end, "mul: shapes [4] and [2, 3] cannot broadcast")
  T.raises(function() return a / b end, "div: shapes [2, 3] and [4] cannot broadcast")
  T.raises(function() return a:lt(b) end, "lt: shapes [2, 3] and [4] cannot broadcast")
  T.raises(function() return a:maximum(b) end, "maximum: shapes [2, 3] and [4] cannot broadcast")
  T.raises(function() tensor.zeros({ 3 }):add_(a) end, "add_: shapes [3] and [2, 3] cannot broadcast into [3]")
  T.raises(function() a:mul_(b) end, "mul_: shapes [2, 3] and [4] cannot broadcast")
  T.raises(function() return a + "x" end, "add: expected a tensor or a number, got string")
  T.raises(function() return a:add({}) end, "add: expected a tensor or a number, got table")
  T.raises(function() return tensor.sub(1, 2) end, "sub: at least one operand must be a tensor (got two numbers)")
  T.raises(function() return tensor.mul(true, a) end, "mul: expected a tensor or a number, got boolean")
  T.raises(function() return tensor.exp(3) end, "exp: expected a tensor, got number")
  T.raises(function() return a:matmul(tensor.zeros({ 4, 5 })) end, "matmul: shapes [2, 3] and [4, 5] do not match (3 != 4)")
  T.raises(function() return tensor.zeros({ 2, 2, 3 }):matmul(tensor.zeros({ 3, 3, 1 })) end,
    "matmul: shapes [2, 2, 3] and [3, 3, 1]: batch dimensions cannot broadcast")
  T.raises(function() return tensor.full({}, 1):matmul(a) end, "matmul: shapes [] and [2, 3]: both operands need at least one dimension")
  T.raises(function() return a:matmul(2) end, "matmul: expected a tensor, got number")
  T.raises(function() return a:sum(3) end, "sum: dimension 3 out of range for shape [2, 3]")
  T.raises(function() return a:mean(0) end, "mean: dimension 0 out of range for shape [2, 3]")
  T.raises(function() return a:max(-3) end, "max: dimension -3 out of range for shape [2, 3]")
  T.raises(function() return a:argmax(5) end, "argmax: dimension 5 out of range for shape [2, 3]")
  T.raises(function() return a:softmax(3) end, "softmax: dimension 3 out of range for shape [2, 3]")
  T.raises(function() return a:log_softmax(1.5) end, "log_softmax: dimension must be an integer, got 1.5")
  T.raises(function() return tensor.zeros({ 0, 3 }):max() end, "max: cannot reduce an empty tensor (shape [0, 3])")
  T.raises(function() return tensor.zeros({ 0, 3 }):argmax(1) end, "argmax: cannot reduce dimension index 0 of size 0 (shape [0, 3])")
  local i = tensor.zeros({ 2, 3 }, { dtype = "i32" })
  T.raises(function() i:add_(a) end, "add_: result dtype f32 cannot be stored in the i32 tensor (shapes [2, 3] and [2, 3])")
  T.raises(function() i:div_(2) end, "div_: result dtype f32 cannot be stored in the i32 tensor")
  T.raises(function() i:exp_() end, "exp_: result dtype f32 cannot be stored in the i32 tensor (shape [2, 3])")
  T.raises(function() return tensor.where(tensor.zeros({ 2 }), a, b) end, "where: shapes [2], [2, 3] and [4] cannot broadcast")
  T.raises(function() a:masked_fill_(tensor.zeros({ 2, 3, 1 }), 1) end, "masked_fill_: mask shape [2, 3, 1] cannot broadcast into [2, 3]")
  -- nothing above changed a
  T.eq(a:sum(), 0)
end)

T.case("temporaries in a loop do not pile up (storage counts toward GC)", function()
  local function rss_kb()
    local f = io.open("/proc/self/status")
    if not f then return nil end
    local s = f:read("*a")
    f:close()
    return tonumber(s:match("VmRSS:%s*(%d+)"))
  end
  local x = tensor.zeros({ 1024, 1024 })   -- 4 MB
  local before = rss_kb()
  if not before then T.skip("no /proc/self/status") end
  for _ = 1, 250 do x = x + 1 end            -- 1 GB of temporaries if none were freed
  T.eq(x:get(7, 7), 250)
  local grown = rss_kb() - before
  T.ok(grown < 400 * 1024, ("resident memory grew by %d MB over 250 ops on a 4 MB tensor"):format(grown / 1024))
end)

T.case("long ops stop with an error when interrupted (Ctrl-C)", function()
  local big = tensor.zeros({ 257, 129, 65 })
  C.clrt_set_interrupt(1)
  local ok1, e1 = pcall(function() return big + big end)
  local ok2, e2 = pcall(function() return big:sum(2) end)
  local ok3, e3 = pcall(function() return big:sum() end)
  local ok4, e4 = pcall(function() return big:matmul(big:transpose(2, 3)) end)
  local ok5, e5 = pcall(function() return big:softmax(1) end)
  C.clrt_set_interrupt(0)
  T.ok(not ok4 and tostring(e4):find("matmul: interrupted", 1, true), tostring(e4))
  T.ok(not ok5 and tostring(e5):find("softmax: interrupted", 1, true), tostring(e5))
  T.ok(not ok1 and tostring(e1):find("add: interrupted", 1, true), tostring(e1))
  T.ok(not ok2 and tostring(e2):find("sum: interrupted", 1, true), tostring(e2))
  T.ok(not ok3 and tostring(e3):find("sum: interrupted", 1, true), tostring(e3))
  T.eq((big + 1):sum(), 257 * 129 * 65)
end)

T.run()
