-- clrt.net.request — one HTTP request, waited for: above both the curl event loop
-- (clrt.net.http, which knows nothing of tasks) and the scheduler (clrt.sched, which pumps
-- that loop), so neither requires the other's caller.
--   local r = request.request{method = "GET", url = url, timeout = 5}   -- {status, body, ...}
local http = require("clrt.net.http")
local sched = require("clrt.sched")
local M = {}

-- Submit and wait for the result. Inside a clrt.sched task the task yields and the
-- scheduler pumps; elsewhere this pumps the loop itself until the result is in.
-- on_abort runs if the scheduler abandons the task (run timeout) while it waits.
function M.request(req, on_abort)
  local task = sched.current()
  if task then
    local id
    id = http.submit(req, function(r) sched.wake(task, r) end)
    return sched.suspend(function()
      http.cancel(id)
      if on_abort then on_abort() end
    end)
  end
  local got
  local id = http.submit(req, function(r) got = r end)
  local ok, err = pcall(function() while not got do http.pump(50) end end)
  if not ok then
    http.cancel(id)   -- interrupted: leave nothing in flight
    error(err, 0)
  end
  return got
end

return M
