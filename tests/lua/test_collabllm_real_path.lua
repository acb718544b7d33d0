-- The CollabLLM recipe's real path over loopback, every component real: a policy model
-- folder, `clrt serve` of a second small model acting as the simulated user (LLM user with
-- its JSON reply schema) and as the judge of the accuracy and interactivity metrics, the
-- HTTP client and scheduler, constrained decoding on the server. Two full steps must run
-- with every reply parsed: no dropped samples and no failed metric.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local data = require("clrt.data")
local config = require("clrt.config")
local rl = require("recipes.collabllm_rl")

if os.execute("command -v curl > /dev/null 2>&1") ~= 0 then
  io.write("skip: curl is not installed\n")
  os.exit(77)
end

local root = T.tmpdir()
local tiny = require("support.tiny_model")
local policy_dir = tiny(root .. "/policy", { seed = 5 })
os.execute("mkdir -p " .. root .. "/helper")
local helper_dir = tiny(root .. "/helper", { seed = 6, max_position = 4096 })

-- A random policy almost never ends its turn, and a first response that runs out of tokens
-- gets no futures (spec step 3). A few SFT steps on short replies teach it to stop.
do
  local sft = require("clrt.sft")
  local m, tok = clrt.model.load(policy_dir), clrt.tokenizer.load(policy_dir)
  local convs = {}
  for i = 1, 16 do
    convs[i] = { { role = "user", content = "Write a card for my friend " .. i .. "." }, { role = "assistant", content = "ok" } }
  end
  local items = sft.encode(tok, convs, 256)
  sft.train(m, items, nil, { steps = 40, batch_size = 16, lr = 1e-2, seed = 1 })
  m:save(policy_dir)
end

local url = require("support.serve")(helper_dir, "--slots 48 --max-len 4096 --served-model-name helper").url

T.case("two RL steps with an LLM user and LLM judges served by clrt serve", function()
  local dir = root .. "/run"
  rl.main(config.parse(rl.defaults, {
    "model=" .. policy_dir, "run_dir=" .. dir, "steps=2", "prompts_per_step=2", "rollout.n=2",
    "rollout.num_repeat_rollouts=1", "rollout.max_user_turns=1", "rollout.max_new_tokens=8",
    "sim=llm", "sim_cfg.base_url=" .. url, "sim_cfg.model=helper", "judge.model=helper", "sim_cfg.max_tokens=160", "sim_cfg.max_chars=16",
    "judge.base_url=" .. url, "judge.max_chars=16",
    'reward.metric_weights={"accuracy":1,"interactivity":1,"token_amount":-0.0001}',
    "eval.before=false", "eval.after=false", "save_every=0",
  }))
  local rows = data.read_jsonl(dir .. "/metrics.jsonl")
  T.eq(#rows, 2)
  for _, r in ipairs(rows) do
    T.eq(r.dropped, 0, "no sample dropped for an unparseable user reply")
    for k, v in pairs(r) do
      if k:find("^failed/") then T.eq(v, 0, k) end
    end
    T.ok(r["metric/accuracy"] ~= nil and r["metric/interactivity"] ~= nil, "the judges scored every conversation")
    T.ok(r.http_calls and r.http_calls > 0, "the simulator and judges were called over HTTP")
  end
  -- rollouts.jsonl (steps 1 and 2: the first and the last) keeps the judges' thoughts, the LLM
  -- user's and each future's own API bill
  local futures = 0
  for _, p in ipairs(data.read_jsonl(dir .. "/rollouts.jsonl")) do
    for _, resp in ipairs(p.type == "prompt" and p.responses or {}) do
      for _, f in ipairs(resp.futures) do
        futures = futures + 1
        T.eq(type(f.rationales.accuracy.rationale), "string", "the accuracy judge's thought")
        T.eq(type(f.rationales.interactivity.rationale), "string", "the interactivity judge's thought")
        T.ok(f.api and f.api.calls >= 3 and f.api.prompt_tokens > 0, "the future's user and judge calls, billed to it")
        T.eq(type(f.messages[1].rationale), "string", "the LLM user's thought")
      end
    end
  end
  T.ok(futures > 0, "rollouts.jsonl holds futures")
end)

T.run()
