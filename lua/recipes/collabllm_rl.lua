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
-- The defaults (clrt.train.defaults, shared with the DPO and eval recipes, and the train table
-- below) are the verl recipe's for a real model (recipe/collabllm/
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
local defaults = require("clrt.train.defaults")
local reward, rollout, prompts = train.reward, train.rollout, train.prompts
local WHO = "collabllm_rl"
local SCRIPT = "recipes/collabllm_rl.lua"
local M = {}

-- The shared settings (clrt.train.defaults: the run, simulator, judges, reward, rollout,
-- evaluation, budget, warm start) and this recipe's training table.
M.defaults = defaults.shared()
M.defaults.name = "collabllm_rl"
-- "int8": rollouts sample from int8 copies of the policy's weights, made again after every
-- optimizer step (docs/quantization.md); the update then weights each token by truncated
-- importance sampling, min(pi_train / pi_rollout, train.tis_cap), and logs the mismatch
M.defaults.rollout.quant = "none"
M.defaults.train = { lr = 1e-6, decay = "constant", min_lr_ratio = 0.0, warmup_steps = 0, -- verl actor.optim
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
  whiten_size = 0,                        -- advantages whitened over groups of this many responses (0: the whole step)
  kl_penalty_coef = 0.2, kl_target = 6, kl_horizon = 10000, -- TRL init_kl_coef, target, horizon (adap_kl_ctrl; kl_target=0: fixed)
  base_dtype = "f32",                     -- bf16 (LoRA only): the frozen base in bf16, shared with the reference
  precision = "f32",                      -- bf16: mixed precision as autocast(bfloat16), on the CPU's matrix unit (docs/runtime.md)
  lora = require("clrt.train.lora").config(),     -- r > 0: train LoRA adapters; the reference is the base
  -- asynchronous RL (clrt.train.async, docs/training.md): step s's rollouts sample from the
  -- weights after update s - 1 - K, made by a rollout worker while the steps before train
  async = require("clrt.train.async").config() }

-- preset=verl (default): the defaults above, verl's recipe. preset=authors: the authors' PPO
-- (Wuyxin/collabllm scripts/train/ppo.py, TRL <= 0.10.1) laid over them, each value with its
-- source there; any key on the command line still wins.
M.defaults.preset = "verl"
local A = defaults.authors_clients()
M.PRESETS = {
  verl = {},
  authors = {
    train = { algorithm = "ppo",              -- ppo.py: TRL's PPOTrainer with a value head
      grad_clip = 0,                          -- PPOConfig max_grad_norm default None: no clipping (ppo.py sets none)
      whiten_size = 1 },                      -- --batch_size 1 (example): TRL whitens the advantages over its batch
    rollout = { n = 1,                        -- generation_kwargs n 1: one response per prompt
      temperature = 0.6,                      -- --assistant_generation_kwargs temperature 0.6 (first and later turns)
      max_new_tokens = 256,                   -- --assistant_generation_kwargs max_tokens 256
      top_k = 50, future_top_k = 0 },         -- generation_kwargs top_k 50 for the response; the futures
                                              -- (collabllm/simulation.py, the same kwargs) none
    sim_cfg = A.sim_cfg, judge = A.judge,     -- user max_tokens 1024, judge claude-3-5-sonnet-latest (defaults.authors_clients)
  },
}

-- The defaults of a preset ("verl" | "authors").
function M.defaults_for(preset)
  local p = M.PRESETS[preset]
  if not p then error(("collabllm_rl: preset must be 'verl' or 'authors', got '%s'"):format(tostring(preset)), 0) end
  local d = defaults.lay(defaults.copy(M.defaults), p)
  d.preset = preset
  return d
end

-- The built-in world (examples/collab_world, on the module path) and its settings file.
local function the_world() return require("collab_world.world") end
function M.world_config_path() return the_world().config_path() end

