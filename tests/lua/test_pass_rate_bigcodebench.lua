-- pass_rate's semantics=bigcodebench against a re-implementation of BigCodeBench 0.2.5's
-- untrusted_check (tests/reference/bigcodebench_untrusted_check.py, unsandboxed, honest
-- programs only): the verdicts agree on every program, and each program's verdict is the
-- one BigCodeBench's rule gives. Planted faults: skips failing (semantics=strict), os/sys/
-- environ not pre-bound, exit/quit left as they are: each changes a verdict this test reads.
local T = require("clrt.test")
local sched = require("clrt.sched")
local sandbox = require("clrt.sandbox")
local pass_rate = require("metrics.pass_rate")

local PYTHON = "/usr/bin/python3"
local TIMEOUT = 3   -- the limit both get: a program sleeping past it fails in both
-- matplotlib's first import in a fresh home builds its font cache: seconds on a loaded
-- machine, so that program gets a limit no load reaches (its 6th field)
local SLOW_IMPORT_TIMEOUT = 60

local ADD = "def task_func(a, b):\n    return a + b\n"
local function tests(body, head)
  return (head or "") .. "import unittest\n\nclass TestCases(unittest.TestCase):\n" .. body
end
local ADD_TEST = "    def test_add(self):\n        self.assertEqual(task_func(2, 3), 5)\n"

-- name, code, tests, BigCodeBench's verdict, needs (a module the program imports)
local PROGRAMS = {
  { "honest", ADD, tests(ADD_TEST), true },
  { "wrong", "def task_func(a, b):\n    return a - b\n", tests(ADD_TEST), false },
  { "a test the tests skip with @unittest.skip", ADD,
    tests(ADD_TEST .. "    @unittest.skip('later')\n    def test_later(self):\n        self.fail()\n"), true },
  { "a test that calls self.skipTest", ADD,
    tests(ADD_TEST .. "    def test_later(self):\n        self.skipTest('later')\n        self.fail()\n"), true },
  { "a class the tests skip", ADD, "import unittest\n\n@unittest.skip('all')\nclass TestCases(unittest.TestCase):\n" .. ADD_TEST
    .. "    def test_no(self):\n        self.fail()\n", true },
  { "an expected failure", ADD, tests(ADD_TEST .. "    @unittest.expectedFailure\n    def test_x(self):\n        self.assertEqual(1, 2)\n"), true },
  { "an unexpected success", ADD, tests(ADD_TEST .. "    @unittest.expectedFailure\n    def test_x(self):\n        self.assertEqual(1, 1)\n"), true },
  { "a failing subtest", ADD, tests("    def test_sub(self):\n        for i in (1, 2):\n            with self.subTest(i=i):\n"
    .. "                self.assertEqual(task_func(i, 0), 1)\n"), false },
  { "timing out", ADD .. "import time\ntime.sleep(30)\n", tests(ADD_TEST), false },
  { "a test that never ends", ADD, tests("    def test_slow(self):\n        import time\n        time.sleep(30)\n"), false },
  { "os, sys and environ used without an import", "def task_func():\n    return os.path.join('a', 'b'), sys.maxsize > 0, environ.get('TZ')\n",
    tests("    def test_ns(self):\n        self.assertEqual(task_func(), ('a/b', True, 'UTC'))\n"), true },
  { "exit and quit are None", "def task_func():\n    return exit, quit\n",
    tests("    def test_guard(self):\n        self.assertEqual(task_func(), (None, None))\n"), true },
  { "printing", "def task_func(a, b):\n    print('adding', a, b)\n    return a + b\n", tests(ADD_TEST), true },
  { "reading a temp file", "def task_func(path):\n    with open(path) as f:\n        return f.read().strip()\n",
    tests("    def test_file(self):\n        import tempfile\n        with tempfile.NamedTemporaryFile('w', suffix='.txt', delete=False) as f:\n"
      .. "            f.write('hello\\n')\n        self.assertEqual(task_func(f.name), 'hello')\n        os.remove(f.name)\n"), true },
  { "matplotlib's Agg backend", "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
    .. "def task_func(xs):\n    fig, ax = plt.subplots()\n    ax.plot(xs)\n    ax.set_title('t')\n    return ax\n",
    tests("    def test_ax(self):\n        ax = task_func([1, 2, 3])\n        self.assertIsInstance(ax, Axes)\n        self.assertEqual(ax.get_title(), 't')\n",
      "from matplotlib.axes import Axes\n"), true, "matplotlib", SLOW_IMPORT_TIMEOUT },
  { "no tests at all", ADD, "import unittest\n\nclass TestCases(unittest.TestCase):\n    pass\n", true },
  { "no class TestCases", ADD, "import unittest\n\nclass Other(unittest.TestCase):\n" .. ADD_TEST, false },
  { "unittest.main behind __main__", ADD, tests(ADD_TEST) .. "\nif __name__ == '__main__':\n    unittest.main()\n", true },
  { "an error in setUpClass", ADD, tests("    @classmethod\n    def setUpClass(cls):\n        raise ValueError('no')\n" .. ADD_TEST), false },
  { "sys.exit at import", ADD .. "import sys\nsys.exit(0)\n", tests(ADD_TEST), false },
  { "a syntax error", "def task_func(a, b)\n    return a + b\n", tests(ADD_TEST), false },
  -- honest code the defenses must leave alone
  { "a solution with its own TestCases and unittest.main", ADD .. "import unittest\nclass TestCases(unittest.TestCase):\n"
    .. "    def test_own(self):\n        self.assertEqual(task_func(1, 1), 2)\nif __name__ == '__main__':\n    unittest.main()\n",
    tests(ADD_TEST), true },
  { "a dataclass result and an __eq__ returning NotImplemented", "from dataclasses import dataclass\n@dataclass\nclass P:\n    x: int\n"
    .. "class Q:\n    def __eq__(self, other):\n        return NotImplemented\n    __hash__ = object.__hash__\n"
    .. "def task_func(a, b):\n    return P(a + b)\n",
    tests("    def test_p(self):\n        self.assertEqual(task_func(2, 3), P(5))\n        self.assertNotEqual(Q(), Q())\n"), true },
  { "a method named get_objects; logging, warnings and a printed traceback", "import logging, warnings, traceback\n"
    .. "class Store:\n    def get_objects(self):\n        return [1, 2]\n"
    .. "def task_func(a, b):\n    logging.getLogger('x').warning('adding')\n    warnings.warn('old', DeprecationWarning)\n"
    .. "    try:\n        1 / 0\n    except ZeroDivisionError:\n        traceback.print_exc()\n    return a + b + len(Store().get_objects()) - 2\n",
    tests(ADD_TEST), true },
  { "a pandas FutureWarning (pandas walks the stack for it)", "import pandas as pd\nimport warnings\n"
    .. "def task_func(a, b):\n    with warnings.catch_warnings(record=True):\n        warnings.simplefilter('always')\n"
    .. "        df = pd.DataFrame({'a': [a]}).append({'a': b}, ignore_index=True)\n    return int(df['a'].sum())\n",
    tests(ADD_TEST), true, "pandas" },
  { "an optional import the tests guard with try", ADD, "try:\n    import clrt_not_installed_42\nexcept ImportError:\n"
    .. "    clrt_not_installed_42 = None\n" .. tests(ADD_TEST), true },
  { "a module the tests need, missing", ADD, "import clrt_not_installed_42\n" .. tests(ADD_TEST), false },
  { "reading stdin", "def task_func():\n    return input()\n", tests("    def test_in(self):\n        self.assertEqual(task_func(), '')\n"), false },
}

