-- clrt.prompt_file — prompts kept as text files, so a researcher can read, diff and replace
-- them without touching code.
--
--   local pf = require("clrt.prompt_file")
--   local text = pf.read("collabllm_user")          -- lua/prompts/collabllm_user.txt
--   local text = pf.read("/path/to/verl_user.txt")  -- any file (a name with a '/' or a dot)
--   local msg  = pf.fill(text, { chat_history = "...", question = "..." }, where)
--
-- A file may start with a header: lines beginning with '#' (what the prompt carries from
-- which reference, and its placeholders), ended by a line that is exactly '---'. The prompt
-- is what follows. A file without such a header is all prompt, so a reference's text can be
-- used as it is.
--
-- Placeholders follow Python's str.format, as the reference implementations write their
-- prompts: {name} is replaced by vars.name, '{{' and '}}' are literal braces. A placeholder
-- with no value, or a lone brace, is an error naming the file: a prompt never goes out with
-- a hole in it.
local M = {}

-- lua/ (this file is lua/clrt/prompt_file.lua): found from the file itself, not a global.
local function lua_dir()
  local src = debug.getinfo(1, "S").source
  local dir = src:sub(1, 1) == "@" and src:sub(2):match("^(.*)/clrt/[^/]*$")
  return dir or "lua"
end

-- The path of a prompt given by name (lua/prompts/<name>.txt) or as a path.
function M.path(name_or_path)
  if type(name_or_path) ~= "string" or name_or_path == "" then
    error(("prompt_file: expected a prompt name or a file path, got %s"):format(tostring(name_or_path)), 2)
  end
  if name_or_path:find("[/.]") then return name_or_path end
  -- a name: the user's own (CLRT_PATH's prompts/) before the shipped one
  return require("clrt.plugins").user_prompt(name_or_path) or (lua_dir() .. "/prompts/" .. name_or_path .. ".txt")
end

-- The prompt text of a file (header dropped); errors name the file.
function M.read(name_or_path)
  local path = M.path(name_or_path)
  local f, err = io.open(path, "rb")
  if not f then error(("prompt_file: cannot read prompt %s (%s)"):format(path, tostring(err)), 2) end
  local text = f:read("*a")
  f:close()
  if text:sub(1, 1) == "#" then
    local body_at = 1
    local header_ok = false
    for line, next_at in text:gmatch("([^\n]*)\n()") do
      if line == "---" then header_ok, body_at = true, next_at break end
      if line:sub(1, 1) ~= "#" then break end
    end
    if header_ok then text = text:sub(body_at) end
  end
  return text
end

-- text with its {placeholders} filled from vars (strings or numbers); `where` names the
-- prompt in errors (a path or a name).
function M.fill(text, vars, where)
  where = where or "prompt"
  local out, i, n = {}, 1, #text
  while i <= n do
    local c = text:sub(i, i)
    if c == "{" and text:sub(i + 1, i + 1) == "{" then
      out[#out + 1] = "{"; i = i + 2
    elseif c == "}" and text:sub(i + 1, i + 1) == "}" then
      out[#out + 1] = "}"; i = i + 2
    elseif c == "{" then
      local close = text:find("}", i + 1, true)
      local name = close and text:sub(i + 1, close - 1)
      if not name or not name:match("^[%a_][%w_]*$") then
        error(("prompt_file: %s: a '{' at byte %d opens no {name} placeholder (write '{{' for a brace)")
          :format(where, i), 2)
      end
      local v = vars[name]
      if v == nil then error(("prompt_file: %s: no value for placeholder {%s}"):format(where, name), 2) end
      out[#out + 1] = tostring(v); i = close + 1
    elseif c == "}" then
      error(("prompt_file: %s: a lone '}' at byte %d (write '}}' for a brace)"):format(where, i), 2)
    else
      local j = text:find("[{}]", i) or n + 1
      out[#out + 1] = text:sub(i, j - 1); i = j
    end
  end
  return table.concat(out)
end

-- The placeholders a prompt uses, in order of first use (to check a user's file up front).
function M.placeholders(text)
  local names, seen = {}, {}
  for name in text:gsub("{{", ""):gsub("}}", ""):gmatch("{([%a_][%w_]*)}") do
    if not seen[name] then seen[name] = true; names[#names + 1] = name end
  end
  return names
end

return M
