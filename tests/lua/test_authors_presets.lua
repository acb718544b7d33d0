-- preset=authors (the authors' scripts, Wuyxin/collabllm) for PPO (collabllm_rl.lua) and for
-- offline and online DPO (collabllm_dpo.lua): every value the audit of issue 42 listed, and
-- the pieces they needed: top-k sampling of the first responses (rollout.top_k, the futures'
-- rollout.future_top_k), advantages whitened per group of responses (train.whiten_size) and
-- DPO rows cut to max_length keeping the end (train.max_length, train.truncation). The
-- defaults (preset=verl, the built-in world) stay as they were.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local config = require("clrt.config")
local rl = require("recipes.collabllm_rl")
local dpo_recipe = require("recipes.collabllm_dpo")

T.case("collabllm_rl preset=authors: the authors' PPO; the default and the world keep verl's", function()
  local a = rl.parse_args({ "model=m", "preset=authors" })
  T.eq({ a.train.algorithm, a.train.grad_clip, a.train.whiten_size, a.rollout.n, a.rollout.temperature,
    a.rollout.future_temperature, a.rollout.max_new_tokens, a.rollout.top_k, a.rollout.future_top_k },
    { "ppo", 0, 1, 1, 0.6, nil, 256, 50, 0 })
  T.eq({ a.sim_cfg.max_tokens, a.sim_cfg.model, a.judge.model }, { 1024, "gpt-4o-mini", "claude-3-5-sonnet-latest" })
  rl.check_config(a)
  T.eq(rl.parse_args({ "model=m", "preset=authors", "rollout.top_k=5" }).rollout.top_k, 5, "the command line wins")
  local v = rl.parse_args({ "model=m" })
  T.eq({ v.preset, v.train.algorithm, v.train.grad_clip, v.train.whiten_size, v.rollout.n, v.rollout.temperature,
    v.rollout.max_new_tokens, v.rollout.top_k, v.rollout.future_top_k, v.sim_cfg.max_tokens, v.judge.model },
    { "verl", "grpo", 1.0, 0, 8, 1.0, 2048, 0, nil, 512, "gpt-4o-mini" })
  local w = rl.parse_args({})
  T.eq({ w.preset, w.rollout.top_k, w.train.whiten_size }, { "verl", 0, 0 }, "the built-in world's run")
  T.raises(function() rl.parse_args({ "model=m", "preset=paper" }) end, "preset must be 'verl' or 'authors'")
end)

T.case("collabllm_dpo preset=authors: online rubric, judge, user and turn caps, top-k; offline keep_end at 2048", function()
  local o = dpo_recipe.parse_args({ "model=m", "online=true" })
  T.eq({ o.reward.metric_options.interactivity.rubric, o.judge.model, o.sim_cfg.max_tokens, o.rollout.max_new_tokens,
    o.rollout.top_k, o.rollout.future_top_k }, { "authors", "claude-3-5-sonnet-latest", 1024, 1024, 50, 0 })
  local f = dpo_recipe.parse_args({ "model=m" })
  T.eq({ f.train.max_length, f.train.truncation }, { 2048, "keep_end" })
  dpo_recipe.check_config(o); dpo_recipe.check_config(f)
  for _, extra in ipairs({ {}, { "online=true" } }) do
    local v = dpo_recipe.parse_args({ "model=m", "preset=verl", unpack(extra) })
    T.eq({ v.train.max_length, v.rollout.top_k, v.rollout.max_new_tokens, v.sim_cfg.max_tokens, v.judge.model,
      v.reward.metric_options.interactivity }, { 0, 0, 2048, 512, "gpt-4o-mini", nil }, "preset=verl")
  end
end)

T.case("DPO rows cut to max_length: keep_end drops the start, keep_start the end", function()
  local dpo = require("clrt.train.dpo")
  local row = { ids = { 1, 2, 3, 4, 5, 6, 7, 8 }, first = 5 }   -- prompt 1..5, reply 6..8
  T.eq(dpo.truncate_row(row, 0), row); T.eq(dpo.truncate_row(row, 8, "keep_end"), row)
  T.eq(dpo.truncate_row(row, 6, "keep_end"), { ids = { 3, 4, 5, 6, 7, 8 }, first = 3 }, "the prompt's start goes")
  T.eq(dpo.truncate_row(row, 2, "keep_end"), { ids = { 7, 8 }, first = 1 }, "the reply's start goes, its first kept token unscored")
  T.eq(dpo.truncate_row(row, 7, "keep_start"), { ids = { 1, 2, 3, 4, 5, 6, 7 }, first = 5 })
  T.eq(dpo.truncate_row(row, 5, "keep_start"), nil, "no reply token left")
end)

T.case("advantages whitened per group of responses (TRL's batch) or over the step", function()
  local gae = require("clrt.train.gae")
  local a = gae.whiten_groups({ { 1, 3 }, { 10, 30 } }, 1)
  -- each response on its own: mean 0, Bessel's variance 1 (TRL's masked_whiten)
  for _, l in ipairs(a) do T.near(l[1], -1 / math.sqrt(2), 1e-6); T.near(l[2], 1 / math.sqrt(2), 1e-6) end
  local b = gae.whiten_groups({ { 1, 3 }, { 10, 30 } }, 0)
  T.ok(math.abs(b[1][1] - b[1][2]) < 0.2 and b[2][2] > 1, "one scale over the step: the small response's two stay close")
  T.eq(b, gae.whiten({ { 1, 3 }, { 10, 30 } }), "0: as whiten over the step")
end)

T.case("rollout.top_k reaches the first responses' sampling, rollout.future_top_k the later turns'", function()
  local sched = require("clrt.sched")
  local real, seen = sched.generate, {}
  sched.generate = function(m, ids, o) seen[#seen + 1] = o.top_k or 0; return real(m, ids, o) end
  T.cleanup(function() sched.generate = real end)
  local dir = require("support.tiny_model")(T.tmpdir(), { seed = 3 })
  local m, tok = clrt.model.load(dir), clrt.tokenizer.load(dir)
  local cfg = rl.parse_args({ "model=" .. dir, "preset=authors", "rollout.max_new_tokens=3", "rollout.n=2", "single_turn=true" })
  local samples = { { id = "a", prompt = { { role = "user", content = "hello there" } }, ground_truth = "x" } }
  require("clrt.train.rollout").step(m, tok, cfg, samples, {}, nil, {}, 1)
  T.eq(seen, { 50 }, "the first responses at top_k 50")
  seen = {}
  local policy = require("clrt.train.policy").new(m, tok, cfg, 1)
  policy({ { role = "user", content = "hello" } }, nil, "k")
  T.ok(#seen > 0, "the policy sampled")
  for _, k in ipairs(seen) do T.eq(k, 0, "the futures: future_top_k 0 (none)") end
  seen = {}
  cfg.rollout.future_top_k = nil
  policy = require("clrt.train.policy").new(m, tok, cfg, 1)
  policy({ { role = "user", content = "hello" } }, nil, "k")
  T.ok(#seen > 0)
  for _, k in ipairs(seen) do T.eq(k, 50, "future_top_k nil: top_k") end
end)

T.run()
