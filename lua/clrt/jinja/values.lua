-- clrt.jinja.values — the template's values, typed as @huggingface/jinja types them:
--   string            a Lua string (UTF-8)
--   integer           a Lua number with an integral value
--   float             M.float(x): a box, so 2.0 prints "2.0" where an integer 2 prints "2"
--   boolean           a Lua boolean
--   none / undefined  M.NULL / M.UNDEF
--   list / tuple      M.list{...} / M.tuple{...} (tuples are lists, except for `is iterable`)
--   dict              M.dict(keys, map): keys in insertion order (tojson and items keep it)
--   keyword arguments M.dict with kind "kwargs"; namespace() objects kind "namespace"
--   function          M.func(fn(args, env))
-- and the rules it takes from JavaScript: truthiness, ==, printing, tojson.
local text = require("clrt.jinja.text")
local json = require("clrt.json")

local M = {}
local floor = math.floor

M.NULL = json.null
M.UNDEF = setmetatable({}, { __tostring = function() return "undefined" end })

local FLOAT, LIST, TUPLE, DICT, FUNC = {}, {}, {}, {}, {}
M.FLOAT, M.LIST, M.TUPLE, M.DICT, M.FUNC = FLOAT, LIST, TUPLE, DICT, FUNC

function M.float(x) return setmetatable({ v = x }, FLOAT) end
function M.list(t) return setmetatable(t or {}, LIST) end
function M.tuple(t) return setmetatable(t or {}, TUPLE) end
function M.dict(keys, map, kind) return setmetatable({ keys = keys or {}, map = map or {}, kind = kind or "dict" }, DICT) end
function M.func(fn, name) return setmetatable({ fn = fn, name = name }, FUNC) end

