-- clrt.train.endpoints — before a run's first step, each API endpoint the run will call (the
-- simulated user's when it is an LLM, the judge's when a metric uses one, the assistant's when
-- an endpoint proposes the responses: recipes/build_dataset.lua) answers
-- GET <base_url>/models and serves the model named: an endpoint that is down, a refused key
-- or a misspelt model name is one line naming the setting, before minutes of rollouts. An
-- endpoint without /models (404/405/501) is said once and not held against the run.
--   endpoints.check(ctx, metrics, cfg, who)    -- raises the one line; returns the lines said
local M = {}

local function uses_judge(metrics)
  for _, m in ipairs(metrics or {}) do
    if m.metric and m.metric.uses_judge then return true end
  end
  return false
end

local function one(client, setting, who)
  local r = client:list_models()
  local where = ("%s.base_url=%s"):format(setting, client.base_url)
  if r.error then error(("%s: %s: cannot reach the endpoint (%s)"):format(who, where, r.error), 0) end
  if r.status == 401 or r.status == 403 then
    error(("%s: %s refused the key: HTTP %d %s (%s.api_key_env)"):format(who, where, r.status, r.message or "", setting), 0)
  end
  if r.status == 404 or r.status == 405 or r.status == 501 then
    return ("%s: %s has no /models (HTTP %d): %s.model=%s not checked"):format(who, where, r.status, setting, client.model)
  end
  if r.status < 200 or r.status >= 300 then
    error(("%s: %s answered GET /models with HTTP %d %s"):format(who, where, r.status, r.message or ""), 0)
  end
  if #r.ids > 0 then
    for _, id in ipairs(r.ids) do if id == client.model then return nil end end
    local shown = {}
    for i = 1, math.min(#r.ids, 8) do shown[i] = r.ids[i] end
    error(("%s: %s.model=%s is not served at %s (it serves: %s%s)"):format(who, setting, client.model, client.base_url,
      table.concat(shown, ", "), #r.ids > 8 and ", ..." or ""), 0)
  end
  return nil
end

function M.check(ctx, metrics, cfg, who)
  if cfg and cfg.check_endpoints == false then return {} end
  local said, seen = {}, {}
  local todo = {}
  if ctx.user and ctx.user.list_models then todo[#todo + 1] = { ctx.user, "sim_cfg" } end
  if ctx.judge and ctx.judge.list_models and uses_judge(metrics) then todo[#todo + 1] = { ctx.judge, "judge" } end
  if ctx.assistant and ctx.assistant.list_models then todo[#todo + 1] = { ctx.assistant, "assistant" } end
  for _, t in ipairs(todo) do
    local key = t[1].base_url .. "\0" .. t[1].model
    if not seen[key] then
      seen[key] = true
      local line = one(t[1], t[2], who)
      if line then said[#said + 1] = line; io.stderr:write(line, "\n") end
    end
  end
  return said
end

return M
