-- clrt.jinja.eval — runs a parsed template against a context, with @huggingface/jinja's
-- semantics: scopes (a for loop has its own, if does not, a macro's body sees the caller's),
-- `loop`, Python-style truthiness, JavaScript's == and printing, none and undefined printing
-- nothing. Errors name the template line being evaluated.
local V = require("clrt.jinja.values")
local B = require("clrt.jinja.builtins")
local text = require("clrt.jinja.text")
local budget = require("clrt.jinja.budget")

local M = {}
local NULL, UNDEF = V.NULL, V.UNDEF
local kind, truthy, fail = V.kind, V.truthy, B.fail
local concat = table.concat

local line = 1          -- the line of the node being evaluated, for errors
local eval, block

-- Each scope's depth: LuaJIT follows at most 100 __index links, so the budget stops far short.
local depth_of = setmetatable({}, { __mode = "k" })
local function child(env)
  local d = (depth_of[env] or 0) + 1
  budget.scope_depth(d)
  local t = setmetatable({}, { __index = env })
  depth_of[t] = d
  return t
end

local function lookup(env, name)
  local v = env[name]
  if v == nil then return UNDEF end
  return v
end

local function eval_args(nodes, env)
  local args, kw, any_kw = {}, {}, false
  local kwd
  for _, a in ipairs(nodes) do
    if a.k == "Spread" then
      local v = eval(a.arg, env)
      if not V.is_list(v) then fail("Cannot unpack non-iterable type: " .. kind(v)) end
      for _, x in ipairs(v) do args[#args + 1] = x end
    elseif a.k ~= "Kw" and a.k ~= "KwSpread" then
      args[#args + 1] = eval(a, env)
    end
  end
  local function add(k, v)
    if kw[k] ~= nil then fail("Got multiple values for keyword argument '" .. k .. "'") end
    kw[k] = v
    any_kw = true
    kwd = kwd or V.dict({}, {}, "kwargs")
    V.dict_set(kwd, k, v)
  end
  for _, a in ipairs(nodes) do
    if a.k == "Kw" then
      add(a.key, eval(a.value, env))
    elseif a.k == "KwSpread" then
      local v = eval(a.arg, env)
      if not V.is_dict(v) then fail("Argument after ** must be a mapping, not " .. kind(v)) end
      for _, k in ipairs(v.keys) do add(k, v.map[k]) end
    end
  end
  return args, kw, any_kw and kwd or nil
end

local function binary(node, env)
  local op = node.op
  local l = eval(node.l, env)
  if op == "and" then if truthy(l) then return eval(node.r, env) end return l end
  if op == "or" then if truthy(l) then return l end return eval(node.r, env) end
  local r = eval(node.r, env)
  line = node.line
  if op == "==" then return V.loose_eq(l, r) end
  if op == "!=" then return not V.loose_eq(l, r) end
  if l == UNDEF or r == UNDEF then
    if r == UNDEF and (op == "in" or op == "not in") then return op == "not in" end
    fail("Cannot perform operation " .. op .. " on undefined values")
  end
  if l == NULL or r == NULL then fail("Cannot perform operation on null values") end
  if op == "~" then
    local a, b = V.js_string(l), V.js_string(r)
    budget.size(#a + #b)
    return a .. b
  end
  local function numlike(x) return V.is_number(x) or type(x) == "boolean" end
  if op == "**" and numlike(l) and numlike(r) then
    local a = type(l) == "boolean" and (l and 1 or 0) or V.num(l)
    local b = type(r) == "boolean" and (r and 1 or 0) or V.num(r)
    if a == 0 and b < 0 then fail("0.0 cannot be raised to a negative power") end
    local res = a ^ b
    if res ~= res or res == math.huge or res == -math.huge then fail("Exponentiation result is not a finite real number") end
    return V.number(res, V.is_float(l) or V.is_float(r) or b < 0)
  end
  if V.is_number(l) and V.is_number(r) then
    local a, b = V.num(l), V.num(r)
    local f = V.is_float(l) or V.is_float(r)
    if op == "+" then return V.number(a + b, f) end
    if op == "-" then return V.number(a - b, f) end
    if op == "*" then return V.number(a * b, f) end
    if op == "/" then return V.float(a / b) end
    if op == "//" then return V.number(math.floor(a / b), f) end
    if op == "%" then return V.number(math.fmod(a, b), f) end
    if op == "<" then return a < b end
    if op == ">" then return a > b end
    if op == "<=" then return a <= b end
    if op == ">=" then return a >= b end
  elseif V.is_list(l) and V.is_list(r) then
    if op == "+" then
      budget.charge(#l + #r)   -- a list doubled in a loop grows as fast as a string
      local out = {}
      for i = 1, #l do out[i] = l[i] end
      for i = 1, #r do out[#out + 1] = r[i] end
      return V.list(out)
    end
  elseif V.is_list(r) then
    if op == "in" or op == "not in" then
      local found = false
      for i = 1, #r do if V.strict_eq(r[i], l) then found = true; break end end
      return (op == "in") == found
    end
  end
  if (type(l) == "string" or type(r) == "string") and op == "+" then
    local a, b = V.js_string(l), V.js_string(r)
    budget.size(#a + #b)
    return a .. b
  end
  if type(l) == "string" and type(r) == "string" then
    if op == "in" then return r:find(l, 1, true) ~= nil end
    if op == "not in" then return r:find(l, 1, true) == nil end
  end
  if type(l) == "string" and V.is_dict(r) then
    if op == "in" then return r.map[l] ~= nil end
    if op == "not in" then return r.map[l] == nil end
  end
  fail(("unknown operator %q between %s and %s"):format(op, kind(l), kind(r)))
end

local function slice(list, start, stop, step)
  local n = #list
  step = step or 1
  if step == 0 then fail("slice step cannot be zero") end
  local out = {}
  if step > 0 then
    start = start or 0
    start = start < 0 and math.max(n + start, 0) or math.min(start, n)
    stop = stop or n
    stop = stop < 0 and math.max(n + stop, 0) or math.min(stop, n)
    local i = start
    while i < stop do out[#out + 1] = list[i + 1]; i = i + step end
  else
    start = start or n - 1
    start = start < 0 and math.max(n + start, -1) or math.min(start, n - 1)
    stop = stop or -1
    stop = stop < -1 and math.max(n + stop, -1) or math.min(stop, n - 1)
    local i = start
    while i > stop do out[#out + 1] = list[i + 1]; i = i + step end
  end
  return out
end

local function member(node, env)
  local obj = eval(node.obj, env)
  local prop
  line = node.line
  local p = node.prop
  if node.computed then
    if p.k == "Slice" then
      if not (V.is_list(obj) or type(obj) == "string") then fail("Slice object must be an array or string") end
      local function part(x)
        if not x then return nil end
        local v = eval(x, env)
        if v == UNDEF then return nil end
        if type(v) ~= "number" then fail("Slice indices must be integers") end
        return v
      end
      local a, b, c = part(p.start), part(p.stop), part(p.step)
      if type(obj) == "string" then return concat(slice(text.chars(obj), a, b, c)) end
      return V.list(slice(obj, a, b, c))
    end
    prop = eval(p, env)
  else
    prop = p.v          -- .name or .0
  end
  local value
  if V.is_attrs(obj) then
    if type(prop) ~= "string" then fail("Cannot access property with non-string: got " .. kind(prop)) end
    value = obj.map[prop]
    if value == nil and obj.kind ~= "namespace" then value = B.dict_attr(obj, prop) end
  elseif V.is_list(obj) or type(obj) == "string" then
    if type(prop) == "number" then
      if type(obj) == "string" then
        local chars = text.chars(obj)
        local i = prop < 0 and #chars + prop or prop
        value = chars[i + 1]
      else
        local i = prop < 0 and #obj + prop or prop
        value = obj[i + 1]
      end
    elseif type(prop) == "string" then
      if type(obj) == "string" then value = B.string_attr(obj, prop)
      elseif prop == "length" then value = #obj end
    else
      fail("Cannot access property with non-string/non-number: got " .. kind(prop))
    end
  else
    if type(prop) ~= "string" then fail("Cannot access property with non-string: got " .. kind(prop)) end
  end
  if value == nil then return UNDEF end
  return value
end

local function call(node, env)
  local args, _, kwd = eval_args(node.args, env)
  if kwd then args[#args + 1] = kwd end
  local fn = eval(node.callee, env)
  line = node.line
  if not V.is_func(fn) then
    local what = node.callee.k == "Name" and (" '" .. node.callee.v .. "'") or
      (node.callee.k == "Member" and not node.callee.computed) and (" '." .. tostring(node.callee.prop.v) .. "'") or ""
    fail(("cannot call%s: it is %s"):format(what, kind(fn) == "UndefinedValue" and "not defined for this value" or "a " .. kind(fn)))
  end
  return fn.fn(args, env)
end

local function filter(node, env, operand)
  local v = operand
  if v == nil then v = eval(node.operand, env) end
  line = node.line
  local f = node.filter
  if f.k == "Name" then return B.plain_filter(v, f.v) end
  if f.callee.k ~= "Name" then fail("a filter must be a name") end
  local name = f.callee.v
  local args, kw
  if name == "selectattr" or name == "rejectattr" then
    args, kw = {}, {}
    for i, a in ipairs(f.args) do
      if a.k ~= "Str" then fail("arguments of `" .. name .. "` must be strings") end
      args[i] = a.v
    end
  else
    args, kw = eval_args(f.args, env)
  end
  line = node.line
  return B.called_filter(v, name, args, kw, f.args)
end

-- Macro and call-block arguments: positionals, then keywords, then defaults (evaluated in
-- the macro's scope); `kwargs` / `varargs` collect extras when the body names them.
local function mentions(nodes, name)
  local found = false
  local function walk(n)
    if found or type(n) ~= "table" then return end
    if n.k == "Name" and n.v == name then found = true; return end
    for _, c in pairs(n) do if type(c) == "table" then walk(c) end end
  end
  walk(nodes)
  return found
end

local function bind(label, params, wants, args, scope)
  local pos = { unpack(args) }
  local kw = {}
  local last = pos[#pos]
  if getmetatable(last) == V.DICT and last.kind == "kwargs" then
    table.remove(pos)
    for _, k in ipairs(last.keys) do kw[k] = last.map[k] end
  end
  local pending = {}
  for i, p in ipairs(params) do
    local name = p.k == "Name" and p.v or p.key
    local v = pos[i]
    if v == nil and kw[name] ~= nil then v = kw[name]; kw[name] = nil end
    if v == nil and p.k == "Kw" then pending[#pending + 1] = { name, p.value } end
    rawset(scope, name, v == nil and UNDEF or v)
  end
  if wants.kwargs then
    local d = V.dict({}, {}, "dict")
    for k, v in pairs(kw) do V.dict_set(d, k, v) end
    rawset(scope, "kwargs", d)
  elseif next(kw) then
    fail(("macro %s takes no keyword argument '%s'"):format(label, next(kw)))
  end
  if wants.varargs then
    local extra = {}
    for i = #params + 1, #pos do extra[#extra + 1] = pos[i] end
    rawset(scope, "varargs", V.list(extra))
  elseif #pos > #params then
    fail(("macro %s takes not more than %d argument(s)"):format(label, #params))
  end
  for _, d in ipairs(pending) do rawset(scope, d[1], eval(d[2], scope)) end
end

local function for_loop(node, env)
  local scope = child(env)
  local iter, test = node.iter, nil
  if iter.k == "Select" then test = iter.test; iter = iter.lhs end
  local it = eval(iter, scope)
  line = node.line
  if not (V.is_list(it) or V.is_dict(it)) then
    fail("a for loop needs a list or a dict, got " .. kind(it))
  end
  if V.is_dict(it) then local keys = {}; for i, k in ipairs(it.keys) do keys[i] = k end; it = keys end
  local var = node.var
  local function assign(target, item)
    if var.k == "Name" then rawset(target, var.v, item); return end
    if getmetatable(item) ~= V.LIST then fail("Cannot unpack non-iterable type: " .. kind(item)) end
    if #var.items ~= #item then fail(("Too %s items to unpack"):format(#var.items > #item and "few" or "many")) end
    for j, n in ipairs(var.items) do
      if n.k ~= "Name" then fail("Cannot unpack non-identifier type") end
      rawset(target, n.v, item[j])
    end
  end
  local items = {}
  for i = 1, #it do
    local item = it[i]
    if test then
      local ls = child(scope)
      assign(ls, item)
      if truthy(eval(test, ls)) then items[#items + 1] = item end
    else
      items[#items + 1] = item
    end
  end
  local out, n = {}, #items
  local none, total = true, 0
  for i = 1, n do
    budget.step()
    local keys = { "index", "index0", "revindex", "revindex0", "first", "last", "length", "previtem", "nextitem" }
    rawset(scope, "loop", V.dict(keys, {
      index = i, index0 = i - 1, revindex = n - i + 1, revindex0 = n - i, first = i == 1, last = i == n, length = n,
      previtem = i > 1 and items[i - 1] or UNDEF, nextitem = i < n and items[i + 1] or UNDEF,
    }))
    assign(scope, items[i])
    local s, sig = block(node.body, scope)
    if sig == "break" then break end
    if sig ~= "continue" then
      total = total + #s
      budget.size(total)
      out[#out + 1] = s
      none = false
    end
  end
  if none then
    local s, sig = block(node.alt, scope)
    if sig then fail("{% " .. sig .. " %} outside a loop") end
    out[#out + 1] = s
  end
  return concat(out)
end

local handlers = {
  Str = function(n) return n.v end,
  Int = function(n) return n.v end,
  Float = function(n) return V.float(n.v) end,
  Name = function(n, env) return lookup(env, n.v) end,
  Array = function(n, env)
    local out = {}
    for i, x in ipairs(n.items) do out[i] = eval(x, env) end
    return V.list(out)
  end,
  Tuple = function(n, env)
    local out = {}
    for i, x in ipairs(n.items) do out[i] = eval(x, env) end
    return V.tuple(out)
  end,
  Object = function(n, env)
    local d = V.dict()
    for _, kv in ipairs(n.pairs) do
      local k = eval(kv[1], env)
      if type(k) ~= "string" then line = n.line; fail("Object keys must be strings: got " .. kind(k)) end
      V.dict_set(d, k, eval(kv[2], env))
    end
    return d
  end,
  Member = member,
  Call = call,
  Bin = binary,
  Not = function(n, env) return not truthy(eval(n.arg, env)) end,
  Unary = function(n, env)
    local v = eval(n.arg, env)
    local sign = n.op == "-" and -1 or 1
    if type(v) == "boolean" then return sign * (v and 1 or 0) end
    if V.is_number(v) then return V.number(sign * V.num(v), V.is_float(v)) end
    line = n.line
    fail(("unknown operator %q for %s"):format(n.op, kind(v)))
  end,
  Filter = function(n, env) return filter(n, env) end,
  Test = function(n, env)
    local v = eval(n.operand, env)
    line = n.line
    local t = B.tests[n.name]
    if not t then fail("the test '" .. n.name .. "' is not supported") end
    local r = t(v)
    if n.negate then return not r end
    return r
  end,
  Select = function(n, env)
    if not truthy(eval(n.test, env)) then return UNDEF end
    return eval(n.lhs, env)
  end,
  Ternary = function(n, env)
    if truthy(eval(n.cond, env)) then return eval(n.t, env) end
    return eval(n.f, env)
  end,
  Comment = function() return NULL end,
  Set = function(n, env)
    local v
    if n.value then v = eval(n.value, env) else
      local s, sig = block(n.body, env)
      if sig then fail("{% " .. sig .. " %} inside {% set %}") end
      v = s
    end
    line = n.line
    local t = n.target
    if t.k == "Name" then
      rawset(env, t.v, v)
    elseif t.k == "Tuple" then
      if not V.is_list(v) then fail("Cannot unpack non-iterable type in set: " .. kind(v)) end
      if #v ~= #t.items then fail(("Too %s items to unpack in set"):format(#t.items > #v and "few" or "many")) end
      for j, x in ipairs(t.items) do
        if x.k ~= "Name" then fail("Cannot unpack to non-identifier in set") end
        rawset(env, x.v, v[j])
      end
    elseif t.k == "Member" then
      local obj = eval(t.obj, env)
      if not (V.is_attrs(obj) and obj.kind == "namespace") then fail("cannot assign attribute on non-namespace object") end
      if t.prop.k ~= "Name" or t.computed then fail("Cannot assign to member with non-identifier property") end
      V.dict_set(obj, t.prop.v, v)
    else
      fail("invalid target of {% set %}")
    end
    return NULL
  end,
  For = for_loop,
  Macro = function(n, env)
    local wants = { kwargs = mentions(n.body, "kwargs"), varargs = mentions(n.body, "varargs") }
    rawset(env, n.name, V.func(function(args, scope)
      local ms = child(scope)
      bind("'" .. n.name .. "'", n.params, wants, args, ms)
      local s, sig = block(n.body, ms)
      if sig then fail("{% " .. sig .. " %} outside a loop") end
      return s
    end, n.name))
    return NULL
  end,
  CallBlock = function(n, env)
    local wants = { kwargs = mentions(n.body, "kwargs"), varargs = mentions(n.body, "varargs") }
    local caller = V.func(function(args)
      local cs = child(env)
      bind("None", n.params, wants, args, cs)
      local s, sig = block(n.body, cs)
      if sig then fail("{% " .. sig .. " %} outside a loop") end
      return s
    end, "caller")
    local args, _, kwd = eval_args(n.args, env)
    args[#args + 1] = kwd or V.dict({}, {}, "kwargs")
    local fn = eval(n.callee, env)
    line = n.line
    if not V.is_func(fn) then fail("cannot call '" .. n.callee.v .. "': it is a " .. kind(fn)) end
    local ne = child(env)
    rawset(ne, "caller", caller)
    return fn.fn(args, ne)
  end,
  FilterBlock = function(n, env)
    local s, sig = block(n.body, env)
    if sig then fail("{% " .. sig .. " %} inside {% filter %}") end
    return filter({ filter = n.filter, line = n.line }, env, s)
  end,
}

function eval(node, env)
  line = node.line
  budget.step()
  local h = handlers[node.k]
  if not h then fail("cannot evaluate a " .. tostring(node.k)) end
  return h(node, env)
end

-- A list of statements: the text, or nil and "break" / "continue".
function block(nodes, env)
  local out, total = {}, 0
  for i = 1, #nodes do
    local n = nodes[i]
    local k = n.k
    budget.step()
    if k == "Str" then
      out[#out + 1] = n.v
    elseif k == "Break" then return nil, "break"
    elseif k == "Continue" then return nil, "continue"
    elseif k == "If" then
      line = n.line
      local s, sig = block(truthy(eval(n.test, env)) and n.body or n.alt, env)
      if sig then return nil, sig end
      total = total + #s
      out[#out + 1] = s
    else
      local v = eval(n, env)
      if v ~= NULL and v ~= UNDEF then
        line = n.line
        local str = V.str(v)
        total = total + #str
        out[#out + 1] = str
      end
    end
    budget.size(total)
  end
  return concat(out)
end

-- Render a parsed program; ctx maps names to template values (clrt.jinja.values); limits:
-- clrt.jinja.budget's (max_steps, max_output, max_scope_depth, tick), its defaults when nil.
function M.run(program, ctx, limits)
  budget.start(limits)
  local env = child(ctx)
  line = 1
  local ok, res, sig = pcall(block, program.body, env)
  budget.finish()
  if not ok then
    local msg = type(res) == "table" and res.jinja_error or tostring(res)
    error(("chat template line %d: %s"):format(line, msg), 0)
  end
  if sig then error(("chat template: {%% %s %%} outside a loop"):format(sig), 0) end
  return res
end

return M
