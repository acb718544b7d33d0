-- clrt.jinja.lexer — template source to tokens, as @huggingface/jinja reads a chat template:
-- one trailing newline dropped, lstrip_blocks and trim_blocks on (what transformers renders
-- with), transformers' {% generation %} tags removed, {%- -%} {{- -}} {#- -#} strip the
-- neighbouring whitespace (Unicode whitespace, as JavaScript's trim does).
-- Every token carries the line of the template it came from, for errors.
local text = require("clrt.jinja.text")

local M = {}
local byte, sub, find = string.byte, string.sub, string.find

local function fail(line, msg) error(("chat template line %d: %s"):format(line, msg), 0) end
M.fail = fail

-- The source after the whitespace settings, and for each of its bytes the template line.
local function preprocess(src)
  if sub(src, -1) == "\n" then src = sub(src, 1, -2) end
  local out, lines, n, line = {}, {}, 0, 1
  local i, len = 1, #src
  local line_start = true
  while i <= len do
    local c = sub(src, i, i)
    if line_start then
      -- lstrip_blocks: spaces and tabs from a line's start up to {% {# or {-
      local j = i
      while sub(src, j, j) == " " or sub(src, j, j) == "\t" do j = j + 1 end
      local two = sub(src, j, j + 1)
      if j > i and (two == "{%" or two == "{#" or two == "{-") then i = j; c = sub(src, i, i) end
      line_start = false
    end
    -- trim_blocks: the newline right after %} #} or -}
    if c == "}" and i > 1 and sub(src, i + 1, i + 1) == "\n" then
      local p = sub(src, i - 1, i - 1)
      if p == "%" or p == "#" or p == "-" then
        n = n + 1; out[n] = "}"; lines[n] = line
        i = i + 2; line = line + 1; line_start = true
        goto continue
      end
    end
    n = n + 1; out[n] = c; lines[n] = line
    if c == "\n" or c == "\r" then
      if c == "\n" then line = line + 1 end
      line_start = true
    end
    i = i + 1
    ::continue::
  end
  src = table.concat(out)
  -- {% generation %} / {% endgeneration %} go; whitespace around them stays unless - asks
  local res, rlines, m, pos = {}, {}, 0, 1
  local function keep(a, b)
    for k = a, b do m = m + 1; res[m] = sub(src, k, k); rlines[m] = lines[k] end
  end
  while true do
    local a, b, lstrip, rstrip = find(src, "{%%(%-?)%s*e?n?d?generation%s*(%-?)%%}", pos)
    if not a then break end
    local word = sub(src, a, b):match("{%%%-?%s*(%a+)")
    if word ~= "generation" and word ~= "endgeneration" then keep(pos, b); pos = b + 1; goto next end
    do
      local before = a
      if lstrip == "-" then
        while before > pos do
          local nb = 0
          for w = 1, 3 do if before - w >= pos and text.space_at(src, before - w) == w then nb = w end end
          if nb == 0 then break end
          before = before - nb
        end
      end
      keep(pos, before - 1)
      pos = b + 1
      if rstrip == "-" then pos = text.skip_space(src, pos) end
    end
    ::next::
  end
  keep(pos, #src)
  return table.concat(res), rlines
end

local SINGLE = { ["("] = "(", [")"] = ")", ["{"] = "{", ["}"] = "}", ["["] = "[", ["]"] = "]",
  [","] = ",", ["."] = ".", [":"] = ":", ["|"] = "|" }
local ESCAPES = { n = "\n", t = "\t", r = "\r", b = "\b", f = "\f", v = "\v", ["'"] = "'", ['"'] = '"', ["\\"] = "\\" }

-- Token types: text, num, str, name, "=", "(", ")", "{%", "%}", "{{", "}}", "[", "]", "{", "}",
-- ",", ".", ":", "|", cmp, add, mul, pow, unary, comment.
function M.tokenize(source)
  local src, lines = preprocess(source)
  local toks, nt = {}, 0
  local i, len = 1, #src
  local depth = 0
  local function line_at(k) return lines[math.min(k, len)] or lines[len] or 1 end
  local function push(t, v, at) nt = nt + 1; toks[nt] = { t = t, v = v, line = line_at(at) } end
  local function strip_last_text()
    local last = toks[nt]
    if last and last.t == "text" then
      last.v = text.trim_end(last.v)
      if last.v == "" then toks[nt] = nil; nt = nt - 1 end
    end
  end
  local function is_word(c) return c ~= "" and find(c, "^[%w_]") ~= nil end
  local function is_digit(c) return c ~= "" and find(c, "^%d") ~= nil end

  while i <= len do
    local last = toks[nt] and toks[nt].t
    if last == nil or last == "%}" or last == "}}" or last == "comment" then
      local a = i
      while i <= len do
        local s = find(src, "{", i, true)
        if not s then i = len + 1; break end
        local nx = sub(src, s + 1, s + 1)
        if nx == "%" or nx == "{" or nx == "#" then i = s; break end
        i = s + 1
      end
      if i > a then push("text", sub(src, a, i - 1), a); goto continue end
    end
    do
      local two = sub(src, i, i + 1)
      if two == "{#" then
        local at = i
        i = i + 2
        local strip_before = sub(src, i, i) == "-"
        if strip_before then i = i + 1 end
        local e = find(src, "#}", i, true)
        if not e or e + 1 > len then fail(line_at(at), "a comment {# is not closed with #}") end
        local body = sub(src, i, e - 1)
        local strip_after = sub(body, -1) == "-"
        if strip_after then body = sub(body, 1, -2) end
        if strip_before then strip_last_text() end
        push("comment", body, at)
        i = e + 2
        if strip_after then i = text.skip_space(src, i) end
        goto continue
      end
      local three = sub(src, i, i + 2)
      if three == "{%-" then strip_last_text(); push("{%", "{%", i); i = i + 3; goto continue end
      if three == "{{-" then strip_last_text(); push("{{", "{{", i); depth = 0; i = i + 3; goto continue end
      -- whitespace inside tags
      while i <= len and find(sub(src, i, i), "^%s") do i = i + 1 end
      if i > len then break end
      three = sub(src, i, i + 2)
      if three == "-%}" then push("%}", "%}", i); i = text.skip_space(src, i + 3); goto continue end
      if three == "-}}" then push("}}", "}}", i); i = text.skip_space(src, i + 3); goto continue end
      local c = sub(src, i, i)
      if c == "-" or c == "+" then
        if last == "text" or last == nil then fail(line_at(i), "unexpected character " .. c) end
        if not (last == "name" or last == "num" or last == "str" or last == ")" or last == "]") then
          local at = i
          i = i + 1
          local a = i
          while is_digit(sub(src, i, i)) do i = i + 1 end
          local num = sub(src, a, i - 1)
          if num ~= "" and sub(src, i, i) == "." and is_digit(sub(src, i + 1, i + 1)) then
            local f = i + 1
            i = f
            while is_digit(sub(src, i, i)) do i = i + 1 end
            num = num .. "." .. sub(src, f, i - 1)
          end
          if num ~= "" then push("num", c .. num, at) else push("unary", c, at) end
          goto continue
        end
      end
      two = sub(src, i, i + 1)
      if two == "{%" or two == "%}" or two == "{{" or (two == "}}" and depth == 0) then
        push(two, two, i)
        if two == "{{" then depth = 0 end
        i = i + 2
        goto continue
      end
      if SINGLE[c] then
        push(c, c, i)
        if c == "{" then depth = depth + 1 elseif c == "}" then depth = depth - 1 end
        i = i + 1
        goto continue
      end
      if two == "<=" or two == ">=" or two == "==" or two == "!=" then push("cmp", two, i); i = i + 2; goto continue end
      if c == "<" or c == ">" then push("cmp", c, i); i = i + 1; goto continue end
      if c == "+" or c == "-" or c == "~" then push("add", c, i); i = i + 1; goto continue end
      if two == "**" then push("pow", two, i); i = i + 2; goto continue end
      if two == "//" then push("mul", two, i); i = i + 2; goto continue end
      if c == "*" or c == "/" or c == "%" then push("mul", c, i); i = i + 1; goto continue end
      if c == "=" then push("=", c, i); i = i + 1; goto continue end
      if c == "'" or c == '"' then
        local at = i
        i = i + 1
        local buf = {}
        while true do
          if i > len then fail(line_at(at), "a string is not closed") end
          local ch = sub(src, i, i)
          if ch == c then break end
          if ch == "\\" then
            i = i + 1
            if i > len then fail(line_at(at), "a string ends in a backslash") end
            local e = sub(src, i, i)
            i = i + 1
            if e == "x" or e == "u" then
              local hex = sub(src, i, i + (e == "x" and 1 or 3))
              if #hex ~= (e == "x" and 2 or 4) or hex:find("[^%x]") then
                fail(line_at(at), "invalid escape \\" .. e .. hex)
              end
              local cp = tonumber(hex, 16)
              i = i + #hex
              -- a UTF-16 surrogate pair written as two \u escapes is one character
              local lo = e == "u" and cp >= 0xD800 and cp <= 0xDBFF and sub(src, i, i + 1) == "\\u" and tonumber(sub(src, i + 2, i + 5), 16)
              if lo and lo >= 0xDC00 and lo <= 0xDFFF then
                cp = 0x10000 + (cp - 0xD800) * 1024 + (lo - 0xDC00)
                i = i + 6
              end
              buf[#buf + 1] = text.utf8(cp)
            else
              if not ESCAPES[e] then fail(line_at(at), "unknown escape \\" .. e .. " in a string") end
              buf[#buf + 1] = ESCAPES[e]
            end
          else
            buf[#buf + 1] = ch
            i = i + 1
            if i > len then fail(line_at(at), "a string is not closed") end
          end
        end
        push("str", table.concat(buf), at)
        i = i + 1
        goto continue
      end
      if is_digit(c) then
        local a = i
        while is_digit(sub(src, i, i)) do i = i + 1 end
        if last ~= "." and sub(src, i, i) == "." and is_digit(sub(src, i + 1, i + 1)) then
          i = i + 1
          while is_digit(sub(src, i, i)) do i = i + 1 end
        end
        push("num", sub(src, a, i - 1), a)
        goto continue
      end
      if is_word(c) then
        local a = i
        while is_word(sub(src, i, i)) do i = i + 1 end
        push("name", sub(src, a, i - 1), a)
        goto continue
      end
      fail(line_at(i), ("unexpected character %q"):format(c))
    end
    ::continue::
  end
  return toks
end

return M
