-- clrt.plugins — where metrics, simulated users and prompts are found: the folders named by
-- CLRT_PATH (colon-separated, searched first, so a user's metrics/accuracy.lua replaces the
-- shipped one), then clrt's own Lua folder. A plug-in is KIND/NAME.lua under one of them
-- (metrics/, interactions/) or a file given by path (sim=./my_user.lua); a prompt is
-- prompts/NAME.txt. lua/clrt/init.lua puts the CLRT_PATH folders first on package.path.
--
--   plugins.user_dirs()                      -- the CLRT_PATH folders, in order
--   plugins.find("metrics", "brevity")       -- module name or file path, and the display name
--   plugins.load("metrics", "./brevity.lua") -- the plug-in's table (a file is loaded once)
--   plugins.searched("metrics")              -- "DIR/metrics, ..." for an unknown name's error
--   plugins.known("interactions")            -- every name found, sorted
local files = require("clrt.files")

local M = {}

function M.user_dirs()
  local out = {}
  for dir in (os.getenv("CLRT_PATH") or ""):gmatch("[^:]+") do out[#out + 1] = (dir:gsub("/+$", "")) end
  return out
end

-- Every folder on package.path (CLRT_PATH's first), once each.
local function roots()
  local seen, out = {}, {}
  for template in package.path:gmatch("[^;]+") do
    local dir = template:match("^(.*)/%?%.lua$")
    if dir and not seen[dir] then seen[dir] = true; out[#out + 1] = dir end
  end
  return out
end

local function is_file_name(name) return type(name) == "string" and name:match("%.lua$") ~= nil end

-- The module name (NAME found under KIND/) or the file (a path ending in .lua) a name
-- means, and the name the run shows for it (the file's base name); nil when there is none.
function M.find(kind, name)
  if is_file_name(name) then
    if not files.exists(name) then return nil end
    return name, name:match("([^/]+)%.lua$")
  end
  if type(name) ~= "string" or not name:match("^[%w_]+$") then return nil end
  if package.searchpath(kind .. "." .. name, package.path) then return kind .. "." .. name, name end
  return nil
end

local by_file = {}

-- The plug-in a name means (require'd, or a file run once); raises like require does.
function M.load(kind, name)
  local what = M.find(kind, name)
  if not what then error(("no %s plug-in '%s'"):format(kind, tostring(name)), 0) end
  if not is_file_name(name) then return require(what) end
  if by_file[what] == nil then
    local chunk, err = loadfile(what)
    if not chunk then error(err, 0) end
    by_file[what] = chunk(what)
  end
  return by_file[what]
end

-- The folders a KIND plug-in is looked for in, for an error that says where it looked.
function M.searched(kind)
  local out = {}
  for _, dir in ipairs(roots()) do
    if files.is_dir(dir .. "/" .. kind) then out[#out + 1] = dir .. "/" .. kind end
  end
  return table.concat(out, ", ")
end

function M.known(kind)
  local seen, out = {}, {}
  for _, dir in ipairs(roots()) do
    local ok, names = pcall(files.list, dir .. "/" .. kind)
    for _, n in ipairs(ok and names or {}) do
      local name = n:match("^([%w_]+)%.lua$")
      if name and not seen[name] then seen[name] = true; out[#out + 1] = name end
    end
  end
  table.sort(out)
  return out
end

-- A prompt's file by name: prompts/NAME.txt in the first CLRT_PATH folder that has it, else nil.
function M.user_prompt(name)
  for _, dir in ipairs(M.user_dirs()) do
    local p = dir .. "/prompts/" .. name .. ".txt"
    if files.exists(p) then return p end
  end
  return nil
end

return M
