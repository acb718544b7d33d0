-- collabllm_eval.lua — multi-turn evaluation of a model with a simulated user, as the paper
-- evaluates: a greedy first response, futures with the simulated user as in training, scored
-- by the metrics in `metrics`; reported per metric, with words per conversation and the share
-- of first replies that ask a question. Prints a table and writes eval.json.
--   clrt recipes/collabllm_eval.lua model=HF_DIR data=rl_test.jsonl sim_cfg.base_url=... judge.base_url=...
--   clrt recipes/collabllm_eval.lua model=HF_DIR               # no data=: the built-in world
-- The defaults are the RL recipe's (simulator, judges, rollout limits, chat); with no data= the
-- built-in world's settings and prompts are used.
local config = require("clrt.config")
local rl_recipe = require("recipes.collabllm_rl")

local M = {}
local R = rl_recipe.defaults
M.defaults = {
  model = config.optional("string"),
  data = config.optional("string"),
  out = config.optional("string"),            -- eval.json goes here (default: the model folder)
  prompts = config.optional("number"),        -- at most this many prompts (nil: all of data=)
  seed = 12345,
  temperature = 0.0,
  metrics = { "accuracy", "interactivity", "token_amount" },
  sim = R.sim,
  sim_cfg = R.sim_cfg,
  judge = R.judge,
  chat = R.chat,
  rollout = R.rollout,
  estimate = false,                           -- true: print the expected calls, tokens and dollars, and exit
}

-- The built-in world's settings for this recipe.
function M.world_config()
  local w = config.read_file(rl_recipe.world_config_path())
  return { sim = w.sim, prompts = w.eval.prompts, metrics = { "exact_match", "token_amount" }, rollout = w.rollout }
end

function M.main(cfg)
  if cfg.estimate then return require("clrt.train.estimate").run(cfg, "eval") end
  if not cfg.model then error("collabllm_eval: model= is required (a Hugging Face model folder)", 0) end
  -- the judges' reply cache: beside eval.json unless judge.cache_dir names one (a training
  -- run's RUN_DIR/llm_cache: the same conversations are then not judged again)
  cfg.judge.cache_dir = cfg.judge.cache_dir or ((cfg.out or cfg.model) .. "/llm_cache")
  local rl, conversation = require("clrt.rl"), require("clrt.conversation")
  local world = require("recipes.collabllm_sft").world()
  local m, tok = clrt.model.load(cfg.model), clrt.tokenizer.load(cfg.model)
  local user, ctx = rl_recipe.simulator(cfg, tok)
  local weights = {}
  for _, name in ipairs(cfg.metrics) do weights[name] = 1 end
  local metrics = rl.load_metrics(weights)
  local samples
  if cfg.data then
    samples = rl_recipe.filter_prompts(m, tok, cfg, rl_recipe.dataset_samples(cfg.data), cfg.data)
  else
    samples = world.eval_prompts(cfg.prompts or 200, cfg.seed)
  end
  while cfg.prompts and #samples > cfg.prompts do table.remove(samples) end
  local rep, results = rl_recipe.validate(m, tok, { rollout = cfg.rollout, chat = cfg.chat,
    eval = { temperature = cfg.temperature, seed = cfg.seed } }, samples, user, ctx, metrics)
  if rep.first_drop then io.stderr:write("collabllm_eval: first dropped conversation: ", rep.first_drop, "\n") end
  local report = { model = cfg.model, conversations = rep.conversations, dropped = rep.dropped, invalid = rep.invalid,
    failed = rep.failed, first_reply_ask_rate = rep.first_reply_ask_rate,
    tokens_per_conversation = rep.tokens_per_conversation, metrics = rep.metrics }
  local spend = ctx.spend:add(clrt.llm.drain_records())
  if spend.all.calls > 0 then report.api = spend end
  if not cfg.data then
    local finished = {}
    for _, r in ipairs(results) do if r.conversation then finished[#finished + 1] = r end end
    report.world = world.summarize(finished)
  end
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
  print(("conversations %d, dropped %d, invalid first replies %d"):format(rep.conversations, rep.dropped, rep.invalid))
  if report.api then print(require("clrt.api.usage").line(report.api)) end
  local path = (cfg.out or cfg.model) .. "/eval.json"
  require("clrt.data").write_atomic(path, require("clrt.json").encode(report) .. "\n")
  print("wrote " .. path)
  return report
end

-- The command line -> a config: with no data= the built-in world's settings come first.
function M.parse_args(argv)
  local world = not config.arg_value(argv, "data") and not config.arg_value(argv, "config")
  return config.parse(M.defaults, argv, world and M.world_config() or nil)
end

local argv = { ... }
if argv[1] == "recipes.collabllm_eval" then return M end
M.main(M.parse_args(argv))
