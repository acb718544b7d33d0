-- collabllm_rl.lua — CollabLLM RL (docs/method.md): each response is rewarded by
-- the conversations it leads to (the multiturn-aware reward), GRPO advantages within each
-- prompt's group, a PPO-clip loss with a low-variance KL term to a frozen reference, trained
-- on the first response's tokens only. train.algorithm=ppo trains instead as the authors' PPO
-- does (TRL): a value head, GAE, the KL as a reward penalty (clrt.train.ppo_value).
--
--   clrt recipes/collabllm_rl.lua                       # the built-in world, no API key
--   clrt recipes/collabllm_rl.lua model=HF_DIR data=rl_train.jsonl data_val=rl_test.jsonl \
--        sim_cfg.base_url=http://127.0.0.1:8001/v1 judge.base_url=http://127.0.0.1:8001/v1
--
-- The defaults below are the verl recipe's for a real model (recipe/collabllm/
-- train_rl_collabllm.sh and its interaction config; each value says where it comes from).
-- With no model= the run loads the built-in world's settings (examples/collab_world/
-- config.lua) under the command line: it builds its own start (the world's tokenizer and a
-- small model trained by collabllm_sft.lua, cached under sft_cache), evaluates it, trains,
-- evaluates again, and writes summary.json (before/after) beside metrics.jsonl and plot.svg.
-- config=FILE loads any such file. Every step's rollouts go through clrt.sched: the policy
-- turns of all conversations are batched into shared generate calls while simulator and
-- judge requests are in flight.
local config = require("clrt.config")
local run = require("clrt.run")
local train = require("clrt.train")
local reward, rollout, prompts = train.reward, train.rollout, train.prompts
local SCRIPT = "recipes/collabllm_rl.lua"
local M = {}

