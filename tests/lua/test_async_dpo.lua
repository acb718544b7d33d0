-- Asynchronous online DPO (collabllm_dpo online=true train.async.max_off_policy_steps=1):
-- the rollout worker samples step s's responses from the weights after update s - 2 while the
-- steps before train, and the run repeats bit for bit, as test_async_rl shows for RL; the same
-- local endpoint (random delays, replies that depend only on each request). A budget stop
-- under it keeps the steps made ahead, bills the worker's step in progress and says so.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local data = require("clrt.data")
local files = require("clrt.files")
local dpo = require("recipes.collabllm_dpo")

local root = T.tmpdir()
local R = require("support.rl_repeat").new(T, root, { steps = 3, spread_key = "pair_score_gap",
  extra = { "online=true", "preset=verl", "min_gap=0", "train.async.max_off_policy_steps=1" } })

T.case("online DPO, K = 1: two runs with the same seed: the same run; each step's pairs from the version the schedule says", function()
  R.run_twice(function(args) dpo.main(dpo.parse_args(args)) end, function(dir)
    local rows = {}
    for _, r in ipairs(data.read_jsonl(dir .. "/metrics.jsonl")) do rows[r.step] = r end
    for step = 1, R.steps do
      T.eq(rows[step]["async/policy_version"], math.max(0, step - 2), "step " .. step .. "'s policy version")
      T.ok((rows[step].pairs or 0) > 0, "step " .. step .. " trained pairs")
    end
    T.ok(not files.exists(dir .. "/async"), "a finished run leaves no async/ folder")
  end)
end)

T.case("offline DPO with max_off_policy_steps > 0 is one line", function()
  local okp, err = pcall(dpo.main, dpo.parse_args({ "train.async.max_off_policy_steps=1" }))
  T.ok(not okp and tostring(err):find("only online=true", 1, true), tostring(err))
end)

T.run()
