-- clrt.train — the training modules (lua/clrt/train/*.lua), loaded on first use like clrt.X:
--   clrt.train.losses     criteria with forward -> loss, stats / backward -> dlogp (NLL, PPO, DPO)
--   clrt.train.update     the micro-batch / gradient-accumulation / optimizer-step loop
--   clrt.train.reward     metrics, scores, rewards, GRPO advantages
--   clrt.train.entry      the record of one first response and its futures (one constructor)
--   clrt.train.policy     the model as a conversation -> next message function
--   clrt.train.rollout    the conversation loop, a step's rollouts
--   clrt.train.validation the world's evaluation, data_val validation
--   clrt.train.failure    a step's failure, the stop on Ctrl-C or a refused key
--   clrt.train.context    the ctx table metrics and simulated users receive
--   clrt.train.users      simulated users by name (lua/interactions/)
--   clrt.train.defaults   the settings the recipes share, fresh per call, and their rules
--   clrt.train.warm_start a world's SFT warm start, cached
--   clrt.train.schedule   learning-rate schedule
--   clrt.train.checkpoint run-folder checkpoints (save / find)
--   clrt.train.prompts    a step's prompts, dataset rows
--   clrt.train.dpo        preference pairs (best/worst per prompt), reference sums, the DPO step
--   clrt.train.evals      a run's evaluations before/during/after training, summary.json
--   clrt.train.report     a step's metrics row, sample items, the before/after table
--   clrt.train.rollouts_log a sampled step's whole tree in rollouts.jsonl (clrt view)
--   clrt.train.ppo        the PPO update over clrt.train.update (SFT's is clrt.sft)
--   clrt.train.budget     budget.max_usd: stop a run before its API spend passes the limit
--   clrt.train.estimate   estimate=true: the calls, tokens and dollars a run will spend
--   clrt.train.tasks      single-turn tasks (task, MATH, BigCodeBench, document rows) for the data engine
--   clrt.train.data_engine the authors' multiturn data engine (recipes/build_dataset.lua)
return setmetatable({}, {
  __index = function(t, k)
    if type(k) ~= "string" or not k:match("^[%a_][%w_]*$") then return nil end
    local m = require("clrt.train." .. k)
    rawset(t, k, m)
    return m
  end,
})
