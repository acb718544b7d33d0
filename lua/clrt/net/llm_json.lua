-- clrt.net.llm_json — a lenient reader for the JSON that judges and simulated users write.
--
--   clrt.llm.extract_json('Sure! ```json\n{"score": "8", \'ok\': True, "why": """a\nb"""}\n```')
--     --> {score = 8, ok = true, why = "a\nb"}
--
-- It takes the outermost {...} in the text (skipping prose, code fences and stray braces),
-- and accepts what models commonly write instead of JSON: single- and triple-quoted strings,
-- unquoted keys, bare true/false/null/none/nil in any case, trailing commas, and unescaped
-- double quotes inside a string. Strings that are numbers become numbers ("8" -> 8).
-- null becomes nil (the key is absent). When nothing parses the error says why and where.
local M = {}

local MAX_DEPTH = 200
local ESC = { n = "\n", t = "\t", r = "\r", b = "\b", f = "\f", ["/"] = "/", ["\\"] = "\\",
              ['"'] = '"', ["'"] = "'" }
local WORDS = { ["true"] = true, ["false"] = false, ["null"] = nil, ["none"] = nil, ["nil"] = nil }
local IS_WORD = { ["true"] = true, ["false"] = true, ["null"] = true, ["none"] = true, ["nil"] = true }

local function fail(pos, msg) error({ pos = pos, msg = msg }, 0) end

local function skip_ws(s, i)
  return s:find("[^ \t\r\n]", i) or #s + 1
end

local function utf8_char(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then
    return string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
  end
  return string.char(0xF0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64,
                     0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
end

local function is_numeric(t)
  local base = t:gsub("[eE][-+]?%d+$", "", 1)
  return base:match("^[-+]?%d+%.?%d*$") ~= nil or base:match("^[-+]?%.%d+$") ~= nil
end

-- A string starting at s[i] (a quote). Returns the text and the index after it.
-- strict: the first unescaped quote closes the string (the fallback when the lenient rule
-- below runs off the end of the text).
local function read_string(s, i, strict)
  local q = s:sub(i, i)
  local triple = s:sub(i, i + 2) == q:rep(3)
  local j = i + (triple and 3 or 1)
  local out = {}
  while true do
    local c = s:sub(j, j)
    if c == "" then
      if not strict and not triple then return read_string(s, i, true) end
      fail(i, "unterminated string")
    end
    if c == "\\" then
      local e = s:sub(j + 1, j + 1)
      if e == "u" and s:sub(j + 2, j + 5):match("^%x%x%x%x$") then
        local cp = tonumber(s:sub(j + 2, j + 5), 16)
        j = j + 6
        if cp >= 0xD800 and cp < 0xDC00 and s:sub(j, j + 1) == "\\u" and s:sub(j + 2, j + 5):match("^%x%x%x%x$") then
          local lo = tonumber(s:sub(j + 2, j + 5), 16)
          if lo >= 0xDC00 and lo < 0xE000 then
            cp = 0x10000 + (cp - 0xD800) * 1024 + (lo - 0xDC00)
            j = j + 6
          end
        end
        out[#out + 1] = utf8_char(cp)
      else
        out[#out + 1] = ESC[e] or e
        j = j + 2
      end
    elseif triple then
      if s:sub(j, j + 2) == q:rep(3) then return table.concat(out), j + 3 end
      out[#out + 1] = c
      j = j + 1
    elseif c == q then
      -- A quote that closes the string is followed by , : } ] or the end; any other quote
      -- is taken as part of the text (models forget to escape quotes they quote).
      local k = skip_ws(s, j + 1)
      local nx = s:sub(k, k)
      if strict or nx == "" or nx:match("[,:}%]]") then return table.concat(out), j + 1 end
      out[#out + 1] = c
      j = j + 1
    else
      out[#out + 1] = c
      j = j + 1
    end
  end
end

local parse_value

local function parse_container(s, i, depth, close)
  if depth > MAX_DEPTH then fail(i, "nesting deeper than " .. MAX_DEPTH) end
  local obj, n = {}, 0
  i = skip_ws(s, i + 1)
  while true do
    local c = s:sub(i, i)
    if c == close then return obj, i + 1 end
    if c == "" then fail(i, "missing '" .. close .. "'") end
    if close == "}" then
      local key
      if c == '"' or c == "'" then
        key, i = read_string(s, i)
      else
        key = s:match("^[%w_%-%.]+", i)
        if not key then fail(i, "expected a key, found '" .. c .. "'") end
        i = i + #key
      end
      i = skip_ws(s, i)
      local sep = s:sub(i, i)
      if sep ~= ":" and sep ~= "=" then fail(i, "expected ':' after key \"" .. key .. "\"") end
      local v
      v, i = parse_value(s, skip_ws(s, i + 1), depth + 1)
      obj[key] = v
    else
      local v
      v, i = parse_value(s, i, depth + 1)
      n = n + 1
      obj[n] = v
    end
    i = skip_ws(s, i)
    c = s:sub(i, i)
    if c == "," then
      i = skip_ws(s, i + 1)
    elseif c ~= close then
      fail(i, c == "" and ("missing '" .. close .. "'") or ("expected ',' or '" .. close .. "', found '" .. c .. "'"))
    end
  end
end

parse_value = function(s, i, depth)
  local c = s:sub(i, i)
  if c == "{" then return parse_container(s, i, depth, "}") end
  if c == "[" then return parse_container(s, i, depth, "]") end
  if c == '"' or c == "'" then
    local str, j = read_string(s, i)
    if is_numeric(str) then return tonumber(str), j end
    return str, j
  end
  local num = s:match("^[-+]?%d+%.?%d*[eE][-+]?%d+", i) or s:match("^[-+]?%d+%.?%d*", i)
              or s:match("^[-+]?%.%d+", i)
  if num then return tonumber(num), i + #num end
  local word = s:match("^[%a_][%w_]*", i)
  if word and IS_WORD[word:lower()] then return WORDS[word:lower()], i + #word end
  if c == "" then fail(i, "expected a value, found the end of the text") end
  fail(i, "expected a value, found '" .. (word or c) .. "'")
end

local function clip(s)
  s = s:gsub("%s+", " ")
  return #s > 120 and (s:sub(1, 120) .. "...") or s
end

function M.extract_json(text)
  if type(text) ~= "string" then
    error("clrt.llm.extract_json: expected a string, got " .. type(text), 2)
  end
  local first_err
  local i, tries = 1, 0
  while tries < 200 do
    local start = text:find("{", i, true)
    if not start then break end
    tries = tries + 1
    local ok, v = pcall(parse_value, text, start, 1)
    if ok then return v end
    if type(v) ~= "table" then error(v, 0) end
    first_err = first_err or { start = start, pos = v.pos, msg = v.msg }
    -- Look for the next candidate after this one's braces close, so a broken outer object
    -- is not silently replaced by an object nested inside it.
    local depth, j = 0, start
    while j <= #text do
      local ch = text:sub(j, j)
      if ch == "{" then depth = depth + 1 elseif ch == "}" then depth = depth - 1 end
      if depth == 0 then break end
      j = j + 1
    end
    i = (depth == 0) and (j + 1) or (start + 1)
  end
  if not first_err then
    error("clrt.llm.extract_json: no {...} object in the reply: " .. clip(text), 2)
  end
  error(("clrt.llm.extract_json: cannot parse the object at offset %d: %s at offset %d; reply: %s")
        :format(first_err.start, first_err.msg, first_err.pos, clip(text)), 2)
end

return M
