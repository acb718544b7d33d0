-- clrt.json_constraint — JSON-constrained decoding: compile a JSON Schema (subset) into the C
-- automaton (runtime/json_grammar.c) and turn each row's state into a token mask.
--
--   local JC = require("clrt.json_constraint")
--   local g = JC.compile(schema)            -- schema table, true (any value) or "object"
--   local c = JC.new{ tokenizer = tok, grammar = g, V = vocab_size, stop_ids = {eos} }
--   gen_opts.mask = function(row) return c:mask(row) end
--
-- Supported: type (a name or a list), properties / required / additionalProperties (objects
-- with properties are written in a fixed order: propertyOrdering if given, else the required
-- keys in their listed order, then the optional ones by name), enum / const, minLength /
-- maxLength, minimum / maximum / exclusiveMinimum / exclusiveMaximum (number and integer),
-- items / minItems / maxItems, anyOf / oneOf whose alternatives start differently (string vs
-- number vs object ...). Annotations (title, description, default, examples, format, $schema,
-- $id, $comment, strict) are ignored; anything else is an error that names the keyword.
local ffi = require("ffi")
local core = require("clrt.ffi")
local C = core.C

local M = {}

local ok_cjson, cjson = pcall(require, "cjson")
local json_null = ok_cjson and cjson.null or nil

local ANNOTATIONS = { title = true, description = true, default = true, examples = true, format = true,
  ["$schema"] = true, ["$id"] = true, ["$comment"] = true, strict = true, name = true, deprecated = true,
  readOnly = true, writeOnly = true, contentMediaType = true, contentEncoding = true }
local KNOWN = { type = true, properties = true, required = true, additionalProperties = true, enum = true,
  const = true, minLength = true, maxLength = true, minimum = true, maximum = true, exclusiveMinimum = true,
  exclusiveMaximum = true, items = true, minItems = true, maxItems = true, anyOf = true, oneOf = true,
  propertyOrdering = true }

local function fail(path, msg) error(("json_schema: %s (at %s)"):format(msg, path), 0) end

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
  if type(v) ~= "number" or v < 0 or v ~= math.floor(v) then fail(path, key .. " must be a non-negative integer") end
  return v
end

local Builder = {}
Builder.__index = Builder

function Builder:node(kind, lo, hi, flags)
  local i = C.clrt_jschema_node(self.g, kind, lo or 0, hi or -1, flags or 0)
  if i < 0 then core.fail(3) end
  return i
end

function Builder:check(st)
  if st ~= 0 then error("json_schema: " .. ffi.string(C.clrt_last_error()), 0) end
end

