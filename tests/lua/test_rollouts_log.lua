-- rollouts.jsonl (clrt.train.rollouts_log): a real tiny RL run on the built-in world writes,
-- with the default sample_every, its first and last steps' whole trees — every prompt once,
-- every response, every future with its per-metric scores and the metric's and simulated
-- user's reasons, the reward and advantage, the ground truth — and each system prompt once.
-- The records' API bills and failed scores are checked on entries made by hand (the world
-- has no API), and the per-future bill on tagged clrt.llm records.
local T = require("clrt.test")
local data = require("clrt.data")
local config = require("clrt.config")
local json = require("clrt.json")
local sft = require("recipes.collabllm_sft")
local rl = require("recipes.collabllm_rl")
local rlog = require("clrt.train.rollouts_log")
local rollout = require("clrt.train.rollout")
local reward = require("clrt.train.reward")

local root = T.tmpdir()

local function by_type(rows, t)
  local out = {}
  for _, r in ipairs(rows) do if r.type == t then out[#out + 1] = r end end
  return out
end

T.case("a tiny RL run records its first and last steps' whole trees", function()
  local start = sft.main(config.parse(sft.defaults, {
    "run_dir=" .. root .. "/sft", "train.steps=40", "train.batch_size=8", "world.conversations=200",
    "arch.hidden_size=32", "arch.intermediate_size=64", "arch.num_hidden_layers=2", "train.val_every=20",
  }, sft.world_config()))
  local P, N, K, STEPS = 3, 3, 2, 4
  local dir = root .. "/rl"
  -- no sample_every=: the world's settings file says 5, more than the run's 4 steps
  rl.main(config.parse(rl.defaults, { "config=" .. rl.world_config_path(), "model=" .. start, "run_dir=" .. dir,
    "steps=" .. STEPS, "prompts_per_step=" .. P, "rollout.n=" .. N, "rollout.num_repeat_rollouts=" .. K,
    "rollout.max_new_tokens=24", "seed=3", "eval.before=false", "eval.after=false", "save_every=0" }))
  local rows = data.read_jsonl(dir .. "/rollouts.jsonl")
  local steps = by_type(rows, "step")
  T.eq(#steps, 2, "two sampled steps")
  T.eq(steps[1].step, 1, "the first step is recorded")
  T.eq(steps[2].step, STEPS, "the last step is recorded")
  local sys = by_type(rows, "system_prompt")
  T.eq(#sys, 1, "the world's one system prompt is written once")
  T.eq(sys[1].hash, rlog.hash(sys[1].text))
  local prompts = by_type(rows, "prompt")
  T.eq(#prompts, 2 * P, "every prompt of each sampled step, once")
  local futures_seen, user_reasons, metric_reasons = 0, 0, 0
  for _, p in ipairs(prompts) do
    local where = ("step %d prompt %d"):format(p.step, p.prompt)
    T.eq(p.system_prompt, sys[1].hash, where .. ": names its system prompt")
    for _, m in ipairs(p.messages) do T.ok(m.role ~= "system", where .. ": no system text per item") end
    T.eq(type(p.ground_truth), "string", where .. ": the ground truth")
    T.eq(#p.responses, N, where .. ": every response")
    for r, resp in ipairs(p.responses) do
      T.eq(resp.response, r)
      T.eq(type(resp.text), "string")
      T.eq(type(resp.reward), "number", where .. ": reward")
      T.eq(type(resp.advantage), "number", where .. ": advantage")
      if resp.truncated then
        T.eq(#resp.futures, 0, where .. ": a cut response has no futures")
      else
        T.eq(#resp.futures, K, where .. ": every future")
        for k, f in ipairs(resp.futures) do
          futures_seen = futures_seen + 1
          T.eq(f.future, k)
          T.eq(type(f.scores.exact_match), "number", where .. ": per-future exact_match")
          T.eq(type(f.scores.token_amount), "number", where .. ": per-future token_amount")
          T.eq(type(f.rationales.exact_match.rationale), "string", where .. ": the metric's reason")
          metric_reasons = metric_reasons + 1
          T.ok(#f.messages >= 1 and f.messages[1].role == "user", where .. ": the future after the response")
          for _, m in ipairs(f.messages) do
            if m.role == "user" then
              T.eq(type(m.rationale), "string", where .. ": the simulated user's reason")
              user_reasons = user_reasons + 1
            end
          end
        end
        T.near(resp.metrics.token_amount, (resp.futures[1].scores.token_amount + resp.futures[2].scores.token_amount) / 2, 1e-12)
      end
    end
  end
  T.ok(futures_seen > 0, "some responses had futures")
  T.ok(user_reasons > 0 and metric_reasons > 0)
  -- the samples log keeps one item per prompt, never the same prompt twice
  local samples = data.read_jsonl(dir .. "/samples.jsonl")
  local ids = {}
  for _, s in ipairs(samples) do
    local key = s.step .. "/" .. s.id
    T.ok(not ids[key], "samples repeat " .. key)
    ids[key] = true
  end
  T.eq(#samples, 2 * P)
end)

T.case("records carry failed scores, judges' notes and the API bill", function()
  local sample = { id = "q1", ground_truth = "42", prompt = { { role = "system", content = "Be brief." },
    { role = "user", content = "What is 6 x 7?" } } }
  local conv = { sample.prompt[1], sample.prompt[2], { role = "assistant", content = "Which numbers?" },
    { role = "user", content = "6 and 7." }, { role = "assistant", content = "42" } }
  local bill = { calls = 3, prompt_tokens = 300, cached_tokens = 0, completion_tokens = 30, usd = 0.002, roles = { user = 0.001 } }
  local e = { group = 1, response = 1, sample = sample, tokens = { 1, 2, 3 }, text = "Which numbers?",
    message = { role = "assistant", content = "Which numbers?" }, convs = { conv },
    scores = { { accuracy = 1, interactivity = reward.failed("judge down") } },
    about = { { future = 1, ended = "max_user_turns", user_turns = 1, assistant_turns = 1, tokens = 9, api = bill,
      metric_notes = { accuracy = { rationale = "correct", parts = { accuracy = 1 } } },
      user_notes = { { message = 4, thought = "they asked which numbers", current_answer = "none yet" } } } },
    reward = 0.5, advantage = 1.25 }
  local e2 = { group = 1, response = 2, sample = sample, tokens = { 1 }, text = "x", message = { role = "assistant", content = "x" },
    convs = {}, scores = {}, about = {}, dropped = "simulator failed", drop_error = "timeout" }
  local seen = {}
  local recs = rlog.records(7, { e, e2 }, { ["api/usd"] = 0.002, ["api/usd_total"] = 0.01, reward = 0.5 }, seen)
  local again = rlog.records(8, { e }, {}, seen)
  T.eq(#by_type(again, "system_prompt"), 0, "a system prompt already written is not written again")
  -- through JSON, as the file holds them
  for i, r in ipairs(recs) do recs[i] = json.decode(json.encode(r)) end
  T.eq(recs[1].type, "system_prompt"); T.eq(recs[1].text, "Be brief.")
  local st = by_type(recs, "step")[1]
  T.eq(st.api.usd, 0.002); T.eq(st.api.usd_total, 0.01); T.eq(st.futures, 1); T.eq(st.responses, 2)
  local p = by_type(recs, "prompt")[1]
  T.eq(p.step, 7); T.eq(p.ground_truth, "42"); T.eq(#p.messages, 1)
  local f = p.responses[1].futures[1]
  T.eq(f.scores.accuracy, 1); T.eq(f.scores.interactivity, json.null)
  T.ok(f.failed.interactivity:find("judge down", 1, true), "a failed score's error")
  T.eq(f.rationales.accuracy.rationale, "correct"); T.eq(f.rationales.accuracy.parts.accuracy, 1)
  T.eq(f.messages[1].rationale, "they asked which numbers", "the simulator's thought on its turn")
  T.eq(f.messages[1].current_answer, "none yet")
  T.eq(f.messages[2].rationale, nil)
  T.eq(f.api.usd, 0.002); T.eq(p.responses[1].api.prompt_tokens, 300); T.eq(p.api.completion_tokens, 30)
  T.eq(p.responses[1].reward, 0.5); T.eq(p.responses[1].advantage, 1.25)
  T.eq(p.responses[2].dropped, "simulator failed"); T.eq(p.responses[2].drop_error, "timeout")
end)

T.case("a future's requests are tagged and billed to it", function()
  local got = {}
  local client = { model = "m", chat = function(self, msgs, opts) got[#got + 1] = opts.tag; return { content = "{}" } end }
  local ctx = { judge = client, user = client, counters = {} }
  local fctx = rollout.tagged_ctx(ctx, "rl/step 1/prompt 1/response 1/future 2")
  fctx.judge:chat({}, { role = "judge/accuracy" })
  fctx.user:chat({}, nil)
  T.eq(got, { "rl/step 1/prompt 1/response 1/future 2", "rl/step 1/prompt 1/response 1/future 2" })
  T.eq(fctx.counters, ctx.counters, "everything else is the run's ctx")
  local bills = rollout.bills_by_tag({
    { tag = "a", role = "user", ok = true, prompt_tokens = 10, completion_tokens = 2, cost_usd = 0.5 },
    { tag = "a", role = "judge/accuracy", ok = true, prompt_tokens = 5, completion_tokens = 1, cost_usd = 0.25 },
    { tag = "b", role = "user", ok = true, prompt_tokens = 1, completion_tokens = 1, cost_usd = 0 },
    { role = "user", ok = true, prompt_tokens = 99 } })
  T.eq(bills.a.calls, 2); T.eq(bills.a.prompt_tokens, 15); T.eq(bills.a.usd, 0.75)
  T.eq(bills.a.roles, { user = 0.5, ["judge/accuracy"] = 0.25 })
  T.eq(bills.b.calls, 1)
end)

T.run()
