-- clrt — the Lua face of the runtime. Preloaded as the global `clrt` in every script and the
-- REPL. `clrt.X` loads the module clrt.X (lua/clrt/X.lua) on first use, so a script pays only
-- for what it touches and a new module needs no registration here.
local clrt = {}

setmetatable(clrt, {
  __index = function(t, k)
    if type(k) ~= "string" or not k:match("^[%a_][%w_]*$") then return nil end
    local ok, m = pcall(require, "clrt." .. k)
    if not ok then
      if tostring(m):find("module 'clrt." .. k .. "' not found", 1, true) then return nil end
      error(m, 2)
    end
    rawset(t, k, m)
    return m
  end,
})

-- clrt.model is the transformer alone (it requires nothing above tensors); for the binary's
-- users it comes with its generation and chat methods (m:decoder, m:generate, m:chat, from
-- clrt.gen.model_methods), by whichever name it is first reached: clrt.model, require, help.
-- Only loading the model pays for generation, as before.
package.preload["clrt.model"] = function(name)
  package.preload[name] = nil
  local path = assert(package.searchpath(name, package.path))
  package.loaded[name] = assert(loadfile(path))(name)
  -- nil unless already loading (Lua's sentinel) or loaded: the methods' module requires the model
  if package.loaded["clrt.gen.model_methods"] == nil then require("clrt.gen.model_methods") end
  return package.loaded[name]
end

local core = require("clrt.core.ffi")
local ffi = require("ffi")
clrt.version = ffi.string(core.C.clrt_version())
clrt.lua_dir = ffi.string(core.C.clrt_lua_dir())
-- The examples folder beside the Lua dir (source tree and install alike) is on the module
-- path, so the built-in world loads as require("collab_world.world") from anywhere.
package.path = package.path .. ";" .. clrt.lua_dir .. "/../examples/?.lua"
-- CLRT_PATH: the user's own folders of metrics/, interactions/ and prompts/, searched before
-- the shipped ones (clrt.plugins)
do
  local dirs = {}
  for dir in (os.getenv("CLRT_PATH") or ""):gmatch("[^:]+") do dirs[#dirs + 1] = (dir:gsub("/+$", "")) end
  for i = #dirs, 1, -1 do package.path = dirs[i] .. "/?.lua;" .. dirs[i] .. "/?/init.lua;" .. package.path end
end

-- Ctrl-C was pressed during this script; check_interrupt raises "interrupted" then
-- (clrt.core.interrupt).
local interrupt = require("clrt.core.interrupt")
clrt.interrupted, clrt.check_interrupt = interrupt.pressed, interrupt.check
function clrt.num_threads() return core.C.clrt_num_threads() end
function clrt.set_num_threads(n) core.C.clrt_set_num_threads(n) end
function clrt.cuda_available() return core.C.clrt_cuda_device_count() > 0 end
-- The GPU's name and dense bf16 peak TFLOP/s (CLRT_PEAK_TFLOPS overrides; 0 unknown).
function clrt.cuda_device_name() return ffi.string(core.C.clrt_cuda_device_name_str()) end
function clrt.cuda_peak_tflops() return core.C.clrt_cuda_peak_tflops() end
function clrt.cuda_status() return ffi.string(core.C.clrt_cuda_status()) end

-- The submodule names (for REPL completion), including those not loaded yet.
function clrt._submodules()
  local out = {}
  local ok, names = pcall(require("clrt.files").list, clrt.lua_dir .. "/clrt")
  for _, name in ipairs(ok and names or {}) do
    local mod = name:match("^([%a_][%w_]*)%.lua$")
    if mod and mod ~= "init" then out[#out + 1] = mod end
  end
  return out
end

return clrt
