-- clrt.jinja.text — the string rules @huggingface/jinja inherits from JavaScript, on UTF-8:
-- what counts as whitespace (JS's \s and String.prototype.trim: ASCII whitespace plus U+00A0,
-- U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000, U+FEFF; not U+0085),
-- code points, UTF-16 lengths, and how JS writes numbers.
local M = {}

local byte, sub, char, floor = string.byte, string.sub, string.char, math.floor

-- Length in bytes of the whitespace character starting at byte i of s (0: none there).
local function space_at(s, i)
  local b = byte(s, i)
  if not b then return 0 end
  if b == 32 or (b >= 9 and b <= 13) then return 1 end
  if b == 0xC2 then return byte(s, i + 1) == 0xA0 and 2 or 0 end
  if b == 0xE1 then return (byte(s, i + 1) == 0x9A and byte(s, i + 2) == 0x80) and 3 or 0 end
  if b == 0xE2 then
    local b2, b3 = byte(s, i + 1), byte(s, i + 2)
    if b2 == 0x80 then
      if b3 and ((b3 >= 0x80 and b3 <= 0x8A) or b3 == 0xA8 or b3 == 0xA9 or b3 == 0xAF) then return 3 end
    elseif b2 == 0x81 then
      if b3 == 0x9F then return 3 end
    end
    return 0
  end
  if b == 0xE3 then return (byte(s, i + 1) == 0x80 and byte(s, i + 2) == 0x80) and 3 or 0 end
  if b == 0xEF then return (byte(s, i + 1) == 0xBB and byte(s, i + 2) == 0xBF) and 3 or 0 end
  return 0
end
M.space_at = space_at

-- Length of the whitespace character ending at byte j of s (0: none there).
local function space_before(s, j)
  for n = 1, 3 do
    if j - n + 1 >= 1 and space_at(s, j - n + 1) == n then return n end
  end
  return 0
end

function M.skip_space(s, i)
  while true do
    local n = space_at(s, i)
    if n == 0 then return i end
    i = i + n
  end
end

function M.trim_end(s)
  local j = #s
  while j > 0 do
    local n = space_before(s, j)
    if n == 0 then break end
    j = j - n
  end
  return sub(s, 1, j)
end

function M.trim_start(s) return sub(s, M.skip_space(s, 1)) end
function M.trim(s) return M.trim_end(M.trim_start(s)) end
function M.is_space(s) return M.skip_space(s, 1) > #s end

