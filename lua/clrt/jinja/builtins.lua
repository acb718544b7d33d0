-- clrt.jinja.builtins — filters, tests, the methods of strings and dicts, and the globals
-- (namespace, range, raise_exception, strftime_now), each as @huggingface/jinja defines it.
-- Its departures from Python's Jinja are kept on purpose, since that is what the Hub's
-- JavaScript clients render: strip/lstrip/rstrip ignore their argument and strip Unicode
-- whitespace, `x | default` without parentheses is an error, `x | first` of [] is undefined.
local V = require("clrt.jinja.values")
local text = require("clrt.jinja.text")

local M = {}
local NULL, UNDEF = V.NULL, V.UNDEF
local kind = V.kind

local function fail(msg) error({ jinja_error = msg }, 0) end
M.fail = fail

local function is_kwargs(v) return getmetatable(v) == V.DICT and v.kind == "kwargs" end

-- Python's str.replace with count (none or negative: all).
local function replace(s, old, new, count)
  if count == 0 then return s end
  local remaining = (count == nil or count < 0) and math.huge or count
  if old == "" then
    local out = {}
    for _, c in ipairs(text.chars(s)) do
      if remaining > 0 then out[#out + 1] = new; remaining = remaining - 1 end
      out[#out + 1] = c
    end
    if remaining > 0 then out[#out + 1] = new end
    return table.concat(out)
  end
  local out, i = {}, 1
  while remaining > 0 do
    local a, b = s:find(old, i, true)
    if not a then break end
    out[#out + 1] = s:sub(i, a - 1)
    out[#out + 1] = new
    i = b + 1
    remaining = remaining - 1
  end
  out[#out + 1] = s:sub(i)
  return table.concat(out)
end

local function title(s)
  return (s:gsub("()([%w_])", function(pos, c)
    local prev = pos > 1 and s:sub(pos - 1, pos - 1) or ""
    if prev:find("^[%w_]") then return c end
    return c:upper()
  end))
end

local function split(s, sep, maxsplit)
  local out = {}
  if sep == NULL then
    local t = text.trim_start(s)
    local i = 1
    while i <= #t do
      local a = i
      while i <= #t and text.space_at(t, i) == 0 do i = i + 1 end
      if maxsplit ~= -1 and #out >= maxsplit then out[#out + 1] = t:sub(a); break end
      out[#out + 1] = t:sub(a, i - 1)
      i = text.skip_space(t, i)
    end
  else
    if sep == "" then fail("empty separator") end
    local i = 1
    while true do
      local a, b = s:find(sep, i, true)
      if not a then break end
      out[#out + 1] = s:sub(i, a - 1)
      i = b + 1
    end
    out[#out + 1] = s:sub(i)
    if maxsplit ~= -1 and #out > maxsplit then
      local rest = {}
      for k = maxsplit + 1, #out do rest[#rest + 1] = out[k]; out[k] = nil end
      out[maxsplit + 1] = table.concat(rest, sep)
    end
  end
  return V.list(out)
end

local function prefix_test(s, pattern, name, at_end)
  local function hit(p)
    if at_end then return p == "" or s:sub(-#p) == p end
    return s:sub(1, #p) == p
  end
  if type(pattern) == "string" then return hit(pattern) end
  if V.is_list(pattern) then
    for _, p in ipairs(pattern) do
      if type(p) ~= "string" then fail(name .. "() tuple elements must be strings") end
      if hit(p) then return true end
    end
    return false
  end
  fail(name .. "() argument must be a string or tuple of strings")
end

-- str.method(...) and str.length
function M.string_attr(s, name)
  if name == "length" then return text.js_length(s) end
  local f
  if name == "upper" then f = function() return text.upper(s) end
  elseif name == "lower" then f = function() return text.lower(s) end
  elseif name == "strip" then f = function() return text.trim(s) end
  elseif name == "rstrip" then f = function() return text.trim_end(s) end
  elseif name == "lstrip" then f = function() return text.trim_start(s) end
  elseif name == "title" then f = function() return title(s) end
  elseif name == "capitalize" then
    f = function() local c = text.chars(s); if c[1] then c[1] = text.upper(c[1]) end; return table.concat(c) end
  elseif name == "startswith" or name == "endswith" then
    f = function(args)
      if #args == 0 then fail(name .. "() requires at least one argument") end
      return prefix_test(s, args[1], name, name == "endswith")
    end
  elseif name == "split" then
    f = function(args)
      local sep = args[1] or NULL
      if type(sep) ~= "string" and sep ~= NULL then fail("sep argument must be a string or null") end
      local maxsplit = args[2] or -1
      if type(maxsplit) ~= "number" then fail("maxsplit argument must be a number") end
      return split(s, sep, maxsplit)
    end
  elseif name == "replace" then
    f = function(args)
      if #args < 2 then fail("replace() requires at least two arguments") end
      local old, new = args[1], args[2]
      if type(old) ~= "string" or type(new) ~= "string" then fail("replace() arguments must be strings") end
      local count = NULL
      if #args > 2 then
        if is_kwargs(args[3]) then count = args[3].map.count or NULL else count = args[3] end
      end
      if type(count) ~= "number" and count ~= NULL then fail("replace() count argument must be a number or null") end
      return replace(s, old, new, count ~= NULL and count or nil)
    end
  else
    return nil
  end
  return V.func(f, name)
end

local function compare(a, b, case_sensitive)
  if a == NULL and b == NULL then return 0 end
  if a == NULL or b == NULL then fail(("Cannot compare %s with %s"):format(kind(a), kind(b))) end
  if a == UNDEF and b == UNDEF then return 0 end
  if a == UNDEF or b == UNDEF then fail(("Cannot compare %s with %s"):format(kind(a), kind(b))) end
  local function numeric(x) return V.is_number(x) or type(x) == "boolean" end
  local function n(x) if type(x) == "boolean" then return x and 1 or 0 end return V.num(x) end
  if numeric(a) and numeric(b) then
    local x, y = n(a), n(b)
    return x < y and -1 or x > y and 1 or 0
  end
  if kind(a) ~= kind(b) then fail(("Cannot compare different types: %s and %s"):format(kind(a), kind(b))) end
  if type(a) == "string" then
    if not case_sensitive then a, b = text.lower(a), text.lower(b) end
    return a < b and -1 or a > b and 1 or 0
  end
  fail("Cannot compare type: " .. kind(a))
end

local function sorted(list, cmp)
  -- a stable sort, as Array.prototype.sort is
  local idx = {}
  for i = 1, #list do idx[i] = i end
  table.sort(idx, function(x, y)
    local c = cmp(list[x], list[y])
    if c ~= 0 then return c < 0 end
    return x < y
  end)
  local out = {}
  for i, k in ipairs(idx) do out[i] = list[k] end
  return V.list(out)
end

local function attribute_path(item, path)
  local v = item
  for part in (path .. "."):gmatch("([^.]*)%.") do
    if V.is_attrs(v) then
      v = v.map[part]
      if v == nil then v = UNDEF end
    elseif V.is_list(v) then
      local i = tonumber(part)
      if i and i >= 0 and i < #v and i == math.floor(i) then v = v[i + 1] else return UNDEF end
    else
      return UNDEF
    end
  end
  return v
end

local function dict_items(d)
  local out = {}
  for i, k in ipairs(d.keys) do out[i] = V.list({ k, d.map[k] }) end
  return V.list(out)
end

-- dict.method(...)
function M.dict_attr(d, name)
  local f
  if name == "get" then
    f = function(args)
      local key, default = args[1], args[2]
      if type(key) ~= "string" then fail("Object key must be a string: got " .. kind(key or UNDEF)) end
      local v = d.map[key]
      if v ~= nil then return v end
      return default or NULL
    end
  elseif name == "items" then f = function() return dict_items(d) end
  elseif name == "keys" then f = function() local out = {}; for i, k in ipairs(d.keys) do out[i] = k end; return V.list(out) end
  elseif name == "values" then f = function() local out = {}; for i, k in ipairs(d.keys) do out[i] = d.map[k] end; return V.list(out) end
  elseif name == "dictsort" then
    f = function(args)
      local kw, pos = {}, {}
      for _, a in ipairs(args) do if is_kwargs(a) then kw = a.map else pos[#pos + 1] = a end end
      local case_sensitive = pos[1] or kw.case_sensitive or false
      local by = pos[2] or kw.by or "key"
      local reverse = pos[3] or kw.reverse or false
      if type(case_sensitive) ~= "boolean" then fail("case_sensitive must be a boolean") end
      if by ~= "key" and by ~= "value" then fail("by must be either 'key' or 'value'") end
      if type(reverse) ~= "boolean" then fail("reverse must be a boolean") end
      local at = by == "key" and 1 or 2
      return sorted(dict_items(d), function(a, b)
        local c = compare(a[at], b[at], case_sensitive)
        return reverse and -c or c
      end)
    end
  else
    return nil
  end
  return V.func(f, name)
end

---------------------------------------------------------------------------------------------
-- tests: name -> fn(value, arg)
M.tests = {
  boolean = function(x) return type(x) == "boolean" end,
  callable = function(x) return V.is_func(x) end,
  odd = function(x) if type(x) ~= "number" then fail("cannot odd on " .. kind(x)) end return x % 2 ~= 0 end,
  even = function(x) if type(x) ~= "number" then fail("cannot even on " .. kind(x)) end return x % 2 == 0 end,
  ["false"] = function(x) return x == false end,
  ["true"] = function(x) return x == true end,
  none = function(x) return x == NULL end,
  string = function(x) return type(x) == "string" end,
  number = function(x) return V.is_number(x) end,
  integer = function(x) return type(x) == "number" end,
  iterable = function(x) return getmetatable(x) == V.LIST or type(x) == "string" end,
  mapping = function(x) return V.is_dict(x) end,
  sequence = function(x) return V.is_list(x) or V.is_dict(x) or type(x) == "string" end,
  lower = function(x) return type(x) == "string" and x == text.lower(x) end,
  upper = function(x) return type(x) == "string" and x == text.upper(x) end,
  defined = function(x) return x ~= UNDEF end,
  undefined = function(x) return x == UNDEF end,
  equalto = function(a, b) return V.strict_eq(a, b == nil and UNDEF or b) end,
}
M.tests.eq = M.tests.equalto

---------------------------------------------------------------------------------------------
-- Filters. `plain` are written `x | name`; `called` are `x | name(...)` and get the
-- evaluated positional arguments and a map of keyword arguments (and the argument nodes).
local function indent(s, width, first, blank)
  local lines = split(s, "\n", -1)
  if type(width) == "number" then require("clrt.jinja.budget").size(width) end
  local pad = type(width) == "string" and width or (" "):rep(width)
  for i, l in ipairs(lines) do
    if not ((not first and i == 1) or (not blank and l == "")) then lines[i] = pad .. l end
  end
  return table.concat(lines, "\n")
end

function M.plain_filter(v, name)
  if name == "safe" then return v end
  if name == "tojson" then return V.tojson(v, {}) end
  local k = kind(v)
  if V.is_list(v) then
    if name == "list" then return v end
    if name == "first" then return v[1] or UNDEF end
    if name == "last" then return v[#v] or UNDEF end
    if name == "length" then return #v end
    if name == "reverse" then local out = {}; for i = #v, 1, -1 do out[#out + 1] = v[i] end; return V.list(out) end
    if name == "sort" then return sorted(v, function(a, b) return compare(a, b, false) end) end
    if name == "join" then
      local parts = {}
      for i, x in ipairs(v) do parts[i] = V.js_string(x) end
      return table.concat(parts)
    end
    if name == "string" then return V.tojson(v, {}, 0, false) end
    if name == "unique" then
      local seen, out = {}, {}
      for _, x in ipairs(v) do
        local key = (type(x) == "table" and getmetatable(x) == V.FLOAT) and x.v or x
        if not seen[key] then seen[key] = true; out[#out + 1] = x end
      end
      return V.list(out)
    end
    fail("unknown filter '" .. name .. "' on a list")
  elseif type(v) == "string" then
    if name == "length" then return text.js_length(v) end
    if name == "upper" or name == "lower" or name == "title" or name == "capitalize" then
      return M.string_attr(v, name).fn({})
    end
    if name == "trim" then return text.trim(v) end
    if name == "indent" then return indent(v, 4, false, false) end
    if name == "join" or name == "string" then return v end
    if name == "int" then return text.parse_int(v) or 0 end
    if name == "float" then return V.float(text.parse_float(v) or 0) end
    fail("unknown filter '" .. name .. "' on a string")
  elseif V.is_number(v) then
    local x = V.num(v)
    if name == "abs" then return V.number(math.abs(x), V.is_float(v)) end
    if name == "int" then return math.floor(x) end
    if name == "float" then return V.float(x) end
    if name == "string" then return V.str(v) end
    fail("unknown filter '" .. name .. "' on a number")
  elseif V.is_dict(v) then
    if name == "items" then return dict_items(v) end
    if name == "length" then return #v.keys end
    local b = M.dict_attr(v, name)
    if b then return b.fn({}) end
    fail("unknown filter '" .. name .. "' on a dict")
  elseif type(v) == "boolean" then
    if name == "bool" then return v end
    if name == "int" then return v and 1 or 0 end
    if name == "float" then return V.float(v and 1 or 0) end
    if name == "string" then return tostring(v) end
    fail("unknown filter '" .. name .. "' on a boolean")
  end
  fail(("cannot apply filter '%s' to %s"):format(name, k == "UndefinedValue" and "an undefined value" or k))
end

function M.called_filter(v, name, args, kw, arg_nodes)
  if name == "tojson" then
    local ind = kw.indent or NULL
    if type(ind) ~= "number" and ind ~= NULL then fail("If set, indent must be a number") end
    local ea = kw.ensure_ascii or false
    if type(ea) ~= "boolean" then fail("If set, ensure_ascii must be a boolean") end
    local sk = kw.sort_keys or false
    if type(sk) ~= "boolean" then fail("If set, sort_keys must be a boolean") end
    local seps = kw.separators or NULL
    local sp
    if V.is_list(seps) then
      if #seps ~= 2 or type(seps[1]) ~= "string" or type(seps[2]) ~= "string" then fail("separators must be a tuple of two strings") end
      sp = { seps[1], seps[2] }
    elseif seps ~= NULL then
      fail("If set, separators must be a tuple of two strings")
    end
    return V.tojson(v, { indent = ind ~= NULL and ind or nil, ensure_ascii = ea, sort_keys = sk, separators = sp })
  elseif name == "join" then
    local items
    if type(v) == "string" then items = text.chars(v)
    elseif V.is_list(v) then items = {}; for i, x in ipairs(v) do items[i] = V.js_string(x) end
    else fail(("cannot apply filter 'join' to %s"):format(kind(v))) end
    local sep = args[1] or kw.separator or ""
    if type(sep) ~= "string" then fail("separator must be a string") end
    return table.concat(items, sep)
  elseif name == "int" or name == "float" then
    local default = args[1] or kw.default or (name == "int" and 0 or V.float(0))
    if type(v) == "string" then
      local x = name == "int" and text.parse_int(v) or text.parse_float(v)
      if x == nil then return default end
      return name == "int" and x or V.float(x)
    elseif V.is_number(v) then return v
    elseif type(v) == "boolean" then return name == "int" and (v and 1 or 0) or V.float(v and 1 or 0) end
    fail(("cannot apply filter '%s' to %s"):format(name, kind(v)))
  elseif name == "default" then
    local default = args[1] or ""
    local boolean = args[2] or kw.boolean or false
    if type(boolean) ~= "boolean" then fail("`default` filter flag must be a boolean") end
    if v == UNDEF or (boolean and not V.truthy(v)) then return default end
    return v
  end
  if V.is_list(v) then
    if name == "sort" then
      local reverse = args[1] or kw.reverse or false
      local cs = args[2] or kw.case_sensitive or false
      local attr = args[3] or kw.attribute or NULL
      if type(reverse) ~= "boolean" then fail("reverse must be a boolean") end
      if type(cs) ~= "boolean" then fail("case_sensitive must be a boolean") end
      if type(attr) ~= "string" and type(attr) ~= "number" and attr ~= NULL then fail("attribute must be a string, integer, or null") end
      local function key(x) if attr == NULL then return x end return attribute_path(x, tostring(attr)) end
      return sorted(v, function(a, b)
        local c = compare(key(a), key(b), cs)
        return reverse and -c or c
      end)
    elseif name == "selectattr" or name == "rejectattr" then
      for _, x in ipairs(v) do
        if not V.is_attrs(x) then fail("`" .. name .. "` can only be applied to array of objects") end
      end
      for _, n in ipairs(arg_nodes) do
        if n.k ~= "Str" then fail("arguments of `" .. name .. "` must be strings") end
      end
      local attr, test_name, value = args[1], args[2], args[3]
      local test
      if test_name then
        test = M.tests[test_name]
        if not test then fail("unknown test '" .. tostring(test_name) .. "'") end
      else
        test = function(x) return V.truthy(x) end
      end
      local out = {}
      for _, x in ipairs(v) do
        local a = x.map[attr]
        local r = false
        if a ~= nil then r = test(a, value) end
        if name == "selectattr" and r or name == "rejectattr" and not r then out[#out + 1] = x end
      end
      return V.list(out)
    elseif name == "map" then
      if kw.attribute == nil then fail("`map` without `attribute` is not supported") end
      if type(kw.attribute) ~= "string" then fail("attribute must be a string") end
      local out = {}
      for i, x in ipairs(v) do
        if not V.is_attrs(x) then fail("items in map must be an object") end
        local r = attribute_path(x, kw.attribute)
        if r == UNDEF then r = kw.default or UNDEF end
        out[i] = r
      end
      return V.list(out)
    end
    fail("unknown filter '" .. name .. "(...)' on a list")
  elseif type(v) == "string" then
    if name == "indent" then
      local width = args[1] or kw.width or 4
      if type(width) ~= "number" then fail("width must be a number") end
      local first = args[2] or kw.first or false
      local blank = args[3] or kw.blank or false
      return indent(v, width, V.truthy(first), V.truthy(blank))
    elseif name == "replace" then
      local a = { unpack(args) }
      a[#a + 1] = V.dict({}, kw, "kwargs")
      for k in pairs(kw) do a[#a].keys[#a[#a].keys + 1] = k end
      return M.string_attr(v, "replace").fn(a)
    end
    fail("unknown filter '" .. name .. "(...)' on a string")
  elseif V.is_dict(v) then
    local b = M.dict_attr(v, name)
    if b then
      local a = { unpack(args) }
      if next(kw) then
        local d = V.dict({}, {}, "kwargs")
        for k, x in pairs(kw) do V.dict_set(d, k, x) end
        a[#a + 1] = d
      end
      return b.fn(a)
    end
    fail("unknown filter '" .. name .. "(...)' on a dict")
  end
  fail(("cannot apply filter '%s' to %s"):format(name, kind(v) == "UndefinedValue" and "an undefined value" or kind(v)))
end

---------------------------------------------------------------------------------------------
-- Globals every render starts with.
local function range(args)
  local a, b, step = args[1], args[2], args[3] or 1
  for _, x in ipairs({ a, b or 0, step }) do
    if not V.is_number(x) then fail("range() takes numbers") end
  end
  a = V.num(a)
  if b == nil then a, b = 0, a else b = V.num(b) end
  step = V.num(step)
  if step == 0 then fail("range() step must not be zero") end
  require("clrt.jinja.budget").charge(math.max(0, math.ceil((b - a) / step)))   -- before the list exists
  local out, i = {}, a
  if step > 0 then while i < b do out[#out + 1] = i; i = i + step end
  else while i > b do out[#out + 1] = i; i = i + step end end
  return V.list(out)
end

local function strftime_now(args)
  local fmt = args[1]
  if type(fmt) ~= "string" then fail("strftime_now() takes a format string") end
  return (fmt:gsub("%%[YmdbBHM%%]", function(tk)
    if tk == "%%" then return "%" end
    return os.date(tk)
  end))
end

local function namespace(args)
  local pos = { unpack(args) }
  local kw
  if is_kwargs(pos[#pos]) then kw = table.remove(pos) end
  if #pos > 1 then fail("namespace expected at most 1 argument, got " .. #pos) end
  local ns = V.dict({}, {}, "namespace")
  local src = pos[1]
  if src ~= nil then
    if V.is_dict(src) then
      for _, k in ipairs(src.keys) do V.dict_set(ns, k, src.map[k]) end
    elseif V.is_list(src) then
      for _, pair in ipairs(src) do
        local kv = V.is_list(pair) and pair or (type(pair) == "string" and text.chars(pair)) or nil
        if not kv or #kv ~= 2 then fail("namespace expected an object or an iterable of [key, value] pairs") end
        if type(kv[1]) ~= "string" then fail("namespace keys must be strings") end
        V.dict_set(ns, kv[1], kv[2])
      end
    else
      fail("'" .. kind(src) .. "' object is not iterable")
    end
  end
  if kw then for _, k in ipairs(kw.keys) do V.dict_set(ns, k, kw.map[k]) end end
  return ns
end

local function raise_exception(args)
  local m = args[1]
  fail("raise_exception: " .. (m == nil and "undefined" or V.js_string(m)))
end

function M.globals()
  return {
    ["true"] = true, ["false"] = false, none = NULL, True = true, False = false, None = NULL,
    namespace = V.func(namespace, "namespace"),
    range = V.func(range, "range"),
    raise_exception = V.func(raise_exception, "raise_exception"),
    strftime_now = V.func(strftime_now, "strftime_now"),
  }
end

return M
