-- The API spend of the recipes against a local endpoint (tests/support/fake_billing_endpoint.py:
-- the simulated user, judges and extractor by schema, `usage` with cached tokens, every
-- request recorded): collabllm_rl's per-step tokens and dollars and its run total equal the
-- endpoint's records exactly; budget.max_usd stops the run after a step with a checkpoint,
-- one line naming the budget and the resume command, and an error; resume= with a higher
-- budget finishes it; collabllm_eval repeated over the run's reply cache sends no judge
-- request; estimate=true prints its numbers and trains nothing.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local data = require("clrt.data")
local config = require("clrt.config")
local json = require("clrt.json")
local files = require("clrt.files")
local rl = require("recipes.collabllm_rl")
local ev = require("recipes.collabllm_eval")

if io.open("/usr/bin/python3") == nil then
  print("skip: /usr/bin/python3 is needed for the fake endpoint")
  os.exit(77)
end

local root = T.tmpdir()
local policy = require("support.tiny_model")(root .. "/policy", { seed = 5 })
-- a random policy almost never ends its turn (and gets no futures): a few SFT steps on short replies
do
  local sft = require("clrt.sft")
  local m, tok = clrt.model.load(policy), clrt.tokenizer.load(policy)
  local convs = {}
  for i = 1, 16 do convs[i] = { { role = "user", content = "What is " .. i .. " plus 2?" }, { role = "assistant", content = "ok" } } end
  sft.train(m, sft.encode(tok, convs, 256), nil, { steps = 40, batch_size = 16, lr = 1e-2, seed = 1 })
  m:save(policy)
end
local rows = {}
for i = 1, 6 do
  rows[i] = { prompt = { { role = "user", content = "What is " .. i .. " plus 2?" } }, ground_truth = tostring(i + 2),
    interaction_kwargs = { single_turn_prompt = "What is " .. i .. " plus 2? Answer with the number.", task_desc = "question answering" } }
end
local data_path = root .. "/rl.jsonl"
data.write_jsonl(data_path, rows)

local srv = dofile(T.source_dir() .. "/tests/support/fake_billing.lua").start(root, {})
T.cleanup(function() srv.stop() end)