M.rules = defaults.rules()
for _, r in ipairs(defaults.optim_rules()) do M.rules[#M.rules + 1] = r end
for _, r in ipairs({
  { "rollout.quant", "one_of", { "none", "int8" } }, { "train.tis_cap", "rate" },
  { "train.mini_batches", "count" }, { "train.micro_batch_size", "count" }, { "train.clip", "rate" },
  { "train.kl_coef", "nonneg" },
  { "train.algorithm", "one_of", { "grpo", "ppo" } }, { "train.gamma", "prob" }, { "train.lam", "prob" },
  { "train.vf_coef", "nonneg" }, { "train.cliprange_value", "rate" }, { "train.kl_penalty_coef", "nonneg" },
  { "train.kl_target", "nonneg" }, { "train.kl_horizon", "count" }, { "train.ppo_epochs", "count" },
  { "train.whiten_size", "count0" }, { "preset", "one_of", { "verl", "authors" } },
}) do M.rules[#M.rules + 1] = r end
for _, r in ipairs(require("clrt.train.async").rules) do M.rules[#M.rules + 1] = r end

-- Every value against its declared kind, before anything loads: one line per bad key.
function M.check_config(cfg) defaults.check(cfg, M.rules, WHO) end

-- Settings a resumed run may not change: they define what the run's steps mean.
M.FIXED_ON_RESUME = { "model", "adapter", "seed", "data", "prompts_per_step", "rollout.n", "single_turn", "sft", "sft_cache",
  "train.lora.r", "train.lora.alpha", "train.lora.targets", "train.base_dtype", "train.algorithm", "preset",
  "train.async.max_off_policy_steps" }

function M.main(cfg)
  M.check_config(cfg)
  if cfg.estimate then return require("clrt.train.estimate").run(cfg, "rl", { world = the_world() }) end
  if not cfg.resume then require("clrt.model_path").apply(cfg, WHO) end
  local run_dir = cfg.resume or run.new_dir(cfg, "collabllm_rl")
  if cfg.resume and cfg.run_dir ~= cfg.resume then
    error("collabllm_rl: resume= needs the run's config: pass the command line through parse_args", 0)
  end
  cfg.run_dir = run_dir
  return run.guard("collabllm_rl", SCRIPT, run_dir, function() return M.run(cfg, run_dir) end)
end

-- The metrics' names, sorted: the same progress line and plot order for the same run (the
-- weights table's own order changes between runs).
function M.metric_names(weights)
  local names = {}
  for name in pairs(weights) do names[#names + 1] = name end
  table.sort(names)
  return names
end

function M.run(cfg, run_dir)
  local world = the_world()
  -- resume=: the latest complete checkpoint; none yet (stopped during the first steps):
  -- the run starts again from step 1 in its own folder
  local ckpt_dir, resume_state
  if cfg.resume then
    ckpt_dir, resume_state = train.checkpoint.find(run_dir)
    resume_state = resume_state or { step = 0 }
  end
  local start_dir = cfg.model or train.warm_start.ensure(cfg, world, require("recipes.collabllm_sft"), WHO)
  local tok = clrt.tokenizer.load(start_dir)
  local m = train.lora.policy(start_dir, ckpt_dir, cfg.train.lora, cfg.seed, cfg.adapter, cfg.train.base_dtype)
  if cfg.device ~= "cpu" then m:to(cfg.device) end
  m:set_batch_invariant(cfg.rollout.batch_invariant)
  require("clrt.gen.prefix_cache").configure(m, { mb = cfg.rollout.prefix_cache_mb })
  train.lora.set_precision(m, cfg.train.precision, "collabllm_rl")
  clrt.model.profile_enable(true)   -- the update's time in products and outside them, per step
  -- prompts without room for a response are left out before anything trains on them
  local dataset, val_set, notes = prompts.load_sets(m, tok, cfg, WHO)
  local weights = cfg.reward.metric_weights
  local metrics = reward.load_metrics(weights, cfg.reward.metric_options)
  -- a dataset's code rows need their modules in the sandbox (pass_rate.check_samples), before the
  -- step count is taken from the rows kept; the world's generated prompts have no code tasks
  if dataset then dataset = reward.check_samples(metrics, dataset, cfg.reward.metric_options, function(s) notes[#notes + 1] = s end) end
  if not cfg.steps then
    if not dataset then error("collabllm_rl: steps= is required without data=", 0) end
    cfg.steps = cfg.epochs * math.ceil(#dataset / cfg.prompts_per_step)
  end
  local plot = { "reward", "first_reply_ask_rate", "kl", "grad_norm" }
  local names = M.metric_names(weights)
  for _, name in ipairs(names) do plot[#plot + 1] = "metric/" .. name end
  local lg = clrt.log.run({ dir = run_dir, config = cfg, total_steps = cfg.steps, plot = plot,
    sample_every = cfg.sample_every, resume_step = resume_state and resume_state.step or nil,
    progress_keys = { "reward", "metric/" .. names[1], "kl", "tokens_per_s" } })
  for _, n in ipairs(notes) do lg:print(n) end
  local ref = train.lora.reference(m, start_dir)
  if cfg.device ~= "cpu" and getmetatable(ref) == getmetatable(m) then ref:to(cfg.device) end
  train.lora.set_precision(ref, cfg.train.precision, "collabllm_rl")
  local opt = clrt.optim.adamw(m, { lr = cfg.train.lr, weight_decay = cfg.train.weight_decay, grad_clip = cfg.train.grad_clip })
  if ckpt_dir then opt:load(ckpt_dir .. "/optimizer.safetensors") end
  local ppo = cfg.train.algorithm == "ppo" and M.ppo_state(m, cfg, ckpt_dir, resume_state) or nil

  local ctx, user = train.context{ config = cfg, tokenizer = tok, who = WHO }
  train.endpoints.check(ctx, metrics, cfg, WHO)   -- the simulator's and judges' endpoints, before any rollout
  local ev = train.evals.new{ run_dir = run_dir, cfg = cfg, model = m, tokenizer = tok, world = world, user = user,
    ctx = ctx, metrics = metrics, val_set = val_set, can_eval = not dataset and cfg.sim == "scripted", log = lg,
    resume_state = resume_state }
  ev:before()

  local first_step = resume_state and resume_state.step + 1 or 1
  local last_step = math.min(cfg.steps, cfg.stop_after or cfg.steps)
  local failed_steps = resume_state and resume_state.failed_steps or 0
  local ran, failed_here, last_failure = 0, 0, nil   -- this invocation's steps
  local budget = require("clrt.train.budget")
  budget.check_start(cfg, ctx, SCRIPT, run_dir, "collabllm_rl")
  -- train.async.max_off_policy_steps > 0: a rollout worker makes the steps' entries ahead
  local async = train.async.start{ cfg = cfg, run_dir = run_dir, model = m, start_dir = start_dir, first = first_step,
    last = last_step, script = M.script_path(), who = WHO, ctx = ctx }
  local ok, err = pcall(function()
    for step = first_step, last_step do
      clrt.check_interrupt()
      local t0 = clrt.log.now()
      local samples = prompts.step_prompts(cfg, world, dataset, step)
      -- rollout.quant=int8: int8 copies of the current weights for the rollouts only
      -- (evaluations and the update read the f32 ones)
      local entries, timing
      if async then entries, timing = async:entries(step, samples, ctx)
      else
        if cfg.rollout.quant == "int8" then m:set_quant("int8") end
        entries, timing = rollout.step(m, tok, cfg, samples, ctx, user, metrics, step)
        if cfg.rollout.quant == "int8" then m:set_quant("none") end
      end
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
      local t1, p1 = clrt.log.now(), clrt.model.product_seconds()
      local lr = train.schedule.lr(step - 1, { lr = cfg.train.lr, decay = cfg.train.decay,
        min_lr_ratio = cfg.train.min_lr_ratio, warmup_steps = cfg.train.warmup_steps, total_steps = cfg.steps })
      local st
      if ppo then st = M.ppo_update(ppo, m, ref, opt, entries, cfg.train, lr)
      else
        local rows = train.ppo.training_rows(entries, cfg.train.async.correction)
        st = #rows > 0 and train.ppo.update(m, ref, opt, rows, cfg.train, lr) or {}
      end
      local t2 = clrt.log.now()
      if async then async:trained(step, m) end   -- the version a later step samples from
      timing.update_products_s = clrt.model.product_seconds() - p1
      local row = train.report.step_row(entries, R, astats, st, lr, timing, t0, t1, t2, ctx)
      if ppo then M.ppo_row(row, st) end
      if async then train.async.row(row, entries, step, timing) end
      -- a failed step (more than max_drop_fraction of its samples dropped, or a metric failed
      -- on every conversation) is marked, printed and counted; max_failed_steps stop the run
      local f = train.failure.assess(cfg, entries, R)
      lg:log(step, train.failure.mark(row, f))
      ran = ran + 1
      if f.failed then
        failed_here, last_failure = failed_here + 1, f
        failed_steps = failed_steps + 1
        lg:print(train.failure.line(step, f, failed_steps, cfg.max_failed_steps))
        if failed_steps >= cfg.max_failed_steps then error(train.failure.stop_message(WHO, step, f, failed_steps), 0) end
      end
      if lg:sample_due(step, last_step) then
        lg:samples(step, train.report.sample_items(entries, cfg.rollout.n))
        train.rollouts_log.write(lg, step, entries, row)   -- the whole step's tree (clrt view)
      end
      ev:at_step(step)
      local over = budget.check_step(cfg, ctx)   -- past budget.max_usd with one more step: stop here, resumable
      if over or (cfg.save_every > 0 and (step % cfg.save_every == 0 or step == last_step)) then
        train.checkpoint.save(run_dir, { step = step, keep = cfg.save_keep, model = m, tokenizer_dir = start_dir,
          optimizer = opt, base = start_dir,
          value_head = ppo and ppo.head, state = { failed_steps = failed_steps, kl_penalty_coef = ppo and ppo.kl_coef } })
        if async then async:checkpointed(step) end
      end
      if over then
        if async then async:stop(false, lg, true) end   -- what it made ahead stays for the resume
        budget.stop(over, cfg, ctx, SCRIPT, run_dir, "collabllm_rl", lg, ev)
      end
    end
  end)
  if async then async:stop(ok and last_step == cfg.steps, ok and nil or lg, ok) end
  if not ok then error(err, 0) end

  local none = train.failure.none_succeeded(WHO, ran, failed_here, last_failure)
  if none then lg:print(none); lg:close(); error(none, 0) end
  ev:after(last_step)
  lg:close()
  ev:finish()
  run.print_end(SCRIPT, run_dir, last_step, cfg.steps)
  return run_dir, ev.summary
end

-- train.algorithm=ppo: the value head (a checkpoint's on resume, else new from the seed)
-- and the KL penalty's coefficient (the checkpoint's, else train.kl_penalty_coef).
function M.ppo_state(m, cfg, ckpt_dir, resume_state)
  if require("clrt.dist").world_size() > 1 then
    error(WHO .. ": train.algorithm=ppo runs on one rank (its value head is not shared across ranks); run without mpirun", 0)
  end
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
  local rows = train.ppo_value.training_rows(entries, t.async.correction)
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
  local over = world and config.read_file(M.world_config_path()) or nil
  local cfg = config.parse(M.defaults, argv, over)
  if cfg.preset ~= "verl" then cfg = config.parse(M.defaults_for(cfg.preset), argv, over) end
  return cfg
end

-- This file's path, for train.async's worker (the same recipe in a process of its own).
function M.script_path()
  return debug.getinfo(1, "S").source:sub(2)
end

-- train.async's rollout worker (async_worker=DIR: its rank's folder under RUN/async; started by the run itself).
function M.async_worker(dir) train.async.recipe_worker(dir, WHO, the_world) end

local argv = { ... }
if argv[1] == "recipes.collabllm_rl" then return M end
local worker_dir = config.arg_value(argv, "async_worker")
if worker_dir then return M.async_worker(worker_dir) end
run.main("collabllm_rl", "recipes/collabllm_rl.lua", argv, M.parse_args, M.main)
