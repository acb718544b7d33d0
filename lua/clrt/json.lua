-- clrt.json — strict JSON for configs, JSONL data and logs.
--   json.decode(text [, where]) -> value      raises "where: json: <what> at line L col C"
--   json.encode(value [, {pretty = true}])    keys sorted, numbers round-trip exactly
--   json.decode(text, where, {key_order = true}) records each object's key order, and
--   encode writes such an object's keys in that order (a chat template's `tojson` must);
--   encode(v, {separators = {", ", ": "}}) spaces items and keys as Python's json.dumps.
-- JSON null decodes to json.null (a sentinel, so arrays keep their length); arrays decode
-- to tables marked with json.array's metatable so an empty [] stays [] when re-encoded.
-- Why not lua-cjson alone: its 2.1.0 encoder keeps only 14 digits, does not sort keys
-- and cannot tell [] from {}; stable, exact output matters for configs and metrics logs.
local M = {}
-- The encoder runs interpreted: Debian's LuaJIT 2.1.0-beta3 compiled it into a trace that
-- wrote a five-key table as "{}" (a simulated user's request body went out empty in about half
-- the runs of test_reproducible_rl under load; with the JIT off for this file, 0 of 5).
-- jit.off(true, true) covers this chunk's functions only.
require("jit").off(true, true)

local array_mt = { __jsontype = "array" }
local object_mt = { __jsontype = "object" }
M.null = setmetatable({}, { __tostring = function() return "null" end, __jsontype = "null" })

function M.array(t) return setmetatable(t or {}, array_mt) end
function M.object(t) return setmetatable(t or {}, object_mt) end
function M.is_array(t)
  if type(t) ~= "table" then return false end
  local mt = getmetatable(t)
  if mt == array_mt then return true end
  if mt == object_mt then return false end
  local n = #t
  if n == 0 then return next(t) == nil and false end
  local count = 0
  for _ in pairs(t) do count = count + 1 end
  return count == n
end

---------------------------------------------------------------------------- decode
local byte, sub, find = string.byte, string.sub, string.find
local tonumber, char, concat = tonumber, string.char, table.concat

local function position(s, i)
  local line, col = 1, 1
  local last = 1
  while true do
    local j = find(s, "\n", last, true)
    if not j or j >= i then break end
    line = line + 1
    last = j + 1
  end
  col = i - last + 1
  return line, col
end