function M.dict_set(d, k, v)
  if d.map[k] == nil then d.keys[#d.keys + 1] = k end
  d.map[k] = v
end

-- Type names as the reference's errors write them.
function M.kind(v)
  local t = type(v)
  if t == "string" then return "StringValue" end
  if t == "number" then return "IntegerValue" end
  if t == "boolean" then return "BooleanValue" end
  if v == M.NULL then return "NullValue" end
  if v == M.UNDEF then return "UndefinedValue" end
  local mt = getmetatable(v)
  if mt == FLOAT then return "FloatValue" end
  if mt == LIST then return "ArrayValue" end
  if mt == TUPLE then return "TupleValue" end
  if mt == FUNC then return "FunctionValue" end
  if mt == DICT then
    return v.kind == "namespace" and "NamespaceValue" or v.kind == "kwargs" and "KeywordArgumentsValue" or "ObjectValue"
  end
  return "unknown"
end

function M.is_list(v) local mt = getmetatable(v); return mt == LIST or mt == TUPLE end
function M.is_dict(v) return getmetatable(v) == DICT and v.kind ~= "namespace" end
function M.is_attrs(v) return getmetatable(v) == DICT end      -- dict or namespace
function M.is_float(v) return getmetatable(v) == FLOAT end
function M.is_number(v) return type(v) == "number" or getmetatable(v) == FLOAT end
function M.is_func(v) return getmetatable(v) == FUNC end
function M.num(v) if type(v) == "number" then return v end return v.v end

-- A number result: a float box when the operation gives a float.
function M.number(x, is_float) if is_float then return M.float(x) end return x end

-- Python-style truthiness as the reference computes it.
function M.truthy(v)
  local t = type(v)
  if t == "string" then return v ~= "" end
  if t == "number" then return v ~= 0 and v == v end
  if t == "boolean" then return v end
  if v == M.NULL or v == M.UNDEF then return false end
  local mt = getmetatable(v)
  if mt == FLOAT then return v.v ~= 0 and v.v == v.v end
  if mt == LIST or mt == TUPLE then return #v > 0 end
  if mt == DICT then return v.kind == "namespace" or #v.keys > 0 end
  return true
end

---------------------------------------------------------------------------------------------
-- JSON as the reference's tojson writes it.
function M.tojson(v, o, depth, undef_as_null)
  o = o or {}
  depth = depth or 0
  if undef_as_null == nil then undef_as_null = true end
  local indent = o.indent
  if indent == 0 then indent = nil end
  local item_sep, key_sep
  if o.separators then item_sep, key_sep = o.separators[1], o.separators[2]
  elseif indent then item_sep, key_sep = ",", ": "
  else item_sep, key_sep = ", ", ": " end
  local t = type(v)
  if v == M.NULL then return "null" end
  if v == M.UNDEF then return undef_as_null and "null" or "undefined" end
  if t == "number" or getmetatable(v) == FLOAT then     -- JSON has no NaN or Infinity: null
    local x = t == "number" and v or v.v
    if x ~= x or x == math.huge or x == -math.huge then return "null" end
    return text.js_number(x)
  end
  if t == "boolean" then return tostring(v) end
  if t == "string" then
    local s = text.json_quote(v)
    return o.ensure_ascii and text.ascii_safe(s) or s
  end
  local mt = getmetatable(v)
  if indent then require("clrt.jinja.budget").size(indent * (depth + 1)) end
  local pad = indent and (" "):rep(indent) or ""
  local base = "\n" .. pad:rep(depth)
  local child = base .. pad
  if mt == TUPLE then error("Cannot convert to JSON: TupleValue", 0) end   -- as the reference
  if mt == LIST then
    local parts = {}
    for i = 1, #v do parts[i] = M.tojson(v[i], o, depth + 1, undef_as_null) end
    if indent and #parts > 0 then return "[" .. child .. table.concat(parts, item_sep .. child) .. base .. "]" end
    return "[" .. table.concat(parts, item_sep) .. "]"
  end
  if mt == DICT then
    local keys = v.keys
    if o.sort_keys then
      keys = { unpack(keys) }
      table.sort(keys, function(a, b)
        local la, lb = a:lower(), b:lower()
        if la ~= lb then return la < lb end
        return a < b
      end)
    end
    local parts = {}
    for i, k in ipairs(keys) do
      local ks = text.json_quote(k)
      if o.ensure_ascii then ks = text.ascii_safe(ks) end
      local s = ks .. key_sep .. M.tojson(v.map[k], o, depth + 1, undef_as_null)
      parts[i] = indent and child .. s or s
    end
    if indent and #parts > 0 then return "{" .. table.concat(parts, item_sep) .. base .. "}" end
    return "{" .. table.concat(parts, item_sep) .. "}"
  end
  error("cannot convert to JSON: " .. M.kind(v), 0)
end

-- What {{ v }} prints (none and undefined print nothing, handled by the caller).
function M.str(v)
  local t = type(v)
  if t == "string" then return v end
  if t == "number" then return text.js_number(v) end
  if t == "boolean" then return tostring(v) end
  local mt = getmetatable(v)
  if mt == FLOAT then
    local x = v.v
    if x == 0 and 1 / x < 0 then return "-0.0" end
    if x == floor(x) and x == x and math.abs(x) ~= math.huge then return text.js_number(x) .. ".0" end
    return text.js_number(x)
  end
  if mt == LIST or mt == TUPLE or mt == DICT then return M.tojson(v, {}, 0, false) end
  if v == M.NULL then return "null" end
  if v == M.UNDEF then return "undefined" end
  error("cannot print a " .. M.kind(v), 0)
end

-- JavaScript's String(x.value): what ~ and + write for an operand (2.0 writes "2", a list
-- its items joined by ",", a dict "[object Map]").
function M.js_string(v)
  local t = type(v)
  if t == "string" then return v end
  if t == "number" then return text.js_number(v) end
  if t == "boolean" then return tostring(v) end
  local mt = getmetatable(v)
  if mt == FLOAT then return text.js_number(v.v) end
  if mt == LIST or mt == TUPLE then
    local parts = {}
    for i = 1, #v do
      local x = v[i]
      parts[i] = (x == M.NULL and "null") or (x == M.UNDEF and "undefined") or M.str(x)
    end
    return table.concat(parts, ",")
  end
  if mt == DICT then return "[object Map]" end
  if v == M.NULL then return "null" end
  if v == M.UNDEF then return "undefined" end
  return "function"
