-- clrt.progress — a long phase's progress on a terminal: one line rewritten in place
-- ("rollouts 12/64  ETA 20s"), at most five times a second, cleared when the phase ends so
-- the run's own progress line (clrt.log) takes the place again. Off the terminal it says
-- nothing (the phases' times are in metrics.jsonl). clrt.sched.run draws one for a run
-- given opts.progress = label.
--   local p = progress.new("step 3 rollouts", 64)   -- opts.tty, opts.out, opts.clock for tests
--   p:set(12) ... p:finish()                        -- returns the phase's seconds
--   progress.set_log(function(line) ... end)          -- one line per finished phase (a run's phases.log)
local M = {}

-- Whether descriptor fd is a terminal (clrt.log's progress line asks too).
local isatty = function() return false end
do
  local ffi = require("ffi")
  pcall(ffi.cdef, "int isatty(int fd);")
  if pcall(function() return ffi.C.isatty end) then isatty = function(fd) return ffi.C.isatty(fd) == 1 end end
end
M.isatty = isatty

-- 59s, 1m01s, 1h01m; "?" for an unknown one.
local function duration(s)
  if s == nil or s ~= s or s == math.huge then return "?" end
  s = math.floor(s + 0.5)
  if s < 60 then return ("%ds"):format(s) end
  if s < 3600 then return ("%dm%02ds"):format(math.floor(s / 60), s % 60) end
  return ("%dh%02dm"):format(math.floor(s / 3600), math.floor(s / 60) % 60)
end

M.format_duration = duration

local P = {}
P.__index = P

function M.new(label, total, opts)
  opts = opts or {}
  local clock = opts.clock or require("clrt.net.http").now
  local tty = opts.tty
  if tty == nil then tty = isatty(2) end
  return setmetatable({ label = label, total = total, done = 0, tty = tty, out = opts.out or io.stderr,
    clock = clock, t0 = clock(), drawn_at = -math.huge, drawn = false }, P)
end

function P:set(done)
  self.done = done
  if not self.tty or self.total <= 0 then return end
  local t = self.clock()
  if t - self.drawn_at < 0.2 and done < self.total then return end
  self.drawn_at = t
  local elapsed = t - self.t0
  local eta = done > 0 and elapsed / done * (self.total - done) or nil
  self.out:write(("\r\27[K%s %d/%d%s"):format(self.label, done, self.total, eta and ("  ETA " .. duration(eta)) or ""))
  self.out:flush()
  self.drawn = true
end

function P:finish()
  if self.drawn then self.out:write("\r\27[K"); self.out:flush() end
  self.drawn = false
  local seconds = self.clock() - self.t0
  if M.log_line and self.total > 0 then M.log_line(("%s: %d in %.2f s"):format(self.label, self.total, seconds)) end
  return seconds
end

-- set_log(fn): every phase that ends says one line through fn (a run's phases.log, which
-- clrt.log.run sets while the run is open); nil: none.
function M.set_log(fn) M.log_line = fn end

return M
