-- The same seed gives the same run with an LLM user over HTTP (issue 32). collabllm_rl on
-- the built-in world with the simulated user and both judges served by a local endpoint
-- whose replies depend only on each request's content (tests/support/fake_collab_endpoint.py,
-- which also checks every request asks for its JSON schema) and which holds each reply a
-- random time, so replies, and with them the policy's next turns, reach the engine in a
-- different order in every run. Futures of one first response meet identical contexts (the
-- user answers alike), the case where arrival order used to pick the random stream.
--   two runs with one seed: identical metrics, samples and final parameters;
--   kill -9 at random moments, then resume=: the uninterrupted run's metrics, samples and
--   final parameters, bit for bit.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local config = require("clrt.config")
local rl = require("recipes.collabllm_rl")

local root = T.tmpdir()
local R = require("support.rl_repeat").new(T, root, { steps = 2 })

local first
T.case("two runs with the same seed and an HTTP user that answers in random order: the same run", function()
  first = R.run_twice(function(args) rl.main(config.parse(rl.defaults, args)) end)
end)

T.case("kill -9 at random moments, then resume=: the uninterrupted run bit for bit", function()
  if not first then T.skip("the uninterrupted run failed") end
  R.kill_and_resume(first)
end)

T.run()
