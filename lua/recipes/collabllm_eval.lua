-- collabllm_eval.lua — multi-turn evaluation of a model with a simulated user. Two protocols:
--
-- protocol=paper (the default): the CollabLLM paper's evaluation, as the authors'
--   scripts/engine/inference.py runs it (clrt.train.paper_eval): every single-turn task of the
--   test set (process_dataset's eval_test.jsonl) starts from an empty chat that the simulated
--   user opens; turns alternate until the user ends the chat or max_messages (14) messages;
--   the assistant samples at temperature 0.6. Reported per task and overall, mean ± standard
--   error: task performance (the row's task_metric: BLEU on documents, pass rate on code,
--   accuracy on math), ITR (itr_metric: the interactivity judge) and tokens read (the
--   assistant's, by the policy's tokenizer, in thousands). eval.json, eval_details.jsonl (every
--   conversation) and a printed table. system_prompt= picks the system message: "default"
--   (process_dataset's, which clrt-trained models saw in training; the world's on the world),
--   "none" (the authors' base-model runs), "proactive" (the prompted baseline the paper
--   compares with: lua/prompts/proactive_system.txt) or a prompt file.
--     clrt recipes/collabllm_eval.lua model=HF_DIR data=eval_test.jsonl sim_cfg.base_url=... judge.base_url=...
--     clrt recipes/collabllm_eval.lua model=HF_DIR data=eval_test.jsonl system_prompt=proactive ...
-- protocol=prefix: the RL validation (what data_val= runs during training): rl_test prefixes,
--   a greedy first response, futures with the simulated user as in training, scored by the
--   metrics in `metrics`; reported per metric, with words per conversation and the share of
--   first replies that ask a question. Not the paper's numbers.
--     clrt recipes/collabllm_eval.lua protocol=prefix model=HF_DIR data=rl_test.jsonl ...
--   clrt recipes/collabllm_eval.lua model=HF_DIR               # no data=: the built-in world
-- protocol=sharded: Lost in Conversation (arXiv 2505.06120; clrt.train.sharded_eval): every
--   sharded task of data= (the authors' sharded_instructions_600.json or shard_dataset.lua's
--   file; their schema, docs/method.md) is simulated `simulations` times (10, the paper's) in
--   FULL (the whole instruction at once), CONCAT (every shard in one message) and SHARDED (the
--   simulated user reveals one shard a turn; a strategy judge classifies each reply and the
--   task's metric scores each answer attempt). Reported per task and overall: performance,
--   aptitude (90th percentile over a task's simulations) and unreliability (90th - 10th), mean
--   ± standard error over tasks; compare_system_prompt= and compare_model= run the same tasks
--   side by side. sim=llm (any endpoint), user_lm (a trained user model) or scripted plays
--   the user; with no data= the world's under-specified requests are two-shard tasks.
--     clrt recipes/collabllm_eval.lua protocol=sharded model=HF_DIR data=sharded_instructions_600.json sim_cfg.base_url=... judge.base_url=...
--     clrt recipes/collabllm_eval.lua protocol=sharded model=runs/collab_world_sft/world2-HASH-seed1 compare_model=runs/collabllm_rl-DATE
-- The defaults are the shared ones the training recipes have too (clrt.train.defaults:
-- simulator, judges, rollout limits, chat); with no data= the
-- built-in world's settings and prompts are used (protocol=paper: its scripted user opens with
-- the world's request; task performance is exact_match, ITR the share of conversations whose
-- first reply asks, asks_question: the world has no judge).
local config = require("clrt.config")
local train = require("clrt.train")
local WHO = "collabllm_eval"

local M = {}

-- protocol=paper's own defaults, laid over the shared ones: the authors' effective caps.
-- Their inference (scripts/engine/inference.py) generates through collabllm/simulation.py,
-- whose sampling parameters default to max_tokens 1024 (its --max_new_tokens 2048 never
-- reaches them), and their user simulator (collabllm/modules/user_simulator.py) has
-- max_tokens 1024. protocol=prefix keeps the training recipes' (verl's 2048 and 512): it
-- checks the training objective.
M.PAPER = { max_new_tokens = 1024, user_max_tokens = 1024 }
-- protocol=sharded's: the authors' assistant cap for a non-reasoning model (simulator_sharded.py
-- and simulator_full.py: max_tokens 1000).
M.SHARDED = { max_new_tokens = 1000 }

-- The defaults of a protocol ("paper" | "prefix" | "sharded"), fresh on each call.
function M.defaults_for(protocol)
  local R = train.defaults.shared()
  if protocol == "paper" then
    R.rollout.max_new_tokens = M.PAPER.max_new_tokens     -- the assistant's turn (collabllm/simulation.py)
    R.sim_cfg.max_tokens = M.PAPER.user_max_tokens        -- the user's turn (collabllm/modules/user_simulator.py)
  elseif protocol == "sharded" then
    R.rollout.max_new_tokens = M.SHARDED.max_new_tokens
  end
  return {
    model = config.optional("string"),
    data = config.optional("string"),
    out = config.optional("string"),            -- eval.json goes here (default: a new runs/collabllm_eval-DATE folder)
    prompts = config.optional("number"),        -- at most this many prompts (nil: all of data=)
    seed = 12345,
    protocol = protocol,                        -- "paper", "prefix" or "sharded" (see the header)
    temperature = config.optional("number"),    -- nil: 0.6 under paper (the authors' inference.py), 1.0 under sharded (theirs), 0.0 (greedy) under prefix
    simulations = config.optional("number"),    -- sharded: conversations per task and setting (nil: 10, the paper's)
    max_turns_per_shard = 2,                    -- sharded: at most this many user turns per shard (clrt's bound; the authors' loop has none)
    tasks = config.optional("string"),          -- sharded: a comma list of the task names of data= to run (nil: all clrt can score)
    compare_model = config.optional("string"),  -- sharded: a second model evaluated on the same tasks, side by side
    compare_system_prompt = config.optional("string"), -- sharded: the model again with this system_prompt (e.g. proactive), side by side
    max_messages = 14,                          -- paper: user + assistant messages (inference.py --max_turns 14)
    system_prompt = "default",                  -- paper: "default" | "none" | "proactive" | a prompt file
    itr_metric = "interactivity",               -- paper: the metric reported as ITR
    -- paper: the ITR judge's rubric: "verl" (three parts, 1 / 0.7 / 0.3 / 0) or "authors" (one
    -- score, 1 / 0.5 / 0: examples/metrics/interactivity.py, the paper's ITR); the judge model
    -- is judge.model (the authors' was claude-3-5-sonnet-latest)
    itr = "verl",
    task_metric = config.optional("string"),    -- paper: overrides every row's task_metric
    metrics = { "accuracy", "interactivity", "token_amount" },   -- prefix
    sim = R.sim,
    check_endpoints = R.check_endpoints,
    sim_cfg = R.sim_cfg,
    -- cross-simulator evaluation: a second simulated user (a sim= name, e.g. user_lm or
    -- scripted) with its own endpoint (eval_sim_cfg, the same keys as sim_cfg); the model is
    -- evaluated against both and eval.json holds both reports side by side (by_simulator)
    eval_sim = config.optional("string"),
    eval_sim_cfg = train.defaults.shared().sim_cfg,
    judge = R.judge,
    chat = R.chat,
    rollout = R.rollout,
    estimate = false,                           -- true: print the expected calls, tokens and dollars, and exit
  }
end
M.defaults = M.defaults_for("paper")

-- The built-in world's settings for this recipe.
local function the_world() return require("collab_world.world") end

function M.world_config(protocol)
  local w = config.read_file(the_world().config_path())
  -- protocol=sharded: prompts= counts tasks, each simulated 3 x simulations times
  local prompts = protocol == "sharded" and require("clrt.train.sharded_recipe").WORLD_TASKS or w.eval.prompts
  return { sim = w.sim, prompts = prompts, metrics = { "exact_match", "token_amount" }, rollout = w.rollout,
    itr_metric = "asks_question" }
end

-- The paper protocol's system message (nil: none) from system_prompt=.
function M.system_text(cfg, world)
  local v = cfg.system_prompt
  local pf = require("clrt.prompt_file")
  if v == "none" then return nil end
  if v == "default" then
    -- process_dataset.lua's system prompt (its SYSTEM_FILE), the text its data were made with
    return cfg.data and pf.read("collabllm_system") or world.system_prompt
  end
  if v == "proactive" then return pf.read("proactive_system") end
  if type(v) ~= "string" or not v:find("[/.]") then
    error(("collabllm_eval: system_prompt must be default, none, proactive or a prompt file path, got %s"):format(tostring(v)), 0)
  end
  return pf.read(v)
end

-- itr=: the interactivity judge's rubric under protocol=paper, checked.
function M.itr_rubric(cfg)
  if cfg.itr ~= "verl" and cfg.itr ~= "authors" then
    error(("collabllm_eval: itr must be verl or authors, got %s"):format(tostring(cfg.itr)), 0)
  end
  return cfg.itr
end

local function reward_failed(v) return train.reward.is_failed(v) end

-- The simulated user and the ctx metrics and the user receive (clrt.train.context).
local function simulator(cfg, tok)
  local ctx, user = train.context{ config = cfg, tokenizer = tok, who = WHO }
  return user, ctx
end

function M.main_paper(cfg)
  local paper = train.paper_eval
  local world = the_world()
  if type(cfg.max_messages) ~= "number" or cfg.max_messages < 1 or cfg.max_messages % 1 ~= 0 then
    error("collabllm_eval: max_messages must be a whole number >= 1, got " .. tostring(cfg.max_messages), 0)
  end
  cfg.temperature = cfg.temperature or 0.6
  if type(cfg.temperature) ~= "number" or cfg.temperature < 0 then
    error("collabllm_eval: temperature must be a number >= 0, got " .. tostring(cfg.temperature), 0)
  end
  local system = M.system_text(cfg, world)
  local itr_rubric = M.itr_rubric(cfg)
  M.open_folder(cfg)
  local m, tok = clrt.model.load(cfg.model, { adapter = cfg.adapter }), clrt.tokenizer.load(cfg.model)
  local user, ctx = simulator(cfg, tok)
  -- the task metrics' and ITR's judge on a dataset's rows (the built-in world scores its own)
  train.endpoints.check(ctx, cfg.data and { { metric = { uses_judge = true } } } or {}, cfg, WHO)
  ctx.metric_options = ctx.metric_options or {}
  ctx.metric_options.interactivity = { rubric = itr_rubric }
  local samples = cfg.data and paper.samples(cfg.data, system, cfg.task_metric, WHO)
    or paper.world_samples(world, cfg.prompts or 200, cfg.seed, system)
  while cfg.prompts and #samples > cfg.prompts do table.remove(samples) end
  local results = paper.run(m, tok, cfg, samples, user, ctx)
  local rep = paper.report(results, cfg)
  rep.model, rep.adapter, rep.data, rep.system_prompt, rep.max_messages = cfg.model, cfg.adapter, cfg.data, cfg.system_prompt, cfg.max_messages
  rep.temperature, rep.itr_metric = cfg.temperature, cfg.itr_metric
  -- what the numbers were measured with: the ITR rubric and judge, the turns' caps
  if cfg.itr_metric == "interactivity" then
    rep.itr, rep.itr_prompt = itr_rubric, require("metrics.interactivity").RUBRICS[itr_rubric] .. ".txt"
    rep.itr_judge_model = cfg.judge.model
  end
  rep.assistant_max_new_tokens, rep.user_max_tokens = cfg.rollout.max_new_tokens, cfg.sim_cfg.max_tokens
  if rep.first_drop then io.stderr:write("collabllm_eval: first dropped conversation: ", rep.first_drop, "\n") end
  paper.print_table(rep, cfg.itr_metric)
  print(("conversations %d, dropped %d"):format(rep.conversations, rep.dropped))
  local dir = cfg.out
  local json, data = require("clrt.json"), require("clrt.data")
  local details = {}
  for _, r in ipairs(results) do
    details[#details + 1] = { id = r.sample.id, task = r.sample.task, task_metric = r.sample.task_metric,
      dropped = r.dropped, error = r.error and tostring(r.error), ended = r.ended, conversation = r.conversation,
      task_performance = (not reward_failed(r.task_performance)) and r.task_performance or nil,
      itr = (not reward_failed(r.itr)) and r.itr or nil, tokens_read_k = r.tokens_read_k }
  end
  data.write_jsonl(dir .. "/" .. (M.details_file or "eval_details.jsonl"), details)
  data.write_atomic(dir .. "/eval.json", json.encode(rep) .. "\n")
  print("wrote " .. dir .. "/eval.json")
  -- an evaluation that scored nothing measured nothing: a failure, with the first drop's cause
  if rep.conversations == 0 and #results > 0 then
    error(("collabllm_eval: no conversation was scored (%d dropped; first: %s)"):format(rep.dropped,
      tostring(rep.first_drop):gsub("%s+", " ")), 0)
  end
  return rep
end

-- The evaluation's own folder, made once its settings are checked (a bad value leaves no
-- folder behind), never the model's: two evaluations of one model (the default and the
-- proactive baseline) must not replace each other's results. out= names it; else
-- runs/collabllm_eval-DATE. Its config.json records what was evaluated.
function M.open_folder(cfg)
  if M.opened and M.opened == cfg.out then return end   -- eval_sim=: one folder for both simulators
  cfg.out = cfg.out or require("clrt.run").new_dir({ out = "runs", name = "collabllm_eval" }, WHO)
  if not require("clrt.files").exists(cfg.out) then M.made_folder = cfg.out end   -- removed if it fails
  require("clrt.files").mkdir_p(cfg.out)
  require("clrt.data").write_atomic(cfg.out .. "/config.json", require("clrt.json").encode(cfg) .. "\n")
  print("evaluation folder: " .. cfg.out)
  M.opened = cfg.out
  -- the judges' reply cache: beside eval.json unless judge.cache_dir names one (a training
  -- run's RUN_DIR/llm_cache: the same conversations are then not judged again)
  cfg.judge.cache_dir = cfg.judge.cache_dir or (cfg.out .. "/llm_cache")
end

-- A name for a simulator in eval.json: its sim= value, and the served model for one that
-- talks to an endpoint.
function M.simulator_name(sim, sim_cfg)
  local ok, uses = pcall(train.users.uses_llm, sim)
  if ok and uses then return ("%s (%s)"):format(sim, tostring(sim_cfg.model)) end
  return sim
end

-- eval_sim=: the model evaluated with sim= and with eval_sim=, each report whole in
-- eval.json's by_simulator (in that order, named by M.simulator_name) and the first one's
-- figures at the top level as without eval_sim=; eval_details.jsonl and the console table
-- are each simulator's in turn (the second's details: eval_details_eval_sim.jsonl).
function M.main_cross(cfg)
  train.users.check(cfg.eval_sim, WHO .. ": eval_sim")
  M.open_folder(cfg)
  local out = cfg.out
  local second = {}
  for k, v in pairs(cfg) do second[k] = v end
  second.sim, second.sim_cfg, second.eval_sim = cfg.eval_sim, cfg.eval_sim_cfg, nil
  local runs = { { cfg = cfg, details = nil }, { cfg = second, details = "eval_details_eval_sim.jsonl" } }
  local by, order = {}, {}
  for i, r in ipairs(runs) do
    local c = r.cfg
    c.eval_sim = nil
    local name = M.simulator_name(c.sim, c.sim_cfg)
    if by[name] then name = name .. " #" .. i end
    print(("== simulated user %d of 2: %s"):format(i, name))
    M.details_file = r.details
    local ok, rep = pcall(M.main_one, c)
    M.details_file = nil
    if not ok then error(rep, 0) end
    rep.simulator = name
    by[name] = rep
    order[#order + 1] = name
  end
  local report = {}
  for k, v in pairs(by[order[1]]) do report[k] = v end
  report.by_simulator, report.simulators = by, order
  cfg.eval_sim = second.sim
  local path = out .. "/eval.json"
  require("clrt.data").write_atomic(path, require("clrt.json").encode(report) .. "\n")
  print("wrote " .. path .. " (both simulators: by_simulator)")
  return report
end

function M.main(cfg)
  if cfg.eval_sim and not cfg.estimate then
    if not cfg.model then error("collabllm_eval: model= is required (a model folder, a run folder or a checkpoint)", 0) end
    require("clrt.model_path").apply(cfg, WHO)
    return M.main_cross(cfg)
  end
  return M.main_one(cfg)
end

function M.main_one(cfg)
  if cfg.estimate and cfg.protocol == "sharded" then
    error("collabllm_eval: estimate=true prices protocol=paper and prefix; protocol=sharded is not priced yet", 0)
  end
  if cfg.estimate then return train.estimate.run(cfg, "eval", { world = the_world() }) end
  if not cfg.model then error("collabllm_eval: model= is required (a model folder, a run folder or a checkpoint)", 0) end
  require("clrt.model_path").apply(cfg, WHO)
  if cfg.protocol ~= "paper" and cfg.protocol ~= "prefix" and cfg.protocol ~= "sharded" then
    error(("collabllm_eval: protocol must be paper, prefix or sharded, got %s"):format(tostring(cfg.protocol)), 0)
  end
  if cfg.protocol == "paper" then return M.main_paper(cfg) end
  if cfg.protocol == "sharded" then
    return require("clrt.train.sharded_recipe").main(cfg, { who = WHO, world = not cfg.data and the_world() or nil,
      open_folder = M.open_folder, system_text = M.system_text, details_file = M.details_file })
  end
  cfg.temperature = cfg.temperature or 0.0
  local world = the_world()
  M.open_folder(cfg)
  local m, tok = clrt.model.load(cfg.model, { adapter = cfg.adapter }), clrt.tokenizer.load(cfg.model)
  local user, ctx = simulator(cfg, tok)
  local weights = {}
  for _, name in ipairs(cfg.metrics) do weights[name] = 1 end
  local metrics = train.reward.load_metrics(weights, ctx.metric_options)
  train.endpoints.check(ctx, metrics, cfg, WHO)
  local samples
  if cfg.data then
    samples = train.prompts.filter_prompts(m, tok, cfg, train.prompts.dataset_samples(cfg.data, WHO), cfg.data, WHO)
    -- the code rows' modules must be in the sandbox before any conversation (pass_rate.check_samples)
    samples = train.reward.check_samples(metrics, samples, ctx.metric_options, print)
  else
    samples = world.eval_prompts(cfg.prompts or 200, cfg.seed)
  end
  while cfg.prompts and #samples > cfg.prompts do table.remove(samples) end
  local rep, results = train.validation.validate(m, tok, { rollout = cfg.rollout, chat = cfg.chat,
    eval = { temperature = cfg.temperature, seed = cfg.seed } }, samples, user, ctx, metrics)
  if rep.first_drop then io.stderr:write("collabllm_eval: first dropped conversation: ", rep.first_drop, "\n") end
  local report = { model = cfg.model, adapter = cfg.adapter, conversations = rep.conversations, dropped = rep.dropped, invalid = rep.invalid,
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
  local path = cfg.out .. "/eval.json"
  require("clrt.data").write_atomic(path, require("clrt.json").encode(report) .. "\n")
  print("wrote " .. path)
  return report
end

-- main, and an evaluation that fails before its eval.json leaves no folder of its own behind.
function M.main_guarded(cfg)
  local ok, res = xpcall(M.main, function(e) return e end, cfg)
  if ok then return res end
  local files = require("clrt.files")
  if M.made_folder and not files.exists(M.made_folder .. "/eval.json") then files.remove_tree(M.made_folder) end
  error(res, 0)
end

-- The command line -> a config: with no data= the built-in world's settings come first.
-- The protocol's defaults (M.defaults_for) come first: protocol=prefix (from the command
-- line or a config= file) parses again over its own.
function M.parse_args(argv)
  local world = not config.arg_value(argv, "data") and not config.arg_value(argv, "config")
  local over = world and M.world_config(config.arg_value(argv, "protocol")) or nil
  local cfg = config.parse(M.defaults, argv, over)
  if cfg.protocol == "prefix" or cfg.protocol == "sharded" then cfg = config.parse(M.defaults_for(cfg.protocol), argv, over) end
  return cfg
end

local argv = { ... }
if argv[1] == "recipes.collabllm_eval" then return M end
if require("clrt.recipe_help").handle(WHO, "recipes.collabllm_eval", argv, M.parse_args) then return end
M.main_guarded(M.parse_args(argv))