end

-- JavaScript's loose == on the operands' raw values.
local function to_js_number(v)
  local t = type(v)
  if t == "number" then return v end
  if t == "boolean" then return v and 1 or 0 end
  if getmetatable(v) == FLOAT then return v.v end
  if t == "string" then
    local s = text.trim(v)
    if s == "" then return 0 end
    return tonumber(s) or (0 / 0)
  end
  return nil
end

function M.loose_eq(a, b)
  if a == b then return true end
  local na, nb = a == M.NULL or a == M.UNDEF, b == M.NULL or b == M.UNDEF
  if na or nb then return na and nb end
  local ta, tb = type(a), type(b)
  if ta == "string" and tb == "string" then return false end
  local ma, mb = getmetatable(a), getmetatable(b)
  local oa = ta == "table" and ma ~= FLOAT
  local ob = tb == "table" and mb ~= FLOAT
  if oa and ob then return false end        -- two objects: same one only
  if oa then a, ta = M.js_string(a), "string"; if ma == DICT or ma == FUNC then return a == b end end
  if ob then b, tb = M.js_string(b), "string"; if mb == DICT or mb == FUNC then return a == b end end
  if ta == "string" and tb == "string" then return a == b end
  local x, y = to_js_number(a), to_js_number(b)
  return x ~= nil and y ~= nil and x == y
end

-- JavaScript's === on raw values (list membership).
function M.strict_eq(a, b)
  if a == b then return true end
  if M.is_number(a) and M.is_number(b) then return M.num(a) == M.num(b) end
  return false
end

---------------------------------------------------------------------------------------------
-- Lua data (clrt.json's decoding, or tables written in Lua) to template values: arrays to
-- lists, tables to dicts in the key order clrt.json recorded (else sorted), nil and
-- json.null to none.
function M.from_lua(x)
  local t = type(x)
  if t == "string" or t == "boolean" then return x end
  if t == "number" then
    if x == floor(x) or x ~= x or math.abs(x) == math.huge then return x end
    return M.float(x)
  end
  if t == "nil" or x == json.null then return M.NULL end
  if t == "function" then
    return M.func(function(args)
      local raw = {}
      for i, a in ipairs(args) do raw[i] = M.to_lua(a) end
      return M.from_lua(x(unpack(raw, 1, #args)))
    end)
  end
  if t == "table" then
    local mt = getmetatable(x)
    if mt == LIST or mt == TUPLE or mt == DICT or mt == FLOAT or mt == FUNC or x == M.UNDEF then return x end
    if json.is_array(x) or (next(x) == nil and mt ~= getmetatable(json.object())) then
      local out = {}
      for i = 1, #x do out[i] = M.from_lua(x[i]) end
      return M.list(out)
    end
    local keys, map = {}, {}
    for _, k in ipairs(json.keys_of(x, "$")) do
      local ks = type(k) == "string" and k or tostring(k)
      keys[#keys + 1] = ks
      map[ks] = M.from_lua(x[k])
    end
    return M.dict(keys, map)
  end
  error("chat template: cannot pass a Lua " .. t .. " to a template", 0)
end

function M.to_lua(v)
  if v == M.NULL or v == M.UNDEF then return nil end
  local mt = getmetatable(v)
  if mt == FLOAT then return v.v end
  if mt == LIST or mt == TUPLE then
    local out = {}
    for i = 1, #v do out[i] = M.to_lua(v[i]) end
    return out
  end
  if mt == DICT then
    local out = {}
    for _, k in ipairs(v.keys) do out[k] = M.to_lua(v.map[k]) end
    return out
  end
  return v
end

return M
