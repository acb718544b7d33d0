-- clrt.core.interrupt — Ctrl-C as the library sees it (the flag stays set until the script
-- ends). The global clrt.interrupted / clrt.check_interrupt are these functions.
--   interrupt.pressed()   -- true once Ctrl-C was pressed during this script
--   interrupt.check()     -- raises "interrupted" then: after a pcall that may have caught the
--                         -- interrupt's error (a scheduler task, a parse attempt), the run still stops
local C = require("clrt.core.ffi").C
local M = {}

function M.pressed() return C.clrt_interrupted() ~= 0 end

function M.check()
  if C.clrt_interrupted() ~= 0 then error("interrupted", 0) end
end

return M
