-- One memory bound for the whole program: processes that each stay under the per-process
-- limits (RLIMIT_AS/DATA) but together pass program_mb end the program, through a memory
-- cgroup where the machine allows one and by polling the process tree's RSS elsewhere;
-- the default fits the host. Planted fault: a bound above what they use lets them pass.
local T = require("clrt.test")
local sandbox = require("clrt.sandbox")
local pass_rate = require("metrics.pass_rate")

local PYTHON = "/usr/bin/python3"
local TESTS = "import unittest\nclass TestCases(unittest.TestCase):\n    def test(self):\n        self.assertEqual(task_func(), 4)\n"
-- four processes of 200 MB each, written (resident), alive at once
local HOG = [[
import os, time
def task_func():
    kids = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            b = b"x" * (200 * 1024 * 1024)
            time.sleep(3)
            os._exit(0)
        kids.append(pid)
    return sum(1 for p in kids if os.waitpid(p, 0)[1] == 0)
]]

T.case("the default bound fits the host: 3/4 of MemTotal over the programs at once, at most 30 GiB", function()
  local total = tonumber(io.open("/proc/meminfo"):read("*a"):match("MemTotal:%s+(%d+) kB"))
  T.eq(pass_rate.limits({ parallel = 2 }).program_mb, math.min(30720, math.floor(total / 1024 * 0.75 / 2)))
  T.eq(pass_rate.limits({ program_mb = 100 }).program_mb, 100)
  T.raises(function() pass_rate.limits({ memory_bound = "none" }) end, "option memory_bound must be auto or poll")
end)

T.case("processes that together pass program_mb end the program (cgroup and polling); under it they pass", function()
  if io.open(PYTHON) == nil then T.skip(PYTHON .. " is missing") end
  local ok, why = sandbox.check({})
  if not ok then T.skip("no sandbox here: " .. why) end
  for _, mode in ipairs({ "auto", "poll" }) do
    local o = { python = PYTHON, timeout = 60, program_mb = 500, memory_bound = mode }
    local passed, detail = pass_rate.run_tests(HOG, TESTS, o)
    T.eq(passed, false, mode .. ": " .. detail)
    o.program_mb = 2048   -- the planted fault: a bound above the 800 MB they use
    local passed2, detail2 = pass_rate.run_tests(HOG, TESTS, o)
    T.eq(passed2, true, mode .. " under 2 GB: " .. detail2)
  end
end)

T.run()
