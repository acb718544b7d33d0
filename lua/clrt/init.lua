-- clrt — the Lua face of the runtime. Preloaded as the global `clrt` in every script and the
-- REPL. Submodules load on first use so a script pays only for what it touches.
local clrt = {}

local lazy = {
  tensor = "clrt.tensor", model = "clrt.model", tokenizer = "clrt.tokenizer",
  chat = "clrt.chat", optim = "clrt.optim", llm = "clrt.llm", sched = "clrt.sched",
  data = "clrt.data", config = "clrt.config", log = "clrt.log", test = "clrt.test",
  repl = "clrt.repl", util = "clrt.util",
  json = "clrt.json", rng = "clrt.rng", rl = "clrt.rl", plot = "clrt.plot", conversation = "clrt.conversation",
}

setmetatable(clrt, {
  __index = function(t, k)
    local name = lazy[k]
    if not name then return nil end
    local m = require(name)
    rawset(t, k, m)
    return m
  end,
})

local core = require("clrt.ffi")
local ffi = require("ffi")
clrt.version = ffi.string(core.C.clrt_version())
clrt.lua_dir = ffi.string(core.C.clrt_lua_dir())

function clrt.num_threads() return core.C.clrt_num_threads() end
function clrt.set_num_threads(n) core.C.clrt_set_num_threads(n) end
function clrt.cuda_available() return core.C.clrt_cuda_device_count() > 0 end

-- The names a user may complete in the REPL, including those not loaded yet.
function clrt._submodules()
  local out = {}
  for k in pairs(lazy) do out[#out + 1] = k end
  table.sort(out)
  return out
end

return clrt