-- Code points of s as a list of UTF-8 strings (invalid bytes stand alone).
function M.chars(s)
  local out, i, n = {}, 1, #s
  while i <= n do
    local b = byte(s, i)
    local len = b < 0x80 and 1 or b >= 0xF0 and 4 or b >= 0xE0 and 3 or b >= 0xC0 and 2 or 1
    out[#out + 1] = sub(s, i, i + len - 1)
    i = i + len
  end
  return out
end

-- String length as JavaScript counts it (UTF-16 code units).
function M.js_length(s)
  local n = 0
  for i = 1, #s do
    local b = byte(s, i)
    if b < 0x80 or b >= 0xC0 then n = n + (b >= 0xF0 and 2 or 1) end
  end
  return n
end

function M.utf8(cp)
  if cp < 0x80 then return char(cp) end
  if cp < 0x800 then return char(0xC0 + floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then return char(0xE0 + floor(cp / 4096), 0x80 + floor(cp / 64) % 64, 0x80 + cp % 64) end
  return char(0xF0 + floor(cp / 262144), 0x80 + floor(cp / 4096) % 64, 0x80 + floor(cp / 64) % 64, 0x80 + cp % 64)
end

-- UTF-16 code units of a code point.
function M.utf16_units(cp)
  if cp < 0x10000 then return { cp } end
  cp = cp - 0x10000
  return { 0xD800 + floor(cp / 1024), 0xDC00 + cp % 1024 }
end

function M.codepoint(c)
  local b1, b2, b3, b4 = byte(c, 1, 4)
  if #c == 1 then return b1 end
  if #c == 2 then return (b1 - 0xC0) * 64 + (b2 - 0x80) end
  if #c == 3 then return (b1 - 0xE0) * 4096 + (b2 - 0x80) * 64 + (b3 - 0x80) end
  return (b1 - 0xF0) * 262144 + (b2 - 0x80) * 4096 + (b3 - 0x80) * 64 + (b4 - 0x80)
end

-- Number.prototype.toString: the shortest digits that read back, exponent form from 1e21 up
-- and below 1e-6.
function M.js_number(x)
  if x ~= x then return "NaN" end
  if x == math.huge then return "Infinity" end
  if x == -math.huge then return "-Infinity" end
  if x == 0 then return "0" end
  if x == floor(x) and math.abs(x) < 1e21 then return ("%.0f"):format(x) end
  local digits, exp
  for p = 1, 17 do
    local t = ("%." .. (p - 1) .. "e"):format(x)
    if tonumber(t) == x then
      local m, e = t:match("^%-?([%d%.]+)e([-+]%d+)$")
      digits, exp = m:gsub("%.", ""), tonumber(e)
      break
    end
  end
  digits = digits:gsub("0+$", "")
  if digits == "" then digits = "0" end
  local sign = x < 0 and "-" or ""
  local k, n = #digits, exp + 1        -- value = 0.digits * 10^n
  if k <= n and n <= 21 then return sign .. digits .. ("0"):rep(n - k) end
  if 0 < n and n <= 21 then return sign .. digits:sub(1, n) .. "." .. digits:sub(n + 1) end
  if -6 < n and n <= 0 then return sign .. "0." .. ("0"):rep(-n) .. digits end
  local e = n - 1
  local es = e >= 0 and "+" .. e or tostring(e)
  if k == 1 then return sign .. digits .. "e" .. es end
  return sign .. digits:sub(1, 1) .. "." .. digits:sub(2) .. "e" .. es
end

-- JSON.stringify of a string: \" \\ \b \f \n \r \t, other control characters as \u00xx,
-- everything else (U+2028 included) as it is.
local esc = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
function M.json_quote(s)
  return '"' .. s:gsub('[%z\1-\31"\\]', function(c) return esc[c] or ("\\u%04x"):format(byte(c)) end) .. '"'
end

-- ensure_ascii: every UTF-16 unit from U+007F up as \uxxxx.
function M.ascii_safe(s)
  return (s:gsub("[\127-\255][\128-\191]*", function(c)
    if #c == 1 and byte(c) ~= 127 then return c end
    local out = {}
    for _, u in ipairs(M.utf16_units(M.codepoint(c))) do out[#out + 1] = ("\\u%04x"):format(u) end
    return table.concat(out)
  end))
end

-- parseInt(s, 10) / parseFloat(s): nil where JS gives NaN.
function M.parse_int(s)
  local t = sub(s, M.skip_space(s, 1))
  local sign, digits = t:match("^([+-]?)(%d+)")
  if not digits then return nil end
  local v = tonumber(digits)
  return sign == "-" and -v or v
end

function M.parse_float(s)
  local t = sub(s, M.skip_space(s, 1))
  if t:match("^[+-]?Infinity") then return t:sub(1, 1) == "-" and -math.huge or math.huge end
  local num = t:match("^[+-]?%d+%.?%d*[eE][+-]?%d+") or t:match("^[+-]?%.%d+[eE][+-]?%d+")
    or t:match("^[+-]?%d+%.?%d*") or t:match("^[+-]?%.%d+")
  return num and tonumber(num) or nil
end

-- toUpperCase / toLowerCase for the scripts chat text mostly carries: ASCII, Latin-1,
-- Latin Extended-A, basic Greek and Cyrillic (ß upper-cases to SS, İ lower-cases to i + U+0307;
-- Greek final sigma and letters outside these blocks are left as they are).
local UPPER, LOWER = {}, {}
do
  local function pair(lo, up) UPPER[lo] = UPPER[lo] or up; LOWER[up] = LOWER[up] or lo end
  for c = 0xE0, 0xFE do if c ~= 0xF7 then pair(c, c - 0x20) end end
  for c = 0x100, 0x137, 2 do if c ~= 0x130 then pair(c + 1, c) end end
  for c = 0x139, 0x148, 2 do pair(c + 1, c) end
  for c = 0x14A, 0x177, 2 do pair(c + 1, c) end
  for c = 0x179, 0x17E, 2 do pair(c + 1, c) end
  pair(0xFF, 0x178)
  for c = 0x3B1, 0x3C9 do if c ~= 0x3C2 then pair(c, c - 0x20) end end
  pair(0x3AC, 0x386); pair(0x3AD, 0x388); pair(0x3AE, 0x389); pair(0x3AF, 0x38A)
  pair(0x3CC, 0x38C); pair(0x3CD, 0x38E); pair(0x3CE, 0x38F)
  for c = 0x430, 0x44F do pair(c, c - 0x20) end
  for c = 0x450, 0x45F do pair(c, c - 0x50) end
  UPPER[0x3C2] = 0x3A3; UPPER[0xB5] = 0x39C; UPPER[0x131] = 0x49; UPPER[0x17F] = 0x53
  UPPER[0xDF] = "SS"
  LOWER[0x130] = "i\204\135"
end

local function map_case(s, tbl, ascii)
  if not s:find("[\128-\255]") then return ascii(s) end
  local out = {}
  for i, c in ipairs(M.chars(s)) do
    if #c == 1 then out[i] = ascii(c) else
      local m = tbl[M.codepoint(c)]
      out[i] = m == nil and c or (type(m) == "string" and m or M.utf8(m))
    end
  end
  return table.concat(out)
end
function M.upper(s) return map_case(s, UPPER, string.upper) end
function M.lower(s) return map_case(s, LOWER, string.lower) end

return M
