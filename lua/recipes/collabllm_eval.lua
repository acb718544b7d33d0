-- collabllm_eval.lua — multi-turn evaluation of a model with a simulated user, as the paper
-- evaluates: every conversation runs to the user's end (or the turn limit) and is scored by
-- the metrics in `metrics`; reported per metric, with tokens per conversation and the share
-- of first replies that ask a question. Prints a table and writes eval.json.
--   clrt recipes/collabllm_eval.lua model=HF_DIR                      # the built-in world
--   clrt recipes/collabllm_eval.lua model=HF_DIR data=rl_test.jsonl sim=llm sim_cfg.base_url=... \
--        judge.base_url=... metrics='["accuracy","interactivity","token_amount"]'
local config = require("clrt.config")
local rl_recipe = require("recipes.collabllm_rl")

local M = {}
M.defaults = {
  model = config.optional("string"),
  data = config.optional("string"),
  out = config.optional("string"),            -- eval.json goes here (default: the model folder)
  prompts = 200,
  seed = 12345,
  temperature = 0.0,
  metrics = { "exact_match", "token_amount" },
  sim = "scripted",
  sim_cfg = rl_recipe.defaults.sim_cfg,
  judge = rl_recipe.defaults.judge,
  rollout = { max_user_turns = 2, max_assistant_turns = 2, max_new_tokens = 256, max_len = 2048 },
}

function M.main(cfg)
  if not cfg.model then error("collabllm_eval: model= is required (a Hugging Face model folder)", 0) end
  local rl, sched, conversation = require("clrt.rl"), require("clrt.sched"), require("clrt.conversation")
  local world = require("recipes.collabllm_sft").world()
  local m, tok = clrt.model.load(cfg.model), clrt.tokenizer.load(cfg.model)
  local rcfg = config.parse(rl_recipe.defaults, {})
  rcfg.sim, rcfg.sim_cfg, rcfg.judge = cfg.sim, cfg.sim_cfg, cfg.judge
  local user, ctx = rl_recipe.simulator(rcfg, tok)
  local weights = {}
  for _, name in ipairs(cfg.metrics) do weights[name] = 1 end
  local metrics = rl.load_metrics(weights)
  local samples
  if cfg.data then
    samples = rl_recipe.dataset_samples(cfg.data)
    while #samples > cfg.prompts do table.remove(samples) end
  else
    samples = world.eval_prompts(cfg.prompts, cfg.seed)
  end
  local ecfg = { rollout = { temperature = cfg.temperature, top_p = 1, max_new_tokens = cfg.rollout.max_new_tokens,
    max_len = cfg.rollout.max_len } }
  local policy = rl_recipe.make_policy(m, tok, ecfg, cfg.seed)
  local fns = {}
  for i, s in ipairs(samples) do
    fns[i] = function()
      local conv = rl_recipe.copy_conv(s.prompt, (policy(s.prompt)) or "")
      local c, info = rl.rollout(conv, policy, user, s, ctx, { max_user_turns = cfg.rollout.max_user_turns,
        max_assistant_turns = cfg.rollout.max_assistant_turns, keep_last_assistant = true })
      if not c then return { dropped = info.dropped } end
      return { sample = s, conversation = c, scores = rl.score_conversation(c, s, metrics, ctx, { retries = 2 }) }
    end
  end
  local results, errs = sched.run(fns)
  local sums, counts, failed, dropped = {}, {}, {}, 0
  local asks, words, n = 0, 0, 0
  local finished = {}
  for i = 1, #samples do
    local r = results[i]
    if errs[i] or not r or r.dropped then
      if dropped == 0 then io.stderr:write("collabllm_eval: first dropped conversation: ", tostring(errs[i] or (r and r.dropped)), "\n") end
      dropped = dropped + 1
    else
      finished[#finished + 1] = r
      n = n + 1
      for name, v in pairs(r.scores) do
        if rl.is_failed(v) then failed[name] = (failed[name] or 0) + 1
        else sums[name] = (sums[name] or 0) + v; counts[name] = (counts[name] or 0) + 1 end
      end
      local first = conversation.first_reply(r.conversation, r.sample)
      if first and conversation.asks_question(first) then asks = asks + 1 end
      for _, msg in ipairs(conversation.after_prompt(r.conversation, r.sample)) do words = words + conversation.word_count(msg.content) end
    end
  end
  local report = { model = cfg.model, conversations = n, dropped = dropped, failed = failed,
    first_reply_ask_rate = n > 0 and asks / n or 0, tokens_per_conversation = n > 0 and words / n or 0, metrics = {} }
  for name in pairs(weights) do report.metrics[name] = counts[name] and sums[name] / counts[name] or nil end
  if not cfg.data then report.world = world.summarize(finished) end
  print(("%-28s %10s"):format("metric", "value"))
  for _, name in ipairs(cfg.metrics) do
    print(("%-28s %10s"):format(name, report.metrics[name] and ("%.4f"):format(report.metrics[name]) or "failed"))
  end
  print(("%-28s %10.4f"):format("first_reply_ask_rate", report.first_reply_ask_rate))
  print(("%-28s %10.2f"):format("tokens_per_conversation", report.tokens_per_conversation))
  if report.world then
    for _, k in ipairs({ "accuracy_underspecified", "accuracy_specified", "ask_rate_underspecified", "ask_rate_specified" }) do
      print(("%-28s %10.4f"):format(k, report.world[k]))
    end
  end
  print(("conversations %d, dropped %d"):format(n, dropped))
  local path = (cfg.out or cfg.model) .. "/eval.json"
  require("clrt.data").write_atomic(path, require("clrt.json").encode(report) .. "\n")
  print("wrote " .. path)
  return report
end

local argv = { ... }
if argv[1] == "recipes.collabllm_eval" then return M end
M.main(config.parse(M.defaults, argv))
