-- Asynchronous RL (train.async.max_off_policy_steps, clrt.train.async): with K = 1 the
-- rollouts of step s sample from the weights after update s - 2 in a worker process while the
-- steps before train, and the run still repeats bit for bit. collabllm_rl with the simulated
-- user and both judges on a local endpoint whose replies depend only on each request and
-- come after random delays (tests/support/fake_collab_endpoint.py, as test_reproducible_rl):
--   two runs with one seed: identical metrics, samples and final parameters; each step's
--   policy version as the schedule says, its mismatch logged, no async/ folder left;
--   kill -9 at random moments, then resume=: the uninterrupted run's metrics, samples and
--   final parameters, bit for bit;
--   a worker killed under the run: the run fails with one line naming it.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local data = require("clrt.data")
local files = require("clrt.files")
local config = require("clrt.config")
local rl = require("recipes.collabllm_rl")

local root = T.tmpdir()
-- 3 steps: step 3 samples from version 1, so the schedule moves past the start
local R = require("support.rl_repeat").new(T, root, { steps = 3, extra = { "train.async.max_off_policy_steps=1" } })
local q = require("support.rl_repeat").quote

local first
T.case("K = 1: two runs with the same seed and an HTTP user that answers in random order: the same run", function()
  first = R.run_twice(function(args) rl.main(config.parse(rl.defaults, args)) end, function(dir)
    -- the schedule: step s sampled from the weights after update max(0, s - 2), one update old
    -- from step 2 on, and the mismatch it left is logged
    local rows = {}
    for _, r in ipairs(data.read_jsonl(dir .. "/metrics.jsonl")) do rows[r.step] = r end
    for step = 1, R.steps do
      T.eq(rows[step]["async/policy_version"], math.max(0, step - 2), "step " .. step .. "'s policy version")
      T.eq(rows[step]["async/age_max"], step == 1 and 0 or 1, "step " .. step .. "'s age")
      T.ok(rows[step]["tis/mismatch_kl"] ~= nil and rows[step]["tis/weight_mean"] ~= nil, "step " .. step .. "'s mismatch")
    end
    T.ok(math.abs(rows[3]["tis/logp_mismatch"]) > 1e-4, "step 3 trains weights one update past its rollouts': "
      .. tostring(rows[3]["tis/logp_mismatch"]))
    T.ok(not files.exists(dir .. "/async"), "a finished run leaves no async/ folder")
  end)
end)

T.case("K = 1: kill -9 at random moments, then resume=: the uninterrupted run bit for bit", function()
  if not first then T.skip("the uninterrupted run failed") end
  R.kill_and_resume(first)
end)

T.case("a rollout worker that dies is one line naming it, and the run fails", function()
  local dir = root .. "/worker_dies"
  local cmd = { q(R.bin), "recipes/collabllm_rl.lua" }
  for _, a in ipairs(R.args(dir)) do cmd[#cmd + 1] = q(a) end
  -- the worker is killed as soon as it has started ([a]: the pattern does not match this
  -- shell's own command line)
  local rc = os.execute(("(%s > %s/dies.log 2>&1; echo $? > %s/dies.rc) & while [ ! -e %s ]; do sleep 0.02; done; "
    .. "sleep 0.3; pkill -9 -f %s; wait"):format(table.concat(cmd, " "), root, root, q(dir .. "/async/worker.log"),
    q("[a]sync_worker=" .. dir)))
  T.ok(rc == 0 or rc == true, "the shell ran")
  local out = T.read(root .. "/dies.log") or ""
  T.ok(tonumber((T.read(root .. "/dies.rc") or ""):match("%d+")) ~= 0, "the run exits non-zero: " .. out)
  T.ok(out:find("the rollout worker stopped before step", 1, true), "the error names the worker: " .. out)
  T.ok(not out:find("stack traceback", 1, true), "no traceback: " .. out)
end)

T.run()
