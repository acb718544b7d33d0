-- clrt.cli.help — help(x) in the REPL and the command list of `clrt --help`, both read from
-- the doc comments the files carry (a module's leading comment block, the comment block
-- right above `function M.name` or `function Class:method`), so they never go stale.
--   help()                   the main modules and how to start
--   help(clrt.model)         a module: its description, functions and classes
--   help(m), help(tok)       an object: its class's methods, one line each
--   help(m.generate)         a function: its signature and comment
--   help("model.generate")   the same by name ("tokenizer.load", "Model:chat", ...)
local M = {}

local function lua_dir()
  return require("ffi").string(require("clrt.core.ffi").C.clrt_lua_dir())
end

local file_cache = {}
local function lines_of(path)
  if file_cache[path] == nil then
    local f = io.open(path, "rb")
    local lines = false
    if f then
      lines = {}
      for line in f:lines() do lines[#lines + 1] = line end
      f:close()
    end
    file_cache[path] = lines
  end
  return file_cache[path] or nil
end

local function comment_text(line) return line:match("^%s*%-%-%s?(.*)$") end

-- The leading comment block of a file (its module doc), as lines without the "-- ".
function M.file_doc(path)
  local lines = lines_of(path)
  if not lines then return nil end
  local out = {}
  for _, line in ipairs(lines) do
    local text = comment_text(line)
    if not text or line:match("^%s*%-%-%[") then break end
    out[#out + 1] = text
  end
  return #out > 0 and out or nil
end

-- The first sentence of a doc block: up to a ". " or a ":" outside brackets, on one line,
-- at most `width` characters (cut at a word).
function M.summary(doc, width)
  width = width or 96
  local text = table.concat(doc or {}, " "):gsub("%s+", " "):gsub("^ ", "")
  local depth, cut, words = 0, #text, false
  for i = 1, #text do
    local c = text:sub(i, i)
    if c == "(" or c == "[" or c == "{" then depth = depth + 1
    elseif (c == ")" or c == "]" or c == "}") and depth > 0 then depth = depth - 1
    elseif depth == 0 and c == " " then words = true
    elseif depth == 0 and (c == ":" or c == ";" or c == ".") and (i == #text or text:sub(i + 1, i + 1) == " ")
      and words then   -- "path: a folder ...", "load(dir): ..." name what follows: go on
      cut = c == "." and i or i - 1
      break
    end
  end
  text = text:sub(1, cut)
  if #text > width then text = text:gsub(" %b()", "") end   -- asides go first, calls stay
  if #text > width then text = text:sub(1, width):gsub("%s+%S*$", "") .. " ..." end
  return text
end

-- A module file's doc without its "name — " lead ("clrt.model — the Llama..." -> "the Llama...").
local function module_doc(path)
  local doc = M.file_doc(path)
  if doc then
    doc[1] = doc[1]:gsub("^[%w_%.]+ — ", "")
  end
  return doc
end

-- Where a Lua function is defined: its file, its definition line (the signature) and the
-- comment block right above it.
function M.function_doc(f)
  local info = debug.getinfo(f, "S")
  if not info or info.what ~= "Lua" or info.source:sub(1, 1) ~= "@" then return nil end
  local path = info.source:sub(2)
  local lines = lines_of(path)
  if not lines or not lines[info.linedefined] then return nil end
  local def = lines[info.linedefined]
  local sig = def:match("function%s+([%w_%.:]+%s*%b())") or def:match("([%w_%.:]+)%s*=%s*function%s*%b()")
  local doc, i = {}, info.linedefined - 1
  while i >= 1 and comment_text(lines[i]) do
    table.insert(doc, 1, comment_text(lines[i]))
    i = i - 1
  end
  return { path = path, line = info.linedefined, signature = sig, doc = doc }
end

-- The short path of a source file (from the Lua dir: "clrt/model.lua").
local function short(path)
  local dir = lua_dir()
  if path:sub(1, #dir + 1) == dir .. "/" then return "lua/" .. path:sub(#dir + 2) end
  return path
end

-- The module name of a loaded table (package.loaded's key), and the module and key that
-- hold a class table (e.g. Model in clrt.model as M.Model).
local function module_name(t)
  for name, v in pairs(package.loaded) do
    if v == t and type(name) == "string" and name:match("^clrt") then return name end
  end
end
local function class_home(cls)
  for name, mod in pairs(package.loaded) do
    if type(mod) == "table" and type(name) == "string" and name:match("^clrt") then
      for k, v in pairs(mod) do
        if v == cls and type(k) == "string" then return name, k end
      end
    end
  end
end

local function module_path(name)
  return package.searchpath and package.searchpath(name, package.path)
    or lua_dir() .. "/" .. name:gsub("%.", "/") .. ".lua"
end

local function sorted_keys(t, want)
  local out = {}
  for k, v in pairs(t) do
    if type(k) == "string" and not k:match("^_") and want(v) then out[#out + 1] = k end
  end
  table.sort(out)
  return out
end

-- One line per function of t: "  prefix.name(args)  first sentence of its comment".
local function function_lines(t, prefix, sep, out)
  local names = sorted_keys(t, function(v) return type(v) == "function" end)
  for _, k in ipairs(names) do
    local d = M.function_doc(t[k])
    local args = d and d.signature and d.signature:match("%b()$") or "(...)"
    local line = ("  %s%s%s%s"):format(prefix, sep, k, args)
    local s = d and #d.doc > 0 and M.summary(d.doc, math.max(30, 98 - math.max(40, #line))) or ""
    out[#out + 1] = s ~= "" and ("%-40s %s"):format(line, s) or line
  end
  return #names
end

-- A class: the table holding the methods of an object (its metatable's __index).
local function class_of(x)
  if type(x) == "cdata" then   -- getmetatable says only "ffi"; tensors' methods are clrt.tensor.Tensor
    local ok, tensor = pcall(require, "clrt.tensor")
    return ok and tensor.is_tensor(x) and tensor.Tensor or nil
  end
  local mt = getmetatable(x)
  if type(mt) ~= "table" then return nil end
  if type(mt.__index) == "table" then return mt.__index end
  return mt
end

local function is_class(v) return type(v) == "table" and rawget(v, "__index") == v end

local function help_module(t, name)
  local out = {}
  local path = module_path(name)
  local doc = path and module_doc(path)
  out[1] = ("%s (%s)"):format(name, path and short(path) or "?")
  for _, l in ipairs(doc or { "(no doc comment)" }) do out[#out + 1] = "  " .. l end
  local short_name = name:gsub("^clrt%.", "")
  out[#out + 1] = "functions:"
  if function_lines(t, short_name, ".", out) == 0 then out[#out] = nil end
  for _, k in ipairs(sorted_keys(t, is_class)) do
    out[#out + 1] = ("class %s (methods: help(\"%s:NAME\"), or help(obj) on one):"):format(k, k)
    function_lines(t[k], k, ":", out)
  end
  return out
end

local function help_object(x)
  local cls = class_of(x)
  if type(cls) ~= "table" then return { ("help: %s has no methods or doc; help() lists the modules"):format(tostring(x)) } end
  local mod, key = class_home(cls)
  local out = {}
  local label = key and ("%s (%s.%s)"):format(key, mod, key) or "object"
  local path = mod and module_path(mod)
  local doc = path and module_doc(path)
  out[1] = ("%s — %s"):format(label, doc and M.summary(doc) or tostring(x))
  out[#out + 1] = "methods (help(obj.NAME) for one):"
  local var = key and key:sub(1, 1):lower() or "obj"
  if key == "Tokenizer" then var = "tok" elseif key == "Tensor" then var = "t" end
  function_lines(cls, var, ":", out)
  local fields = type(x) == "table" and sorted_keys(x, function(v) return type(v) ~= "function" end) or {}
  if #fields > 0 then
    local shown = {}
    for i = 1, math.min(#fields, 12) do shown[i] = fields[i] end
    out[#out + 1] = "fields: " .. table.concat(shown, ", ") .. (#fields > 12 and ", ..." or "")
  end
  return out
end

local function help_function(f, name)
  local d = M.function_doc(f)
  if not d then return { (name or tostring(f)) .. ": a built-in function (no Lua source to read its doc from)" } end
  local sig = d.signature or name or "function"
  local mod = short(d.path):match("^lua/(.+)%.lua$")
  if mod then sig = sig:gsub("^M%.", mod:gsub("/", ".") .. ".") end   -- "M.generate" -> "clrt.chat.generate"
  local out = { ("%s  (%s:%d)"):format(sig, short(d.path), d.line) }
  if #d.doc == 0 then out[#out + 1] = "  (no doc comment)" end
  for _, l in ipairs(d.doc) do out[#out + 1] = "  " .. l end
  return out
end

-- "model.generate", "clrt.tokenizer.load", "Model:chat", "chat.generate" -> the value and
-- its printable name, or nil and why.
local function resolve(name)
  local parts = {}
  for p in name:gsub("^clrt%.", ""):gmatch("[^%.:]+") do parts[#parts + 1] = p end
  if #parts == 0 then return nil, "an empty name" end
  local ok, mod = pcall(require, "clrt." .. parts[1])
  local cur, at
  if ok and type(mod) == "table" then
    cur, at = mod, "clrt." .. parts[1]
  elseif not name:match("^clrt%.") and (type(rawget(_G, parts[1])) == "table" or type(rawget(_G, parts[1])) == "cdata") then
    cur, at = rawget(_G, parts[1]), parts[1]   -- a global object: "m:generate", "tok.encode"
  else
    for mname, m in pairs(package.loaded) do   -- a class name: Model, Tokenizer, Tensor
      if type(m) == "table" and type(mname) == "string" and mname:match("^clrt") and type(m[parts[1]]) == "table" then
        cur, at = m[parts[1]], mname .. "." .. parts[1]
        break
      end
    end
    if not cur and #parts == 1 then
      -- a bare function name ("generate"): the loaded modules' and classes' functions of that name
      local found, seen = {}, {}
      for mname, m in pairs(package.loaded) do
        if type(m) == "table" and type(mname) == "string" and mname:match("^clrt") then
          if type(m[parts[1]]) == "function" and not seen[m[parts[1]]] then
            seen[m[parts[1]]] = true
            found[#found + 1] = mname .. "." .. parts[1]
          end
          for cname, c in pairs(m) do
            if type(cname) == "string" and cname:match("^%u") and type(c) == "table" and type(rawget(c, parts[1])) == "function"
               and not seen[c[parts[1]]] then
              seen[c[parts[1]]] = true
              found[#found + 1] = cname .. ":" .. parts[1]
            end
          end
        end
      end
      table.sort(found)
      if #found > 0 then
        return nil, ("'%s' is %s: help(\"%s\") for one"):format(parts[1], table.concat(found, ", "), found[1])
      end
    end
    if not cur then return nil, ("no module clrt.%s (help() lists them)"):format(parts[1]) end
  end
  for i = 2, #parts do
    local v = type(cur) == "table" and rawget(cur, parts[i]) or nil
    local cls = v == nil and class_of(cur)
    if type(cls) == "table" then v = cls[parts[i]] end   -- an object's method
    if v == nil and type(cur) == "table" then   -- a method of one of the module's classes
      for _, k in ipairs(sorted_keys(cur, is_class)) do
        if type(cur[k][parts[i]]) == "function" then v = cur[k][parts[i]]; break end
      end
    end
    if v == nil then return nil, ("%s has no '%s'"):format(at, parts[i]) end
    cur, at = v, at .. "." .. parts[i]
  end
  return cur, at
end

local START = [[
Start:
  m = clrt.model.load("models/Qwen3-0.6B")     -- a Hugging Face folder (config.json, *.safetensors)
  tok = clrt.tokenizer.load("models/Qwen3-0.6B")
  m:chat("Plan a trip.")                        -- a chat reply (the folder's tokenizer and template)
  m:generate({tok:encode("Once upon")}, {max_new_tokens = 20})[1].text   -- needs tokenizer = tok for .text
  help(m), help(tok), help(clrt.chat), help("model.load")
Run a recipe: clrt recipes/NAME.lua key=value ...   (clrt --help lists them)]]

-- help() alone: the main modules (first sentence of each file's doc) and how to start.
local function overview()
  local out = { "clrt — the modules (clrt.NAME loads on first use; help(clrt.NAME) for one):" }
  local dir = lua_dir() .. "/clrt"
  local ok, names = pcall(require("clrt.files").list, dir)
  table.sort(ok and names or {})
  for _, f in ipairs(ok and names or {}) do
    local mod = f:match("^([%a_][%w_]*)%.lua$")
    if mod and mod ~= "init" then
      local doc = module_doc(dir .. "/" .. f)
      out[#out + 1] = ("  %-16s %s"):format(mod, doc and M.summary(doc, 90) or "")
    end
  end
  out[#out + 1] = START
  return out
end

-- help(x): print the doc of x (see the top of this file).
function M.help(...)
  local x = ...
  local out
  if select("#", ...) == 0 then
    out = overview()
  elseif type(x) == "string" then
    local v, at = resolve(x)
    if v == nil then
      out = { ("help: %s"):format(at) }
    elseif type(v) == "function" then
      out = help_function(v, at)
    elseif module_name(v) then
      out = help_module(v, module_name(v))
    else
      out = help_object(v)
    end
  elseif type(x) == "function" then
    out = help_function(x)
  elseif type(x) == "table" and module_name(x) then
    out = help_module(x, module_name(x))
  elseif (type(x) == "table" or type(x) == "cdata") and class_of(x) then
    out = help_object(x)
  else
    out = { ("help: a %s has no doc; help() lists the modules"):format(type(x)) }
  end
  io.stdout:write(table.concat(out, "\n"), "\n")
  io.stdout:flush()
end

-- The one-line description of a command file: its doc after the synopsis lines
-- ("clrt serve MODEL_DIR [...]" and their indented continuations).
local function command_summary(path)
  local doc = M.file_doc(path) or {}
  local i = 1
  while doc[i] and (doc[i]:match("^clrt ") or doc[i]:match("^%s+%[")) do i = i + 1 end
  local rest = {}
  for j = i, #doc do rest[#rest + 1] = doc[j] end
  return M.summary(rest, 80)
end

local function lua_files(dir)
  local ok, names = pcall(require("clrt.files").list, dir)
  local out = {}
  for _, f in ipairs(ok and names or {}) do
    if f:match("^[%w_]+%.lua$") then out[#out + 1] = f end
  end
  table.sort(out)
  return out
end

-- What `clrt --help` lists after the options: the subcommands and the shipped recipes, one
-- line each from their files' doc comments.
function M.catalogue()
  local dir = lua_dir()
  local out = { "commands (clrt COMMAND --help for their flags):" }
  for _, f in ipairs(lua_files(dir .. "/clrt/cli/commands")) do
    out[#out + 1] = ("  %-8s %s"):format(f:gsub("%.lua$", ""), command_summary(dir .. "/clrt/cli/commands/" .. f))
  end
  out[#out + 1] = "recipes (clrt recipes/NAME.lua key=value ...):"
  for _, f in ipairs(lua_files(dir .. "/recipes")) do
    local doc = module_doc(dir .. "/recipes/" .. f)
    out[#out + 1] = ("  %-20s %s"):format(f, M.summary(doc, 72))
  end
  out[#out + 1] = "In the REPL, help() lists the library's modules."
  io.stdout:write(table.concat(out, "\n"), "\n")
end

return M
