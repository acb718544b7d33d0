-- bench/pass_rate_overlap.lua — does the engine decode while pass_rate's programs run? The
-- second phase of an RL step on code rows, reduced to its parts: `convs` conversations, each
-- decoding a reply of its own length (futures end at different times) on a small real model
-- (random Qwen2-shaped weights; the decode cost is what matters), then scored by pass_rate on
-- a BigCodeBench-shaped task that imports numpy and pandas, in the sandbox. Run twice in this
-- invocation: as pass_rate runs now (each program an asynchronous child the scheduler waits
-- on) and as it ran before (`blocking`: the wait holds the Lua thread, as os.execute did).
-- Prints per mode the wall time, decode steps, decode steps taken while a program ran, and
-- the seconds spent in programs (summed).
--   clrt bench/pass_rate_overlap.lua [convs=12] [tokens=24] [parallel=<cores>] [hidden=256] [layers=4]
local args = {}
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^([%w_]+)=(.*)$")
  if k then args[k] = v end
end
local convs = tonumber(args.convs or 12)
local tokens = tonumber(args.tokens or 24)
local hidden = tonumber(args.hidden or 256)
local layers = tonumber(args.layers or 4)

local sched, proc = require("clrt.sched"), require("clrt.proc")
local pass_rate = require("metrics.pass_rate")
local now = require("clrt.log").now

local ok, why = require("clrt.sandbox").check({})
if not ok then error("bench/pass_rate_overlap: no sandbox here: " .. why, 0) end

local TESTS = [[
import unittest
import numpy as np
import pandas as pd

class TestCases(unittest.TestCase):
    def test_frame(self):
        df, mean = task_func([("a", 1.0), ("b", 3.0)])
        self.assertIsInstance(df, pd.DataFrame)
        self.assertAlmostEqual(mean, 2.0)

    def test_matrix(self):
        df, mean = task_func([(str(i), float(i)) for i in range(200)])
        m = np.outer(df["value"].to_numpy(), np.ones(400)) @ np.ones((400, 400))
        self.assertAlmostEqual(m[10, 0], 4000.0)
]]
local SOLUTION = [[
import numpy as np
import pandas as pd

def task_func(records):
    df = pd.DataFrame(records, columns=["name", "value"])
    return df, float(np.mean(df["value"].to_numpy())) if len(df) else float("nan")
]]

local m = clrt.model.new({
  architectures = { "Qwen2ForCausalLM" }, vocab_size = 512, hidden_size = hidden, intermediate_size = hidden * 3,
  num_hidden_layers = layers, num_attention_heads = 8, num_key_value_heads = 2, max_position_embeddings = 1024,
  rms_norm_eps = 1e-6, rope_theta = 10000, tie_word_embeddings = true,
}, { seed = 1 })

-- The way the waits ran before: the Lua thread blocks until the program ends.
local probe = proc.spawn({ argv = { "true" } })
probe:wait()
local Proc = getmetatable(probe).__index
local async_wait = Proc.wait
local function blocking_wait(self, opts)
  local real_current = sched.current
  sched.current = function() return nil end
  local r = async_wait(self, opts)
  sched.current = real_current
  return r
end

local function run(mode)
  Proc.wait = mode == "blocking" and blocking_wait or async_wait
  local ctx = { counters = {}, metric_options = { pass_rate = { extract = false, parallel = tonumber(args.parallel) } } }
  local sample = { prompt = {}, tests = TESTS }
  local fns = {}
  for i = 1, convs do
    fns[i] = function()
      -- a reply of its own length: conversations reach their tests at different times
      local out = sched.generate(m, { 1 + i, 2, 3 }, { temperature = 0, max_new_tokens = tokens * (1 + (i - 1) % 4) })
      local conv = { { role = "assistant", content = "```python\n" .. SOLUTION .. "```" } }
      return { pass_rate.compute(conv, sample, ctx), #out[1].tokens }
    end
  end
  local t0 = now()
  local results, errors, info = sched.run(fns)
  local wall = now() - t0
  for i in pairs(errors) do error("conversation " .. i .. ": " .. errors[i], 0) end
  local passed = 0
  for _, r in ipairs(results) do passed = passed + r[1] end
  Proc.wait = async_wait
  print(("%-9s wall %6.2f s  decode steps %4d  while programs ran %4d  programs %2d (passed %2d)  in programs %6.2f s")
    :format(mode, wall, info.engine_steps, info.engine_steps_during_procs, ctx.counters.pass_rate_programs or 0,
      passed, ctx.counters.pass_rate_seconds or 0))
  return wall
end

print(("%d conversations, replies of %d..%d tokens, parallel %s, model hidden %d x %d layers")
  :format(convs, tokens, tokens * 4, args.parallel or proc.cpu_count(), hidden, layers))
run("async")   -- warms the probe, the page cache and the engine
local a = run("async")
local b = run("blocking")
print(("blocking / async wall time: %.2f"):format(b / a))
