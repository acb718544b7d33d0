-- pass_rate on the published bigcodebench rows, the way a run meets them: a JSONL in the
-- published multiturn schema -> process_dataset -> the RL recipe's dataset_samples -> the
-- metric, under Debian's /usr/bin/python3 with numpy and pandas (the tests import both and
-- multiply matrices, so BLAS runs). Also: the extractor is told the entry point and the
-- row's extraction requirement; the limits are options (BigCodeBench's by default); the
-- defaults leave room for numpy on as many BLAS threads as the GPU machine has cores.
local T = require("clrt.test")
local data = require("clrt.data")
local pd = require("recipes.process_dataset")
local pass_rate = require("metrics.pass_rate")
local extract_json = require("clrt.net.llm_json").extract_json

local PYTHON = "/usr/bin/python3"

local function have_numpy_pandas()
  local ok, why = require("clrt.sandbox").check({})
  if not ok then T.skip("no sandbox here: " .. why) end
  local r = os.execute(PYTHON .. " -c 'import numpy, pandas' >/dev/null 2>&1")
  return r == 0 or r == true
end

local TEST = [[
import unittest
import numpy as np
import pandas as pd


class TestCases(unittest.TestCase):
    def test_small(self):
        df, mean = task_func([("a", 1.0), ("b", 3.0)])
        self.assertIsInstance(df, pd.DataFrame)
        self.assertEqual(list(df.columns), ["name", "value"])
        self.assertAlmostEqual(mean, 2.0)

    def test_matrix(self):
        df, mean = task_func([(str(i), float(i)) for i in range(200)])
        m = np.outer(df["value"].to_numpy(), np.ones(400)) @ np.ones((400, 400))
        self.assertEqual(m.shape, (200, 400))
        self.assertAlmostEqual(m[10, 0], 4000.0)
        self.assertAlmostEqual(mean, 99.5)

    def test_empty(self):
        df, mean = task_func([])
        self.assertEqual(len(df), 0)
        self.assertTrue(np.isnan(mean))
]]

local REQUIREMENT = "Your extraction should be executable code that starts with:\n```\nimport numpy as np\nimport pandas as pd\ndef task_func(records):\n```"

local SOLUTION = [[
import numpy as np
import pandas as pd

def task_func(records):
    df = pd.DataFrame(records, columns=["name", "value"])
    mean = float(np.mean(df["value"].to_numpy())) if len(df) else float("nan")
    return df, mean
]]
local WRONG = SOLUTION:gsub("np%.mean", "np.sum")

local function fenced(code) return "Here is the function:\n```python\n" .. code .. "```\nIt returns the frame and the mean." end

-- Ten conversations about the task, two turns each, two candidates per turn.
local function write_rows(path)
  local rows = {}
  local request = "Build a pandas DataFrame from (name, value) records and return it with the mean value."
  for c = 0, 9 do
    local md = { entry_point = "task_func", extraction_requirement = REQUIREMENT, task_id = "BigCodeBench/" .. (900 + c), test = TEST }
    local turns = {
      { { role = "user", content = "I need a function for a table of records and their average. Task " .. c } },
      { { role = "user", content = "I need a function for a table of records and their average. Task " .. c },
        { role = "assistant", content = "Should the records be (name, value) pairs, and what should an empty input give?" },
        { role = "user", content = "Yes, pairs; an empty input gives an empty frame and NaN." } },
    }
    for t, prompt in ipairs(turns) do
      for k, score in ipairs({ 0.8, 0.3 }) do
        rows[#rows + 1] = {
          prompt = prompt, completion = k == 1 and fenced(SOLUTION) or "Sure, here is a sketch.",
          conv_id = c, turn_id = t - 1, score = score,
          single_turn_prompt = request, single_turn_completion = SOLUTION, single_turn_metadata = md,
          sessions = {}, rewards = { pass_rate = { score } },
        }
      end
    end
  end
  data.write_jsonl(path, rows)
end

