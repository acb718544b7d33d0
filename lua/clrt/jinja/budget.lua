-- clrt.jinja.budget — what one render may cost: evaluation steps, the size of any string it
-- builds, how deep scopes nest. A chat template is code from a model folder: a loop over
-- range(10^9), a string doubled 64 times or a macro that calls itself must end in one error
-- naming the line, not a hang, gigabytes, or "loop in gettable". The defaults are far above
-- what real templates need (docs/chat_templates.md; test_jinja checks every shipped template
-- on long conversations), and a caller may pass its own (jinja's render(ctx, limits)).
-- tick: called every TICK_EVERY steps (the server yields there to answer other clients);
-- the budget's state is saved around it, so renders interleaved through ticks stay apart.
local M = {}

M.DEFAULTS = { max_steps = 2000000, max_output = 16 * 1024 * 1024, max_scope_depth = 64 }
M.TICK_EVERY = 4096

local steps, max_steps, max_output, max_scope_depth, tick, next_check = 0, 0, 0, 0, nil, 0
M.steps_used = 0   -- the last render's steps (for tests and for sizing the defaults)

local function fail(msg) error({ jinja_error = msg }, 0) end

function M.start(limits)
  limits = limits or {}
  steps = 0
  max_steps = limits.max_steps or M.DEFAULTS.max_steps
  max_output = limits.max_output or M.DEFAULTS.max_output
  max_scope_depth = limits.max_scope_depth or M.DEFAULTS.max_scope_depth
  tick = limits.tick
  next_check = math.min(M.TICK_EVERY, max_steps)
end

function M.finish() M.steps_used = steps end

local function over()
  fail(("the template ran more than %d steps (a loop that does not end?)"):format(max_steps))
end

local function check()
  if steps > max_steps then over() end
  next_check = math.min(steps + M.TICK_EVERY, max_steps + 1)
  if tick then
    local saved = { steps, max_steps, max_output, max_scope_depth, tick, next_check }
    pcall(tick)   -- a yield that cannot happen here (inside a C call) is skipped, not an error
    steps, max_steps, max_output, max_scope_depth, tick, next_check = unpack(saved)
  end
end

-- One step (an expression evaluated, a loop turned).
function M.step()
  steps = steps + 1
  if steps >= next_check then check() end
end

-- n steps at once (a list of n built or copied).
function M.charge(n)
  steps = steps + n
  if steps > max_steps then over() end
  if steps >= next_check then check() end
end

-- A string (or padding) of n bytes is about to exist.
function M.size(n)
  if n > max_output then
    fail(("the template built a string of more than %d bytes"):format(max_output))
  end
end

function M.scope_depth(d)
  if d > max_scope_depth then
    fail(("scopes nested deeper than %d (a macro that calls itself without end?)"):format(max_scope_depth))
  end
end

return M