local function utf8(cp)
  if cp < 0x80 then return char(cp) end
  if cp < 0x800 then return char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then
    return char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
  end
  return char(0xF0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64,
              0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
end

local escapes = { [34] = '"', [92] = "\\", [47] = "/", [98] = "\b", [102] = "\f",
                  [110] = "\n", [114] = "\r", [116] = "\t" }

-- object -> its keys in the order the decoded text had them (weak: no leak)
M.key_order = setmetatable({}, { __mode = "k" })

function M.decode(s, where, opts)
  if type(s) ~= "string" then error("json.decode: expected a string, got " .. type(s), 2) end
  local keep_order = opts and opts.key_order
  -- opts.tick: called every 1024 values (a server yields there to answer other clients while
  -- a large body decodes)
  local tick, values_seen = opts and opts.tick, 0
  local i = 1
  local depth = 0
  local function fail(msg, at)
    local line, col = position(s, at or i)
    error(("%sjson: %s at line %d col %d"):format(where and (where .. ": ") or "", msg, line, col), 0)
  end
  local function ws()
    local _, e = find(s, "^[ \t\r\n]*", i)
    i = e + 1
  end
  local value
  local function str()
    i = i + 1 -- opening quote
    local parts, np = {}, 0
    while true do
      local a, b = find(s, '^[^"\\%z\1-\31]+', i)
      if a then np = np + 1; parts[np] = sub(s, a, b); i = b + 1 end
      local c = byte(s, i)
      if c == 34 then i = i + 1; return concat(parts) end
      if c == nil then fail("unterminated string") end
      if c ~= 92 then fail("control character in string") end
      local e = byte(s, i + 1)
      if e == 117 then
        local hex = sub(s, i + 2, i + 5)
        if not hex:match("^%x%x%x%x$") then fail("bad \\u escape") end
        local cp = tonumber(hex, 16)
        i = i + 6
        if cp >= 0xD800 and cp <= 0xDBFF and sub(s, i, i + 1) == "\\u" then
          local lo = tonumber(sub(s, i + 2, i + 5), 16)
          if lo and lo >= 0xDC00 and lo <= 0xDFFF then
            cp = 0x10000 + (cp - 0xD800) * 1024 + (lo - 0xDC00)
            i = i + 6
          end
        end
        np = np + 1; parts[np] = utf8(cp)
      elseif e and escapes[e] then
        np = np + 1; parts[np] = escapes[e]; i = i + 2
      else
        fail("bad escape in string")
      end
    end
  end
  function value()
    if tick then
      values_seen = values_seen + 1
      if values_seen % 1024 == 0 then tick() end
    end
    ws()
    local c = byte(s, i)
    if c == 123 then -- {
      depth = depth + 1
      if depth > 1000 then fail("nesting deeper than 1000") end
      i = i + 1
      local t = setmetatable({}, object_mt)
      local order = keep_order and {} or nil
      if order then M.key_order[t] = order end
      ws()
      if byte(s, i) == 125 then i = i + 1; depth = depth - 1; return t end
      while true do
        ws()
        if byte(s, i) ~= 34 then fail("expected a string key") end
        local k = str()
        ws()
        if byte(s, i) ~= 58 then fail("expected ':' after key") end
        i = i + 1
        if order and t[k] == nil then order[#order + 1] = k end
        t[k] = value()
        ws()
        local d = byte(s, i)
        if d == 44 then i = i + 1
        elseif d == 125 then i = i + 1; depth = depth - 1; return t
        else fail("expected ',' or '}' in object") end
      end
    elseif c == 91 then -- [
      depth = depth + 1
      if depth > 1000 then fail("nesting deeper than 1000") end
      i = i + 1
      local t, n = setmetatable({}, array_mt), 0
      ws()
      if byte(s, i) == 93 then i = i + 1; depth = depth - 1; return t end
      while true do
        n = n + 1
        t[n] = value()
        ws()
        local d = byte(s, i)
        if d == 44 then i = i + 1
        elseif d == 93 then i = i + 1; depth = depth - 1; return t
        else fail("expected ',' or ']' in array") end
      end
    elseif c == 34 then
      return str()
    elseif c == 116 then
      if sub(s, i, i + 3) == "true" then i = i + 4; return true end
    elseif c == 102 then
      if sub(s, i, i + 4) == "false" then i = i + 5; return false end
    elseif c == 110 then
      if sub(s, i, i + 3) == "null" then i = i + 4; return M.null end
    elseif c == nil then
      fail("unexpected end of input")
    else
      local a, b = find(s, "^-?%d+%.?%d*[eE]?[-+]?%d*", i)
      if a then
        local text = sub(s, a, b)
        if text:match("^-?0%d") or text:match("%.$") or text:match("%.[eE]") or text:match("[eE][-+]?$") then
          fail("malformed number '" .. text .. "'")
        end
        local v = tonumber(text)
        if v then i = b + 1; return v end
      end
    end
    fail("unexpected character '" .. sub(s, i, i) .. "'")
  end
  local v = value()
  ws()
  if i <= #s then fail("trailing characters after the value") end
  return v
end

---------------------------------------------------------------------------- encode
local function num(x)
  if x ~= x or x == math.huge or x == -math.huge then
    error("json.encode: cannot encode " .. tostring(x) .. " (NaN or infinity)", 0)
  end
  if x == math.floor(x) and math.abs(x) < 2^53 then return ("%d"):format(x) end
  -- Shortest of 15/16/17 significant digits that reads back as the same double.
  for p = 15, 17 do
    local t = ("%." .. p .. "g"):format(x)
    if tonumber(t) == x then return t end
  end
end

local str_escape = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f",
                     ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
local function quote(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    return str_escape[c] or ("\\u%04x"):format(byte(c))
  end) .. '"'
end
M.quote = quote

local function keycmp(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return ta < tb end
  return a < b
end

-- The keys of object v in the order to write them: as decoded when recorded, else sorted.
local function keys_of(v, path)
  local keys, order = {}, M.key_order[v]
  if order then
    local listed = {}
    for _, k in ipairs(order) do
      if v[k] ~= nil then keys[#keys + 1] = k; listed[k] = true end
    end
    local extra = {}
    for k in pairs(v) do if not listed[k] then extra[#extra + 1] = k end end
    table.sort(extra, keycmp)
    for _, k in ipairs(extra) do keys[#keys + 1] = k end
  else
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys, keycmp)
  end
  for _, k in ipairs(keys) do
    if type(k) ~= "string" and type(k) ~= "number" then
      error("json.encode: key of type " .. type(k) .. " at " .. path, 0)
    end
  end
  return keys
end
M.keys_of = keys_of

local function enc(v, pretty, indent, out, seen, path, seps)
  local t = type(v)
  if t == "string" then out[#out + 1] = quote(v)
  elseif t == "number" then out[#out + 1] = num(v)
  elseif t == "boolean" then out[#out + 1] = tostring(v)
  elseif v == nil or v == M.null then out[#out + 1] = "null"
  elseif t == "table" then
    if seen[v] then error("json.encode: cycle at " .. path, 0) end
    seen[v] = true
    local nl = pretty and ("\n" .. indent .. "  ") or ""
    local sep = pretty and ", " or ","
    if M.is_array(v) or (next(v) == nil and getmetatable(v) ~= object_mt) then
      if #v == 0 then
        out[#out + 1] = (getmetatable(v) == array_mt or next(v) == nil) and "[]" or "{}"
      else
        -- short arrays of scalars stay on one line: metrics and vectors read better
        local flat = true
        for i = 1, #v do if type(v[i]) == "table" and v[i] ~= M.null then flat = false break end end
        out[#out + 1] = "["
        for i = 1, #v do
          if i > 1 then out[#out + 1] = seps and seps[1] or ((pretty and not flat) and "," or sep) end
          if pretty and not flat then out[#out + 1] = nl end
          enc(v[i], pretty, indent .. "  ", out, seen, path .. "[" .. i .. "]", seps)
        end
        if pretty and not flat then out[#out + 1] = "\n" .. indent end
        out[#out + 1] = "]"
      end
    else
      local keys = keys_of(v, path)
      out[#out + 1] = "{"
      for i, k in ipairs(keys) do
        if i > 1 then out[#out + 1] = seps and seps[1] or "," end
        out[#out + 1] = nl
        out[#out + 1] = quote(tostring(k))
        out[#out + 1] = seps and seps[2] or (pretty and ": " or ":")
        enc(v[k], pretty, indent .. "  ", out, seen, path .. "." .. tostring(k), seps)
      end
      if pretty and #keys > 0 then out[#out + 1] = "\n" .. indent end
      out[#out + 1] = "}"
    end
    seen[v] = nil
  else
    error("json.encode: cannot encode a " .. t .. " at " .. path, 0)
  end
end

function M.encode(v, opts)
  local out = {}
  enc(v, opts and opts.pretty, "", out, {}, "$", opts and opts.separators)
  return concat(out)
end

return M