function Builder:enum(values, path)
  local n = self:node(C.CLRT_JSCHEMA_ENUM)
  for _, v in ipairs(values) do
    local s = encode(v, path)
    self:check(C.clrt_jschema_add_literal(self.g, n, s, #s))
  end
  return n
end

function Builder:typed(s, ty, path, depth)
  if ty == "string" then
    local lo, hi = nonneg_int(s, "minLength", path) or 0, nonneg_int(s, "maxLength", path) or -1
    return self:node(C.CLRT_JSCHEMA_STRING, lo, hi)
  elseif ty == "number" or ty == "integer" then
    local flags, lo, hi = 0, 0, 0
    local function bound(key, ex_key, has, excl, is_min)
      local v, ex = s[key], s[ex_key]
      if v ~= nil and type(v) ~= "number" then fail(path, key .. " must be a number") end
      if type(ex) == "boolean" then        -- draft 4: a flag on minimum/maximum
        if ex and v ~= nil then flags = bit.bor(flags, excl) end
        ex = nil
      end
      if ex ~= nil then
        if type(ex) ~= "number" then fail(path, ex_key .. " must be a number") end
        if v == nil or (is_min and ex >= v) or (not is_min and ex <= v) then v = ex; flags = bit.bor(flags, excl) end
      end
      if v ~= nil then
        flags = bit.bor(flags, has)
        if is_min then lo = v else hi = v end
      end
    end
    bound("minimum", "exclusiveMinimum", C.CLRT_JSCHEMA_HAS_MIN, C.CLRT_JSCHEMA_EXCL_MIN, true)
    bound("maximum", "exclusiveMaximum", C.CLRT_JSCHEMA_HAS_MAX, C.CLRT_JSCHEMA_EXCL_MAX, false)
    return self:node(ty == "integer" and C.CLRT_JSCHEMA_INTEGER or C.CLRT_JSCHEMA_NUMBER, lo, hi, flags)
  elseif ty == "boolean" then
    return self:enum({ false, true }, path)
  elseif ty == "null" then
    return self:enum({ json_null or "null" }, path)
  elseif ty == "array" then
    if type(s.items) == "table" and #s.items > 0 then fail(path, "'items' as a list (tuple) is not supported") end
    local lo, hi = nonneg_int(s, "minItems", path) or 0, nonneg_int(s, "maxItems", path) or -1
    local n = self:node(C.CLRT_JSCHEMA_ARRAY, lo, hi)
    if s.items ~= nil and s.items ~= true then
      self:check(C.clrt_jschema_add_child(self.g, n, self:compile(s.items, path .. "/items", depth + 1)))
    end
    return n
  elseif ty == "object" then
    local props, ap = s.properties, s.additionalProperties
    if props ~= nil and type(props) ~= "table" then fail(path, "properties must be an object") end
    if ap ~= nil and type(ap) ~= "table" and type(ap) ~= "boolean" then fail(path, "additionalProperties must be a boolean or a schema") end
    local req = s.required or {}
    if type(req) ~= "table" then fail(path, "required must be a list of names") end
    if (props == nil or next(props) == nil) and ap ~= false then
      if #req > 0 then fail(path, "required without properties is not supported") end
      local n = self:node(C.CLRT_JSCHEMA_MAP)
      if type(ap) == "table" then
        self:check(C.clrt_jschema_add_child(self.g, n, self:compile(ap, path .. "/additionalProperties", depth + 1)))
      end
      return n
    end
    props = props or {}
    local is_req, order, seen = {}, {}, {}
    for _, k in ipairs(req) do
      if type(k) ~= "string" then fail(path, "required must be a list of names") end
      if props[k] == nil then fail(path, ("required property '%s' is not in properties"):format(k)) end
      is_req[k] = true
    end
    local function add(k)
      if props[k] ~= nil and not seen[k] then seen[k] = true; order[#order + 1] = k end
    end
    if type(s.propertyOrdering) == "table" then for _, k in ipairs(s.propertyOrdering) do add(k) end end
    for _, k in ipairs(req) do add(k) end
    local rest = {}
    for k in pairs(props) do
      if type(k) ~= "string" then fail(path, "properties must be an object") end
      if not seen[k] then rest[#rest + 1] = k end
    end
    table.sort(rest)
    for _, k in ipairs(rest) do add(k) end
    local n = self:node(C.CLRT_JSCHEMA_OBJECT)
    for _, k in ipairs(order) do
      local child = self:compile(props[k], path .. "/properties/" .. k, depth + 1)
      local key = encode(k, path)
      self:check(C.clrt_jschema_add_property(self.g, n, key, #key, child, is_req[k] and 1 or 0))
    end
    return n
  end
  fail(path, ("type '%s' is not supported"):format(tostring(ty)))
end

function Builder:compile(s, path, depth)
  if depth > 40 then fail(path, "nests deeper than 40 levels") end
  if s == true then return self:node(C.CLRT_JSCHEMA_ANY) end
  if type(s) ~= "table" then fail(path, "a schema must be an object or true") end
  for k in pairs(s) do
    if not KNOWN[k] and not ANNOTATIONS[k] then
      fail(path, ("'%s' is not supported"):format(tostring(k)))
    end
  end
  if s.enum ~= nil or s.const ~= nil then
    local values = s.enum
    if s.const ~= nil then values = { s.const } end
    if type(values) ~= "table" then fail(path, "enum must be a list") end
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
    if #keep == 0 then fail(path, "enum has no value of the given type") end
    return self:enum(keep, path)
  end
  local alts = s.anyOf or s.oneOf
  if alts ~= nil then
    if s.anyOf ~= nil and s.oneOf ~= nil then fail(path, "anyOf together with oneOf is not supported") end
    if type(alts) ~= "table" or #alts == 0 then fail(path, "anyOf must be a non-empty list") end
    for k in pairs(s) do
      if KNOWN[k] and k ~= "anyOf" and k ~= "oneOf" then fail(path, ("'%s' beside anyOf is not supported"):format(k)) end
    end
    local n = self:node(C.CLRT_JSCHEMA_ANYOF)
    for i, a in ipairs(alts) do
      self:check(C.clrt_jschema_add_child(self.g, n, self:compile(a, ("%s/anyOf/%d"):format(path, i - 1), depth + 1)))
    end
    return n
  end
  local ty = s.type
  if ty == nil then
    if s.properties ~= nil or s.additionalProperties ~= nil or s.required ~= nil then ty = "object"
    elseif s.items ~= nil or s.minItems ~= nil or s.maxItems ~= nil then ty = "array"
    elseif s.minLength ~= nil or s.maxLength ~= nil then ty = "string"
    elseif s.minimum ~= nil or s.maximum ~= nil or s.exclusiveMinimum ~= nil or s.exclusiveMaximum ~= nil then ty = "number"
    else return self:node(C.CLRT_JSCHEMA_ANY) end
  end
  if type(ty) == "table" then
    if #ty == 0 then fail(path, "type must not be an empty list") end
    if #ty == 1 then return self:typed(s, ty[1], path, depth) end
    local n = self:node(C.CLRT_JSCHEMA_ANYOF)
    local has = {}
    for _, t in ipairs(ty) do has[t] = true end
    for _, t in ipairs(ty) do
      if not (t == "integer" and has.number) then   -- number already admits the integers
        self:check(C.clrt_jschema_add_child(self.g, n, self:typed(s, t, path, depth)))
      end
    end
    return n
  end
  return self:typed(s, ty, path, depth)
end

-- schema: a JSON Schema table, true (any JSON value) or "object" (any JSON object).
-- opts.max_ws: whitespace bytes allowed between JSON tokens (default 2).
function M.compile(schema, opts)
  opts = opts or {}
  local g = C.clrt_jschema_new(opts.max_ws or 2)
  if g == nil then core.fail(2) end
  g = ffi.gc(g, C.clrt_jschema_free)
  local b = setmetatable({ g = g }, Builder)
  local root
  if schema == "object" then
    root = b:node(C.CLRT_JSCHEMA_MAP)
  else
    root = b:compile(schema, "#", 0)
  end
  b:check(C.clrt_jschema_finish(g, root))
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