local OPENAI = "https://api.openai.com/v1"
M.defaults = {
  model = config.optional("string"),        -- HF folder of the starting policy (and reference)
  adapter = config.optional("string"),      -- a PEFT LoRA folder over model=: the policy trains it, the reference is model=
  data = config.optional("string"),         -- RL JSONL from process_dataset.lua; nil: world prompts
  data_val = config.optional("string"),     -- validation JSONL (process_dataset's rl_test.jsonl)
  out = "runs",
  name = "collabllm_rl",
  run_dir = config.optional("string"),
  resume = config.optional("string"),       -- a run folder: continue from its latest checkpoint
  seed = 1,
  device = "cpu",                           -- "cuda": the policy and its reference on the GPU (the world's SFT start is made on the cpu)
  epochs = 20,                              -- verl trainer.total_epochs
  steps = config.optional("number"),        -- optimizer steps; nil: epochs over the data
  stop_after = config.optional("number"),   -- end this run after that step (resume later)
  prompts_per_step = 16,                    -- verl data.train_batch_size
  save_every = 100,                         -- verl trainer.save_freq
  sample_every = 10,
  single_turn = false,                      -- ablation: reward the response alone, no futures
  -- A step fails when more than max_drop_fraction of its first responses are dropped (the
  -- simulator failed) or a metric failed on every conversation; the run stops after
  -- max_failed_steps failed steps. An HTTP 401/403 from the simulator or judge stops it at once.
  max_drop_fraction = 0.5,
  max_failed_steps = 3,
  chat = {
    enable_thinking = config.optional("boolean"), -- Qwen3's switch, passed to every render
    strip_think = true,                     -- the user, judges and token_amount see visible text only
  },
  sim = "llm",                              -- "llm" (an OpenAI-compatible user) or "scripted" (the world's)
  -- The simulated user (sim=llm) and the judges, each an OpenAI-compatible endpoint.
  -- api_key_env names the variable holding the key (OPENAI_API_KEY for OpenAI); local
  -- endpoints (vLLM, clrt serve) need none. Retries live in two places (DESIGN.md):
  -- max_retries / backoff / max_backoff are the HTTP client's transport retries
  -- (connection, timeout, 429/5xx, Retry-After, jittered exponential back-off);
  -- parse_retries is how often a reply that does not parse or lacks a key is asked again
  -- (clrt.llm_reply). Worst case per score or user turn: (1 + parse_retries) * (1 + max_retries).
  sim_cfg = { base_url = OPENAI, model = "gpt-4o-mini", api_key_env = config.optional("string"), -- verl interaction config
    temperature = 1.0, max_tokens = 512, top_p = config.optional("number"),   -- verl: user 1.0 / 512
    timeout = 120, max_retries = 5, backoff = 0.5, max_backoff = 30, max_concurrency = 64, -- verl: num_retries 3 = 3 attempts in all, transport and parse (collabllm_interaction_config.yaml)
    parse_retries = 1, response_format = true, max_chars = 1500,
    prompt_file = config.optional("string"),     -- nil: lua/prompts/collabllm_user.txt (its header: placeholders)
    terminate_marker = "[[TERMINATE CHAT]]",   -- the text with which the user ends the chat
    -- spend (docs/api_cost.md): requests / tokens per minute (one limit per base URL + key),
    -- {input, cached_input, output} $ per million tokens (nil: clrt.api.prices' table),
    -- cache=true caches the user's replies too (they are sampled: futures would repeat)
    rpm = config.optional("number"), tpm = config.optional("number"), price = config.optional("table"),
    cache = config.optional("boolean") },
  -- judge.top_p=null leaves top_p out of the request (for APIs that refuse it beside a
  -- temperature); max_chars bounds the judge's "thought" only, never an extracted document,
  -- whose reply may take extract_max_tokens (servers refuse a prompt + max_tokens over the
  -- judge's context: lower it for a judge with a small context).
  judge = { base_url = OPENAI, model = "gpt-4o-mini", api_key_env = config.optional("string"), -- verl llm_judge_kwargs
    temperature = 0, max_tokens = 2048, top_p = 1, extract_max_tokens = 4096,   -- verl: temperature 0, max_tokens 2048 (train_rl_collabllm.sh)
    timeout = 120, max_retries = 5, backoff = 0.5, max_backoff = 30, max_concurrency = 64,
    parse_retries = 1, response_format = true, max_chars = 1500,
    rpm = config.optional("number"), tpm = config.optional("number"), price = config.optional("table"),
    -- replies to temperature-0 requests are kept in cache_dir (nil: RUN_DIR/llm_cache; a
    -- shared folder serves several runs and evaluations); cache=false: none, true: every reply
    cache = config.optional("boolean"), cache_dir = config.optional("string") },
  budget = { max_usd = config.optional("number") },  -- stop (resumable) before the API spend passes this
  estimate = false,                         -- true: print the expected calls, tokens and dollars, and exit
  -- metric_options: per-metric options, ctx.metric_options[name] (see each lua/metrics file):
  -- reward.metric_options.bleu_score.level=word, or the whole table as JSON:
  -- 'reward.metric_options={"pass_rate":{"timeout":60}}'.
  -- mode "verl": r = sum_m clamp(w_m * mean_k s_m, -1, 1); "mean": r = mean_k sum_m w_m s_m,
  -- the authors' MR averaged over the futures. verl's token_amount counts words (weight
  -- -0.0001); the authors' cost is tokens_read (assistant tokens / 1000, weight -0.5), so
  -- with their weights use tokens_read, not token_amount (docs/method.md).
  reward = { metric_weights = config.map({ accuracy = 1, interactivity = 1, token_amount = -0.0001 }), -- verl
    mode = "verl", metric_options = config.map({}) },
  rollout = {
    n = 8, temperature = 1.0, top_p = 1.0,  -- verl rollout.n, rollout.temperature
    num_repeat_rollouts = 3, max_user_turns = 2, -- verl multi_turn.*
    max_assistant_turns = 2,                -- future turns: verl's max_assistant_turns 3 counts A1
    keep_last_assistant = true,             -- the authors' A1 U1 A2 U2 A3 (verl drops A3)
    max_new_tokens = 2048,                  -- per policy turn: verl data.max_response_length
    token_budget = 2048,                    -- per future, verl's rule: A1 + user + later assistant tokens
    max_prompt_len = 8196,                  -- verl data.max_prompt_length; longer prompts are filtered out
    max_len = config.optional("number"),    -- context; nil: max_prompt_len + token_budget, capped by the model
    future_temperature = config.optional("number"), -- the policy's later turns; nil: temperature
    -- The reward of a first response cut at max_new_tokens, empty or malformed (it gets no
    -- futures). verl's agent loop says "tell reward manager to score -1 and skip future
    -- interaction to avoid reward hacking with incompleted message" (collabllm_agent_loop.py;
    -- its reward manager then scores a batch with no futures 0). -1 keeps a cut-off reply
    -- below any valid one whose reward is only lowered by a token cost.
    cutoff_reward = -1,
    -- "int8": rollouts sample from int8 copies of the policy's weights, made again after every
    -- optimizer step (docs/quantization.md); the update then weights each token by truncated
    -- importance sampling, min(pi_train / pi_rollout, train.tis_cap), and logs the mismatch
    quant = "none",
  },
  train = { lr = 1e-6, decay = "constant", min_lr_ratio = 0.0, warmup_steps = 0, -- verl actor.optim
    weight_decay = 0.01, grad_clip = 1.0,
    mini_batches = 2,                       -- verl ppo_mini_batch_size 8 of 16 prompts
    micro_batch_size = 4,                   -- rows per forward/backward (gradients accumulate)
    clip = 0.2, kl_coef = 0.001, norm_adv_by_std = true,   -- verl kl_loss_coef (low_var_kl), GRPO
    tis_cap = 2,                            -- rollout.quant=int8: TIS's cap C (verl tis_imp_ratio_cap)
    -- algorithm=ppo: the authors' PPO (TRL PPOTrainer <= 0.10.1, PPOConfig defaults): a value
    -- head on the final hidden state, GAE, the KL as a per-token reward penalty (kl_coef above
    -- is then unused), clip as cliprange (clrt.train.ppo_value)
    algorithm = "grpo",                     -- "grpo" (verl's, the default) or "ppo"
    gamma = 1.0, lam = 0.95,                -- TRL gamma, lam
    vf_coef = 0.1, cliprange_value = 0.2,   -- TRL vf_coef, cliprange_value
    ppo_epochs = 1,                         -- passes over the mini-batches: the authors' ppo.py example (TRL's default 4)
    kl_penalty_coef = 0.2, kl_target = 6, kl_horizon = 10000, -- TRL init_kl_coef, target, horizon (adap_kl_ctrl; kl_target=0: fixed)
    base_dtype = "f32",                     -- bf16 (LoRA only): the frozen base in bf16, shared with the reference
    lora = require("clrt.train.lora").config() },    -- r > 0: train LoRA adapters; the reference is the base
  eval = { every = 10,                      -- verl trainer.test_freq: validation on data_val
    prompts = config.optional("number"),    -- at most this many validation prompts (nil: all)
    seed = 12345, temperature = 0.0, before = false, after = true },
  dist = { check_every = 50 },              -- under mpirun: steps between parameter checks across ranks (0: none)
  sft_cache = "runs/collab_world_sft",      -- where the built-in world's warm start is kept
  sft = config.map({}),                     -- collabllm_sft.lua settings for the world's warm start
}

-- Names other recipes and tests use (the code lives in lua/clrt/train/).
M.world_config_path = prompts.world_config_path
M.dataset_samples, M.filter_prompts = prompts.dataset_samples, prompts.filter_prompts
M.validate, M.evaluate, M.check_stop = rollout.validate, rollout.evaluate, rollout.check_stop
M.render_opts, M.reply_message, M.make_policy, M.context_len = rollout.render_opts, rollout.reply_message, rollout.policy, rollout.context_len
function M.simulator(cfg, tok)
  local ctx, user = train.context{ config = cfg, tokenizer = tok }
  return user, ctx
end

M.rules = {
  { "seed", "count0" }, { "epochs", "count" }, { "steps", "count" }, { "stop_after", "count" },
  { "prompts_per_step", "count" }, { "save_every", "count0" }, { "sample_every", "count0" },
  { "sim", "one_of", { "llm", "scripted" } }, { "max_drop_fraction", "prob" }, { "max_failed_steps", "count" },
  { "reward.mode", "one_of", { "verl", "mean" } },
  { "rollout.n", "count" }, { "rollout.temperature", "nonneg" }, { "rollout.top_p", "fraction" },
  { "rollout.num_repeat_rollouts", "count" }, { "rollout.max_user_turns", "count0" },
  { "rollout.max_assistant_turns", "count0" }, { "rollout.max_new_tokens", "count" }, { "rollout.token_budget", "count" },
  { "rollout.max_prompt_len", "count" }, { "rollout.max_len", "count" }, { "rollout.future_temperature", "nonneg" },
  { "rollout.cutoff_reward", "finite" }, { "rollout.quant", "one_of", { "none", "int8" } }, { "train.tis_cap", "rate" },
  { "train.lr", "rate" }, { "train.decay", "one_of", { "constant", "cosine", "linear" } }, { "train.min_lr_ratio", "prob" },
  { "train.warmup_steps", "count0" }, { "train.weight_decay", "nonneg" }, { "train.grad_clip", "nonneg" },
  { "train.mini_batches", "count" }, { "train.micro_batch_size", "count" }, { "train.clip", "rate" },
  { "train.kl_coef", "nonneg" },
  { "train.algorithm", "one_of", { "grpo", "ppo" } }, { "train.gamma", "prob" }, { "train.lam", "prob" },
  { "train.vf_coef", "nonneg" }, { "train.cliprange_value", "rate" }, { "train.kl_penalty_coef", "nonneg" },
  { "train.kl_target", "nonneg" }, { "train.kl_horizon", "count" }, { "train.ppo_epochs", "count" },
  { "eval.every", "count0" }, { "eval.prompts", "count" }, { "eval.seed", "count0" }, { "eval.temperature", "nonneg" },
  { "judge.extract_max_tokens", "count" }, { "dist.check_every", "count0" }, { "budget.max_usd", "nonneg" },
}
for _, r in ipairs(train.context.client_rules("sim_cfg")) do M.rules[#M.rules + 1] = r end
for _, r in ipairs(train.context.client_rules("judge")) do M.rules[#M.rules + 1] = r end

-- Every value against its declared kind, before anything loads: one line per bad key.
function M.check_config(cfg)
  config.check(cfg, M.rules, "collabllm_rl")
  reward.check_config(cfg.reward, "collabllm_rl")
  for _, k in ipairs({ "sim_cfg", "judge" }) do
    if cfg[k].price ~= nil then require("clrt.api.prices").check(cfg[k].price, "collabllm_rl: " .. k .. ".price") end
  end
end

-- Settings a resumed run may not change: they define what the run's steps mean.
M.FIXED_ON_RESUME = { "model", "adapter", "seed", "data", "prompts_per_step", "rollout.n", "single_turn", "sft", "sft_cache",
  "train.lora.r", "train.lora.alpha", "train.lora.targets", "train.base_dtype", "train.algorithm" }

function M.main(cfg)
  M.check_config(cfg)
  if cfg.estimate then return require("clrt.train.estimate").run(cfg, "rl") end
  local run_dir = cfg.resume or run.new_dir(cfg, "collabllm_rl")
  if cfg.resume and cfg.run_dir ~= cfg.resume then
    error("collabllm_rl: resume= needs the run's config: pass the command line through parse_args", 0)
  end
  cfg.run_dir = run_dir
  return run.guard("collabllm_rl", SCRIPT, run_dir, function() return M.run(cfg, run_dir) end)
end

function M.run(cfg, run_dir)
  local world = prompts.world()
  -- resume=: the latest complete checkpoint; none yet (stopped during the first steps):
  -- the run starts again from step 1 in its own folder
  local ckpt_dir, resume_state
  if cfg.resume then
    ckpt_dir, resume_state = train.checkpoint.find(run_dir)
    resume_state = resume_state or { step = 0 }
  end
  local start_dir = cfg.model or prompts.world_start(cfg, world)
  local tok = clrt.tokenizer.load(start_dir)
  local m = train.lora.policy(start_dir, ckpt_dir, cfg.train.lora, cfg.seed, cfg.adapter, cfg.train.base_dtype)
  if cfg.device ~= "cpu" then m:to(cfg.device) end
  -- prompts without room for a response are left out before anything trains on them
  local dataset, val_set, notes = prompts.load_sets(m, tok, cfg)
  if not cfg.steps then
    if not dataset then error("collabllm_rl: steps= is required without data=", 0) end
    cfg.steps = cfg.epochs * math.ceil(#dataset / cfg.prompts_per_step)
  end
  local weights = cfg.reward.metric_weights
  local plot = { "reward", "first_reply_ask_rate", "kl", "grad_norm" }
  for name in pairs(weights) do plot[#plot + 1] = "metric/" .. name end
  local lg = clrt.log.run({ dir = run_dir, config = cfg, total_steps = cfg.steps, plot = plot,
    sample_every = cfg.sample_every, resume_step = resume_state and resume_state.step or nil,
    progress_keys = { "reward", "metric/" .. (next(weights)), "kl", "tokens_per_s" } })
  for _, n in ipairs(notes) do lg:print(n) end
  local ref = train.lora.reference(m, start_dir)
  if cfg.device ~= "cpu" and getmetatable(ref) == getmetatable(m) then ref:to(cfg.device) end
  local opt = clrt.optim.adamw(m, { lr = cfg.train.lr, weight_decay = cfg.train.weight_decay, grad_clip = cfg.train.grad_clip })
  if ckpt_dir then opt:load(ckpt_dir .. "/optimizer.safetensors") end
  local ppo = cfg.train.algorithm == "ppo" and M.ppo_state(m, cfg, ckpt_dir, resume_state) or nil

  local ctx, user = train.context{ config = cfg, tokenizer = tok }
  local metrics = reward.load_metrics(weights, cfg.reward.metric_options)
  local ev = train.evals.new{ run_dir = run_dir, cfg = cfg, model = m, tokenizer = tok, world = world, user = user,
    ctx = ctx, metrics = metrics, val_set = val_set, can_eval = not dataset and cfg.sim == "scripted", log = lg,
    resume_state = resume_state }
  ev:before()

  local first_step = resume_state and resume_state.step + 1 or 1
  local last_step = math.min(cfg.steps, cfg.stop_after or cfg.steps)
  local failed_steps = resume_state and resume_state.failed_steps or 0
  local budget = require("clrt.train.budget")
  budget.check_start(cfg, ctx, SCRIPT, run_dir, "collabllm_rl")
  for step = first_step, last_step do
    clrt.check_interrupt()
    local t0 = clrt.log.now()
    local samples = prompts.step_prompts(cfg, world, dataset, step)
    -- rollout.quant=int8: int8 copies of the current weights for the rollouts only
    -- (evaluations and the update read the f32 ones)
    if cfg.rollout.quant == "int8" then m:set_quant("int8") end
    local entries, timing = rollout.step(m, tok, cfg, samples, ctx, user, metrics, step)
    if cfg.rollout.quant == "int8" then m:set_quant("none") end
    local R = reward.batch_rewards(entries, weights, cfg.reward.mode)
    local groups = {}
    for i, e in ipairs(entries) do groups[i] = e.group end
    -- GRPO's group advantages (PPO's come from its value: astats stays empty)
    local A, astats = {}, {}
    if not ppo then A, astats = reward.group_advantages(R.rewards, groups, { scale_by_std = cfg.train.norm_adv_by_std }, #entries) end
    for i, e in ipairs(entries) do
      e.reward = R.rewards[i]
      if e.reward ~= nil and not ppo then e.advantage = A[i] end
    end
    local t1 = clrt.log.now()
    local lr = train.schedule.lr(step - 1, { lr = cfg.train.lr, decay = cfg.train.decay,
      min_lr_ratio = cfg.train.min_lr_ratio, warmup_steps = cfg.train.warmup_steps, total_steps = cfg.steps })
    local st
    if ppo then st = M.ppo_update(ppo, m, ref, opt, entries, cfg.train, lr)
    else
      local rows = train.ppo.training_rows(entries)
      st = #rows > 0 and train.ppo.update(m, ref, opt, rows, cfg.train, lr) or {}
    end
    local t2 = clrt.log.now()
    local row = train.report.step_row(entries, R, astats, st, lr, timing, t0, t1, t2, ctx)
    if ppo then M.ppo_row(row, st) end
    failed_steps = rollout.log_step(lg, cfg, step, row, entries, R, failed_steps)
    if lg:sample_due(step) then lg:samples(step, train.report.sample_items(entries, cfg.rollout.n)) end
    ev:at_step(step)
    local over = budget.check_step(cfg, ctx)   -- past budget.max_usd with one more step: stop here, resumable
    if over or (cfg.save_every > 0 and (step % cfg.save_every == 0 or step == last_step)) then
      train.checkpoint.save(run_dir, { step = step, model = m, tokenizer_dir = start_dir, optimizer = opt, base = start_dir,
        value_head = ppo and ppo.head, state = { failed_steps = failed_steps, kl_penalty_coef = ppo and ppo.kl_coef } })
    end
    if over then budget.stop(over, cfg, ctx, SCRIPT, run_dir, "collabllm_rl", lg, ev) end
  end

  ev:after(last_step)
  lg:close()
  ev:finish()
  run.print_end(SCRIPT, run_dir, last_step, cfg.steps)
  return run_dir, ev.summary
end

-- train.algorithm=ppo: the value head (a checkpoint's on resume, else new from the seed)
-- and the KL penalty's coefficient (the checkpoint's, else train.kl_penalty_coef).
function M.ppo_state(m, cfg, ckpt_dir, resume_state)
  local value_head = train.value_head
  local C = m.config.hidden_size
  local head
  if ckpt_dir then
    local path = ckpt_dir .. "/value_head.safetensors"
    if not require("clrt.files").exists(path) then
      error(("collabllm_rl: %s has no value_head.safetensors; it was not saved by a train.algorithm=ppo run"):format(ckpt_dir), 0)
    end
    head = value_head.load(path, C)
  else
    head = value_head.new(C, cfg.seed)
  end
  return { head = head, kl_coef = resume_state and resume_state.kl_penalty_coef or cfg.train.kl_penalty_coef }
end

function M.ppo_update(ppo, m, ref, opt, entries, t, lr)
  local rows = train.ppo_value.training_rows(entries)
  if #rows == 0 then return {} end
  local st
  st, ppo.kl_coef = train.ppo_value.update(m, ref, ppo.head, opt, rows, t, lr, ppo.kl_coef)
  return st
end

-- PPO's figures on the step's row (value/*, returns, the KL penalty's coefficient).
function M.ppo_row(row, st)
  row["value/loss"], row["value/clipfrac"] = st.value_loss, st.vf_clipfrac
  row["value/explained_variance"], row["value/mean"], row["value/vpred_mean"] = st.explained_variance, st.values_mean, st.vpred_mean
  row["returns/mean"], row["returns/var"] = st.returns_mean, st.returns_var
  row.kl_penalty_coef, row.non_score_reward = st.kl_coef, st.non_score_reward
  return row
end

-- The command line -> a config: with no model= (and no config=) the built-in world's file
-- is loaded under the overrides.
function M.parse_args(argv)
  if config.arg_value(argv, "resume") then
    return run.resume_config(M.defaults, argv, M.FIXED_ON_RESUME, "collabllm_rl")
  end
  local world = not config.arg_value(argv, "model") and not config.arg_value(argv, "config")
  return config.parse(M.defaults, argv, world and config.read_file(M.world_config_path()) or nil)
end

local argv = { ... }
if argv[1] == "recipes.collabllm_rl" then return M end
run.main("collabllm_rl", "recipes/collabllm_rl.lua", argv, M.parse_args, M.main)
