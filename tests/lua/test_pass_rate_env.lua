-- pass_rate's code environment: before the first step the modules the code rows need
-- (their published libs, else the imports of their tests and reference solution) are
-- checked in the sandbox; a missing one stops the run with one line (modules, rows, the
-- apt-get line), missing_modules=skip leaves those rows out and counts them; at run time
-- an ImportError is an environment error, counted apart from a wrong answer.
local T = require("clrt.test")
local sandbox = require("clrt.sandbox")
local pass_rate = require("metrics.pass_rate")
local env = require("metrics.lib.pass_rate_env")
local reward = require("clrt.train.reward")

local PYTHON = "/usr/bin/python3"
local MISSING = "clrt_no_such_module_42"

local function sandbox_or_skip()
  if io.open(PYTHON) == nil then T.skip(PYTHON .. " is missing") end
  local ok, why = sandbox.check({})
  if not ok then T.skip("no sandbox here: " .. why) end
end

local function row(tests, solution, libs)
  return { prompt = {}, single_turn_completion = solution,
    single_turn_metadata = { test = tests, libs = libs, task_id = "BigCodeBench/t" } }
end
local TESTS_OK = "import unittest\nimport json\nclass TestCases(unittest.TestCase):\n    def test(self):\n        self.assertEqual(task_func(), 1)\n"
local TESTS_MISSING = "import unittest\nimport " .. MISSING .. "\nclass TestCases(unittest.TestCase):\n    def test(self):\n        self.assertEqual(task_func(), 1)\n"

T.case("the modules a row needs: its libs, else the imports of its tests and reference solution", function()
  local mods = env.task_modules({
    row(TESTS_OK, "import numpy as np\nfrom scipy import stats\ndef task_func():\n    return 1\n"),
    row(TESTS_OK, "", "['pandas', 'scikit-learn', 'random']"),
    row(TESTS_OK, "", { "PIL", "os" }),
    { prompt = {}, tests = "import matplotlib.pyplot as plt\n" },
  }, PYTHON, pass_rate)
  -- the standard library (json, random, os) is always there and left out
  T.eq(mods, { { "numpy", "scipy" }, { "pandas", "sklearn" }, { "PIL" }, { "matplotlib" } })
  T.eq(env.package_of("sklearn"), "python3-sklearn")
  T.eq(env.package_of("cv2"), "python3-opencv")
  T.eq(env.package_of("tensorflow"), nil)
  T.eq(env.package_of("pytz"), "python3-tz")
  T.eq(env.package_of("faker"), "faker")
end)

T.case("a missing module stops the run before the first step, in one line; skip leaves its rows out", function()
  sandbox_or_skip()
  local samples = { row(TESTS_OK, "def task_func():\n    return 1\n"), row(TESTS_MISSING, ""),
    row(TESTS_OK, "", "['" .. MISSING .. "', 'json']"), { prompt = {}, answer = "not a code row" } }
  local opts = { python = PYTHON }
  local ok, err = pcall(pass_rate.check_samples, samples, opts)
  T.eq(ok, false)
  T.ok(err:find("lacks " .. MISSING .. ", needed by 2 of 3 code rows", 1, true), err)
  T.ok(err:find("apt-get install python3-" .. MISSING:gsub("_", "-"), 1, true), err)
  T.ok(err:find("missing_modules=skip", 1, true), err)
  T.ok(not err:find("\n", 1, true), "one line: " .. err)
  -- through the reward's hook, as collabllm_rl calls it
  local metrics = reward.load_metrics({ pass_rate = 1 }, { pass_rate = opts })
  T.raises(function() reward.check_samples(metrics, samples, { pass_rate = opts }) end, "needed by 2 of 3 code rows")
  local notes = {}
  local kept = reward.check_samples(metrics, samples, { pass_rate = { python = PYTHON, missing_modules = "skip" } },
    function(s) notes[#notes + 1] = s end)
  T.eq(#kept, 2)
  T.eq(kept[1], samples[1]); T.eq(kept[2], samples[4])
  T.eq(notes, { "pass_rate: 2 of 4 rows left out before the run" })
  -- nothing missing: every row stays
  T.eq(#reward.check_samples(metrics, { samples[1], samples[4] }, { pass_rate = opts }), 2)
  T.raises(function() pass_rate.check_samples(samples, { python = PYTHON, missing_modules = "maybe" }) end,
    "option missing_modules must be refuse or skip")
end)

T.case("an ImportError at run time is an environment error, counted apart; a made-up module is the code's fault", function()
  sandbox_or_skip()
  local ctx = { counters = {}, metric_options = { pass_rate = { python = PYTHON, extract = false } } }
  local conv = { { role = "assistant", content = "```python\ndef task_func():\n    return 1\n```" } }
  -- the tests need the module: a failed metric (never a 0), counted in pass_rate_env_errors
  local ok, err = pcall(pass_rate.compute, conv, row(TESTS_MISSING, ""), ctx)
  T.eq(ok, false)
  T.ok(err:find("environment error: modules missing in the sandbox: " .. MISSING, 1, true), err)
  T.eq(ctx.counters.pass_rate_env_errors, 1)
  -- the solution imports a module no task needs: a wrong answer, 0
  local conv2 = { { role = "assistant", content = "```python\nimport " .. MISSING .. "\ndef task_func():\n    return 1\n```" } }
  T.eq(pass_rate.compute(conv2, row(TESTS_OK, "def task_func():\n    return 1\n"), ctx), 0)
  T.eq(ctx.counters.pass_rate_env_errors, 2)
  -- the row's libs name it: the environment's fault again
  T.raises(function() pass_rate.compute(conv2, row(TESTS_OK, "", "['" .. MISSING .. "']"), ctx) end, "environment error")
  local p, detail, kind = pass_rate.run_tests("def task_func():\n    import " .. MISSING .. "\n", TESTS_OK, { python = PYTHON })
  T.eq({ p, kind }, { false, "env" }, detail)
  -- the step's row shows it
  local row_ = require("clrt.train.report").step_row({}, { rewards = {}, dropped = 0, truncated = 0 }, {}, {}, 0,
    { generate_first_s = 0, rollout_s = 0 }, 0, 1, 2, ctx)
  T.eq(row_["pass_rate/env_errors"], 3)
end)

T.run()
