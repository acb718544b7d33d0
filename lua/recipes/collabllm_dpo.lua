-- collabllm_dpo.lua — CollabLLM with DPO (docs/method.md, "Algorithms"):
-- the multiturn-aware reward (MR) ranks candidate responses, and the policy learns to prefer
-- the best over the worst with the sigmoid DPO loss against a frozen reference (the start).
--
-- offline (default): pairs from process_dataset.lua's dpo_train.jsonl (one row per
--   (conversation, turn): prompt, chosen = the best-scored completion, rejected = the worst,
--   kept when the gap is at least its min_gap), in a seeded order per epoch.
--     clrt recipes/collabllm_dpo.lua model=HF_DIR data=dpo_train.jsonl data_val=dpo_test.jsonl
-- online=true: every step samples rollout.n responses per prompt from the current policy
--   and scores each with the MR exactly as collabllm_rl.lua does (clrt.train.rollout.step
--   and clrt.train.reward, the same futures, simulator and judges); each prompt's best and
--   worst response form a pair when their gap is at least min_gap.
--     clrt recipes/collabllm_dpo.lua online=true model=HF_DIR data=rl_train.jsonl \
--          sim_cfg.base_url=... judge.base_url=...
--
-- With no model= (or with world=true) the run uses the built-in world (examples/collab_world/
-- config.lua under examples/collab_world/config_dpo.lua): its SFT start (or model=), and for offline DPO pairs made in
-- the world, since it has no published data set: the start samples rollout.n candidates for
-- each of pairs_prompts training prompts, the MR scores them (futures with the scripted
-- user), and the best/worst pair of each prompt is kept (RUN_DIR/pairs.jsonl, in
-- process_dataset's DPO schema). The same pass writes RUN_DIR/scored.jsonl, every scored
-- conversation (the schema collabllm_sft.lua's scored= reads: MR-selected SFT).
-- Presets: preset=authors (default) takes the authors' DPO scripts' settings (offline:
-- min_gap 0.02, lr 5e-6 cosine, 8 epochs, 64 pairs a step, LoRA r 32 / alpha 16, pairs cut to
-- 2048 tokens keeping the end; online: 2 responses at temperature 0.6 and top-k 50, 1024
-- tokens a turn, the better mean MR chosen with no gap filter, MR = mean over futures of
-- accuracy + interactivity (the authors' rubric) - 0.5 tokens_read, the user at 1024 tokens,
-- the judge claude-3-5-sonnet-latest, lr 5e-6 cosine, 1 epoch, 32 prompts a step, LoRA r 32 /
-- alpha 16; each value's source is beside it in M.PRESETS); preset=verl keeps
-- the RL recipe's verl-style settings (8 responses, best vs worst with min_gap 0.1,
-- temperature 1.0, lr 1e-6 constant, 3 epochs, 16 pairs, full fine-tuning). Any key on the
-- command line still wins. process_dataset.lua's own min_gap (0.1, the authors' notebook)
-- filters the pairs file first: for the offline script's 0.02, build it with min_gap=0.02.
-- Every other setting (rollout, reward, sim_cfg, judge, eval, chat) is the one the RL recipe
-- has too: clrt.train.defaults, which both take.
-- The run folder is the RL recipe's: config.json, metrics.jsonl (+ TensorBoard, plot.svg),
-- checkpoint-<step>/ + latest, summary.json; resume=RUN_DIR continues bit for bit.
local config = require("clrt.config")
local files = require("clrt.files")
local train = require("clrt.train")
local defaults = require("clrt.train.defaults")
local reward, rollout, prompts, dpo = train.reward, train.rollout, train.prompts, train.dpo
local WHO = "collabllm_dpo"
local M = {}

-- The built-in world (examples/collab_world, on the module path).
local function the_world() return require("collab_world.world") end

local copy, lay = defaults.copy, defaults.lay

-- The base: the shared defaults (clrt.train.defaults: verl's recipe) with TRL's DPOConfig
-- defaults (beta 0.1, sigmoid loss, no label smoothing) at verl's lr for 7B. This is
-- preset=verl; the default preset=authors lays the authors' settings over it (M.PRESETS below).
local base = defaults.shared()
local D = base
D.name = "collabllm_dpo"
D.preset = "authors"          -- "authors": the authors' scripts' settings (M.PRESETS); "verl": verl-style, as below
D.online = false              -- false: pairs from data= (or the world's); true: sampled each step
D.world = false               -- true: the built-in world's settings even with model= (a start of your own)
-- offline: process_dataset's DPO pairs (dpo_train.jsonl); online: its RL prompts (rl_train.jsonl)
D.data = config.optional("string")
-- offline: DPO pairs for the validation loss (dpo_test.jsonl); online: RL prompts
-- (rl_test.jsonl) for validation conversations, as in collabllm_rl.lua
D.data_val = config.optional("string")
D.min_gap = 0.1               -- the authors' notebook's minimum_gap
D.pairs_prompts = 256         -- built-in world, offline: prompts whose candidates make the pairs
D.epochs = 3                  -- offline: over the pairs; online: over data= prompts (TRL num_train_epochs)
D.prompts_per_step = 16       -- online: prompts per step (verl data.train_batch_size)
D.train = { lr = 1e-6, decay = "constant", min_lr_ratio = 0.0, warmup_steps = 0, weight_decay = 0.01,
  grad_clip = 1.0, beta = 0.1, label_smoothing = 0.0,
  batch_size = 16,            -- offline: pairs per optimizer step
  -- offline: a pair's rows longer than max_length tokens (prompt + reply) are cut, keeping
  -- the end ("keep_end") or the start ("keep_start"); 0: no cut (rows over the context are
  -- left out, counted)
  max_length = 0, truncation = "keep_end",
  micro_batch_size = 2,       -- pairs per forward/backward (the gradients accumulate)
  base_dtype = "f32",                            -- bf16 (LoRA only): the frozen base in bf16, shared with the reference
  precision = "f32",                             -- bf16: mixed precision as autocast(bfloat16), on the CPU's matrix unit (docs/runtime.md)
  lora = require("clrt.train.lora").config(),    -- r > 0: train LoRA adapters; the reference is the start, adapters off
  -- online: step s's responses sampled from the weights after update s - 1 - K by a rollout
  -- worker while the steps before train (clrt.train.async; DPO trains no ratio, so the
  -- correction is unused; each step logs the version its pairs came from)
  async = require("clrt.train.async").config() }
D.eval.every = 10

-- preset=authors: Wuyxin/collabllm's scripts, each value with its source there. Both their
-- DPO scripts run TRL with beta 0.1, loss "sigmoid", max_grad_norm 1.0, adamw_torch,
-- lr_scheduler_type "cosine" (to 0: min_lr_ratio 0), warmup_ratio 0 and Hugging Face's
-- weight_decay 0 — the base's beta, loss and grad_clip already agree. Their LoRA: peft_r 32,
-- peft_alpha 16, no lora_dropout given (PEFT's 0), target_modules q,k,v,o,gate,up,down
-- (the base's targets); their LoRA init "gaussian" is not clrt's (PEFT's default init).
local A = defaults.authors_clients()
M.PRESETS = {
  authors = {
    offline = {                                -- scripts/train/offline_dpo.py
      min_gap = 0.02,                          -- --minimum_gap default 0.02 (to_dpo_dataset)
      epochs = 8,                              -- --num_train_epochs 8 (both example commands)
      train = { lr = 5e-6,                     -- --learning_rate 5e-6 (example commands)
        decay = "cosine", min_lr_ratio = 0.0, warmup_steps = 0, weight_decay = 0.0,   -- DPOConfig
        batch_size = 64,                       -- 4 GPUs x per_device_train_batch_size 4 x gradient_accumulation_steps 4
        max_length = 2048,                     -- DPOConfig(max_length=args.max_new_tokens), --max_new_tokens default 2048
        truncation = "keep_end",               -- TRL 0.18.1 (requirements.txt) DPOConfig truncation_mode default
        lora = { r = 32, alpha = 16, dropout = 0.0 } },   -- --peft_r 32, --peft_alpha 16, --use_lora
    },
    online = {                                 -- scripts/train/online_dpo.py
      min_gap = 0.0,                           -- MultiturnRewardJudge: argmax of the two mean MRs, no gap filter
      epochs = 1,                              -- --num_train_epochs 1 (example command)
      prompts_per_step = 32,                   -- 8 GPUs x per_device_train_batch_size 1 x gradient_accumulation_steps 4
      rollout = { n = 2,                       -- _generate_vllm: n = 2 completions per prompt
        temperature = 0.6, top_p = 1.0,        -- --assistant_generation_kwargs temperature 0.6; _generate_vllm top_p 1.0
        top_k = 50, future_top_k = 0,          -- _generate_vllm top_k 50 for the first responses; the futures
                                               -- (collabllm/simulation.py, the same kwargs) none
        max_new_tokens = 1024 },               -- collabllm/simulation.py: vLLM max_tokens default 1024 (the kwargs set none)
      sim_cfg = A.sim_cfg, judge = A.judge,    -- user max_tokens 1024, judge claude-3-5-sonnet-latest (defaults.authors_clients)
      -- futures: --num_samples 3, --max_new_turns 4 (U A U A after A1) = the base's
      -- num_repeat_rollouts 3, max_user_turns 2, max_assistant_turns 2
      reward = { metric_weights = config.map({ accuracy = 1, interactivity = 1, tokens_read = -0.5 }),  -- --metric_names/--metric_weights
        mode = "mean",                         -- multiturn_aware_reward: MR = sum w*s per session, np.mean over sessions
        -- examples/metrics/interactivity.py: one score, 1 / 0.5 / 0 (lua/prompts/judge_interactivity_authors.txt)
        metric_options = config.map({ interactivity = { rubric = "authors" } }) },
      train = { lr = 5e-6,                     -- --learning_rate 5e-6 (example command)
        decay = "cosine", min_lr_ratio = 0.0, warmup_steps = 0, weight_decay = 0.0,   -- OnlineDPOConfig
        lora = { r = 32, alpha = 16, dropout = 0.0 } },   -- --use_lora with peft_r 32, peft_alpha 16
    },
  },
  verl = { offline = {}, online = {} },        -- the base as it stands
}

-- The defaults of a preset ("authors" | "verl") for offline or online DPO.
function M.defaults_for(preset, online)
  local p = M.PRESETS[preset]
  if not p then error(("collabllm_dpo: preset must be 'authors' or 'verl', got '%s'"):format(tostring(preset)), 0) end
  local d = lay(copy(base), p[online and "online" or "offline"])
  d.preset, d.online = preset, online and true or false
  return d
end

M.defaults = M.defaults_for("authors", false)

M.rules = { { "preset", "one_of", { "authors", "verl" } }, { "min_gap", "nonneg" }, { "pairs_prompts", "count" },
  { "train.beta", "rate" }, { "train.label_smoothing", "prob" }, { "train.batch_size", "count" },
  { "train.micro_batch_size", "count" }, { "train.max_length", "count0" },
  { "train.truncation", "one_of", { "keep_end", "keep_start" } } }
for _, r in ipairs(require("clrt.train.lora").rules) do M.rules[#M.rules + 1] = r end
for _, r in ipairs(require("clrt.train.async").rules) do M.rules[#M.rules + 1] = r end
for _, r in ipairs(defaults.rules()) do M.rules[#M.rules + 1] = r end
for _, r in ipairs(defaults.optim_rules()) do M.rules[#M.rules + 1] = r end

function M.check_config(cfg)
  if type(cfg.online) ~= "boolean" then error("collabllm_dpo: online must be true or false", 0) end
  defaults.check(cfg, M.rules, WHO)   -- the shared keys (rollout, reward, sim_cfg, judge) and this recipe's
  if cfg.train.label_smoothing >= 0.5 then
    error("collabllm_dpo: train.label_smoothing must be below 0.5, got " .. cfg.train.label_smoothing, 0)
  end
  if not cfg.online and cfg.train.async.max_off_policy_steps > 0 then
    error("collabllm_dpo: train.async.max_off_policy_steps samples ahead, which only online=true does (offline pairs are fixed)", 0)
  end
end

M.FIXED_ON_RESUME = { "model", "seed", "data", "online", "preset", "prompts_per_step", "rollout.n", "single_turn", "sft",
  "sft_cache", "min_gap", "pairs_prompts", "train.batch_size", "train.lora.r", "train.lora.alpha", "train.lora.targets", "train.base_dtype",
  "train.async.max_off_policy_steps" }

-- The built-in world's settings: the RL world file (less its RL-only train table) under
-- examples/collab_world/config_dpo.lua.
function M.world_config()
  local world = the_world()
  local base = config.read_file(world.config_path())
  base.train = nil
  local over = config.read_file(world.config_path("config_dpo"))
  local function merge(dst, src)
    for k, v in pairs(src) do
      if type(v) == "table" and type(dst[k]) == "table" and #v == 0 and next(v) ~= nil then merge(dst[k], v)
      else dst[k] = v end
    end
  end
  merge(base, over)
  return base
end

-- process_dataset's DPO rows, checked up front (file and line in the error), those below
-- min_gap left out when they carry scores. Returns the rows and how many were left out.
function M.read_pairs(path, min_gap)
  local rows, line_of = require("clrt.data").read_dataset(path)
  local out, below = {}, 0
  for i, r in ipairs(rows) do
    local where = ("collabllm_dpo: %s:%d: "):format(path, line_of[i])
    if type(r) ~= "table" or type(r.prompt) ~= "table" or #r.prompt == 0 then error(where .. "a row needs a \"prompt\" list of messages", 0) end
    for j, msg in ipairs(r.prompt) do
      if type(msg) ~= "table" or type(msg.role) ~= "string" or type(msg.content) ~= "string" then
        error(where .. ("prompt message %d needs a \"role\" and a \"content\" string"):format(j), 0)
      end
    end
    if type(r.chosen) ~= "string" or type(r.rejected) ~= "string" then error(where .. "\"chosen\" and \"rejected\" must be strings", 0) end
    local gap = (type(r.score_chosen) == "number" and type(r.score_rejected) == "number") and r.score_chosen - r.score_rejected
    if gap and gap < min_gap then below = below + 1 else out[#out + 1] = r end
  end
  return out, below
end

-- Token pairs of DPO rows (pairs whose rendering leaves no reply are counted, not kept).
local function encode_pairs(tok, cfg, rows, m)
  local ropts = { enable_thinking = cfg.chat.enable_thinking }
  local limit = train.policy.context_len(m, cfg.rollout)
  local out, skipped = {}, 0
  for _, r in ipairs(rows) do
    local p = dpo.encode_pair(tok, r, ropts, { max_length = cfg.train.max_length, truncation = cfg.train.truncation })
    if p and #p.chosen.ids <= limit and #p.rejected.ids <= limit then out[#out + 1] = p else skipped = skipped + 1 end
  end
  return out, skipped
end

-- The world's offline pairs and scored conversations, made once per run folder by the start
-- policy: pairs_prompts prompts in groups of prompts_per_step (the RL steps' prompts and
-- seeds), each with rollout.n candidates scored by the MR. Returns the pairs rows.
function M.world_pairs(m, tok, cfg, world, ctx, user, metrics, run_dir)
  local pairs_path, scored_path = run_dir .. "/pairs.jsonl", run_dir .. "/scored.jsonl"
  local data = require("clrt.data")
  if files.exists(pairs_path) and files.exists(scored_path) then return data.read_jsonl(pairs_path) end
  local rows, scored = {}, {}
  local batches = math.ceil(cfg.pairs_prompts / cfg.prompts_per_step)
  for k = 1, batches do
    clrt.check_interrupt()
    local samples = prompts.step_prompts(cfg, world, nil, k)
    local entries = rollout.step(m, tok, cfg, samples, ctx, user, metrics, k)
    local R = reward.batch_rewards(entries, cfg.reward.metric_weights, cfg.reward.mode)
    for i, e in ipairs(entries) do
      if R.rewards[i] ~= nil then
        local conv = e.convs[1] or rollout.copy_conv(e.sample.prompt, e.message)
        scored[#scored + 1] = { messages = conv, score = R.rewards[i], group = ("%d-%d"):format(k, e.group) }
      end
    end
    for _, sel in ipairs(dpo.select(entries, R.rewards, cfg.min_gap)) do
      rows[#rows + 1] = { prompt = sel.chosen.sample.prompt, chosen = sel.chosen.message.content,
        rejected = sel.rejected.message.content, score_chosen = sel.score_chosen, score_rejected = sel.score_rejected,
        conv_id = ("%d-%d"):format(k, sel.group), turn_id = 0 }
    end
  end
  data.write_jsonl(scored_path, scored)
  data.write_jsonl(pairs_path, rows)
  return rows
end

function M.main(cfg)
  M.check_config(cfg)
  if cfg.estimate then return require("clrt.train.estimate").run(cfg, "dpo", { world = the_world() }) end
  if not cfg.resume then require("clrt.model_path").apply(cfg, "collabllm_dpo") end
  local run = require("clrt.run")
  local run_dir = cfg.resume or run.new_dir(cfg, "collabllm_dpo")
  cfg.run_dir = run_dir
  return run.guard("collabllm_dpo", "recipes/collabllm_dpo.lua", run_dir, function() return M.run(cfg, run_dir) end)
end

function M.run(cfg, run_dir)
  local json = require("clrt.json")
  local world = the_world()
  local ckpt_dir, resume_state
  if cfg.resume then
    ckpt_dir, resume_state = train.checkpoint.find(run_dir)
    resume_state = resume_state or { step = 0 }
  end
  files.mkdir_p(run_dir)
  local start_dir = cfg.model or train.warm_start.ensure(cfg, world, require("recipes.collabllm_sft"), WHO)
  local tok = clrt.tokenizer.load(start_dir)
  local m = train.lora.policy(start_dir, ckpt_dir, cfg.train.lora, cfg.seed, cfg.adapter, cfg.train.base_dtype)
  train.lora.set_precision(m, cfg.train.precision, "collabllm_dpo")
  local ref = train.lora.reference(m, start_dir)   -- the frozen reference (with LoRA: the base, adapters off)
  train.lora.set_precision(ref, cfg.train.precision, "collabllm_dpo")
  local ctx, user = train.context{ config = cfg, tokenizer = tok, who = WHO }
  local weights = cfg.reward.metric_weights
  local metrics = reward.load_metrics(weights, cfg.reward.metric_options)
  if cfg.online then train.endpoints.check(ctx, metrics, cfg, WHO) end   -- the API the rollouts call
  local t = cfg.train
  local notes = {}

  -- the data: offline pairs (encoded, in a seeded order per epoch) or online prompts
  local offline_pairs, val_pairs, dataset, val_set
  if not cfg.online then
    local rows
    if cfg.data then
      local below
      rows, below = M.read_pairs(cfg.data, cfg.min_gap)
      notes[#notes + 1] = ("%s: %d pairs, %d below min_gap=%g left out"):format(cfg.data, #rows, below, cfg.min_gap)
    else
      -- the start model samples them: the same model as the reference, before any step
      -- (resumed: the start is the reference; under LoRA, the policy with its adapters off)
      local sampler = ckpt_dir and (m.lora and m or ref) or m
      if ckpt_dir and m.lora then m:set_adapters(false) end
      rows = M.world_pairs(sampler, tok, cfg, world, ctx, user, metrics, run_dir)
      if m.lora then m:set_adapters(true) end
      notes[#notes + 1] = ("built-in world: %d pairs from %d prompts (pairs.jsonl, scored.jsonl)"):format(#rows, cfg.pairs_prompts)
    end
    local skipped
    offline_pairs, skipped = encode_pairs(tok, cfg, rows, m)
    if skipped > 0 then notes[#notes + 1] = ("%d pairs longer than the context left out"):format(skipped) end
    if #offline_pairs == 0 then error("collabllm_dpo: no training pair (none in the data, or none above min_gap)", 0) end
    -- the reference's sums of every pair, once, in file order: the same numbers however the
    -- steps group the pairs and whether the run was resumed
    dpo.attach_ref(ref, offline_pairs, t.micro_batch_size)
    if cfg.data_val then
      val_pairs = encode_pairs(tok, cfg, (M.read_pairs(cfg.data_val, cfg.min_gap)), m)
      dpo.attach_ref(ref, val_pairs, t.micro_batch_size)
    end
    cfg.steps = cfg.steps or cfg.epochs * math.ceil(#offline_pairs / t.batch_size)
  else
    local set_notes
    dataset, val_set, set_notes = prompts.load_sets(m, tok, cfg, WHO)
    for _, n in ipairs(set_notes) do notes[#notes + 1] = n end
    if not cfg.steps then
      if not dataset then error("collabllm_dpo: steps= is required for online DPO without data=", 0) end
      cfg.steps = cfg.epochs * math.ceil(#dataset / cfg.prompts_per_step)
    end
  end

  local plot = cfg.online and { "reward", "first_reply_ask_rate", "loss", "reward_accuracy" }
    or { "loss", "reward_margin", "reward_accuracy", "grad_norm" }
  local lg = clrt.log.run({ dir = run_dir, config = cfg, total_steps = cfg.steps, plot = plot,
    sample_every = cfg.sample_every, resume_step = resume_state and resume_state.step or nil,
    progress_keys = { "loss", "reward_margin", "reward_accuracy", cfg.online and "reward" or "pairs" } })
  for _, n in ipairs(notes) do lg:print(n) end
  local opt = clrt.optim.adamw(m, { lr = t.lr, weight_decay = t.weight_decay, grad_clip = t.grad_clip })
  if ckpt_dir then opt:load(ckpt_dir .. "/optimizer.safetensors") end

  local summary = { config = { seed = cfg.seed, online = cfg.online, steps = cfg.steps, single_turn = cfg.single_turn } }
  local function save_summary()
    files.write_atomic(run_dir .. "/summary.json", require("clrt.json").encode(summary) .. "\n")
  end
  if resume_state and files.exists(run_dir .. "/summary.json") then
    local ok, old = pcall(config.load, run_dir .. "/summary.json")
    if ok and type(old) == "table" then summary.before, summary.val_before = old.before, old.val_before end
  end
  local can_eval = not cfg.data and cfg.sim == "scripted"
  if can_eval and cfg.eval.before and not summary.before then
    summary.before = train.validation.evaluate(m, tok, cfg, world, user, ctx)
    lg:print("before DPO: " .. json.encode(summary.before))
    save_summary()
  end
  local function validate(step, row)
    if val_pairs and #val_pairs > 0 then
      local v = dpo.evaluate(m, val_pairs, t)
      row.val_loss, row.val_reward_accuracy, row.val_reward_margin = v.loss, v.reward_accuracy, v.reward_margin
      return v
    elseif val_set then
      local rep = train.validation.validate(m, tok, cfg, val_set, user, ctx, metrics)
      train.validation.val_row(rep, row)
      return rep
    end
  end

  -- offline: a step's pairs depend only on (seed, step), so a resumed run trains on the same pairs
  local function offline_batch(step)
    return prompts.epoch_batch(offline_pairs, cfg.seed, step, math.min(t.batch_size, #offline_pairs))
  end

  local first_step = resume_state and resume_state.step + 1 or 1
  local last_step = math.min(cfg.steps, cfg.stop_after or cfg.steps)
  local failed_steps = resume_state and resume_state.failed_steps or 0
  local ran, failed_here, last_failure = 0, 0, nil   -- this invocation's steps (online)
  local budget, SCRIPT = require("clrt.train.budget"), "recipes/collabllm_dpo.lua"
  budget.check_start(cfg, ctx, SCRIPT, run_dir, "collabllm_dpo")
  -- online with train.async.max_off_policy_steps > 0: a rollout worker samples the steps ahead
  local async = cfg.online and train.async.start{ cfg = cfg, run_dir = run_dir, model = m, start_dir = start_dir,
    first = first_step, last = last_step, script = M.script_path(), who = WHO, ctx = ctx } or nil
  local ok, err = pcall(function()
  for step = first_step, last_step do
    clrt.check_interrupt()
    local t0 = clrt.log.now()
    local lr = train.schedule.lr(step - 1, { lr = t.lr, decay = t.decay, min_lr_ratio = t.min_lr_ratio,
      warmup_steps = t.warmup_steps, total_steps = cfg.steps })
    local row
    if not cfg.online then
      local batch = offline_batch(step)
      local st = dpo.update(m, opt, batch, t, lr)
      row = { loss = st.loss, reward_chosen = st.reward_chosen, reward_rejected = st.reward_rejected,
        reward_margin = st.reward_margin, reward_accuracy = st.reward_accuracy, logp_chosen = st.logp_chosen,
        logp_rejected = st.logp_rejected, grad_norm = st.grad_norm, pairs = st.pairs, trained_tokens = st.tokens,
        lr = lr, time_step_s = clrt.log.now() - t0 }
    else
      local samples = prompts.step_prompts(cfg, world, dataset, step)
      local entries, timing
      if async then entries, timing = async:entries(step, samples, ctx)
      else entries, timing = rollout.step(m, tok, cfg, samples, ctx, user, metrics, step) end
      local R = reward.batch_rewards(entries, weights, cfg.reward.mode)
      for i, e in ipairs(entries) do e.reward = R.rewards[i] end
      local t1 = clrt.log.now()
      local list, gap = {}, 0
      for _, sel in ipairs(dpo.select(entries, R.rewards, cfg.min_gap)) do
        list[#list + 1] = dpo.entry_pair(sel)
        gap = gap + sel.chosen.reward - sel.rejected.reward   -- the MR each entry earned
      end
      local st = { pairs = 0 }
      if #list > 0 then
        dpo.attach_ref(ref, list, t.micro_batch_size)
        st = dpo.update(m, opt, list, t, lr)
      end
      local t2 = clrt.log.now()
      if async then async:trained(step, m) end   -- the version a later step samples from
      row = require("clrt.train.report").step_row(entries, R, {}, st, lr, timing, t0, t1, t2, ctx)
      if async then train.async.row(row, entries, step, timing) end
      for _, k in ipairs({ "reward_chosen", "reward_rejected", "reward_margin", "reward_accuracy", "pairs" }) do row[k] = st[k] end
      row.pair_score_gap = #list > 0 and gap / #list or nil   -- mean MR of chosen minus rejected
      -- a failed step (simulator or judge down) counts as in collabllm_rl.lua
      local f = train.failure.assess(cfg, entries, R)
      train.failure.mark(row, f)
      ran = ran + 1
      if f.failed then
        failed_here, last_failure = failed_here + 1, f
        failed_steps = failed_steps + 1
        lg:print(train.failure.line(step, f, failed_steps, cfg.max_failed_steps))
        if failed_steps >= cfg.max_failed_steps then
          lg:log(step, row)
          error(train.failure.stop_message(WHO, step, f, failed_steps), 0)
        end
      end
      if lg:sample_due(step, last_step) then
        local items = train.report.sample_items(entries, cfg.rollout.n)
        for _, it in ipairs(items) do it.advantage = nil end   -- DPO has none
        lg:samples(step, items)
        train.rollouts_log.write(lg, step, entries, row)   -- the whole step's tree (clrt view)
      end
    end
    if (val_pairs or val_set) and (step == cfg.steps or (cfg.eval.every > 0 and step % cfg.eval.every == 0)) then
      local v = validate(step, row)
      if step == cfg.steps and cfg.eval.after then summary.val_after = v end
    end
    lg:log(step, row)
    local over = budget.check_step(cfg, ctx)   -- past budget.max_usd with one more step: stop here, resumable
    if over or (cfg.save_every > 0 and (step % cfg.save_every == 0 or step == last_step)) then
      train.checkpoint.save(run_dir, { step = step, keep = cfg.save_keep, model = m, tokenizer_dir = start_dir, optimizer = opt, base = start_dir,
        state = { failed_steps = failed_steps } })
      if async then async:checkpointed(step) end
    end
    if over then
      if async then async:stop(false, lg, true) end   -- what it made ahead stays for the resume; its step in progress billed
      summary.api = ctx.spend.total
      save_summary()
      budget.stop(over, cfg, ctx, SCRIPT, run_dir, "collabllm_dpo", lg)
    end
  end
  end)
  if async then async:stop(ok and last_step == cfg.steps, ok and nil or lg, ok) end
  if not ok then error(err, 0) end

  local none = train.failure.none_succeeded(WHO, ran, failed_here, last_failure)
  if none then lg:print(none); lg:close(); error(none, 0) end
  if can_eval and cfg.eval.after and last_step == cfg.steps then
    summary.after = train.validation.evaluate(m, tok, cfg, world, user, ctx)
    lg:print("after DPO: " .. json.encode(summary.after))
  end
  lg:close()
  local rest = clrt.llm.drain_records()   -- the API spend (clrt.api.usage), the last validation's calls too
  if #rest > 0 then ctx.spend:add(rest, true) end
  if ctx.spend.total.all.calls > 0 then summary.api = ctx.spend.total end
  if summary.before or summary.after or summary.val_after or summary.api then
    save_summary()
    if summary.before or summary.after then require("clrt.train.report").print_summary(summary, cfg, weights) end
  end
  print("run folder: " .. run_dir)
  if last_step < cfg.steps then
    print(("stopped after step %d of %d (stop_after); continue with:\n  %s"):format(last_step, cfg.steps,
      require("clrt.run").resume_command("recipes/collabllm_dpo.lua", run_dir)))
  end
  return run_dir, summary
end

-- The preset's defaults (preset=, online= from the command line or a config= file), then the
-- world's settings when it runs, then the command line.
function M.parse_args(argv)
  if config.arg_value(argv, "resume") then
    return require("clrt.run").resume_config(M.defaults, argv, M.FIXED_ON_RESUME, "collabllm_dpo")
  end
  local world = config.arg_value(argv, "world") == "true"
    or (not config.arg_value(argv, "model") and not config.arg_value(argv, "config"))
  local over = world and M.world_config() or nil
  local cfg = config.parse(M.defaults, argv, over)
  local preset, online = cfg.preset, cfg.online == true
  if preset ~= "authors" or online then
    cfg = config.parse(M.defaults_for(preset, online), argv, over)
  end
  return cfg
end

-- This file's path, for train.async's worker (the same recipe in a process of its own).
function M.script_path()
  return debug.getinfo(1, "S").source:sub(2)
end

-- train.async's rollout worker (async_worker=DIR: its rank's folder under RUN/async; started by the run itself).
function M.async_worker(dir) train.async.recipe_worker(dir, WHO, the_world) end

local argv = { ... }
if argv[1] == "recipes.collabllm_dpo" then return M end
local worker_dir = config.arg_value(argv, "async_worker")
if worker_dir then return M.async_worker(worker_dir) end
require("clrt.run").main("collabllm_dpo", "recipes/collabllm_dpo.lua", argv, M.parse_args, M.main)
