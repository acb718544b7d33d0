-- clrt.gen.json_constraint — JSON-constrained decoding: compile a JSON Schema (subset) into the C
-- automaton (runtime/text/json_grammar.c) and turn each row's state into a token mask.
--
--   local JC = require("clrt.gen.json_constraint")
--   local g = JC.compile(schema)            -- schema table, true (any value) or "object"
--   local c = JC.new{ tokenizer = tok, grammar = g, V = vocab_size, stop_ids = {eos} }
--   gen_opts.mask = function(row) return c:mask(row) end
--
-- Supported: type (a name or a list), properties / required / additionalProperties (objects
-- with properties are written in a fixed order: propertyOrdering if given, else the required
-- keys in their listed order, then the optional ones by name), enum / const, minLength /
-- maxLength, minimum / maximum / exclusiveMinimum / exclusiveMaximum (number and integer,
-- |bound| <= 2^53), items / minItems / maxItems, anyOf / oneOf whose alternatives start
-- differently (string vs number vs object ...; enum and const alternatives are merged),
-- allOf of one schema, nullable (OpenAPI's, which zod 3 emits), and $ref to any place in the
-- same document (#/$defs/X, #/definitions/X, #): a shared definition compiles once, and a
-- recursive one is unrolled four levels deep (below that only its non-recursive choices
-- remain: null, an empty array, an absent optional property). These are the shapes
-- openai's zodResponseFormat and Pydantic's model_json_schema() emit. Annotations (title,
-- description, default, examples, format, $schema, $id, $comment, strict, discriminator, ...)
-- are ignored; anything else (pattern, not, if, uniqueItems, ...) is an error. Every error
-- names the JSON path of the offending keyword, like $.properties.n.maximum.
local ffi = require("ffi")
local core = require("clrt.core.ffi")
local C = core.C

local M = {}

local ok_cjson, cjson = pcall(require, "cjson")
local json_null = ok_cjson and cjson.null or nil

local ANNOTATIONS = { title = true, description = true, default = true, examples = true, format = true,
  ["$schema"] = true, ["$id"] = true, ["$comment"] = true, strict = true, name = true, deprecated = true,
  readOnly = true, writeOnly = true, contentMediaType = true, contentEncoding = true, discriminator = true,
  ["$defs"] = true, definitions = true }
local KNOWN = { type = true, properties = true, required = true, additionalProperties = true, enum = true,
  const = true, minLength = true, maxLength = true, minimum = true, maximum = true, exclusiveMinimum = true,
  exclusiveMaximum = true, items = true, minItems = true, maxItems = true, anyOf = true, oneOf = true,
  propertyOrdering = true, allOf = true, nullable = true, ["$ref"] = true }
local WHY = { pattern = "regular expressions are not compiled into the grammar",
  patternProperties = "regular expressions are not compiled into the grammar",
  ["not"] = "negated schemas cannot be enforced", ["if"] = "conditional schemas cannot be enforced",
  ["then"] = "conditional schemas cannot be enforced", ["else"] = "conditional schemas cannot be enforced",
  uniqueItems = "uniqueness cannot be enforced while writing", multipleOf = "multipleOf cannot be enforced",
  prefixItems = "tuples are not supported" }

-- Bounds beyond 2^53 could not be honoured exactly (doubles skip integers there).
local BOUND_MAX = 9007199254740992
-- How many copies of a recursive schema one path may nest (the root counts as one).
local RECURSION_LEVELS = 4

local function fail(path, msg) error(("json_schema: %s (at %s)"):format(msg, path), 0) end

-- $.a.b for names, $.a["x y"] otherwise, $.anyOf[0] for list positions.
local function at(path, k)
  if type(k) == "number" then return ("%s[%d]"):format(path, k) end
  k = tostring(k)
  if k:match("^[%a_$][%w_$]*$") then return path .. "." .. k end
  return ("%s[\"%s\"]"):format(path, (k:gsub('[%c"\\]', function(c) return ("\\u%04x"):format(c:byte()) end)))
end

-- Valid UTF-8 without surrogates: enum strings and keys are written raw.
local function utf8_ok(s)
  local i, n = 1, #s
  while i <= n do
    local b = s:byte(i)
    local len, lo, hi = 1, 0x80, 0xBF
    if b < 0x80 then len = 1
    elseif b >= 0xC2 and b <= 0xDF then len = 2
    elseif b == 0xE0 then len, lo = 3, 0xA0
    elseif b == 0xED then len, hi = 3, 0x9F
    elseif b >= 0xE1 and b <= 0xEF then len = 3
    elseif b == 0xF0 then len, lo = 4, 0x90
    elseif b >= 0xF1 and b <= 0xF3 then len = 4
    elseif b == 0xF4 then len, hi = 4, 0x8F
    else return false end
    for k = 1, len - 1 do
      local c = s:byte(i + k)
      if not c then return false end
      if k == 1 and (c < lo or c > hi) then return false end
      if k > 1 and (c < 0x80 or c > 0xBF) then return false end
    end
    i = i + len
  end
  return true
end

local ESC = { ['"'] = '\\"', ['\\'] = '\\\\', ['\b'] = '\\b', ['\f'] = '\\f', ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t' }

-- The one spelling the automaton will allow for a literal value.
local function encode(v, path)
  local t = type(v)
  if v == json_null then return "null" end
  if t == "string" then
    if not utf8_ok(v) then fail(path, "a string value is not valid UTF-8") end
    return '"' .. v:gsub('[%c"\\]', function(c)
      return ESC[c] or (c:byte() < 0x20 and ("\\u%04x"):format(c:byte())) or c
    end) .. '"'
  elseif t == "boolean" then
    return tostring(v)
  elseif t == "number" then
    if v ~= v or v == math.huge or v == -math.huge then fail(path, "a value is not a finite number") end
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return ("%d"):format(v) end
    return ("%.17g"):format(v)
  elseif t == "table" then
    if #v > 0 or next(v) == nil then
      local parts = {}
      for i, x in ipairs(v) do parts[i] = encode(x, path) end
      return "[" .. table.concat(parts, ",") .. "]"
    end
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys)
    local parts = {}
    for i, k in ipairs(keys) do parts[i] = encode(tostring(k), path) .. ":" .. encode(v[k], path) end
    return "{" .. table.concat(parts, ",") .. "}"
  end
  fail(path, "a value of Lua type " .. t .. " has no JSON form")
end

local function type_of(v)
  if v == json_null then return "null" end
  local t = type(v)
  if t == "number" then return v == math.floor(v) and "integer" or "number" end
  if t == "table" then return (#v > 0 or next(v) == nil) and "array" or "object" end
  return t
end

local function nonneg_int(s, key, path)
  local v = s[key]
  if v == nil then return nil end
  if type(v) ~= "number" or v < 0 or v ~= math.floor(v) then fail(at(path, key), key .. " must be a non-negative integer") end
  if v > 1e9 then fail(at(path, key), key .. " above 1e9 is not supported") end
  return v
end

-- The first bytes a value of each kind can start with (anyOf alternatives must differ in them).
local DIGITS = "-0123456789"
local function set_of(chars)
  local t = {}
  for i = 1, #chars do t[chars:sub(i, i)] = true end
  return t
end
local ANY_FIRST = set_of('{["tfn' .. DIGITS)

local Builder = {}
Builder.__index = Builder

-- A compiled node: its index, the bytes it can start with, and its literals when it is an
-- enum (anyOf merges enum alternatives). NEVER: a schema no value satisfies within the
-- recursion limit; its parents drop it where JSON lets them.
local NEVER = {}

-- The same compiled node, named for an anyOf error message (shared nodes are not changed).
local function tag(a, where)
  if a == NEVER then return a end
  return { id = a.id, first = a.first, lits = a.lits, any = a.any, where = where }
end

function Builder:node(kind, path, lo, hi, flags)
  local i = C.clrt_jschema_node(self.g, kind, lo or 0, hi or -1, flags or 0)
  if i < 0 then core.fail(3) end
  self.paths[i] = path
  return i
end

function Builder:check(st, path)
  if st ~= 0 then fail(path, (ffi.string(C.clrt_last_error()):gsub("^json [%a]+: ", ""))) end
end

function Builder:enum(lits, path)
  local n = self:node(C.CLRT_JSCHEMA_ENUM, path)
  local first = {}
  for _, s in ipairs(lits) do
    self:check(C.clrt_jschema_add_literal(self.g, n, s, #s), path)
    first[s:sub(1, 1)] = true
  end
  return { id = n, first = first, lits = lits }
end

function Builder:literals(values, path)
  local lits = {}
  for i, v in ipairs(values) do lits[i] = encode(v, at(path, i - 1)) end
  return lits
end

-- anyOf over compiled alternatives: NEVER ones dropped, enum ones merged into one enum, the
-- rest must start differently.
function Builder:alternatives(alts, path, key)
  local keep, lits, seen = {}, nil, {}
  for _, a in ipairs(alts) do
    if a ~= NEVER and a.any then return a end   -- any value already admits every alternative
  end
  for _, a in ipairs(alts) do
    if a ~= NEVER then
      if a.lits then
        lits = lits or {}
        for _, l in ipairs(a.lits) do
          if not seen[l] then seen[l] = true; lits[#lits + 1] = l end
        end
      else
        keep[#keep + 1] = a
      end
    end
  end
  if lits then keep[#keep + 1] = tag(self:enum(lits, path), "the enum values") end
  if #keep == 0 then return NEVER end
  if #keep == 1 then return keep[1] end
  for x = 1, #keep do
    for y = x + 1, #keep do
      for b in pairs(keep[x].first) do
        if keep[y].first[b] then
          fail(at(path, key), ("alternatives %s and %s can both start with '%s' (alternatives of the same JSON type are not supported)")
            :format(keep[x].where or "?", keep[y].where or "?", b))
        end
      end
    end
  end
  local n = self:node(C.CLRT_JSCHEMA_ANYOF, path)
  local first = {}
  for _, a in ipairs(keep) do
    self:check(C.clrt_jschema_add_child(self.g, n, a.id), path)
    for b in pairs(a.first) do first[b] = true end
  end
  return { id = n, first = first }
end

function Builder:number(s, ty, path)
  local flags, lo, hi = 0, 0, 0
  local lo_key, hi_key
  local function bound(key, ex_key, has, excl, is_min)
    local v, ex = s[key], s[ex_key]
    if v ~= nil and type(v) ~= "number" then fail(at(path, key), key .. " must be a number") end
    local used = key
    if type(ex) == "boolean" then        -- draft 4: a flag on minimum/maximum
      if ex and v ~= nil then flags = bit.bor(flags, excl) end
      ex = nil
    end
    if ex ~= nil then
      if type(ex) ~= "number" then fail(at(path, ex_key), ex_key .. " must be a number") end
      if v == nil or (is_min and ex >= v) or (not is_min and ex <= v) then v = ex; used = ex_key; flags = bit.bor(flags, excl) end
    end
    if v ~= nil then
      if not (math.abs(v) <= BOUND_MAX) then
        fail(at(path, used), ("%s %.17g is beyond +-2^53 (9007199254740992); larger bounds are not supported"):format(used, v))
      end
      flags = bit.bor(flags, has)
      if is_min then lo, lo_key = v, used else hi, hi_key = v, used end
    end
  end
  bound("minimum", "exclusiveMinimum", C.CLRT_JSCHEMA_HAS_MIN, C.CLRT_JSCHEMA_EXCL_MIN, true)
  bound("maximum", "exclusiveMaximum", C.CLRT_JSCHEMA_HAS_MAX, C.CLRT_JSCHEMA_EXCL_MAX, false)
  if lo_key and hi_key then
    local excl = bit.band(flags, C.CLRT_JSCHEMA_EXCL_MIN + C.CLRT_JSCHEMA_EXCL_MAX) ~= 0
    if hi < lo or (hi == lo and excl) then
      fail(at(path, hi_key), ("%s %.17g leaves no value above %s %.17g"):format(hi_key, hi, lo_key, lo))
    end
    if ty == "integer" then
      local a, b = math.ceil(lo), math.floor(hi)
      if a == lo and bit.band(flags, C.CLRT_JSCHEMA_EXCL_MIN) ~= 0 then a = a + 1 end
      if b == hi and bit.band(flags, C.CLRT_JSCHEMA_EXCL_MAX) ~= 0 then b = b - 1 end
      if b < a then fail(at(path, hi_key), ("no integer lies between %s %.17g and %s %.17g"):format(lo_key, lo, hi_key, hi)) end
    end
  end
  local n = self:node(ty == "integer" and C.CLRT_JSCHEMA_INTEGER or C.CLRT_JSCHEMA_NUMBER, path, lo, hi, flags)
  return { id = n, first = set_of(DIGITS) }
end

function Builder:typed(s, ty, path, depth)
  if ty == "string" then
    local lo, hi = nonneg_int(s, "minLength", path) or 0, nonneg_int(s, "maxLength", path) or -1
    if hi >= 0 and hi < lo then fail(at(path, "maxLength"), ("maxLength %d is below minLength %d"):format(hi, lo)) end
    return { id = self:node(C.CLRT_JSCHEMA_STRING, path, lo, hi), first = { ['"'] = true } }
  elseif ty == "number" or ty == "integer" then
    return self:number(s, ty, path)
  elseif ty == "boolean" then
    return self:enum({ "false", "true" }, path)
  elseif ty == "null" then
    return self:enum({ "null" }, path)
  elseif ty == "array" then
    if type(s.items) == "table" and #s.items > 0 then fail(at(path, "items"), "'items' as a list (tuple) is not supported") end
    local lo, hi = nonneg_int(s, "minItems", path) or 0, nonneg_int(s, "maxItems", path) or -1
    if hi >= 0 and hi < lo then fail(at(path, "maxItems"), ("maxItems %d is below minItems %d"):format(hi, lo)) end
    local child
    if s.items ~= nil and s.items ~= true then
      child = self:compile(s.items, at(path, "items"), depth + 1)
      if child == NEVER then
        if lo > 0 then return NEVER end
        hi = 0                            -- only the empty array is left
      end
    end
    local n = self:node(C.CLRT_JSCHEMA_ARRAY, path, lo, hi)
    if child and child ~= NEVER then self:check(C.clrt_jschema_add_child(self.g, n, child.id), at(path, "items")) end
    return { id = n, first = { ["["] = true } }
  elseif ty == "object" then
    local props, ap = s.properties, s.additionalProperties
    if props ~= nil and type(props) ~= "table" then fail(at(path, "properties"), "properties must be an object") end
    if ap ~= nil and type(ap) ~= "table" and type(ap) ~= "boolean" then
      fail(at(path, "additionalProperties"), "additionalProperties must be a boolean or a schema")
    end
    local req = s.required or {}
    if type(req) ~= "table" then fail(at(path, "required"), "required must be a list of names") end
    if (props == nil or next(props) == nil) and ap ~= false then
      if #req > 0 then fail(at(path, "required"), "required without properties is not supported") end
      local child = type(ap) == "table" and self:compile(ap, at(path, "additionalProperties"), depth + 1) or nil
      if child == NEVER then   -- no value fits: only {} is left
        return { id = self:node(C.CLRT_JSCHEMA_OBJECT, path), first = { ["{"] = true } }
      end
      local n = self:node(C.CLRT_JSCHEMA_MAP, path)
      if child then self:check(C.clrt_jschema_add_child(self.g, n, child.id), at(path, "additionalProperties")) end
      return { id = n, first = { ["{"] = true } }
    end
    props = props or {}
    local is_req, order, seen = {}, {}, {}
    for i, k in ipairs(req) do
      if type(k) ~= "string" then fail(at(at(path, "required"), i - 1), "required must be a list of names") end
      if props[k] == nil then fail(at(at(path, "required"), i - 1), ("required property '%s' is not in properties"):format(k)) end
      is_req[k] = true
    end
    local function add(k)
      if props[k] ~= nil and not seen[k] then seen[k] = true; order[#order + 1] = k end
    end
    if type(s.propertyOrdering) == "table" then for _, k in ipairs(s.propertyOrdering) do add(k) end end
    for _, k in ipairs(req) do add(k) end
    local rest = {}
    for k in pairs(props) do
      if type(k) ~= "string" then fail(at(path, "properties"), "properties must be an object") end
      if not seen[k] then rest[#rest + 1] = k end
    end
    table.sort(rest)
    for _, k in ipairs(rest) do add(k) end
    local kids = {}
    for i, k in ipairs(order) do
      local ppath = at(at(path, "properties"), k)
      local child = self:compile(props[k], ppath, depth + 1)
      if child == NEVER and is_req[k] then return NEVER end
      kids[i] = child
    end
    local n = self:node(C.CLRT_JSCHEMA_OBJECT, path)
    for i, k in ipairs(order) do
      if kids[i] ~= NEVER then
        local ppath = at(at(path, "properties"), k)
        local key = encode(k, ppath)
        self:check(C.clrt_jschema_add_property(self.g, n, key, #key, kids[i].id, is_req[k] and 1 or 0), ppath)
      end
    end
    return { id = n, first = { ["{"] = true } }
  end
  fail(at(path, "type"), ("type '%s' is not supported"):format(tostring(ty)))
end

-- The schema a "#/..." pointer names in the root document, or an error at path.
function Builder:resolve(ref, path)
  if type(ref) ~= "string" then fail(path, "$ref must be a string") end
  if ref:sub(1, 1) ~= "#" then fail(path, ("$ref '%s' points outside this schema; only '#...' refs are supported"):format(ref)) end
  local target = self.root
  local rest = ref:sub(2)
  if rest ~= "" and rest:sub(1, 1) ~= "/" then fail(path, ("$ref '%s' is not a JSON pointer (#/...)"):format(ref)) end
  for part in rest:gmatch("/([^/]*)") do
    part = part:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end):gsub("~1", "/"):gsub("~0", "~")
    if type(target) ~= "table" then target = nil; break end
    local nxt = target[part]
    if nxt == nil and part:match("^%d+$") then nxt = target[tonumber(part) + 1] end
    target = nxt
  end
  if target == nil or (type(target) ~= "table" and target ~= true) then
    fail(path, ("$ref '%s' names nothing in this schema"):format(ref))
  end
  return target
end

function Builder:compile_ref(s, path, depth)
  local rpath = at(path, "$ref")
  for k in pairs(s) do
    if KNOWN[k] and k ~= "$ref" then
      fail(at(path, k), ("'%s' beside $ref is not supported"):format(k))
    end
  end
  local target = self:resolve(s["$ref"], rpath)
  local open = self.open[target] or 0
  if open == 0 and self.done[target] then return self.done[target] end
  if open >= RECURSION_LEVELS then
    self.cut = self.cut + 1
    return NEVER
  end
  self.open[target] = open + 1
  local cut0 = self.cut
  local r = self:compile(target, rpath, depth + 1)
  self.open[target] = open
  -- shared, not recursive: compiled once for every place that refers to it
  if open == 0 and self.cut == cut0 then self.done[target] = r end
  if r == NEVER and (open == 0 or (target == self.root and open == 1)) then
    fail(rpath, ("$ref '%s' refers to itself with no way to stop (every value would be infinite)"):format(s["$ref"]))
  end
  return r
end

function Builder:compile(s, path, depth)
  if depth > 64 then fail(path, "nests deeper than 64 levels") end
  if s == true then return { id = self:node(C.CLRT_JSCHEMA_ANY, path), first = ANY_FIRST, any = true } end
  if type(s) ~= "table" or (next(s) ~= nil and #s > 0) then fail(path, "a schema must be an object or true") end
  for k in pairs(s) do
    if not KNOWN[k] and not ANNOTATIONS[k] then
      fail(at(path, k), ("'%s' is not supported%s"):format(tostring(k), WHY[k] and (" (" .. WHY[k] .. ")") or ""))
    end
  end
  if s.nullable == true then           -- OpenAPI's nullable: the schema or null
    local copy = {}
    for k, v in pairs(s) do if k ~= "nullable" then copy[k] = v end end
    local inner = self:compile(copy, path, depth)
    if inner ~= NEVER and inner.first.n then return inner end
    return self:alternatives({ tag(inner, "the schema"), tag(self:enum({ "null" }, path), "null") }, path, "nullable")
  elseif s.nullable ~= nil and s.nullable ~= false then
    fail(at(path, "nullable"), "nullable must be a boolean")
  end
  if s["$ref"] ~= nil then return self:compile_ref(s, path, depth) end
  if s.allOf ~= nil then
    if type(s.allOf) ~= "table" or #s.allOf ~= 1 then
      fail(at(path, "allOf"), "allOf is supported with exactly one schema")
    end
    for k in pairs(s) do
      if KNOWN[k] and k ~= "allOf" then fail(at(path, k), ("'%s' beside allOf is not supported"):format(k)) end
    end
    return self:compile(s.allOf[1], at(at(path, "allOf"), 0), depth + 1)
  end
  if s.enum ~= nil or s.const ~= nil then
    local key = s.const ~= nil and "const" or "enum"
    local values = s.enum
    if s.const ~= nil then values = { s.const } end
    if type(values) ~= "table" then fail(at(path, "enum"), "enum must be a list") end
    if s.enum ~= nil and s.const ~= nil then
      local hit = false
      for _, v in ipairs(s.enum) do if encode(v, at(path, "enum")) == encode(s.const, at(path, "const")) then hit = true end end
      if not hit then fail(at(path, "const"), "const is not among the enum values") end
    end
    local types = s.type
    if type(types) == "string" then types = { types } end
    local keep = {}
    for _, v in ipairs(values) do
      local ok = types == nil
      for _, t in ipairs(types or {}) do
        local vt = type_of(v)
        if t == vt or (t == "number" and vt == "integer") then ok = true end
      end
      if ok then keep[#keep + 1] = v end
    end
    if #keep == 0 then fail(at(path, key), key .. " has no value of the given type") end
    return self:enum(self:literals(keep, at(path, key)), path)
  end
  local alts = s.anyOf or s.oneOf
  if alts ~= nil then
    local key = s.anyOf ~= nil and "anyOf" or "oneOf"
    if s.anyOf ~= nil and s.oneOf ~= nil then fail(at(path, "oneOf"), "anyOf together with oneOf is not supported") end
    if type(alts) ~= "table" or #alts == 0 then fail(at(path, key), key .. " must be a non-empty list") end
    for k in pairs(s) do
      if KNOWN[k] and k ~= "anyOf" and k ~= "oneOf" then fail(at(path, k), ("'%s' beside %s is not supported"):format(k, key)) end
    end
    local compiled = {}
    for i, a in ipairs(alts) do
      compiled[i] = tag(self:compile(a, at(at(path, key), i - 1), depth + 1), tostring(i - 1))
    end
    return self:alternatives(compiled, path, key)
  end
  local ty = s.type
  if ty == nil then
    if s.properties ~= nil or s.additionalProperties ~= nil or s.required ~= nil then ty = "object"
    elseif s.items ~= nil or s.minItems ~= nil or s.maxItems ~= nil then ty = "array"
    elseif s.minLength ~= nil or s.maxLength ~= nil then ty = "string"
    elseif s.minimum ~= nil or s.maximum ~= nil or s.exclusiveMinimum ~= nil or s.exclusiveMaximum ~= nil then ty = "number"
    else return { id = self:node(C.CLRT_JSCHEMA_ANY, path), first = ANY_FIRST, any = true } end
  end
  if type(ty) == "table" then
    if #ty == 0 then fail(at(path, "type"), "type must not be an empty list") end
    if #ty == 1 then return self:typed(s, ty[1], path, depth) end
    local has, list = {}, {}
    for i, t in ipairs(ty) do
      if type(t) ~= "string" then fail(at(at(path, "type"), i - 1), "a type must be a name") end
      has[t] = true
    end
    for _, t in ipairs(ty) do
      if not (t == "integer" and has.number) then   -- number already admits the integers
        list[#list + 1] = tag(self:typed(s, t, path, depth), "'" .. t .. "'")
      end
    end
    return self:alternatives(list, path, "type")
  end
  return self:typed(s, ty, path, depth)
end

-- schema: a JSON Schema table, true (any JSON value) or "object" (any JSON object).
-- opts.max_ws: 1 (default) allows one optional space or newline between JSON tokens, 0 none.
function M.compile(schema, opts)
  opts = opts or {}
  local max_ws = opts.max_ws or 1
  if max_ws ~= 0 and max_ws ~= 1 then
    error(("json_schema: whitespace %s must be 0 (compact) or 1 (one optional space or newline per gap)"):format(tostring(max_ws)), 0)
  end
  local g = C.clrt_jschema_new(max_ws)
  if g == nil then core.fail(2) end
  g = ffi.gc(g, C.clrt_jschema_free)
  local b = setmetatable({ g = g, root = schema, paths = {}, open = {}, done = {}, cut = 0 }, Builder)
  local root
  if schema == "object" then
    root = b:node(C.CLRT_JSCHEMA_MAP, "$")
  else
    if type(schema) == "table" then b.open[schema] = 1 end   -- "#" re-enters the root
    local r = b:compile(schema, "$", 0)
    if r == NEVER then fail("$", "no value satisfies the schema") end
    root = r.id
  end
  if C.clrt_jschema_finish(g, root) ~= 0 then
    local msg = ffi.string(C.clrt_last_error()):gsub("^json [%a]+: ", ""):gsub(" %(node %d+%)", "")
    fail(b.paths[C.clrt_jschema_error_node(g)] or "$", msg)
  end
  return { grammar = g, schema = schema }
end

-- Raw bytes of every token id below V; "" for ids that can never be JSON text (special and
-- added tokens, ids past the tokenizer's vocabulary). tok: token_bytes(id), vocab_size() and
-- optionally is_special(id) / added[id].
function M.token_bytes(tok, V)
  local out, n = {}, tok.vocab_size and tok:vocab_size() or V
  for id = 0, V - 1 do
    local b = ""
    if id < n and not (tok.added and tok.added[id]) and not (tok.is_special and tok:is_special(id)) then
      b = tok:token_bytes(id) or ""
    end
    out[id + 1] = b
  end
  return out
end

-- A trie over a list of byte strings (list[id + 1]); built once, shared by every request.
function M.vocab_from_bytes(list)
  local V = #list
  local off = ffi.new("int64_t[?]", V + 1)
  for i = 1, V do off[i] = off[i - 1] + #list[i] end
  local all = table.concat(list)
  local v = C.clrt_jschema_vocab_new(all, off, V)
  if v == nil then core.fail(2) end
  return ffi.gc(v, C.clrt_jschema_vocab_free)
end

local vocab_cache = setmetatable({}, { __mode = "k" })
function M.vocab(tok, V)
  local per = vocab_cache[tok]
  if not per then per = {}; vocab_cache[tok] = per end
  if not per[V] then
    local bytes = M.token_bytes(tok, V)
    per[V] = { trie = M.vocab_from_bytes(bytes), bytes = bytes }
  end
  return per[V]
end

local Constraint = {}
Constraint.__index = Constraint

-- new{tokenizer | vocab (from M.vocab / {trie, bytes}), schema | grammar, V, stop_ids, max_ws}
function M.new(opts)
  local V = opts.V
  local voc = opts.vocab or M.vocab(opts.tokenizer, V)
  V = V or #voc.bytes
  local g = opts.grammar or M.compile(opts.schema == nil and true or opts.schema, { max_ws = opts.max_ws })
  if C.clrt_jschema_vocab_size(voc.trie) ~= V then
    error(("json constraint: the vocabulary has %d ids but the model %d"):format(C.clrt_jschema_vocab_size(voc.trie), V), 2)
  end
  local stops = opts.stop_ids or {}
  local self = setmetatable({
    V = V, vocab = voc, g = g,
    stops = ffi.new("int32_t[?]", math.max(1, #stops)), nstop = #stops,
    buf = ffi.new("uint8_t[?]", V),
    rows = setmetatable({}, { __mode = "k" }),
  }, Constraint)
  for i, s in ipairs(stops) do self.stops[i - 1] = s end
  return self
end

function Constraint:state()
  local s = C.clrt_jschema_state_new(self.g.grammar)
  if s == nil then core.fail(2) end
  return ffi.gc(s, C.clrt_jschema_state_free)
end

-- Feed a token to a state; raises if its bytes leave the grammar.
function Constraint:advance(s, id)
  local b = self.vocab.bytes[id + 1]
  if C.clrt_jschema_state_advance(s, b, #b) ~= 0 then
    error(("json constraint: token %d (%q) does not fit the grammar: %s"):format(id, b, ffi.string(C.clrt_last_error())), 2)
  end
end

function Constraint:complete(s) return C.clrt_jschema_state_complete(s) == 1 end

-- The allowed-token mask [V] for a state; nil, count when nothing is (the value is complete
-- and there is no stop id to end it with).
function Constraint:fill(s, out)
  out = out or self.buf
  local n = C.clrt_jschema_fill_mask(self.vocab.trie, s, self.stops, self.nstop, out)
  if n < 0 then core.fail(2) end
  return n > 0 and out or nil, n
end

-- gen_opts.mask: the row's state follows row.tokens; false ends the row (value complete).
function Constraint:mask(row)
  local r = self.rows[row]
  if not r then r = { s = self:state(), n = 0 }; self.rows[row] = r end
  while r.n < #row.tokens do
    r.n = r.n + 1
    self:advance(r.s, row.tokens[r.n])
  end
  local m = self:fill(r.s)
  if m == nil then return false end
  return m
end

return M
