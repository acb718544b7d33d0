-- Test support for JSON-constrained decoding: a byte-level vocabulary shaped like a BPE
-- model's (every single byte, plus multi-byte pieces that span several JSON tokens such as
-- `"},{"`, digit runs, escapes, whole and partial UTF-8 characters, invalid bytes), a fake
-- tokenizer over it with special and added tokens, a random-logits decoder, an independent
-- JSON parser and schema validator, and random schemas with random valid instances.
local ffi = require("ffi")
local M = {}

local pieces = {
  -- structure, alone and fused the way BPE merges them
  '{"', '"}', '":', '":"', '","', '",', '"},{"', '},{"', '"],"', '"]', ']}', '}]', '}}', '{}', '[]',
  '[{"', '": "', '", "', ': ', ', ', '{\n', '\n}', '\n  "', '  ', '   ', '    ', '\n', ' {', '":[', '":{"',
  '":true', '":false', '":null', '":0', '":1', ':"', ',"', '""', '"""', '],', '},', '[[', ']]', '["', '"]}',
  '"}]', ',{', '},{', ' }', ' ]', '\t', '\r\n', ' ,',
  -- literals and their pieces
  'true', 'false', 'null', 'tru', 'fals', 'nul', 'true,', 'null}', 'false]', 'e', 'ue', 'll',
  -- numbers
  '000', '123', '-1', '-0', '.5', '0.', '.0', 'e+', 'E-', '1e', 'e10', '-12', '100', '0.25', '0.7', '99', '00',
  '37', '-15', '1.5e3', '2.', '.25',
  -- escapes
  '\\"', '\\\\', '\\n', '\\t', '\\u00', '\\u', '\\ud83d', '\\ude00', '\\u0041', '\\uDBFF', '\\uDC00', '\\/', '\\b',
  '\\"}', '\\\\"', '\\u00e9', 'u00', 'd83d', '\\x',
  -- text, unicode, partial UTF-8
  'é', '中', '文', '中文', '😀', 'ü', '\xe4\xb8', '\xad', '\xf0\x9f', '\x98\x80', '\xc3', 'ñ', 'Ω',
  ' the', 'the', 'name', 'age', 'tags', 'a', 'ab', 'abc', 'yes', 'no', 'cat', ' cat', 'dog', 'hello', ' world',
  'thought', 'response', 'accuracy', '"name"', '"name":', '"na', 'me"', '"thought":"', '"response": "', '"a', 'b"',
  '"ab', '"abc"', '"b"', '"yes"}', 'lorem ipsum dolor sit amet',
  -- bytes no JSON text may hold
  '\x00', '\x1f', '\xff', '\xc0\x80', '\xed\xa0\x80', '\xf5\x80\x80\x80',
}
for i = 0, 99 do pieces[#pieces + 1] = tostring(i) end

-- list[id + 1] = bytes ("" for special tokens); eos and im_end are special, <think> is added.
function M.vocab()
  local list, seen = {}, {}
  for b = 0, 255 do list[#list + 1] = string.char(b); seen[list[#list]] = true end
  for _, p in ipairs(pieces) do
    if not seen[p] then seen[p] = true; list[#list + 1] = p end
  end
  local eos = #list; list[#list + 1] = ""
  local im_end = #list; list[#list + 1] = ""
  local think = #list; list[#list + 1] = "<think>"
  return list, { eos = eos, im_end = im_end, think = think }
end

function M.tokenizer(list, ids)
  local tok = { added = { [ids.think] = "<think>" } }
  local special = { [ids.eos] = "<|endoftext|>", [ids.im_end] = "<|im_end|>" }
  function tok:vocab_size() return #list end
  function tok:token_bytes(id) return special[id] or list[id + 1] end
  function tok:is_special(id) return special[id] ~= nil end
  function tok:decode(toks, opts)
    local s = {}
    for _, id in ipairs(toks) do
      if not (special[id] and opts and opts.skip_special_tokens) then s[#s + 1] = self:token_bytes(id) end
    end
    return table.concat(s)
  end
  function tok:stream() return { push = function(_, id) return special[id] and "" or list[id + 1] end, finish = function() return "" end } end
  return tok
end

-- Random logits that depend only on the slot's history: logit(v) = scale * U + bias[v].
function M.decoder(V, slots, max_len, bias, seed)
  local C = require("clrt.core.ffi").C
  local d = { vocab_size = V, slots = slots, max_len = max_len, key = {} }
  local rng = ffi.new("clrt_rng")
  local function fill(out, key)
    C.clrt_rng_seed(rng, key)
    for v = 0, V - 1 do out[v] = 4 * C.clrt_rng_uniform(rng) + (bias[v] or 0) end
  end
  function d:prefill(slot, toks, n, out)
    local k = seed or 1
    for i = 0, n - 1 do k = (k * 1000003 + toks[i]) % 2147483647 end
    self.key[slot] = k
    fill(out + slot * V, k)
  end
  function d:copy_slot(src, dst) self.key[dst] = self.key[src] end
  function d:decode(n, slot_ids, toks, out)
    for i = 0, n - 1 do
      local s = slot_ids[i]
      self.key[s] = (self.key[s] * 1000003 + toks[i] + 7) % 2147483647
      fill(out + s * V, self.key[s])
    end
  end
  return d
end

-- Tokens that close things get a push so samples end in a reasonable number of tokens, as a
-- real model's would.
function M.bias(list, ids)
  local bias = {}
  for id, b in ipairs(list) do
    if b:find('["%]}]') then bias[id - 1] = 1.5 end
  end
  bias[ids.eos] = 6
  bias[ids.im_end] = 6
  return bias
end

---------------------------------------------------------------------------------------------
-- An independent JSON parser: strict RFC 8259, arrays tagged so [] and {} differ.
local ARRAY = {}
M.ARRAY = ARRAY
M.NULL = setmetatable({}, { __tostring = function() return "null" end })

local function utf8_char(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then
    return string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
  end
  return string.char(0xF0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64,
    0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
end
M.utf8_char = utf8_char

-- number of code points, or nil if s is not valid UTF-8 (no surrogates, no overlongs)
function M.utf8_len(s)
  local i, n, count = 1, #s, 0
  while i <= n do
    local b = s:byte(i)
    local len, cp
    if b < 0x80 then len, cp = 1, b
    elseif b >= 0xC0 and b < 0xE0 then len, cp = 2, b % 32
    elseif b >= 0xE0 and b < 0xF0 then len, cp = 3, b % 16
    elseif b >= 0xF0 and b < 0xF8 then len, cp = 4, b % 8
    else return nil end
    for k = 1, len - 1 do
      local c = s:byte(i + k)
      if not c or c < 0x80 or c > 0xBF then return nil end
      cp = cp * 64 + c % 64
    end
    local min = ({ 0, 0x80, 0x800, 0x10000 })[len]
    if cp < min or cp > 0x10FFFF or (cp >= 0xD800 and cp <= 0xDFFF) then return nil end
    i = i + len
    count = count + 1
  end
  return count
end

function M.parse(text)
  local pos = 1
  local function err(msg) error(("json parse: %s at byte %d of %q"):format(msg, pos, text), 0) end
  local function ws() pos = text:find("[^ \t\n\r]", pos) or #text + 1 end
  local value
  local function str()
    pos = pos + 1
    local out = {}
    while true do
      local c = text:sub(pos, pos)
      if c == "" then err("unterminated string") end
      if c == '"' then pos = pos + 1; break end
      if c:byte() < 0x20 then err("control byte in string") end
      if c == "\\" then
        local e = text:sub(pos + 1, pos + 1)
        local simple = ({ ['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f', n = '\n', r = '\r', t = '\t' })[e]
        if simple then out[#out + 1] = simple; pos = pos + 2
        elseif e == "u" then
          local h = text:sub(pos + 2, pos + 5)
          if not h:match("^%x%x%x%x$") then err("bad \\u escape") end
          local cp = tonumber(h, 16)
          pos = pos + 6
          if cp >= 0xDC00 and cp <= 0xDFFF then err("lone low surrogate") end
          if cp >= 0xD800 and cp <= 0xDBFF then
            local h2 = text:match("^\\u(%x%x%x%x)", pos)
            local lo = h2 and tonumber(h2, 16)
            if not lo or lo < 0xDC00 or lo > 0xDFFF then err("unpaired high surrogate") end
            cp = 0x10000 + (cp - 0xD800) * 1024 + (lo - 0xDC00)
            pos = pos + 6
          end
          out[#out + 1] = utf8_char(cp)
        else err("bad escape") end
      else
        out[#out + 1] = c
        pos = pos + 1
      end
    end
    local s = table.concat(out)
    if not M.utf8_len(s) then err("invalid UTF-8 in string") end
    return s
  end
  function value()
    ws()
    local c = text:sub(pos, pos)
    if c == "{" then
      pos = pos + 1
      local obj, keys = {}, {}
      ws()
      if text:sub(pos, pos) == "}" then pos = pos + 1; return obj end
      while true do
        ws()
        if text:sub(pos, pos) ~= '"' then err("expected a key") end
        local k = str()
        ws()
        if text:sub(pos, pos) ~= ":" then err("expected ':'") end
        pos = pos + 1
        obj[k] = value()
        keys[#keys + 1] = k
        ws()
        local d = text:sub(pos, pos)
        pos = pos + 1
        if d == "}" then return obj end
        if d ~= "," then err("expected ',' or '}'") end
      end
    elseif c == "[" then
      pos = pos + 1
      local arr = { [ARRAY] = true }
      ws()
      if text:sub(pos, pos) == "]" then pos = pos + 1; return arr end
      while true do
        arr[#arr + 1] = value()
        ws()
        local d = text:sub(pos, pos)
        pos = pos + 1
        if d == "]" then return arr end
        if d ~= "," then err("expected ',' or ']'") end
      end
    elseif c == '"' then
      return str()
    else
      local lit = text:match("^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
      if lit and #lit > 0 then
        if not (lit:match("^-?0$") or lit:match("^-?[1-9]%d*$") or lit:match("^-?0%.%d+$") or lit:match("^-?[1-9]%d*%.%d+$")
            or lit:match("^-?0[eE][-+]?%d+$") or lit:match("^-?[1-9]%d*[eE][-+]?%d+$")
            or lit:match("^-?0%.%d+[eE][-+]?%d+$") or lit:match("^-?[1-9]%d*%.%d+[eE][-+]?%d+$")) then
          err("bad number " .. lit)
        end
        pos = pos + #lit
        return { num = tonumber(lit), text = lit }
      end
      for name, v in pairs({ ["true"] = true, ["false"] = false, null = M.NULL }) do
        if text:sub(pos, pos + #name - 1) == name then pos = pos + #name; return v end
      end
      err("unexpected byte")
    end
  end
  local v = value()
  ws()
  if pos <= #text then err("text after the value") end
  return v
end

---------------------------------------------------------------------------------------------
-- A validator for the schema subset, over M.parse's values.
local function kind(v)
  if v == M.NULL then return "null" end
  local t = type(v)
  if t == "boolean" or t == "string" then return t end
  if t == "table" and v.num then return "number" end
  if t == "table" and v[ARRAY] then return "array" end
  return "object"
end

local function equal(a, b)   -- a: parsed value, b: a Lua schema value
  if b == M.NULL or (type(b) == "userdata") then return a == M.NULL end
  if type(b) == "number" then return kind(a) == "number" and a.num == b end
  return a == b
end

-- A "#/..." JSON pointer into the root schema.
local function resolve(root, ref)
  local t = root
  for part in ref:sub(2):gmatch("/([^/]*)") do
    part = part:gsub("~1", "/"):gsub("~0", "~")
    t = type(t) == "table" and (t[part] == nil and part:match("^%d+$") and t[tonumber(part) + 1] or t[part]) or nil
  end
  assert(t ~= nil, "validate: $ref " .. ref .. " names nothing")
  return t
end

-- root: the whole schema, for $ref (defaults to s).
function M.validate(v, s, path, root)
  path = path or "#"
  root = root or s
  if s == true or s == nil then return true end
  local function no(why) return false, path .. ": " .. why end
  if s["$ref"] then return M.validate(v, resolve(root, s["$ref"]), path, root) end
  for _, sub in ipairs(s.allOf or {}) do
    local ok, why = M.validate(v, sub, path, root)
    if not ok then return false, why end
  end
  if s.nullable == true and v == M.NULL then return true end   -- OpenAPI's nullable
  if s.const ~= nil and not equal(v, s.const) then return no("not the const") end
  if s.enum then
    local hit = false
    for _, e in ipairs(s.enum) do if equal(v, e) then hit = true end end
    if not hit then return no("not in the enum") end
  end
  local alts = s.anyOf or s.oneOf
  if alts then
    local n = 0
    for _, a in ipairs(alts) do if M.validate(v, a, path, root) then n = n + 1 end end
    if n == 0 or (s.oneOf and n > 1) then return no(("%d alternatives match"):format(n)) end
  end
  local k = kind(v)
  if s.type then
    local types = type(s.type) == "table" and s.type or { s.type }
    local ok = false
    for _, t in ipairs(types) do
      if t == k then ok = true end
      if t == "integer" and k == "number" and v.num == math.floor(v.num) then ok = true end
    end
    if not ok then return no("type " .. k .. " is not " .. table.concat(types, "|")) end
  end
  if k == "string" then
    local n = M.utf8_len(v)
    if not n then return no("invalid UTF-8") end
    if s.minLength and n < s.minLength then return no("shorter than minLength") end
    if s.maxLength and n > s.maxLength then return no("longer than maxLength") end
  elseif k == "number" then
    local x = v.num
    local emin, emax = s.exclusiveMinimum, s.exclusiveMaximum
    if s.minimum and x < s.minimum then return no(x .. " below minimum") end
    if s.maximum and x > s.maximum then return no(x .. " above maximum") end
    if type(emin) == "number" and x <= emin then return no(x .. " not above exclusiveMinimum") end
    if type(emax) == "number" and x >= emax then return no(x .. " not below exclusiveMaximum") end
  elseif k == "array" then
    if s.minItems and #v < s.minItems then return no("fewer than minItems") end
    if s.maxItems and #v > s.maxItems then return no("more than maxItems") end
    for i, x in ipairs(v) do
      local ok, why = M.validate(x, s.items, path .. "/" .. (i - 1), root)
      if not ok then return false, why end
    end
  elseif k == "object" then
    for _, r in ipairs(s.required or {}) do
      if v[r] == nil then return no("lacks required " .. r) end
    end
    for key, x in pairs(v) do
      local sub = s.properties and s.properties[key]
      if sub == nil then
        if s.additionalProperties == false then return no("has extra key " .. key) end
        sub = type(s.additionalProperties) == "table" and s.additionalProperties or true
      end
      local ok, why = M.validate(x, sub, path .. "/" .. key, root)
      if not ok then return false, why end
    end
  end
  return true
end

---------------------------------------------------------------------------------------------
-- Random schemas (adversarial on purpose: shared enum prefixes, tight bounds, escapes and
-- unicode in keys and enums, nesting) and random valid instances of them.
local function pick(r, t) return t[r(#t)] end

function M.random_schema(r, depth)
  depth = depth or 0
  local choice = r(depth >= 3 and 7 or 13)
  if choice == 1 then
    local s = { type = "string" }
    if r(2) == 1 then s.minLength = r(3) - 1 end
    if r(2) == 1 then s.maxLength = (s.minLength or 0) + r(6) - 1 end
    return s
  elseif choice == 2 then
    local s = { type = pick(r, { "integer", "number" }) }
    local a = pick(r, { -15, 0, 1, 3, -100, 7, 37 })
    if r(3) > 1 then s.minimum = a end
    if r(3) > 1 then s.maximum = a + pick(r, { 0, 1, 9, 52, 1000 }) end
    if s.type == "number" and r(3) == 1 then
      if s.minimum then s.minimum = s.minimum + 0.25 end
      if s.maximum then s.maximum = s.maximum + 0.75 end
    end
    if r(4) == 1 and s.minimum and (not s.maximum or s.maximum > s.minimum + 1) then
      s.exclusiveMinimum, s.minimum = s.minimum, nil
    end
    return s
  elseif choice == 3 then
    return { enum = pick(r, { { "a", "ab", "abc" }, { "yes", "no" }, { "é", "e", "中文" }, { 1, 12, 123, "1" },
      { "q\"uote", "back\\slash", "tab\t" }, { true, "true" }, { 0.5, -2, "x" } }) }
  elseif choice == 4 then
    return { type = "boolean" }
  elseif choice == 5 then
    return { type = "null" }
  elseif choice == 6 then
    return { anyOf = { { type = "string", maxLength = 4 }, { type = "integer", minimum = 0, maximum = 9 }, { type = "null" } } }
  elseif choice == 7 then
    return { type = { "number", "null" }, maximum = 10 }
  elseif choice <= 10 then
    local s = { type = "object", properties = {}, required = {}, additionalProperties = false }
    local names = { "name", "a", "ab", "abc", "thought", "response", "é", "k\"q", "中" }
    local used = {}
    for _ = 1, r(4) do
      local nm = pick(r, names)
      if not used[nm] then
        used[nm] = true
        s.properties[nm] = M.random_schema(r, depth + 1)
        if r(3) > 1 then s.required[#s.required + 1] = nm end
      end
    end
    return s
  elseif choice <= 12 then
    local s = { type = "array", items = M.random_schema(r, depth + 1) }
    if r(2) == 1 then s.minItems = r(3) - 1 end
    if r(2) == 1 then s.maxItems = (s.minItems or 0) + r(3) - 1 end
    return s
  else
    return pick(r, { {}, { type = "object" }, { type = "array" } })
  end
end

-- Spell a string the way a model might: raw, or with any escape JSON allows.
local function spell_string(r, s)
  local out = { '"' }
  local i = 1
  while i <= #s do
    local b = s:byte(i)
    local len = b < 0x80 and 1 or b < 0xE0 and 2 or b < 0xF0 and 3 or 4
    local ch = s:sub(i, i + len - 1)
    local cp = b
    if len > 1 then
      cp = b % (len == 2 and 32 or len == 3 and 16 or 8)
      for k = 2, len do cp = cp * 64 + s:byte(i + k - 1) % 64 end
    end
    if ch == '"' or ch == "\\" or cp < 0x20 or r(4) == 1 then
      if cp >= 0x10000 then
        local v = cp - 0x10000
        out[#out + 1] = ("\\u%04x\\u%04X"):format(0xD800 + math.floor(v / 1024), 0xDC00 + v % 1024)
      elseif ch == '"' and r(2) == 1 then out[#out + 1] = '\\"'
      elseif ch == "\\" and r(2) == 1 then out[#out + 1] = "\\\\"
      elseif ch == "\n" then out[#out + 1] = "\\n"
      else out[#out + 1] = ("\\u%04x"):format(cp) end
    else
      out[#out + 1] = ch
    end
    i = i + len
  end
  out[#out + 1] = '"'
  return table.concat(out)
end

local alphabet = { "a", "b", "é", "中", "😀", " ", '"', "\\", "\n", "\t", "/", "\1" }

local function random_text(r, n)
  local t = {}
  for i = 1, n do t[i] = pick(r, alphabet) end
  return table.concat(t)
end

local function ws(r, max_ws)
  local n = r(max_ws + 1) - 1
  local t = {}
  for i = 1, n do t[i] = pick(r, { " ", "\n" }) end   -- the only whitespace the grammar writes
  return table.concat(t)
end

-- The canonical spelling of a literal (as the compiler writes enum values).
local function canon(v)
  if type(v) == "string" then
    return '"' .. v:gsub('[%c"\\]', function(c)
      local e = ({ ['"'] = '\\"', ['\\'] = '\\\\', ['\b'] = '\\b', ['\f'] = '\\f', ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t' })[c]
      return e or (c:byte() < 0x20 and ("\\u%04x"):format(c:byte())) or c
    end) .. '"'
  elseif type(v) == "number" then
    return v == math.floor(v) and ("%d"):format(v) or ("%.17g"):format(v)
  elseif v == M.NULL then return "null" end
  return tostring(v)
end

local function number_in(r, s, integer)
  local lo = s.minimum or (s.exclusiveMinimum and s.exclusiveMinimum + (integer and 1 or 0.125))
  local hi = s.maximum or (lo or -50) + 60
  lo = lo or hi - 60
  for _ = 1, 20 do
    local x
    if integer then
      local a, b = math.ceil(lo), math.floor(hi)
      x = pick(r, { a, b, a + r(math.max(1, b - a + 1)) - 1 })
      return ("%d"):format(x)
    end
    local choices = { lo, hi, lo + (hi - lo) * (r(1000) - 1) / 1000 }
    x = pick(r, choices)
    local txt = pick(r, { ("%.17g"):format(x), ("%.3f"):format(x), ("%g"):format(x) })
    local v = tonumber(txt)
    if v and (not s.minimum or v >= s.minimum) and (not s.maximum or v <= s.maximum)
        and (not s.exclusiveMinimum or v > s.exclusiveMinimum) and not txt:find("[eE]") then
      return txt
    end
  end
  return nil
end

-- A random instance's text, or nil when this draw found none. Properties are written in the
-- order the grammar uses: required in their listed order, then the optional ones by name.
function M.random_instance(r, s, max_ws, depth)
  depth = depth or 0
  if s.enum then return canon(pick(r, s.enum)) end
  if s.const ~= nil then return canon(s.const) end
  if s.anyOf then return M.random_instance(r, pick(r, s.anyOf), max_ws, depth + 1) end
  local ty = s.type
  if type(ty) == "table" then ty = pick(r, ty) end
  if ty == nil or (ty == "object" and not s.properties) or (ty == "array" and not s.items and depth > 3) then
    if ty == nil then ty = pick(r, { "string", "number", "null", "boolean", "object", "array" }) end
    if depth > 3 and (ty == "object" or ty == "array") then ty = "null" end
  end
  local W = function() return ws(r, max_ws) end
  if ty == "string" then
    local lo, hi = s.minLength or 0, s.maxLength or (s.minLength or 0) + 6
    return spell_string(r, random_text(r, lo + r(hi - lo + 1) - 1))
  elseif ty == "integer" or ty == "number" then
    return number_in(r, s, ty == "integer")
  elseif ty == "boolean" then
    return pick(r, { "true", "false" })
  elseif ty == "null" then
    return "null"
  elseif ty == "array" then
    local lo = s.minItems or 0
    local hi = s.maxItems or lo + 3
    local n = lo + r(hi - lo + 1) - 1
    local parts = {}
    for i = 1, n do
      local x = M.random_instance(r, s.items or {}, max_ws, depth + 1)
      if not x then return nil end
      parts[i] = W() .. x .. W()
    end
    if n == 0 then return "[" .. W() .. "]" end
    return "[" .. table.concat(parts, ",") .. "]"
  elseif ty == "object" then
    local parts = {}
    local function add(k, sub)
      local x = M.random_instance(r, sub, max_ws, depth + 1)
      if not x then return false end
      local key = s.properties and canon(k) or spell_string(r, k)
      parts[#parts + 1] = W() .. key .. W() .. ":" .. W() .. x .. W()
      return true
    end
    if s.properties then
      local req, seen = {}, {}
      for _, k in ipairs(s.required or {}) do req[#req + 1] = k; seen[k] = true end
      local rest = {}
      for k in pairs(s.properties) do if not seen[k] then rest[#rest + 1] = k end end
      table.sort(rest)
      for _, k in ipairs(req) do if not add(k, s.properties[k]) then return nil end end
      for _, k in ipairs(rest) do
        if r(2) == 1 and not add(k, s.properties[k]) then return nil end
      end
    else
      for _ = 1, r(3) - 1 do
        if not add(random_text(r, r(4)), {}) then return nil end
      end
    end
    if #parts == 0 then return "{" .. W() .. "}" end
    return "{" .. table.concat(parts, ",") .. "}"
  end
  error("random_instance: type " .. tostring(ty))
end

return M
