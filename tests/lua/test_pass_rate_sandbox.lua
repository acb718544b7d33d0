-- pass_rate against a policy that games it: every attack of issue 29 scores 0 and leaves no
-- file or process behind, honest code scores what its tests say (numpy and pandas
-- included), the sandbox refuses to be skipped silently, and the scheduler decodes and
-- moves HTTP while programs run. Under Debian's /usr/bin/python3 in bubblewrap; the
-- sandboxed cases skip (saying why) where this machine cannot make the sandbox.
local T = require("clrt.test")
local ffi = require("ffi")
local files = require("clrt.files")
local sched = require("clrt.sched")
local sandbox = require("clrt.sandbox")
local pass_rate = require("metrics.pass_rate")

ffi.cdef [[int setenv(const char *name, const char *value, int overwrite);]]

local PYTHON = "/usr/bin/python3"
local SECRET = "sk-clrt-test-" .. tostring(os.time()) .. "-never-leaks"
-- the attacks' target on the host: a folder like a run's checkpoints, and /tmp
local HOST_DIR = T.tmpdir()
local TMP = T.tmpdir()
local ESCAPE = "/tmp/clrt-escape-" .. tostring(os.time()) .. "-" .. tostring(math.random(1e6))
-- a uid of this test alone, so that its processes are told apart from any other sandbox's
math.randomseed(os.time())
local UID = sandbox.DEFAULT_UID + 1000 + math.random(0, 90000)
local MARKER = "clrt-survivor-" .. UID
-- the program's key and temporary folders: what the sandbox must not let through
ffi.C.setenv("OPENAI_API_KEY", SECRET, 1)
ffi.C.setenv("TMPDIR", TMP, 1)

local OPTS = { python = PYTHON, uid = UID, timeout = 30 }
local function opts(extra)
  local o = {}
  for k, v in pairs(OPTS) do o[k] = v end
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

local function sandbox_or_skip()
  if io.open(PYTHON) == nil then T.skip(PYTHON .. " is missing") end
  local ok, why = sandbox.check({ uid = UID })
  if not ok then T.skip("no sandbox here: " .. why) end
end

local function have_numpy_pandas()
  local r = os.execute(PYTHON .. " -c 'import numpy, pandas' >/dev/null 2>&1")
  return r == 0 or r == true
end