local function dataset(dir)
  local input = dir .. "/collabllm-multiturn-bigcodebench.jsonl"
  write_rows(input)
  local real_print = print
  print = function() end
  local ok, err = pcall(pd.main, clrt.config.parse(pd.defaults, { "input=" .. input, "out=" .. dir .. "/data" }))
  print = real_print
  if not ok then error(err, 0) end
  local train = require("clrt.train.prompts").dataset_samples(dir .. "/data/rl_train.jsonl", "collabllm_rl")
  local test = require("clrt.train.prompts").dataset_samples(dir .. "/data/rl_test.jsonl", "collabllm_rl")
  T.ok(#train > 0 and #test > 0, ("both splits have rows (%d / %d)"):format(#train, #test))
  return train, test
end

local function conversation(sample, reply)
  local c = {}
  for i, m in ipairs(sample.prompt) do c[i] = m end
  c[#c + 1] = { role = "assistant", content = reply }
  return c
end

local NO_JUDGE = { metric_options = { pass_rate = { python = PYTHON, extract = false } } }

T.case("a bigcodebench row through process_dataset and the RL recipe: pass 1, fail 0", function()
  if not have_numpy_pandas() then T.skip(PYTHON .. " lacks numpy/pandas (python3-numpy, python3-pandas)") end
  local dir = T.tmpdir()
  local train, test = dataset(dir)
  for _, s in ipairs({ train[1], test[1] }) do
    T.eq(s.single_turn_metadata.entry_point, "task_func")
    T.eq(pass_rate.tests_of(s), TEST)
    T.eq(pass_rate.compute(conversation(s, fenced(SOLUTION)), s, NO_JUDGE), 1)
    T.eq(pass_rate.compute(conversation(s, fenced(WRONG)), s, NO_JUDGE), 0)
  end
  -- extract=false keeps the LAST fenced block of the reply
  local s = train[1]
  T.eq(pass_rate.compute(conversation(s, fenced(WRONG) .. "\nFixed:\n" .. fenced(SOLUTION)), s, NO_JUDGE), 1)
  T.eq(pass_rate.compute(conversation(s, fenced(SOLUTION) .. "\nOr:\n" .. fenced(WRONG)), s, NO_JUDGE), 0)
end)

T.case("the extractor is told the entry point and the row's extraction requirement", function()
  if not have_numpy_pandas() then T.skip(PYTHON .. " lacks numpy/pandas (python3-numpy, python3-pandas)") end
  local dir = T.tmpdir()
  local train = dataset(dir)
  local s = train[1]
  local judge = { calls = {} }
  function judge:chat(messages, opts)
    self.calls[#self.calls + 1] = { messages = messages, opts = opts }
    return { content = require("clrt.json").encode({ thought = "last reply", final_completion = SOLUTION }) }
  end
  local ctx = { judge = judge, extract_json = extract_json, metric_options = { pass_rate = { python = PYTHON } } }
  T.eq(pass_rate.compute(conversation(s, "Use the function from before, with the empty case handled."), s, ctx), 1)
  T.eq(#judge.calls, 1)
  local text = judge.calls[1].messages[#judge.calls[1].messages].content
  T.ok(text:find("`task_func`", 1, true), "entry point in the extraction prompt")
  T.ok(text:find(REQUIREMENT, 1, true), "extraction requirement in the extraction prompt")
  -- a sample without metadata: no instructions, and the prompt is the judge's own
  T.eq(pass_rate.extraction_instructions({ prompt = s.prompt }), nil)
  -- metadata kept as a JSON string by some exports reads the same
  local as_string = { single_turn_metadata = require("clrt.json").encode(s.single_turn_metadata) }
  T.ok(pass_rate.extraction_instructions(as_string):find("`task_func`", 1, true))
  T.eq(pass_rate.tests_of(as_string), TEST)
end)

T.case("limits are options; the defaults fit numpy on 16 BLAS threads; bad options are errors", function()
  if not have_numpy_pandas() then T.skip(PYTHON .. " lacks numpy/pandas (python3-numpy, python3-pandas)") end
  local code = SOLUTION
  -- the GPU machine has 16 cores: numpy's BLAS on 16 threads reserves ~2.6 GB (measured)
  local ok, detail = pass_rate.run_tests(code, TEST, { python = PYTHON, threads = 16 })
  T.ok(ok, "16 BLAS threads under the default limits: " .. detail)
  local d = pass_rate.limits({})
  -- BigCodeBench's untrusted_check: max(min_time_limit 240, gt_time_limit 60) + 1 = 241 s
  -- per task (planted fault: the old 60 s), 30 GiB of address space and of data, 10 MiB of stack
  T.eq({ d.timeout, d.cpu_s, d.mem_mb, d.as_mb, d.stack_mb, d.file_mb, d.threads, d.procs, d.python, d.semantics },
    { 241, 241, 30720, 30720, 10, 16, 1, 64, "/usr/bin/python3", "bigcodebench" })
  T.eq(d.parallel, require("clrt.proc").cpu_count())
  T.eq(pass_rate.limits({ timeout = 20 }).cpu_s, 20)
  -- writable memory: a 600 MB array is refused under mem_mb = 256
  local okm, dm = pass_rate.run_tests("x = bytearray(600 * 1024 * 1024)\n", "", { python = PYTHON, mem_mb = 256, semantics = "strict" })
  T.eq(okm, false); T.ok(dm:find("MemoryError", 1, true), dm)
  -- the options reach the sandbox through ctx.metric_options: a wall-clock timeout that
  -- sleeping past fails and a longer one passes
  local s = { prompt = {}, tests = "import time\ntime.sleep(2)\n" }
  local function strict(o) o.semantics = "strict" return o end
  local conv = { { role = "assistant", content = "```python\nx = 1\n```" } }
  T.eq(pass_rate.compute(conv, s, { metric_options = { pass_rate = strict({ python = PYTHON, extract = false, timeout = 1 }) } }), 0)
  T.eq(pass_rate.compute(conv, s, { metric_options = { pass_rate = strict({ python = PYTHON, extract = false, timeout = 10 }) } }), 1)
  T.raises(function() pass_rate.compute(conv, s, { metric_options = { pass_rate = { timeout = "soon" } } }) end,
    "option timeout must be a positive number")
  T.raises(function() pass_rate.run_tests("", "", { mem_mb = 0 }) end, "option mem_mb must be a positive number")
  T.raises(function() pass_rate.run_tests("", "", { bind = { "relative" } }) end, "option bind[1] must be an absolute path")
  T.raises(function() pass_rate.run_tests("", "", { loopback = "yes" }) end, "option loopback must be true or false")
end)

T.run()
