-- clrt.train.failure — when a step or a run has failed. The recipe asks and decides: it
-- counts failed steps, logs, and stops the run (its logger, its stop).
--   failure.check_stop(ctx)                    -- between phases: Ctrl-C, or a refused API key
--   local f = failure.assess(cfg, entries, R)   -- {failed, why, causes = {cause = n}, first}
--   failure.mark(row, f)                        -- dropped/<cause>, failed_step = 1 on the row
--   failure.line(step, f, failed_steps, cfg.max_failed_steps)   -- the line a failed step prints
--   error(failure.stop_message(who, step, f, failed_steps), 0)  -- the run's last line
--   failure.none_succeeded(who, ran, failed, last_f)  -- every step this invocation ran failed: the message
-- cfg: max_drop_fraction; entries: clrt.train.entry records; R: clrt.train.reward.batch_rewards'.
local interrupt = require("clrt.core.interrupt")
local reward = require("clrt.train.reward")
local M = {}

-- Ctrl-C (which a scheduler task may have caught as its own error), or a 401/403 answer to
-- one of the run's own clients (ctx.user, ctx.judge, ctx.assistant: clrt.llm remembers it on the client),
-- stops the run here with one line naming ctx.who, the recipe.
function M.check_stop(ctx)
  interrupt.check()
  for _, role in ipairs({ "user", "judge", "assistant" }) do
    local c = ctx and ctx[role]
    local auth = c and c.take_auth_error and c:take_auth_error()
    if auth then
      error(("%s: %s; fix the key (or its api_key_env) and resume"):format(ctx.who or "clrt.train", auth), 0)
    end
  end
end

-- Why a step's samples were lost ({cause = count} and the first error message) and whether
-- the step failed: more than max_drop_fraction of its first responses that went on to
-- futures and scores were dropped, or a metric failed on every conversation it scored.
function M.assess(cfg, entries, R)
  local causes, first = {}, nil
  for _, e in ipairs(entries) do
    if e.dropped then
      local cause = e.dropped:match("^error: ") and "task error" or e.dropped
      causes[cause] = (causes[cause] or 0) + 1
      first = first or (e.drop_error and (e.dropped .. ": " .. tostring(e.drop_error))) or e.dropped
    end
  end
  local scored = #entries - R.dropped - R.truncated
  local all_failed = {}
  for name, n in pairs(R.failed or {}) do
    if n > 0 and R.metrics[name] == nil then
      all_failed[#all_failed + 1] = name
      if not first then
        for _, e in ipairs(entries) do
          for _, sc in ipairs(e.scores) do
            local v = sc[name]
            if reward.is_failed(v) then first = first or ("metric " .. name .. ": " .. tostring(v.error)) end
          end
        end
      end
    end
  end
  table.sort(all_failed)
  -- the share of the samples that went on to the simulator and judges (a first reply cut
  -- at the length limit is scored 0 without them)
  local sent = #entries - R.truncated
  local frac = sent > 0 and R.dropped / sent or 0
  local failed = frac > cfg.max_drop_fraction or #all_failed > 0
  local why
  if failed then
    why = frac > cfg.max_drop_fraction
      and ("%d of %d samples dropped"):format(R.dropped, sent)
      or ("metric %s failed on every conversation (%d scored)"):format(table.concat(all_failed, ", "), scored)
  end
  return { failed = failed, why = why, causes = causes, first = first }
end

-- The step's row with its losses: dropped/<cause> counts, failed_step = 1 when it failed.
function M.mark(row, f)
  for cause, n in pairs(f.causes) do row["dropped/" .. cause] = n end
  if f.failed then row.failed_step = 1 end
  return row
end

function M.line(step, f, failed_steps, max_failed_steps)
  return ("step %d failed (%d of %d allowed): %s; first: %s"):format(step, failed_steps, max_failed_steps,
    f.why, tostring(f.first))
end

-- A run in which every step it ran failed (an endpoint down, a wrong model name) has
-- trained on nothing: it must not end as a success. The message, or nil when a step succeeded.
function M.none_succeeded(who, ran, failed, last)
  if ran == 0 or failed < ran then return nil end
  return ("%s: no step succeeded (%d of %d failed); the last: %s; first: %s"):format(who, failed, ran,
    last and last.why or "?", tostring(last and last.first))
end

function M.stop_message(who, step, f, failed_steps)
  return ("%s: stopped after %d failed steps (max_failed_steps); step %d: %s; first: %s")
    :format(who, failed_steps, step, f.why, tostring(f.first))
end

return M