local run = root .. "/rl"
local function rl_args(extra)
  local a = { "model=" .. policy, "data=" .. data_path, "run_dir=" .. run, "steps=3", "prompts_per_step=2", "rollout.n=2",
    "rollout.num_repeat_rollouts=2", "rollout.max_user_turns=1", "rollout.max_assistant_turns=1", "rollout.max_new_tokens=8",
    "sim=llm", "sim_cfg.base_url=" .. srv.base_url, "judge.base_url=" .. srv.base_url,
    'reward.metric_weights={"accuracy":1,"interactivity":1,"token_amount":-0.0001}',
    "eval.before=false", "eval.after=false", "save_every=0", "sample_every=0" }
  for _, x in ipairs(extra or {}) do a[#a + 1] = x end
  return a
end

-- the endpoint's answered requests summed: tokens and gpt-4o-mini dollars at the published prices
local function endpoint_totals()
  local t = { sent = 0, prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0, usd = 0, judged = 0 }
  for _, r in ipairs(srv.records()) do
    if r.status == 200 then
      local u = r.usage
      t.sent = t.sent + 1
      if r.role == "judge" or r.role == "extractor" then t.judged = t.judged + 1 end
      for _, k in ipairs({ "prompt_tokens", "completion_tokens", "cached_tokens" }) do t[k] = t[k] + u[k] end
      t.usd = t.usd + ((u.prompt_tokens - u.cached_tokens) * 0.15 + u.cached_tokens * 0.075 + u.completion_tokens * 0.60) / 1e6
    end
  end
  return t
end

local function same_totals(got, want, what)
  for _, k in ipairs({ "prompt_tokens", "completion_tokens", "cached_tokens" }) do T.eq(got[k], want[k], what .. " " .. k) end
  T.eq(got.calls - got.cache_hits, want.sent, what .. ": calls sent")
  T.near(got.usd, want.usd, 1e-12, what .. " dollars")
end

T.case("estimate=true prints the expected calls and trains nothing", function()
  local e = rl.main(config.parse(rl.defaults, rl_args({ "estimate=true" })))
  T.ok(not files.exists(run), "no run folder")
  T.eq(#srv.records(), 0, "nothing sent")
  -- 2 prompts x n=2 x 2 futures, one user turn each, one request per judged metric
  T.near(e.step_roles.user.calls, 8, 1e-9)
  T.near(e.step_roles["judge/accuracy"].calls, 8, 1e-9)
  T.near(e.step_roles["judge/interactivity"].calls, 8, 1e-9)
  T.ok(e.step_usd > 0 and e.run_usd >= 3 * e.step_usd - 1e-12, "dollars per step and for the run")
  local de = require("recipes.collabllm_eval").main(config.parse(ev.defaults, { "model=" .. policy, "data=" .. data_path,
    "protocol=prefix", "sim=llm", "sim_cfg.base_url=" .. srv.base_url, "judge.base_url=" .. srv.base_url, "estimate=true" }))
  T.near(de.step_roles.user.calls, 6 * 2, 1e-9, "six conversations, max_user_turns 2 each")
  -- the paper's protocol: the user opens and writes ceil(max_messages / 2) messages; each row
  -- is judged by its task metric (accuracy here) and the ITR (interactivity) only
  local eval_rows = {}
  for i = 1, 5 do
    eval_rows[i] = { single_turn_prompt = "Compute " .. i .. " + " .. i .. ".", ground_truth = tostring(2 * i),
      single_turn_metadata = {}, task_desc = "question answering", task_metric = "accuracy", conv_id = i }
  end
  local eval_path = root .. "/eval_test.jsonl"
  data.write_jsonl(eval_path, eval_rows)
  local pe = require("recipes.collabllm_eval").main(config.parse(ev.defaults, { "model=" .. policy, "data=" .. eval_path,
    "max_messages=6", "sim=llm", "sim_cfg.base_url=" .. srv.base_url, "judge.base_url=" .. srv.base_url, "estimate=true" }))
  T.near(pe.step_roles.user.calls, 5 * 3, 1e-9, "five conversations, 3 user messages of max_messages 6 each")
  T.near(pe.step_roles["judge/accuracy"].calls, 5, 1e-9, "the task metric once a conversation")
  T.near(pe.step_roles["judge/interactivity"].calls, 5, 1e-9, "the ITR once a conversation")
  T.eq(#srv.records(), 0, "an estimate sends nothing")
  local dpo = require("recipes.collabllm_dpo")
  local online = dpo.main(config.parse(dpo.defaults, rl_args({ "online=true", "estimate=true" })))
  T.near(online.step_usd, e.step_usd, 1e-12, "online DPO samples and scores as RL does")
  T.eq(dpo.main(config.parse(dpo.defaults, rl_args({ "estimate=true" }))).step.calls, 0, "offline DPO on stored pairs calls nothing")
end)

T.case("budget.max_usd stops after a step, resumably; totals equal the endpoint's records", function()
  local ok, err = pcall(rl.main, config.parse(rl.defaults, rl_args({ "budget.max_usd=0.000000001" })))
  T.ok(not ok, "the run stops with an error (a non-zero exit)")
  err = tostring(err)
  T.ok(err:find("budget.max_usd=1e-09 reached", 1, true), err)
  T.ok(err:find("resume=" .. run, 1, true) and not err:find("\n"), "one line with the resume command: " .. err)
  T.eq(T.read(run .. "/latest"), "checkpoint-1\n", "a checkpoint of the step it stopped after")
  local want = endpoint_totals()
  T.ok(want.sent > 0 and want.cached_tokens > 0, "the step called the endpoint")
  local saved = json.decode(T.read(run .. "/api_usage.json"))
  same_totals(saved.all, want, "api_usage.json after step 1")
  local metrics = data.read_jsonl(run .. "/metrics.jsonl")
  T.eq(#metrics, 1)
  T.near(metrics[1]["api/usd"], want.usd, 1e-12, "the step's dollars in metrics.jsonl")
  T.eq(metrics[1]["api/user/calls"] + metrics[1]["api/judge/accuracy/calls"] + metrics[1]["api/judge/interactivity/calls"],
    metrics[1]["api/calls"], "per role")
  -- the same budget again stops before any step
  local ok2, err2 = pcall(rl.main, rl.parse_args({ "resume=" .. run }))
  T.ok(not ok2 and tostring(err2):find("budget.max_usd", 1, true), tostring(err2))
  T.eq(endpoint_totals().sent, want.sent, "nothing sent")
  -- a higher budget finishes the run
  rl.main(rl.parse_args({ "resume=" .. run, "budget.max_usd=1000" }))
  local all = endpoint_totals()
  local summary = json.decode(T.read(run .. "/summary.json"))
  same_totals(summary.api.all, all, "summary.json")
  local steps, usd = 0, 0
  for _, r in ipairs(data.read_jsonl(run .. "/metrics.jsonl")) do steps = steps + 1; usd = usd + r["api/usd"] end
  T.eq(steps, 3)
  T.near(usd, all.usd, 1e-12, "the steps' dollars add up to the run's")
end)

T.case("a repeated evaluation sends no judge request; an evaluation reads a run's cache", function()
  local function eval_once(out, cache_dir)
    files.mkdir_p(out)
    local args = { "model=" .. policy, "data=" .. data_path, "protocol=prefix", "out=" .. out, "prompts=4",
      "sim=llm", "sim_cfg.base_url=" .. srv.base_url, "judge.base_url=" .. srv.base_url,
      "rollout.max_user_turns=1", "rollout.max_new_tokens=8" }
    if cache_dir then args[#args + 1] = "judge.cache_dir=" .. cache_dir end
    local before = endpoint_totals()
    local report = ev.main(config.parse(ev.defaults, args))
    return report, endpoint_totals().judged - before.judged, endpoint_totals().sent - before.sent
  end
  -- its own cache (beside eval.json): the judges are asked
  local first, judged1 = eval_once(root .. "/eval1")
  T.ok(judged1 > 0, "the first evaluation asks the judges")
  T.ok(files.is_dir(root .. "/eval1/llm_cache"), "the cache sits beside eval.json")
  -- the same evaluation again over that cache: the user (sampled, not cached) is asked, no judge
  local second, judged2, sent2 = eval_once(root .. "/eval2", root .. "/eval1/llm_cache")
  T.ok(sent2 > 0, "the simulated user is asked again")
  T.eq(judged2, 0, "no judge or extractor request the second time")
  T.eq(second.metrics, first.metrics)
  T.eq(second.api.all.cache_hits, second.api.roles["judge/accuracy"].calls + second.api.roles["judge/interactivity"].calls)
  -- over the training run's cache: the conversations the run already judged are not judged again
  local third = eval_once(root .. "/eval3", run .. "/llm_cache")
  T.ok(third.api.all.cache_hits > 0, "hits from the run's cache")
end)

T.run()
