-- clrt.train.defaults — the settings the CollabLLM recipes share, made fresh on each call so
-- no recipe can change another's: the run, the simulated user (sim, sim_cfg), the judges
-- (judge), the reward, the rollout limits, evaluation, the API budget and the built-in
-- world's warm start. Each value says where it comes from (the verl recipe's for a real
-- model: recipe/collabllm/train_rl_collabllm.sh and its interaction config). A recipe adds
-- its own `train` table and rules:
--   local d = defaults.shared(); d.name = "collabllm_rl"; d.train = {...}
--   defaults.check(cfg, rules, "collabllm_rl")   -- rules: defaults.rules() + the recipe's
local config = require("clrt.config")
local M = {}

local OPENAI = "https://api.openai.com/v1"

-- Every shared setting with its default (no `train` table: each recipe has its own).
function M.shared()
  return {
    model = config.optional("string"),        -- the starting policy (and reference): a model, run or checkpoint folder
    adapter = config.optional("string"),      -- a PEFT LoRA folder over model=: the policy trains it, the reference is model=
    data = config.optional("string"),         -- RL JSONL from process_dataset.lua; nil: world prompts
    data_val = config.optional("string"),     -- validation JSONL (process_dataset's rl_test.jsonl)
    out = "runs",
    name = "collabllm",                       -- the run folder's name (each recipe sets its own)
    run_dir = config.optional("string"),
    resume = config.optional("string"),       -- a run folder: continue from its latest checkpoint
    seed = 1,
    device = "cpu",                           -- "cuda": the policy and its reference on the GPU (the world's SFT start is made on the cpu)
    epochs = 20,                              -- verl trainer.total_epochs
    steps = config.optional("number"),        -- optimizer steps; nil: epochs over the data
    stop_after = config.optional("number"),   -- end this run after that step (resume later)
    prompts_per_step = 16,                    -- verl data.train_batch_size
    save_every = 100,                         -- verl trainer.save_freq
    save_keep = 2,                            -- checkpoints kept; an older one goes only once a newer one verifies
    sample_every = 10,                        -- samples + rollouts.jsonl at step 1, every 10th and the last (0: none)
    single_turn = false,                      -- ablation: reward the response alone, no futures
    -- A step fails when more than max_drop_fraction of its first responses are dropped (the
    -- simulator failed) or a metric failed on every conversation; the run stops after
    -- max_failed_steps failed steps. An HTTP 401/403 from the simulator or judge stops it at once.
    max_drop_fraction = 0.5,
    max_failed_steps = 3,
    check_endpoints = true,                   -- before the first step: each endpoint answers GET /models and serves its model
    chat = {
      enable_thinking = config.optional("boolean"), -- Qwen3's switch, passed to every render
      strip_think = true,                     -- the user, judges and token_amount see visible text only
    },
    sim = "llm",                              -- "llm" (an OpenAI-compatible user), "scripted" (the world's) or a lua/interactions/ plug-in's name
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
      -- sim=user_lm (a trained user model, lua/interactions/user_lm.lua): the marker the model
      -- ends a chat with, the sample's field holding the intent, whether the roles are flipped
      end_marker = "<|endconversation|>", intent_field = "single_turn_prompt", flip_roles = true,
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
      top_k = 0,                              -- first responses: the k most likely tokens only (0: all, verl's)
      future_top_k = config.optional("number"), -- the policy's later turns; nil: top_k
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
      -- A row's logits the same bits whatever rows share its batch (CPU; docs/reproducibility.md):
      -- the same seed then gives the same samples however requests arrive, and the training
      -- forward's log-probabilities those of the rollout. false: the faster batch kernels.
      batch_invariant = true,
      cutoff_reward = -1,
      -- keys and values of earlier turns kept for the later ones (a response's futures share the
      -- prompt and the response): MiB of memory, 0 off (docs/prefix_cache.md)
      prefix_cache_mb = 1024,
    },
    eval = { every = 10,                      -- verl trainer.test_freq: validation on data_val
      prompts = config.optional("number"),    -- at most this many validation prompts (nil: all)
      seed = 12345, temperature = 0.0, before = false, after = true },
    dist = { check_every = 50 },              -- under mpirun: steps between parameter checks across ranks (0: none)
    sft_cache = "runs/collab_world_sft",      -- where the built-in world's warm start is kept
    sft = config.map({}),                     -- collabllm_sft.lua settings for the world's warm start
  }
end

-- A deep copy that keeps config.optional / config.map markers (their metatables).
function M.copy(t)
  if type(t) ~= "table" then return t end
  local out = {}
  for k, v in pairs(t) do out[k] = M.copy(v) end
  return setmetatable(out, getmetatable(t))
end

-- t with a preset's src laid over it: nested settings tables key by key, maps and values
-- replaced (a recipe's presets: collabllm_dpo's and collabllm_rl's).
function M.lay(t, src)
  for k, v in pairs(src) do
    if type(v) == "table" and getmetatable(v) == nil and type(t[k]) == "table" and getmetatable(t[k]) == nil then M.lay(t[k], v)
    else t[k] = M.copy(v) end
  end
  return t
end

-- The authors' simulated user and judges (Wuyxin/collabllm), shared by the recipes' presets:
-- the user's max_tokens 1024 (collabllm/modules/user_simulator.py; their example commands name
-- gpt-4o-mini, the shared default); the judges claude-3-5-sonnet-latest (the example commands'
-- --reward_generation_kwargs): point judge.base_url at an endpoint that serves it.
function M.authors_clients()
  return { sim_cfg = { max_tokens = 1024 }, judge = { model = "claude-3-5-sonnet-latest" } }
end

-- clrt.config.check rules for one client's settings (sim_cfg, judge): the keys
-- clrt.train.context's clients and *_options tables read.
function M.client_rules(prefix)
  return { { prefix .. ".timeout", "rate" }, { prefix .. ".max_retries", "count0" }, { prefix .. ".backoff", "nonneg" },
    { prefix .. ".max_backoff", "nonneg" }, { prefix .. ".max_concurrency", "count" }, { prefix .. ".parse_retries", "count0" },
    { prefix .. ".temperature", "nonneg" }, { prefix .. ".max_tokens", "count" }, { prefix .. ".top_p", "fraction" },
    { prefix .. ".max_chars", "count" }, { prefix .. ".rpm", "rate" }, { prefix .. ".tpm", "rate" } }
end

-- The optimizer's settings every recipe's `train` table carries (train.lr ... train.grad_clip).
function M.optim_rules()
  return { { "train.lr", "rate" }, { "train.decay", "one_of", { "constant", "cosine", "linear" } },
    { "train.min_lr_ratio", "prob" }, { "train.warmup_steps", "count0" }, { "train.weight_decay", "nonneg" },
    { "train.grad_clip", "nonneg" } }
end

-- clrt.config.check rules of the shared settings; a recipe appends its own.
function M.rules()
  local rules = {
    { "seed", "count0" }, { "epochs", "count" }, { "steps", "count" }, { "stop_after", "count" },
    { "prompts_per_step", "count" }, { "save_every", "count0" }, { "save_keep", "count" }, { "sample_every", "count0" },
    { "max_drop_fraction", "prob" }, { "max_failed_steps", "count" },
    { "reward.mode", "one_of", { "verl", "mean" } },
    { "rollout.n", "count" }, { "rollout.temperature", "nonneg" }, { "rollout.top_p", "fraction" },
    { "rollout.top_k", "count0" }, { "rollout.future_top_k", "count0" },
    { "rollout.num_repeat_rollouts", "count" }, { "rollout.max_user_turns", "count0" },
    { "rollout.max_assistant_turns", "count0" }, { "rollout.max_new_tokens", "count" }, { "rollout.token_budget", "count" },
    { "rollout.max_prompt_len", "count" }, { "rollout.max_len", "count" }, { "rollout.future_temperature", "nonneg" },
    { "rollout.cutoff_reward", "finite" }, { "rollout.prefix_cache_mb", "nonneg" },
    { "eval.every", "count0" }, { "eval.prompts", "count" }, { "eval.seed", "count0" }, { "eval.temperature", "nonneg" },
    { "judge.extract_max_tokens", "count" }, { "dist.check_every", "count0" }, { "budget.max_usd", "nonneg" },
  }
  for _, r in ipairs(M.client_rules("sim_cfg")) do rules[#rules + 1] = r end
  for _, r in ipairs(M.client_rules("judge")) do rules[#rules + 1] = r end
  return rules
end

-- Every value against its declared kind, before anything loads: one line per bad key, each
-- starting with who (the recipe's name).
function M.check(cfg, rules, who)
  config.check(cfg, rules, who)
  require("clrt.train.users").check(cfg.sim, who)
  require("clrt.train.reward").check_config(cfg.reward, who)
  for _, k in ipairs({ "sim_cfg", "judge" }) do
    if cfg[k].price ~= nil then require("clrt.api.prices").check(cfg[k].price, who .. ": " .. k .. ".price") end
  end
end

return M
