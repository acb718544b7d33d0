-- clrt.cli.repl — what the REPL does with a chunk of input, and tab completion.
-- The C side (runtime/cli/main.c) reads lines with readline and calls eval(); eval returns true
-- while the chunk is incomplete so the C side keeps reading continuation lines.
local M = {}

local MAX_DEPTH, MAX_ITEMS = 3, 40

local function is_ident(k) return type(k) == "string" and k:match("^[%a_][%w_]*$") end

-- Pretty-print a value: tables nested up to MAX_DEPTH, tensors summarised.
function M.show(v, depth, seen)
  depth, seen = depth or 0, seen or {}
  local tv = type(v)
  if tv == "string" then return ("%q"):format(v) end
  if tv == "cdata" then
    local ok, tensor = pcall(require, "clrt.tensor")
    if ok and tensor.is_tensor(v) then return tensor.summary(v) end
    return tostring(v)
  end
  if tv ~= "table" then return tostring(v) end
  local mt = getmetatable(v)
  if mt and mt.__tostring then return tostring(v) end
  if seen[v] then return "<cycle>" end
  if depth >= MAX_DEPTH then return "{...}" end
  seen[v] = true
  local parts, n = {}, 0
  local len = #v
  for i = 1, len do
    n = n + 1
    if n > MAX_ITEMS then parts[#parts + 1] = "..."; break end
    parts[#parts + 1] = M.show(v[i], depth + 1, seen)
  end
  local keys = {}
  for k in pairs(v) do
    if not (type(k) == "number" and k >= 1 and k <= len and k == math.floor(k)) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(keys) do
    n = n + 1
    if n > MAX_ITEMS then parts[#parts + 1] = "..."; break end
    local ks = is_ident(k) and k or ("[" .. M.show(k, MAX_DEPTH, seen) .. "]")
    parts[#parts + 1] = ks .. " = " .. M.show(v[k], depth + 1, seen)
  end
  seen[v] = nil
  return "{" .. table.concat(parts, ", ") .. "}"
end

local function incomplete(msg) return msg and msg:find("<eof>", 1, true) ~= nil end

-- The traceback up to the user's chunk: the frames of the REPL itself are noise.
local function traceback(e)
  local tb = debug.traceback(type(e) == "string" and e or M.show(e), 2)
  local cut = tb:find("\n%s*%[C%]: in function 'xpcall'")
  return cut and tb:sub(1, cut - 1) or tb
end

local function pack(...) return select("#", ...), { ... } end

-- Compile a chunk of text (never bytecode: malformed bytecode can crash LuaJIT).
local function compile(src, name) return load(src, name, "t") end

-- Evaluate a chunk; returns true when more lines are needed.
function M.eval(src)
  -- An expression first, so `1+1` and `t` print their value. The values go through pack()
  -- rather than a plain `return expr`: a tail call would drop the chunk's frame, and with
  -- it the line number of an error and the traceback. The newline keeps a trailing
  -- comment from swallowing the parenthesis.
  local fn, err = compile("local __pack = ...; return __pack(" .. src .. "\n)", "=stdin")
  local is_expr = fn ~= nil
  if not fn then
    fn, err = compile(src, "=stdin")
    if not fn then
      if incomplete(err) then return true end
      io.stderr:write(err, "\n")
      return false
    end
  end
  -- Hooks (Ctrl-C) only fire in interpreted code, so the user's chunk runs with the JIT off.
  jit.off(fn, true)
  local ok, n, vals = xpcall(fn, traceback, pack)
  if not ok then
    io.stderr:write(tostring(n), "\n")
    return false
  end
  if is_expr and n > 0 then
    local out = {}
    for i = 1, n do out[i] = M.show(vals[i]) end
    io.stdout:write(table.concat(out, "\t"), "\n")
  end
  io.stdout:flush()
  return false
end

-- Completion of `text` (the word under the cursor, e.g. "clrt.ten" or "str"): globals and
-- table fields, following dots and colons.
function M.complete(text)
  local prefix, sep, partial = text:match("^(.*)([%.:])([%w_]*)$")
  local scope, lead = _G, ""
  if prefix then
    local ok, v = pcall(function()
      local cur = _G
      for part in prefix:gmatch("[^%.:]+") do
        cur = cur[part]
        if cur == nil then return nil end
      end
      return cur
    end)
    if not ok or v == nil then return {} end
    scope, lead = v, prefix .. sep
  else
    partial = text
  end
  local names, seen = {}, {}
  local function add_from(tbl)
    if type(tbl) ~= "table" then return end
    for k in pairs(tbl) do
      if type(k) == "string" and not seen[k] and k:sub(1, #partial) == partial then
        seen[k] = true
        names[#names + 1] = lead .. k
      end
    end
  end
  local mt = getmetatable(scope)
  if type(scope) == "table" then add_from(scope) end
  if scope == _G.clrt and _G.clrt._submodules then
    for _, k in ipairs(_G.clrt._submodules()) do
      if not seen[k] and k:sub(1, #partial) == partial then seen[k] = true; names[#names + 1] = lead .. k end
    end
  end
  if type(scope) == "cdata" then
    -- getmetatable() on cdata says only "ffi"; tensors' methods live in clrt.tensor.Tensor.
    local ok, tensor = pcall(require, "clrt.tensor")
    if ok and tensor.is_tensor(scope) then add_from(tensor.Tensor) end
    mt = nil
  elseif type(scope) == "string" then
    mt = getmetatable(scope)
  end
  if mt and type(mt.__index) == "table" then add_from(mt.__index) end
  table.sort(names)
  return names
end

-- help(x) at the prompt: the doc comments of modules, objects and functions (clrt.cli.help).
function M.install_help()
  if rawget(_G, "help") == nil then
    rawset(_G, "help", function(...) return require("clrt.cli.help").help(...) end)
  end
end
M.install_help()

return M