-- Processes of this test's sandboxes still alive (by uid as root, by marker always); they
-- die with the sandbox's PID 1, which the kernel tears down just after bwrap exits.
local function leftovers()
  local found = {}
  for _, name in ipairs(files.list("/proc")) do
    if name:match("^%d+$") then
      local st = files.read("/proc/" .. name .. "/status") or ""
      local cmd = (files.read("/proc/" .. name .. "/cmdline") or ""):gsub("%z", " ")
      local uid = tonumber(st:match("\nUid:%s+(%d+)"))
      if (uid == UID and sandbox.is_root()) or cmd:find(MARKER, 1, true) then
        found[#found + 1] = name .. " " .. cmd
      end
    end
  end
  return found
end

local function assert_nothing_left(what)
  local left
  for _ = 1, 100 do
    left = leftovers()
    if #left == 0 then break end
    require("clrt.net.http").sleep(0.05)
  end
  -- whatever a broken sandbox left goes before the verdict, so that a failing test leaves
  -- nothing either
  local escaped = files.exists(ESCAPE)
  os.remove(ESCAPE)
  for _, l in ipairs(left) do os.execute("kill -9 " .. l:match("^%d+") .. " 2>/dev/null") end
  local stray_dirs, stray_files = files.list(TMP), files.list(HOST_DIR)
  for _, d in ipairs(stray_dirs) do pcall(files.remove_tree, TMP .. "/" .. d) end
  for _, d in ipairs(stray_files) do pcall(files.remove_tree, HOST_DIR .. "/" .. d) end
  T.eq(left, {}, what .. ": processes left")
  T.eq(stray_dirs, {}, what .. ": temporary folders left")
  T.eq(stray_files, {}, what .. ": files written in the host's folder")
  T.eq(escaped, false, what .. ": a file written in the host's /tmp")
end

-- The task every attack faces: add two numbers (the attacks all get it wrong).
local TESTS = [[
import unittest

class TestCases(unittest.TestCase):
    def test_small(self):
        self.assertEqual(task_func(2, 3), 5)

    def test_negative(self):
        self.assertEqual(task_func(-4, 1), -3)

    def test_zero(self):
        self.assertEqual(task_func(0, 0), 0)
]]
local WRONG = "def task_func(a, b):\n    return a - b\n"
local RIGHT = "def task_func(a, b):\n    return a + b\n"

local ATTACKS = {
  { "early os._exit(0) at import", "import os\nos._exit(0)\n" },
  { "early sys.exit(0) at import", "import sys\nsys.exit(0)\n" },
  { "atexit after the failures", WRONG .. "import atexit, os\natexit.register(lambda: os._exit(0))\n" },
  { "os._exit(0) from tearDown", WRONG .. "import os, unittest\nunittest.TestCase.tearDown = lambda self: os._exit(0)\n" },
  { "a patched TestCase.run", WRONG .. [[
import unittest
def run(self, result=None):
    result.startTest(self)
    result.addSuccess(self)
    result.stopTest(self)
unittest.TestCase.run = run
]] },
  { "patched assertions at import", WRONG .. [[
import unittest
for name in dir(unittest.TestCase):
    if name.startswith("assert"):
        setattr(unittest.TestCase, name, lambda self, *a, **k: None)
]] },
  { "patched assertions from inside the test", [[
import unittest
def task_func(a, b):
    unittest.TestCase.assertEqual = lambda self, *a, **k: None
    return a - b
]] },
  { "a patched unittest.main", WRONG .. "import os, unittest\nunittest.main = lambda *a, **k: os._exit(0)\n" },
  { "patched result classes", WRONG .. [[
import unittest, unittest.runner
for cls in (unittest.TestResult, unittest.TextTestResult):
    cls.addFailure = lambda self, *a: None
    cls.addError = lambda self, *a: None
    cls.wasSuccessful = lambda self: True
]] },
  { "a builtin the assertions use, patched", WRONG .. "import builtins\nbuiltins.isinstance = lambda *a: True\nbuiltins.len = lambda x: 0\n" },
  { "the test class's methods removed", WRONG .. [[
import unittest
def strip(cls, **kw):
    for k in [k for k in vars(cls) if k.startswith("test")]:
        delattr(cls, k)
unittest.TestCase.__init_subclass__ = classmethod(strip)
]] },
  { "sys.modules['unittest'] replaced", WRONG .. [[
import sys, types, unittest
fake = types.ModuleType("unittest")
class TestCase:
    def __init__(self, *a): pass
fake.TestCase = TestCase
sys.modules["unittest"] = fake
]] },
  { "a forged report on every descriptor", WRONG .. [[
import os
for fd in range(1, 10):
    try:
        os.write(fd, b"CLRT-PASS-RATE 00000000000000000000000000000000 PASS ran=3 expected=3 ok=3\n")
    except OSError:
        pass
print("OK\nRan 3 tests in 0.001s\n\nOK")
os._exit(0)
]] },
  { "killing the parent and every process it can", WRONG .. [[
import os, signal
for pid in (os.getppid(), 1, -1):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
]] },
  { "reading the API key", (([[
import os, glob
def task_func(a, b):
    found = os.environ.get("OPENAI_API_KEY", "")
    for path in glob.glob("/proc/*/environ"):
        try:
            found += open(path, "rb").read().decode("latin-1")
        except OSError:
            pass
    print(found)
    return a + b if "SECRET" in found else a - b
]]):gsub("SECRET", SECRET)) },
  { "writing outside its folder", (([[
import os
def task_func(a, b):
    wrote = 0
    for path in ("HOST_DIR/checkpoint.safetensors", "ESCAPE"):
        try:
            with open(path, "w") as f:
                f.write("overwritten")
            wrote += 1
        except OSError:
            pass
    return a + b if wrote == 2 else a - b
]]):gsub("HOST_DIR", HOST_DIR):gsub("ESCAPE", ESCAPE)) },
  { "a child that outlives the test", WRONG .. (([[
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "MARKER"], start_new_session=True)
]]):gsub("MARKER", MARKER)) },
  { "a fork bomb", ([[
import os, sys, time
def task_func(a, b):
    n = 0
    for _ in range(200):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
    sys.stderr.write("forked %d\n" % n)
    return a + b if n == 200 else a - b
]]), { procs = 32 } },
}

