-- build_dataset.lua — your own CollabLLM data: the authors' multiturn data engine
-- (Wuyxin/collabllm scripts/engine/build_dataset.py with collabllm/synthetic.py, read as
-- facts; clrt.train.data_engine) from single-turn tasks to the published
-- collabllm-multiturn schema, which process_dataset.lua and every recipe read unchanged.
--   clrt recipes/build_dataset.lua input=TASKS.jsonl out=DIR model=HF_DIR \
--        sim_cfg.base_url=... judge.base_url=...          # candidates from a local model
--   clrt recipes/build_dataset.lua input=TASKS.jsonl out=DIR assistant.base_url=... tokenizer=HF_DIR
--   clrt recipes/build_dataset.lua out=DIR                 # the built-in world, no API
--   clrt recipes/process_dataset.lua input=DIR/multiturn.jsonl out=data task_desc="question answering"
-- For each task (clrt.train.tasks: a task JSONL, or MATH / BigCodeBench / document-editing
-- rows; docs/training.md) a simulated user who holds the whole task opens the chat; at each
-- assistant turn `candidates` replies are sampled (the local model through clrt's own batched
-- engine, or any OpenAI-compatible endpoint), each scored by the multiturn-aware reward: the
-- futures and metrics of collabllm_rl.lua (clrt.train.rollout.score_candidates and
-- clrt.train.reward); the best continues the chat. The same seed and deterministic endpoints
-- give the same rows (every request names who asks: conversation, turn, candidate, future).
-- DIR holds config.json, conversations/<conv_id>.json (each finished task written atomically
-- once: its rows, or why it made none: the user ended the chat at once, every candidate
-- failed), multiturn.jsonl (every conversation's rows, in input order), counts.json and
-- api_usage.json. The same command again (after Ctrl-C, kill -9 or a budget stop) goes on
-- with the tasks that have no file yet; a task whose simulated user failed has none, so it
-- is tried again. estimate=true prints the calls, tokens and dollars first.
local config = require("clrt.config")
local files = require("clrt.files")
local json = require("clrt.json")
local train = require("clrt.train")
local defaults = require("clrt.train.defaults")
local tasks = require("clrt.train.tasks")
local engine = require("clrt.train.data_engine")
local WHO = "build_dataset"
local SCRIPT = "recipes/build_dataset.lua"
local M = {}

local D = defaults.shared()
D.name = "build_dataset"
-- what the engine does not use of the shared settings (training, validation, data sets)
for _, k in ipairs({ "data", "data_val", "run_dir", "resume", "epochs", "steps", "stop_after", "prompts_per_step",
  "save_every", "save_keep", "sample_every", "single_turn", "max_drop_fraction", "max_failed_steps", "eval", "dist" }) do
  D[k] = nil
end
D.rollout.n = nil                        -- candidates= instead
D.input = config.optional("string")      -- the single-turn tasks (JSONL); nil: the built-in world's
D.out = config.optional("string")        -- the folder the data goes to (required); the same out= resumes
D.format = "auto"                        -- auto (by each row's fields), tasks, math, bigcodebench or document
D.task_type = config.optional("string")  -- the task type of a tasks row that names none (qa, document, code)
D.limit = config.optional("number")      -- at most this many tasks, the first (build_dataset.py --train_size 500; nil: all)
D.max_bad_rows = 10                      -- bad input rows skipped (one line each) before the run stops
D.world_tasks = 64                       -- no input=: this many of the built-in world's training tasks
D.tokenizer = config.optional("string")  -- a tokenizer folder (tokens_read counts with it); nil: model='s
-- Task types: what the simulated user is told (the authors' datasets_info task_desc) and the
-- metric weights of the candidates' MR (build_dataset.py's example commands, one per data set;
-- their "token_amount" is tokens / 1000, clrt's tokens_read). reward.metric_weights, when
-- set, replaces every type's weights.
D.task_types = {
  qa = { task_desc = "question answering",   -- math-hard's; weights: its example's --metric_weights 1 0.5 -0.5
    weights = config.map({ accuracy = 1, interactivity = 0.5, tokens_read = -0.5 }),
  },
  document = { task_desc = "document editing",   -- medium's; weights: its example's --metric_weights 1 -0.1
    weights = config.map({ bleu_score = 1, tokens_read = -0.1 }),
  },
  code = { task_desc = "code generation",   -- bigcodebench's; weights: its example's --metric_weights 1 -0.5
    weights = config.map({ pass_rate = 1, tokens_read = -0.5 }),
  },
}
D.reward.metric_weights = config.map({})   -- empty: each task type's weights (task_types.NAME.weights)
D.reward.mode = "mean"                     -- multiturn_aware_reward: MR = sum_m w_m s_m per session; the score its mean over sessions
-- examples/metrics/interactivity.py: one score, 1 / 0.5 / 0 (lua/prompts/judge_interactivity_authors.txt)
D.reward.metric_options = config.map({ interactivity = { rubric = "authors" } })
D.candidates = 2                           -- --num_candidate_responses default 2 (the example commands give 3)
D.max_messages = 14                        -- --max_total_turns 14: user and assistant messages of a conversation
D.proactive_ratio = 0.5                    -- --proact_prompt_ratio 0.5: this share of the candidates gets the proactive prompt
D.system_prompt_ratio = 0.0                -- --add_system_prompt_ratio 0: this share gets the CollabLLM system prompt
D.proactive_prompt_file = "proactive_system"   -- the proactive prompt (lua/prompts/; the authors' proact_instruction.txt)
D.system_prompt_file = "collabllm_system"      -- the system prompt (the authors' system_prompt.txt)
-- estimate=true: assistant turns a conversation is assumed to run (nil: max_messages / 2, an upper bound)
D.estimate_turns = config.optional("number")   -- estimate=true: assistant turns per conversation (nil: the upper bound)
D.tasks_in_flight = 8                      -- --max_gen_workers 8: conversations built at once (their turns batched)
-- The futures of each candidate: --num_samples 3 conversations of --max_new_turns 4 messages
-- after it (U A U A: two user and two assistant turns, the last assistant turn kept).
D.rollout.num_repeat_rollouts = 3          -- --num_samples 3
D.rollout.max_user_turns = 2               -- --max_new_turns 4 = U A U A
D.rollout.max_assistant_turns = 2          -- --max_new_turns 4 = U A U A
D.rollout.temperature = 0.8                -- LLMCollaborator's default temperature 0.8 (the math and code examples; medium 0.9)
D.rollout.max_new_tokens = 2048            -- LLMCollaborator's default max_tokens 2048
D.rollout.token_budget = config.optional("number")   -- none: the authors bound a future by its turns only
-- The endpoint that proposes the assistant's turns instead of a local model (candidates and
-- the futures' assistant turns, sampled with rollout.temperature, top_p, max_new_tokens and a
-- seed per request). Priced, rate-limited and cached as sim_cfg is.
D.assistant = { base_url = config.optional("string"),   -- nil: model= (or the world's start) through clrt's engine
  api_key_env = config.optional("string"), -- the variable holding the key (OPENAI_API_KEY for OpenAI)
  timeout = 120, max_retries = 5, backoff = 0.5, max_backoff = 30, max_concurrency = 64,   -- as sim_cfg's
  rpm = config.optional("number"), tpm = config.optional("number"),   -- requests / tokens per minute
  price = config.optional("table"),        -- {input, cached_input, output} $ per million tokens (nil: clrt.api.prices')
  cache = config.optional("boolean"),      -- true: every reply cached (sampled replies would repeat)
}
D.assistant.model = "gpt-4o-mini"          -- the model the endpoint serves (the authors' example commands name gpt-4o)

M.defaults = D

M.rules = {
  { "format", "one_of", tasks.FORMATS }, { "limit", "count" }, { "max_bad_rows", "count0" }, { "world_tasks", "count" },
  { "candidates", "count" }, { "max_messages", "count" }, { "proactive_ratio", "prob" }, { "system_prompt_ratio", "prob" },
  { "tasks_in_flight", "count" }, { "estimate_turns", "count" },
}
for _, r in ipairs(defaults.rules()) do M.rules[#M.rules + 1] = r end
for _, r in ipairs(defaults.client_rules("assistant")) do
  if r[1]:find("^assistant%.[%a_]+$") and not r[1]:find("temperature") and not r[1]:find("max_tokens")
    and not r[1]:find("top_p") and not r[1]:find("max_chars") and not r[1]:find("parse_retries") then
    M.rules[#M.rules + 1] = r
  end
end

-- The settings that decide a folder's rows: the same out= with other values is refused.
M.FIXED = { "input", "format", "task_type", "limit", "world_tasks", "seed", "model", "adapter", "assistant.base_url",
  "assistant.model", "candidates", "max_messages", "proactive_ratio", "system_prompt_ratio", "proactive_prompt_file",
  "system_prompt_file", "task_types", "reward.metric_weights", "reward.mode", "reward.metric_options", "rollout", "sim",
  "sim_cfg.model", "sim_cfg.prompt_file", "judge.model", "chat" }

-- The built-in world (examples/collab_world, on the module path).
local function the_world() return require("collab_world.world") end

-- The world's settings for the engine: its simulated user, its policy's sampling and limits
-- and its SFT start (examples/collab_world/config.lua; its training settings are RL's), and
-- a proactive prompt that fits its context (examples/collab_world/proactive_prompt.txt).
function M.world_config()
  local path = the_world().config_path()
  local w = config.read_file(path)
  local r = w.rollout
  r.n = nil
  return { sim = w.sim, rollout = r, sft = w.sft, sft_cache = w.sft_cache,
    proactive_prompt_file = path:gsub("[^/]*$", "") .. "proactive_prompt.txt" }
end

-- name -> {task_desc, weights}: task_types (each weighed by reward.metric_weights when set),
-- with the world's own type in the world.
function M.task_types(cfg, world)
  local types = {}
  local over = next(cfg.reward.metric_weights) ~= nil and cfg.reward.metric_weights or nil
  for name, t in pairs(cfg.task_types) do types[name] = { task_desc = t.task_desc, weights = over or t.weights } end
  if world then types.world = { task_desc = world.task_desc, weights = over or world.default_weights } end
  return types
end

function M.check_config(cfg)
  config.check(cfg, M.rules, WHO)
  require("clrt.train.users").check(cfg.sim, WHO)
  for _, k in ipairs({ "sim_cfg", "judge", "assistant" }) do
    if cfg[k].price ~= nil then require("clrt.api.prices").check(cfg[k].price, WHO .. ": " .. k .. ".price") end
  end
  for name, t in pairs(cfg.task_types) do
    if type(t) ~= "table" or type(t.task_desc) ~= "string" or type(t.weights) ~= "table" then
      error(("%s: task_types.%s needs a task_desc text and a weights table"):format(WHO, tostring(name)), 0)
    end
  end
  for name, t in pairs(M.task_types(cfg, not cfg.input and the_world() or nil)) do
    require("clrt.train.reward").check_config({ metric_weights = t.weights, metric_options = cfg.reward.metric_options },
      WHO .. ": task_types." .. name)
  end
  if cfg.assistant.base_url and cfg.model then
    error(WHO .. ": give model= (a local policy) or assistant.base_url= (an endpoint), not both", 0)
  end
end

local function conv_path(dir, id) return ("%s/conversations/%06d.json"):format(dir, id) end

-- out=: a new folder gets config.json; an existing one must hold a build of the same settings.
function M.open_out(cfg)
  local dir = cfg.out
  local path = dir .. "/config.json"
  if files.exists(path) then
    local old = config.load(path)
    for _, key in ipairs(M.FIXED) do
      local a, b = json.encode(config.get(old, key) or json.null), json.encode(config.get(cfg, key) or json.null)
      if a ~= b then
        error(("%s: out=%s was built with %s=%s, not %s: keep the setting to go on, or choose another out="):format(WHO, dir, key, a, b), 0)
      end
    end
    return true
  end
  if files.exists(dir) and (not files.is_dir(dir) or #files.list(dir) > 0) then
    error(("%s: out=%s exists and holds no build (no config.json): choose another out="):format(WHO, dir), 0)
  end
  files.mkdir_p(dir .. "/conversations")
  files.write_atomic(path, config.dump(cfg))
  return false
end

-- multiturn.jsonl and counts.json from every task's file, in input order.
function M.assemble(dir, samples, counts)
  local data = require("clrt.data")
  local rows, status = {}, { conversation = 0, ended_at_once = 0, candidates_failed = 0 }
  local done = 0
  for _, s in ipairs(samples) do
    local p = conv_path(dir, s.id)
    if files.exists(p) then
      done = done + 1
      local rec = json.decode(files.read(p), p)
      status[rec.status] = (status[rec.status] or 0) + 1
      for _, r in ipairs(rec.rows or {}) do rows[#rows + 1] = r end
    end
  end
  data.write_jsonl(dir .. "/multiturn.jsonl", rows)
  counts.tasks, counts.finished, counts.rows = #samples, done, #rows
  counts.conversations, counts.ended_at_once, counts.candidates_failed = status.conversation, status.ended_at_once, status.candidates_failed
  files.write_atomic(dir .. "/counts.json", json.encode(counts, { pretty = true }) .. "\n")
  return counts
end

-- The command that goes on with this build (the same one: out= resumes).
local function again_command(cfg)
  local parts = { "clrt", SCRIPT }
  local quote = require("clrt.util.shell").quote
  if cfg.input then parts[#parts + 1] = "input=" .. quote(cfg.input) end
  parts[#parts + 1] = "out=" .. quote(cfg.out)
  return table.concat(parts, " ") .. " ..."
end

function M.main(cfg)
  M.check_config(cfg)
  local world = not cfg.input and the_world() or nil
  local types = M.task_types(cfg, world)
  local samples, bad
  if cfg.input then
    samples, bad = tasks.read(cfg.input, { format = cfg.format, task_type = cfg.task_type, types = types,
      max_bad_rows = cfg.max_bad_rows, who = WHO })
  else
    samples, bad = tasks.world(world, cfg.world_tasks, cfg.seed), 0
  end
  if cfg.limit then while #samples > cfg.limit do table.remove(samples) end end
  local present = {}
  for _, s in ipairs(samples) do present[s.task_type] = true end
  for name in pairs(types) do if not present[name] then types[name] = nil end end   -- only the types the tasks have
  if cfg.estimate then return require("clrt.train.estimate").build(cfg, samples, types) end
  if not cfg.out then error(WHO .. ": out= is required (the folder the data goes to)", 0) end
  if not cfg.assistant.base_url then require("clrt.model_path").apply(cfg, WHO) end
  local resumed = M.open_out(cfg)
  cfg.run_dir = cfg.out   -- the reply cache (llm_cache/) and the API bill (api_usage.json) live there
  cfg.resume = resumed and cfg.out or nil

  -- the policy: a local model through clrt's engine, or an endpoint
  local m, tok
  if cfg.assistant.base_url then
    tok = cfg.tokenizer and clrt.tokenizer.load(cfg.tokenizer) or nil
  else
    local dir = cfg.model or train.warm_start.ensure(cfg, world, require("recipes.collabllm_sft"), WHO)
    tok = clrt.tokenizer.load(cfg.tokenizer or dir)
    m = train.lora.policy(dir, nil, { r = 0 }, cfg.seed, cfg.adapter, "f32")
    if cfg.device ~= "cpu" then m:to(cfg.device) end
    m:set_batch_invariant(cfg.rollout.batch_invariant)   -- a row's tokens whatever shares its batch
    require("clrt.gen.prefix_cache").configure(m, { mb = cfg.rollout.prefix_cache_mb })
  end
  local ctx, user = train.context{ config = cfg, tokenizer = tok, who = WHO }
  local reward = train.reward
  local metrics, all = {}, {}
  for name, t in pairs(types) do
    if t.weights.tokens_read and not tok then
      error(("%s: task_types.%s weighs tokens_read, which counts with a tokenizer: give tokenizer=DIR (the model you will train)")
        :format(WHO, name), 0)
    end
    metrics[name] = reward.load_metrics(t.weights, cfg.reward.metric_options)
    for _, mt in ipairs(metrics[name]) do all[#all + 1] = mt end
  end
  -- code tasks need their modules in the sandbox (pass_rate.check_samples), as in RL
  local by_type = {}
  for _, s in ipairs(samples) do by_type[s.task_type] = by_type[s.task_type] or {}; table.insert(by_type[s.task_type], s) end
  local keep = {}
  for name, list in pairs(by_type) do
    for _, s in ipairs(reward.check_samples(metrics[name], list, cfg.reward.metric_options, print)) do keep[s] = true end
  end
  local kept = {}
  for _, s in ipairs(samples) do if keep[s] then kept[#kept + 1] = s end end
  samples = kept
  train.endpoints.check(ctx, all, cfg, WHO)

  local prompt_file = require("clrt.prompt_file")
  local env = { cfg = cfg, ctx = ctx, user = user, tok = tok, m = m, client = ctx.assistant,
    metrics_of = function(t) return metrics[t] end, weights_of = function(t) return types[t].weights end,
    prompts = { proactive = prompt_file.read(cfg.proactive_prompt_file), system = prompt_file.read(cfg.system_prompt_file) },
    policy = m and train.policy.new(m, tok, cfg, cfg.seed) or engine.endpoint_policy(ctx.assistant, cfg) }

  local todo = {}
  for _, s in ipairs(samples) do
    local p = conv_path(cfg.out, s.id)
    if not files.exists(p) then todo[#todo + 1] = s
    else
      -- a file is for the task of its line: an input edited since would pair rows with other tasks
      local ok, rec = pcall(json.decode, files.read(p), p)
      if not ok or type(rec) ~= "table" then error(("%s: %s is unreadable (%s): remove it to build that task again"):format(WHO, p, tostring(rec)), 0) end
      if rec.single_turn_prompt ~= s.single_turn_prompt then
        error(("%s: %s was built from another task than line %d of input=%s now holds: the input changed; use another out="):format(
          WHO, p, s.id, tostring(cfg.input or "(the world)")), 0)
      end
    end
  end
  print(("%s: %d tasks (%d bad rows skipped), %d already built, %d to build -> %s"):format(WHO, #samples, bad,
    #samples - #todo, #todo, cfg.out))
  local budget = train.budget
  local counts = { bad_rows = bad, user_failed = 0, candidates = 0, candidates_truncated = 0, candidates_dropped = 0 }
  local function over_budget()
    local t = ctx.spend.total
    return budget.exceeded(cfg.budget.max_usd, t.all.usd, t.last_step_usd)
  end
  local why = over_budget()
  if why then error(budget.stop_line(WHO, why, again_command(cfg), cfg.budget.max_usd, ctx.spend.total.last_step_usd), 0) end
  local failed_ids = {}
  for b = 1, #todo, cfg.tasks_in_flight do
    clrt.check_interrupt()
    local states = {}
    for i = b, math.min(#todo, b + cfg.tasks_in_flight - 1) do states[#states + 1] = { sample = todo[i] } end
    local results = engine.build(states, env)
    local line = {}
    for i, r in ipairs(results) do
      local s = states[i].sample
      counts.candidates = counts.candidates + r.candidates
      counts.candidates_truncated = counts.candidates_truncated + r.truncated
      counts.candidates_dropped = counts.candidates_dropped + r.dropped
      if r.status == "user_failed" then
        -- the simulated user failed before any turn: no file, so the next run tries it again
        counts.user_failed = counts.user_failed + 1
        failed_ids[#failed_ids + 1] = s.id
        io.stderr:write(("%s: task %d (line %d): the simulated user failed: %s\n"):format(WHO, s.id, s.id, tostring(r.error)))
      else
        if r.status ~= "conversation" then
          io.stderr:write(("%s: task %d: %s%s\n"):format(WHO, s.id, r.status:gsub("_", " "),
            r.error and (": " .. r.error) or ""))
        end
        files.write_atomic(conv_path(cfg.out, s.id), json.encode({ conv_id = s.id, single_turn_prompt = s.single_turn_prompt,
          status = r.status, ended = r.ended,
          turns = r.turns, messages = r.messages, candidates = r.candidates, rows = json.array(r.rows) }) .. "\n")
      end
      line[#line + 1] = r.status
    end
    local rest = require("clrt.llm").drain_records()
    ctx.spend:add(rest)
    for k in pairs(ctx.counters) do ctx.counters[k] = nil end
    print(("%s: tasks %d-%d of %d built (api $%.4f so far)"):format(WHO, b, b + #states - 1, #todo, ctx.spend.total.all.usd))
    why = over_budget()
    if why and b + cfg.tasks_in_flight <= #todo then
      M.assemble(cfg.out, samples, counts)
      error(budget.stop_line(WHO, why, again_command(cfg), cfg.budget.max_usd, ctx.spend.total.last_step_usd), 0)
    end
  end
  local c = M.assemble(cfg.out, samples, counts)
  if ctx.spend.total.all.calls > 0 then print(require("clrt.api.usage").line(ctx.spend.total)) end
  print(("%s: %d conversations, %d rows -> %s/multiturn.jsonl; %d tasks ended by the user at once, %d with every candidate failed (counts.json)")
    :format(WHO, c.conversations, c.rows, cfg.out, c.ended_at_once, c.candidates_failed))
  if c.conversations == 0 then
    error(("%s: no conversation built from %d tasks (%d ended by the user at once, %d with every candidate failed or cut "
      .. "at rollout.max_new_tokens; %d simulated-user failures): see the lines above and counts.json")
      :format(WHO, #samples, c.ended_at_once, c.candidates_failed, #failed_ids), 0)
  end
  if #failed_ids > 0 then
    error(("%s: %d tasks not built (the simulated user failed: tasks %s); run the same command again to retry them")
      :format(WHO, #failed_ids, table.concat(failed_ids, ", ", 1, math.min(#failed_ids, 10))), 0)
  end
  local desc = {}
  for _, s in ipairs(samples) do desc[s.task_desc] = true end
  local one = next(desc)
  print(("next: clrt recipes/process_dataset.lua input=%s/multiturn.jsonl out=data%s"):format(cfg.out,
    one and next(desc, one) == nil and (" task_desc=" .. require("clrt.util.shell").quote(one)) or ""))
  return cfg.out, c
end

-- The command line -> a config: with no input= (and no config=) the built-in world's
-- settings under the overrides.
function M.parse_args(argv)
  local world = not config.arg_value(argv, "input") and not config.arg_value(argv, "config")
  return config.parse(M.defaults, argv, world and M.world_config() or nil)
end

local argv = { ... }
if argv[1] == "recipes.build_dataset" then return M end
require("clrt.run").main(WHO, SCRIPT, argv, M.parse_args, M.main)
