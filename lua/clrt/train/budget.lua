-- clrt.train.budget — budget.max_usd: whether a run may start another step.
--   local why = budget.exceeded(max_usd, spent_usd, last_step_usd)   -- nil: go on
-- The next step is expected to cost what the last one did, so a run stops once its total
-- would pass the limit with one more step (or already has): it never starts a step it cannot
-- pay for at the last step's rate. The recipe saves a checkpoint, prints the one line this
-- returns (with the command that continues under a higher budget) and exits non-zero.
local M = {}

function M.exceeded(max_usd, spent, last)
  if max_usd == nil then return nil end
  spent, last = spent or 0, last or 0
  if spent + last <= max_usd then return nil end
  return ("budget.max_usd=%g reached: $%.4f spent, the next step would cost about $%.4f more"):format(max_usd, spent, last)
end

-- The one line a stopped run prints: why, and the command that continues it with room for
-- at least a few more steps.
function M.stop_line(who, why, resume_command, max_usd, last)
  local raise = math.max(max_usd * 2, max_usd + 10 * (last or 0))
  return ("%s: %s; continue with a higher budget: %s budget.max_usd=%s"):format(who, why, resume_command,
    tostring(math.ceil(raise * 100) / 100))
end

-- The ranks agree on rank 0's decision (each holds every rank's records, but a stop must be
-- the same everywhere or a collective waits forever).
local function agreed(why)
  local dist = require("clrt.dist")
  if dist.world_size() == 1 then return why end
  local s = dist.broadcast_string(why or "")
  return s ~= "" and s or nil
end

local function spent(ctx)
  local t = ctx.spend and ctx.spend.total
  return t and t.all.usd or 0, t and t.last_step_usd or 0
end

-- Before the first step of a run (a resumed one may already be at its limit): raises the
-- stop line when one more step at the last step's rate would pass budget.max_usd.
function M.check_start(cfg, ctx, script, run_dir, who)
  local max = cfg.budget and cfg.budget.max_usd
  local total, last = spent(ctx)
  local why = agreed(M.exceeded(max, total, last))
  if why then
    error(M.stop_line(who, why, require("clrt.run").resume_command(script, run_dir), max, last), 0)
  end
end

-- After a step: the reason to stop now, or nil.
function M.check_step(cfg, ctx)
  local max = cfg.budget and cfg.budget.max_usd
  local total, last = spent(ctx)
  return agreed(M.exceeded(max, total, last))
end

-- The stop after the step's checkpoint: the log closed, summary.json with the spend, one line.
function M.stop(why, cfg, ctx, script, run_dir, who, lg, ev)
  local _, last = spent(ctx)
  if lg then lg:close() end
  if ev then ev:finish() end
  error(M.stop_line(who, why, require("clrt.run").resume_command(script, run_dir), cfg.budget.max_usd, last), 0)
end

return M
