-- clrt.progress: a long phase's line on a terminal (count, total, ETA), redrawn at most five
-- times a second and cleared at the end; nothing off a terminal. clrt.sched.run draws one
-- for opts.progress.
local T = require("clrt.test")
local progress = require("clrt.progress")
local sched = require("clrt.sched")

local function sink()
  local parts = {}
  return { write = function(_, s) parts[#parts + 1] = s end, flush = function() end,
    text = function() return table.concat(parts) end }
end

T.case("on a terminal: count, total and ETA in one rewritten line, cleared at the end", function()
  local out, t = sink(), 0
  local p = progress.new("step 2: futures", 4, { tty = true, out = out, clock = function() return t end })
  t = 1; p:set(1)
  t = 1.1; p:set(2)   -- within 0.2 s of the last draw: not drawn
  t = 2; p:set(2)
  t = 4; p:set(4)     -- the last is always drawn
  T.near(p:finish(), 4, 1e-12)
  local text = out:text()
  T.ok(text:find("\r\27[Kstep 2: futures 1/4  ETA 3s", 1, true), text)
  T.ok(text:find("\r\27[Kstep 2: futures 2/4  ETA 2s", 1, true), text)
  T.ok(text:find("4/4  ETA 0s", 1, true), text)
  T.eq(select(2, text:gsub("2/4", "")), 1, "one draw in the same 0.2 s")
  T.ok(text:sub(-4) == "\r\27[K", "cleared for the run's own line")
  T.ok(not text:find("\n", 1, true), "never a new line")
end)

T.case("off a terminal nothing is written", function()
  local out = sink()
  local p = progress.new("x", 3, { tty = false, out = out })
  p:set(1); p:set(3); p:finish()
  T.eq(out:text(), "")
end)

T.case("clrt.sched.run draws the count of finished functions for opts.progress", function()
  local out, t = sink(), 0
  local fns = {}
  for i = 1, 3 do fns[i] = function() t = t + 1; sched.sleep(0.001); return i end end
  local res = sched.run(fns, { progress = "rollouts", progress_opts = { tty = true, out = out, clock = function() return t end } })
  T.eq(res, { 1, 2, 3 })
  T.ok(out:text():find("rollouts 3/3", 1, true), out:text())
end)

T.case("a run's phases.log: one line per finished phase while the run's logger is open", function()
  local log = require("clrt.log")
  local lg = log.run{ dir = T.tmpdir() .. "/ph", quiet = true }
  local p = progress.new("step 1: futures and scores", 6, { tty = false })
  p:set(6); p:finish()
  sched.run({ function() return 1 end }, { progress = "validation: conversations", progress_opts = { tty = false } })
  lg:close()
  progress.new("after the run", 1, { tty = false }):finish()
  local text = T.read(lg.dir .. "/phases.log")
  T.ok(text:find("%d%d:%d%d:%d%d step 1: futures and scores: 6 in %d+%.%d%d s\n"), text)
  T.ok(text:find("validation: conversations: 1 in ", 1, true), text)
  T.ok(not text:find("after the run", 1, true), "nothing once the run's logger is closed")
end)

T.run()
