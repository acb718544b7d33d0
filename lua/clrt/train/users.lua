-- clrt.train.users — simulated users by name, found as metrics are: a plug-in is the file
-- lua/interactions/<name>.lua (any folder interactions/ on package.path), returning
-- {respond = function(conversation, sample, ctx) -> text, uses_llm = true when it talks to
-- ctx.user (an OpenAI-compatible client that clrt.train.context then builds)}. The config
-- key `sim` names one; "llm" and "scripted" are its short names for collabllm_user and
-- scripted_user.
--   local user = users.load(cfg.sim, "collabllm_rl")    -- the plug-in, or an error listing the known
--   users.check(cfg.sim, who)                           -- the same error, without loading it
--   users.known()                                       -- {"collabllm_user", "scripted_user", ...}
local plugins = require("clrt.plugins")
local M = {}

M.SHORT = { llm = "collabllm_user", scripted = "scripted_user" }

-- The plug-in's module name or file for a `sim` value (a short name, the file's name under
-- an interactions/ folder, or a path ending in .lua), or nil.
local function module_of(name)
  if type(name) ~= "string" then return nil end
  return plugins.find("interactions", M.SHORT[name] or name)
end

-- Every plug-in on package.path, sorted, short names first.
function M.known()
  local out = plugins.known("interactions")
  local shorts = {}
  for short in pairs(M.SHORT) do shorts[#shorts + 1] = short end
  table.sort(shorts)
  for i = #shorts, 1, -1 do table.insert(out, 1, shorts[i]) end
  return out
end

local function unknown(name, who)
  return ("%s: sim: unknown simulated user '%s' (no interactions/%s.lua in %s; known: %s; a file: sim=PATH.lua)")
    :format(who or "clrt.train.users", tostring(name), tostring(name), plugins.searched("interactions"),
      table.concat(M.known(), ", "))
end

function M.check(name, who)
  if not module_of(name) then error(unknown(name, who), 0) end
end

function M.load(name, who)
  local mod = module_of(name)
  if not mod then error(unknown(name, who), 0) end
  local ok, user = pcall(plugins.load, "interactions", M.SHORT[name] or name)
  if not ok then error(("%s: sim: cannot load %s: %s"):format(who or "clrt.train.users", mod, tostring(user)), 0) end
  if type(user) ~= "table" or type(user.respond) ~= "function" then
    error(("%s: sim: %s must return {respond = function(conversation, sample, ctx)}"):format(who or "clrt.train.users", mod), 0)
  end
  return user
end

-- Whether the plug-in a `sim` value names talks to an LLM (needs sim_cfg's endpoint).
function M.uses_llm(name) return M.load(name).uses_llm == true end

return M