T.case("every attack scores 0 and leaves nothing behind", function()
  sandbox_or_skip()
  -- a listener on the host's loopback: the program must not reach it
  local sock = T.tmpdir()
  local srv = dofile(T.source_dir() .. "/tests/support/fake_openai.lua").start({ "--lifetime", "120" })
  local loop_attack = { "a connection to the host's loopback", (([[
import socket
def task_func(a, b):
    try:
        socket.create_connection(("127.0.0.1", PORT), timeout=3).close()
        return a + b
    except OSError as e:
        print("no connection:", e)
        return a - b
]]):gsub("PORT", tostring(srv.port))) }
  local attacks = { loop_attack }
  for _, a in ipairs(ATTACKS) do attacks[#attacks + 1] = a end
  local fns = {}
  for i, a in ipairs(attacks) do
    fns[i] = function() return { pass_rate.run_tests(a[2], TESTS, opts(a[3])) } end
  end
  local results, errors = sched.run(fns)
  srv.stop()
  files.remove_tree(sock)
  for i, a in ipairs(attacks) do
    T.eq(errors[i], nil, a[1])
    local passed, detail = results[i][1], results[i][2]
    T.eq(passed, false, a[1] .. ": " .. tostring(detail))
    T.ok(not detail:find(SECRET, 1, true), a[1] .. ": the key reached the program")
    if a[1] == "a fork bomb" then
      local n = tonumber(detail:match("forked (%d+)"))
      T.ok(n and n < 32, "the fork bomb stopped at the process limit: " .. detail)
    end
  end
  assert_nothing_left("attacks")
end)

-- Tests as BigCodeBench writes them: patches started in setUpClass (kept over every test),
-- mock.patch decorators and mock_open (which change unittest.mock's own globals), temporary
-- folders; and an asyncio test case. None of it is the code's tampering.
local MOCKING_TESTS = [[
import unittest
from unittest.mock import patch, mock_open
import os, tempfile, shutil

class TestCases(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.patcher = patch('builtins.print')
        cls.mock_print = cls.patcher.start()

    @classmethod
    def tearDownClass(cls):
        cls.patcher.stop()

    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def tearDown(self):
        shutil.rmtree(self.dir)

    @patch('os.listdir')
    def test_mocked(self, mock_listdir):
        mock_listdir.return_value = ['a.txt', 'b.csv']
        self.assertEqual(task_func(self.dir), ['a.txt'])

    def test_real(self):
        open(os.path.join(self.dir, 'x.txt'), 'w').close()
        self.assertEqual(task_func(self.dir), ['x.txt'])

    def test_open(self):
        with patch('builtins.open', mock_open(read_data='hi')):
            self.assertEqual(open('f').read(), 'hi')
        self.assertEqual(task_func(self.dir), [])
]]
local LIST_TXT = "import os\ndef task_func(d):\n    return sorted(f for f in os.listdir(d) if f.endswith('.txt'))\n"
local ASYNC_TESTS = [[
import unittest

class TestCases(unittest.IsolatedAsyncioTestCase):
    async def test_double(self):
        self.assertEqual(await task_func(2), 4)
]]

T.case("right code passes; the program's environment is exactly the harness's variables", function()
  sandbox_or_skip()
  local fns = {
    function() return { pass_rate.run_tests(RIGHT, TESTS, opts()) } end,
    function() return { pass_rate.run_tests(LIST_TXT, MOCKING_TESTS, opts()) } end,
    function() return { pass_rate.run_tests(LIST_TXT:gsub("%.txt", ".csv"), MOCKING_TESTS, opts()) } end,
    function() return { pass_rate.run_tests("async def task_func(x):\n    return 2 * x\n", ASYNC_TESTS, opts()) } end,
  }
  local results, errors = sched.run(fns)
  T.eq(errors, {})
  for i, want in ipairs({ true, true, false, true }) do T.eq(results[i][1], want, results[i][2]) end
  local env = table.concat(pass_rate.environment(pass_rate.limits(opts())), "\n")
  T.ok(not env:find("OPENAI_API_KEY", 1, true))
  local p, detail = pass_rate.run_tests("import os\nprint(sorted(os.environ))\n" .. RIGHT, TESTS, opts())
  T.eq(p, true)
  T.ok(detail:find("'HOME', 'LANG', 'MKL_NUM_THREADS', 'MPLBACKEND', 'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', " ..
    "'PATH', 'PWD', 'TF_CPP_MIN_LOG_LEVEL', 'TF_ENABLE_ONEDNN_OPTS', 'TMPDIR', 'TZ'", 1, true), detail)
  assert_nothing_left("honest runs")
end)

T.case("honest code: numpy and pandas pass; wrong code, a skipped test, a failing subtest and a timeout fail", function()
  sandbox_or_skip()
  if not have_numpy_pandas() then T.skip(PYTHON .. " lacks numpy/pandas (python3-numpy, python3-pandas)") end
  local tests = [[
import unittest
import numpy as np
import pandas as pd

class TestCases(unittest.TestCase):
    def test_frame(self):
        df, mean = task_func([("a", 1.0), ("b", 3.0)])
        self.assertIsInstance(df, pd.DataFrame)
        pd.testing.assert_frame_equal(df, pd.DataFrame({"name": ["a", "b"], "value": [1.0, 3.0]}))
        self.assertAlmostEqual(mean, 2.0)

    def test_matrix(self):
        df, mean = task_func([(str(i), float(i)) for i in range(200)])
        m = np.outer(df["value"].to_numpy(), np.ones(400)) @ np.ones((400, 400))
        np.testing.assert_allclose(m[10, :3], [4000.0, 4000.0, 4000.0])
        self.assertAlmostEqual(mean, 99.5)

    def test_subtests(self):
        for n in (1, 2, 3):
            with self.subTest(n=n):
                df, _ = task_func([("x", 1.0)] * n)
                self.assertEqual(len(df), n)
]]
  local solution = [[
import numpy as np
import pandas as pd

def task_func(records):
    df = pd.DataFrame(records, columns=["name", "value"])
    mean = float(np.mean(df["value"].to_numpy())) if len(df) else float("nan")
    return df, mean
]]
  local wrong = solution:gsub("np%.mean", "np.sum")
  local skipped = tests:gsub("    def test_matrix", "    @unittest.skip('later')\n    def test_matrix")
  local cases = {
    -- a skip the tests declare: a pass as BigCodeBench counts it, a fail under semantics=strict
    { solution, tests, true }, { wrong, tests, false }, { solution, skipped, false, { semantics = "strict" } },
    -- a subtest that fails fails its test even when the others pass
    { solution:gsub("return df, mean", "return (df if len(df) != 2 else df.head(1)), mean"), tests, false },
    -- a test that never ends is a failure at the timeout, its processes gone
    { solution .. "import time\ntime.sleep(120)\n", tests, false, { timeout = 3 } },
  }
  local fns = {}
  for i, c in ipairs(cases) do fns[i] = function() return { pass_rate.run_tests(c[1], c[2], opts(c[4])) } end end
  local results, errors = sched.run(fns)
  for i, c in ipairs(cases) do
    T.eq(errors[i], nil)
    T.eq(results[i][1], c[3], ("case %d: %s"):format(i, results[i][2]))
  end
  T.eq(pass_rate.run_tests(solution, skipped, opts()), true, "a declared skip passes under bigcodebench")
  T.ok(results[5][2]:find("timed out after 3 s", 1, true), results[5][2])
  -- the dataset's rows as compute meets them: the last fenced block of the reply
  local sample = { prompt = {}, single_turn_metadata = { test = tests, entry_point = "task_func" } }
  local conv = { { role = "user", content = "table" }, { role = "assistant", content = "```python\n" .. solution .. "```" } }
  local ctx = { metric_options = { pass_rate = opts({ extract = false }) }, counters = {} }
  T.eq(pass_rate.compute(conv, sample, ctx), 1)
  T.eq(ctx.counters.pass_rate_programs, 1)
  T.ok(ctx.counters.pass_rate_seconds > 0)
  assert_nothing_left("honest runs")
end)

T.case("strict: a test source without TestCase classes is one test: it passes when it runs to its end", function()
  sandbox_or_skip()
  -- BigCodeBench requires the class TestCases: no class, no pass
  T.eq(pass_rate.run_tests("def task_func(a, b):\n    return a + b\n", "assert task_func(2, 3) == 5\n", opts()), false)
  local asserts = "assert task_func(2, 3) == 5\nassert task_func(-1, 1) == 0\n"
  local cases = {
    { RIGHT, asserts, true }, { WRONG, asserts, false },
    { "import os\nos._exit(0)\n", asserts, false }, { WRONG .. "import sys\nsys.exit(0)\n", asserts, false },
    -- the limits: a file over file_mb, memory over mem_mb
    { "open('big', 'wb').write(b'x' * (4 * 1024 * 1024))\n", "", false, { file_mb = 1 } },
    { "open('small', 'wb').write(b'x' * 1024)\n", "", true, { file_mb = 1 } },
    { "x = bytearray(600 * 1024 * 1024)\n", "", false, { mem_mb = 256 }, "MemoryError" },
    -- the network: only a loopback that is down
    { "import socket\nassert [n for _, n in socket.if_nameindex()] == ['lo']\n" ..
      "s = socket.socket()\ntry:\n    s.bind(('127.0.0.1', 0)); s.listen(); socket.create_connection(s.getsockname(), timeout=2)\n" ..
      "    raise SystemExit('loopback works')\nexcept OSError:\n    pass\n", "", true },
  }
  local fns = {}
  for i, c in ipairs(cases) do
    local o = c[4] or {}
    o.semantics = "strict"
    fns[i] = function() return { pass_rate.run_tests(c[1], c[2], opts(o)) } end
  end
  local results, errors = sched.run(fns)
  for i, c in ipairs(cases) do
    T.eq(errors[i], nil)
    T.eq(results[i][1], c[3], ("case %d: %s"):format(i, results[i][2]))
    if c[5] then T.ok(results[i][2]:find(c[5], 1, true), results[i][2]) end
  end
  assert_nothing_left("script tests")
end)

T.case("no sandbox: a one-line refusal naming what is missing; unsafe_no_sandbox runs it with a warning", function()
  local s = { prompt = {}, tests = TESTS }
  local conv = { { role = "assistant", content = "```python\n" .. RIGHT .. "```" } }
  local missing = { metric_options = { pass_rate = { python = PYTHON, extract = false, bwrap = "/nonexistent/bwrap" } } }
  local ok, err = pcall(pass_rate.compute, conv, s, missing)
  T.eq(ok, false)
  T.ok(err:find("refusing to run the policy's code without a sandbox", 1, true), err)
  T.ok(err:find("bubblewrap (/nonexistent/bwrap) is not installed", 1, true), err)
  T.ok(err:find("apt-get install bubblewrap", 1, true), err)
  T.ok(err:find("reward.metric_options.pass_rate.unsafe_no_sandbox=true", 1, true), err)
  T.ok(not err:find("\n", 1, true), "one line: " .. err)
  -- a bwrap that cannot make namespaces (here: one that always fails) says how to allow them
  local fake_dir = T.tmpdir()
  os.execute("chmod 755 " .. fake_dir)   -- the sandbox's uid runs it
  local fails = fake_dir .. "/bwrap"
  local f = assert(io.open(fails, "w"))
  f:write("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
  f:close()
  os.execute("chmod +x " .. fails)
  local ok2, err2 = pcall(pass_rate.prepare, { bwrap = fails })
  T.eq(ok2, false)
  T.ok(err2:find("cannot create its namespaces here (bwrap: setting up uid map: Permission denied)", 1, true), err2)
  T.ok(err2:find("user.max_user_namespaces", 1, true), err2)
  T.ok(not err2:find("\n", 1, true), "one line: " .. err2)
  -- the metric's loading refuses before a run starts
  local reward = require("clrt.train.reward")
  T.raises(function() reward.load_metrics({ pass_rate = 1 }, { pass_rate = { bwrap = "/nonexistent/bwrap" } }) end,
    "refusing to run the policy's code without a sandbox")
  -- the explicit way around it: the old isolation-free run, still through the harness
  if io.open(PYTHON) == nil then return end
  local unsafe = { metric_options = { pass_rate = { python = PYTHON, extract = false, bwrap = "/nonexistent/bwrap",
    unsafe_no_sandbox = true } } }
  T.eq(pass_rate.compute(conv, s, unsafe), 1)
  T.eq(pass_rate.run_tests("import os\nos._exit(0)\n", TESTS, unsafe.metric_options.pass_rate), false)
  T.eq(files.list(TMP), {}, "temporary folders left")
end)

-- A model with the fake decoder of tests/lua/support/fake_model.lua: the scheduler's engine.
package.path = T.source_dir() .. "/tests/lua/?.lua;" .. package.path
local fakedec = require("support.fake_model")
local function engine_model()
  local m = { config = { vocab_size = fakedec.V, max_position_embeddings = 256 }, decs = {} }
  function m:decoder(slots, max_len)
    local d = fakedec.decoder(slots, max_len)
    self.decs[#self.decs + 1] = d
    return d
  end
  return m
end

T.case("the scheduler decodes and moves HTTP while programs run, at most `parallel` at once", function()
  sandbox_or_skip()
  local srv = dofile(T.source_dir() .. "/tests/support/fake_openai.lua").start({ "--lifetime", "60" })
  local c = clrt.llm.client { base_url = srv.base_url, model = "m", timeout = 30 }
  local m = engine_model()
  local ctx = { counters = {} }
  -- the programs wait for a flag file (a host folder bound read-only), then sleep 1 s and
  -- pass; the other task creates the flag only after decoding 40 tokens and two requests.
  -- A scheduler blocked on a program would never get there: ordering, not timing.
  local flag_dir = T.tmpdir()
  os.execute("chmod 755 " .. flag_dir)   -- the sandbox's uid looks into it
  local flag = flag_dir .. "/go"
  local slow = RIGHT .. ("import os, time\nwhile not os.path.exists('%s'):\n    time.sleep(0.01)\ntime.sleep(1)\n"):format(flag)
  local sem_peak, in_flight = 0, 0
  local events = {}
  local fns = {}
  for i = 1, 3 do
    fns[i] = function()
      local passed = pass_rate.run_tests(slow, TESTS, opts({ parallel = 2, bind = { flag_dir } }), ctx)
      events[#events + 1] = "program"
      return passed
    end
  end
  fns[4] = function()
    local out = sched.generate(m, { 1, 2 }, { temperature = 0, max_new_tokens = 40 })
    local r1 = c:chat({ { role = "user", content = "first" } })
    local r2 = c:chat({ { role = "user", content = "second" } })
    events[#events + 1] = "decode+http"
    assert(io.open(flag, "w")):close()
    return #out[1].tokens .. "|" .. r1.content .. "|" .. r2.content
  end
  -- count the programs in flight at once through the metric's own child processes
  local proc = require("clrt.proc")
  local spawn = proc.spawn
  proc.spawn = function(o)
    local p = spawn(o)
    in_flight = in_flight + 1
    sem_peak = math.max(sem_peak, in_flight)
    local wait = p.wait
    p.wait = function(self, wo)
      local r = wait(self, wo)
      in_flight = in_flight - 1
      return r
    end
    return p
  end
  local results, errors, info = sched.run(fns)
  proc.spawn = spawn
  srv.stop()
  T.eq(errors, {})
  T.eq(results, { true, true, true, "40|echo:first|echo:second" })
  T.eq(events[1], "decode+http", table.concat(events, ", "))
  T.eq(sem_peak, 2, "programs at once under parallel = 2")
  T.ok(info.engine_steps_during_procs >= 39, ("decode steps while programs ran: %d of %d")
    :format(info.engine_steps_during_procs, info.engine_steps))
  T.eq(ctx.counters.pass_rate_programs, 3)
  T.ok(ctx.counters.pass_rate_seconds >= 3, "three programs of over 1 s: " .. ctx.counters.pass_rate_seconds)
  -- the step's row logs them (and resets the counters for the next step)
  local timing = { generate_first_s = 0, rollout_s = 0, engine_steps_during_tests = info.engine_steps_during_procs }
  local row = require("clrt.train.report").step_row({}, { rewards = {}, dropped = 0, truncated = 0 }, {}, {}, 0,
    timing, 0, 1, 2, ctx)
  T.eq(row.tests_run, 3)
  T.ok(row.time_tests_s >= 3, "time in tests: " .. tostring(row.time_tests_s))
  T.eq(row.engine_steps_during_tests, info.engine_steps_during_procs)
  T.eq(ctx.counters, {})
  assert_nothing_left("scheduled runs")
end)

T.case("an abandoned run kills its programs and removes their folders", function()
  sandbox_or_skip()
  local fns = {}
  for i = 1, 2 do
    fns[i] = function() return pass_rate.run_tests(RIGHT .. "import time\ntime.sleep(300)\n", TESTS, opts({ timeout = 600 })) end
  end
  local _, errors = sched.run(fns, { timeout = 2 })
  T.ok(errors[1] and errors[1]:find("timed out", 1, true), tostring(errors[1]))
  assert_nothing_left("abandoned run")
  -- the slots came back: a program runs again at once
  T.eq(pass_rate.run_tests(RIGHT, TESTS, opts()), true)
end)

T.run()