local function available(mod)
  local r = os.execute(PYTHON .. " -c 'import " .. mod .. "' >/dev/null 2>&1")
  return r == 0 or r == true
end

local function reference(code, test_src, timeout)
  local dir = T.tmpdir()
  local c, t = dir .. "/code.py", dir .. "/tests.py"
  local f = assert(io.open(c, "w")); f:write(code); f:close()
  f = assert(io.open(t, "w")); f:write(test_src); f:close()
  local p = assert(io.popen(("cd %q && %s %q %q %q %d 2>/dev/null"):format(dir, PYTHON,
    T.source_dir() .. "/tests/reference/bigcodebench_untrusted_check.py", c, t, timeout or TIMEOUT)))
  local out = p:read("*a")
  p:close()
  return out:match("^%s*(%a+)") == "pass"
end

local function clrt_verdicts(programs, extra)
  local fns = {}
  for i, pr in ipairs(programs) do
    local o = { python = PYTHON, timeout = pr[6] or TIMEOUT, parallel = 2 }
    for k, v in pairs(extra or {}) do o[k] = v end
    fns[i] = function() return (pass_rate.run_tests(pr[2], pr[3], o)) end
  end
  local r, errors = sched.run(fns)
  T.eq(errors, {})
  return r
end

local function runnable()
  if io.open(PYTHON) == nil then T.skip(PYTHON .. " is missing") end
  local ok, why = sandbox.check({})
  if not ok then T.skip("no sandbox here: " .. why) end
  local out = {}
  for _, pr in ipairs(PROGRAMS) do
    if not pr[5] or available(pr[5]) then out[#out + 1] = pr
    else io.stderr:write(("skipping %q: %s lacks %s\n"):format(pr[1], PYTHON, pr[5])) end
  end
  return out
end

T.case("semantics=bigcodebench: clrt's verdict is untrusted_check's on every program", function()
  local programs = runnable()
  local got = clrt_verdicts(programs)
  for i, pr in ipairs(programs) do
    local ref = reference(pr[2], pr[3], pr[6])
    T.eq(ref, pr[4], pr[1] .. ": the reference gives BigCodeBench's verdict")
    T.eq(got[i], ref, pr[1] .. ": clrt agrees with the reference")
  end
end)

T.case("planted faults: strict skips, no pre-bound os/sys/environ, exit/quit kept: the verdicts change", function()
  local programs = runnable()
  local by = {}
  for _, pr in ipairs(programs) do by[pr[1]] = pr end
  local function verdict(name, extra) return clrt_verdicts({ by[name] }, extra)[1] end
  T.eq(verdict("a test the tests skip with @unittest.skip", { semantics = "strict" }), false)
  T.eq(verdict("a test that calls self.skipTest", { semantics = "strict" }), false)
  T.eq(verdict("an unexpected success", { semantics = "strict" }), false)
  T.eq(verdict("os, sys and environ used without an import", { disable_defenses = "prebind" }), false)
  T.eq(verdict("exit and quit are None", { disable_defenses = "exitnone" }), false)
end)

T.run()
