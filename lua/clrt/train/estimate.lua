-- clrt.train.estimate — estimate=true: the calls, tokens and dollars a run will spend on its
-- simulated user, judges and extractor, printed before anything loads or trains.
--   local e = estimate.run(cfg, "rl" | "dpo" | "eval")   -- prints; returns the numbers
--   local e = estimate.build(cfg, samples, types)         -- recipes/build_dataset.lua's engine
--   estimate.run(cfg, kind, {assume = {assistant_turn = 120}})   -- other reply lengths (bench/)
--   opts.world: the world whose prompts stand in when there is no data= (the recipe passes it)
-- How: the number of calls follows from the config (prompts per step x rollout.n x
-- num_repeat_rollouts futures, max_user_turns user calls per future, one request per
-- LLM-judged metric per future, validation every eval.every steps). Their sizes come from
-- the real prompts: up to SAMPLE_ROWS rows of data= are put through the simulated user and
-- every metric with clients that record the request they would send (and send nothing), over
-- conversations whose assistant and user turns have the assumed lengths below. Stated
-- assumptions (printed with the estimate): about 4 characters a token; every first response
-- valid and every future running all its user turns (an upper bound: users that end early
-- cost less); no parse or transport retries; no reply-cache hits; reply lengths as in
-- ASSUME.
local json = require("clrt.json")
local prices = require("clrt.api.prices")
local M = {}

M.SAMPLE_ROWS = 16
M.CHARS_PER_TOKEN = 4
-- tokens of: a policy turn (capped by rollout.max_new_tokens), a simulated user's message
-- inside the conversation, and the replies of the user (its JSON), a judge and an extractor
M.ASSUME = { assistant_turn = 300, user_message = 40, user_reply = 120, judge_reply = 150, extractor_extra = 40 }

local CAPTURED = setmetatable({}, { __tostring = function() return "clrt.train.estimate: request recorded" end })

local function tokens_of(text) return math.ceil(#text / M.CHARS_PER_TOKEN) end

-- A client that records the request it is asked to send and raises instead of sending it.
local function recorder(role, log)
  return { chat = function(_, messages, opts)
    opts = opts or {}
    log[#log + 1] = { role = opts.role or role, prompt_tokens = tokens_of(json.encode(messages)) + 3 }
    error(CAPTURED, 0)
  end }
end

local function filler(n) return ("abc "):rep(n) end   -- n tokens at 4 characters a token

local function copy_messages(list)
  local out = {}
  for i, m in ipairs(list) do out[i] = { role = m.role, content = m.content } end
  return out
end

-- The requests of one future of `sample`: the user's turns and the metrics' calls, each
-- {role =, prompt_tokens =, completion_tokens =}.
-- paper: collabllm_eval's protocol=paper, where the user opens an empty chat (no first
-- response) and each row is scored by its task_metric and the ITR metric only.
-- asst: the assistant's turns are API calls too (build_dataset's assistant.base_url): each
-- is recorded with the conversation before it as its prompt.
local function future_requests(sample, cfg, user, ctx, metrics, turns, log, A, paper, asst)
  local R = cfg.rollout
  local a_tokens = math.min(R.max_new_tokens, A.assistant_turn)
  local conv = copy_messages(sample.prompt)
  if not paper then conv[#conv + 1] = { role = "assistant", content = filler(a_tokens) } end
  local out = {}
  local function take(completion)
    for _, r in ipairs(log) do
      r.completion_tokens = completion(r.role)
      out[#out + 1] = r
    end
    for i = #log, 1, -1 do log[i] = nil end
  end
  for _ = 1, turns do
    pcall(user.respond, conv, sample, ctx)
    take(function() return A.user_reply end)
    conv[#conv + 1] = { role = "user", content = filler(A.user_message) }
    if asst then
      out[#out + 1] = { role = "assistant", prompt_tokens = tokens_of(json.encode(conv)) + 3, completion_tokens = a_tokens }
    end
    conv[#conv + 1] = { role = "assistant", content = filler(a_tokens) }
  end
  for _, m in ipairs(metrics) do
    local scored = not paper or m.name == cfg.itr_metric or m.name == sample.task_metric
    if scored and (not (m.metric and m.metric.applies) or m.metric.applies(sample)) then
      pcall(m.compute, conv, sample, ctx)
      take(function(role)
        if role == "extractor" then return a_tokens + A.extractor_extra end
        return A.judge_reply
      end)
    end
  end
  return out
end

-- The rows whose prompts size the estimate: k = min(SAMPLE_ROWS, #samples) of them by a seeded
-- random choice (rows evenly spaced would see one kind only in a file that cycles through its
-- sets); returns k and the order (its first k are the rows).
local function sample_order(samples, seed)
  local k = math.min(M.SAMPLE_ROWS, #samples)
  local order = {}
  for i = 1, #samples do order[i] = i end
  local rng = require("clrt.data").rng.new(seed or 1)
  for i = 1, k do
    local j = i + rng:next32() % (#samples - i + 1)
    order[i], order[j] = order[j], order[i]
  end
  return k, order
end

-- Per future, averaged over the sampled rows: {role = {calls, prompt_tokens, completion_tokens}}.
local function per_future(cfg, samples, turns, A, paper)
  local log = {}
  local clients = { user = recorder("user", log), judge = cfg.judge and cfg.judge.base_url and recorder("judge", log) or nil }
  local ctx, user = require("clrt.train.context"){ config = cfg, clients = clients }
  local weights = cfg.reward and cfg.reward.metric_weights or {}
  if paper then   -- collabllm_eval.lua protocol=paper: the rows' task metrics and the ITR
    weights = { [cfg.itr_metric] = 1 }
    for _, smp in ipairs(samples) do weights[smp.task_metric] = 1 end
  elseif cfg.metrics then   -- collabllm_eval.lua: a list of names
    weights = {}
    for _, name in ipairs(cfg.metrics) do weights[name] = 1 end
  end
  local metrics = require("clrt.train.reward").load_metrics(weights)
  local k, order = sample_order(samples, cfg.seed)
  local roles = {}
  for i = 1, k do
    local s = samples[order[i]]
    for _, r in ipairs(future_requests(s, cfg, user, ctx, metrics, turns, log, A, paper)) do
      local t = roles[r.role] or { calls = 0, prompt_tokens = 0, completion_tokens = 0 }
      roles[r.role] = t
      t.calls = t.calls + 1 / k
      t.prompt_tokens = t.prompt_tokens + r.prompt_tokens / k
      t.completion_tokens = t.completion_tokens + r.completion_tokens / k
    end
  end
  return roles, k
end

local function price_of(cfg, role)
  local c = role == "user" and cfg.sim_cfg or role == "assistant" and cfg.assistant or cfg.judge
  return prices.lookup(c.model, c.price), c.model
end

local function scaled(roles, n)
  local out = {}
  for role, t in pairs(roles) do
    out[role] = { calls = t.calls * n, prompt_tokens = t.prompt_tokens * n, completion_tokens = t.completion_tokens * n }
  end
  return out
end

local function dollars(cfg, roles)
  local sum, unpriced = 0, {}
  for role, t in pairs(roles) do
    local p, model = price_of(cfg, role)
    t.usd = prices.cost(p, t)
    if t.usd then sum = sum + t.usd else unpriced[model] = true end
  end
  return sum, unpriced
end

local function samples_of(cfg, path, world, who)
  if path then return require("clrt.train.prompts").dataset_samples(path, who) end
  return world.rl_prompts(math.max(cfg.prompts_per_step or 16, 8), cfg.seed or 1), world
end

local function print_table(title, roles)
  local names = {}
  for role in pairs(roles) do names[#names + 1] = role end
  table.sort(names)
  local rows, total = {}, { calls = 0, prompt_tokens = 0, completion_tokens = 0, usd = 0 }
  for _, role in ipairs(names) do
    local t = roles[role]
    rows[#rows + 1] = { role, math.floor(t.calls + 0.5), math.floor(t.prompt_tokens + 0.5),
      math.floor(t.completion_tokens + 0.5), t.usd and ("$%.4f"):format(t.usd) or "no price" }
    for _, f in ipairs({ "calls", "prompt_tokens", "completion_tokens" }) do total[f] = total[f] + t[f] end
    total.usd = total.usd + (t.usd or 0)
  end
  rows[#rows + 1] = { "total", math.floor(total.calls + 0.5), math.floor(total.prompt_tokens + 0.5),
    math.floor(total.completion_tokens + 0.5), ("$%.4f"):format(total.usd) }
  print(title)
  io.write(require("clrt.log").format_table({ "role", "calls", "prompt tokens", "completion tokens", "dollars" }, rows))
  return total
end

function M.run(cfg, kind, opts)
  local A = {}
  for k, v in pairs(M.ASSUME) do A[k] = v end
  for k, v in pairs(opts and opts.assume or {}) do A[k] = v end
  local who = "collabllm_" .. kind
  local function the_world()
    if not (opts and opts.world) then error(who .. ": estimate=true without data= needs the world (opts.world)", 0) end
    return opts.world
  end
  local R = cfg.rollout
  local e = { kind = kind }
  local sim_llm = require("clrt.train.users").uses_llm(cfg.sim)   -- the simulated user calls an API
  print(("%s: estimate=true: the API calls, tokens and dollars to expect (nothing is trained or sent)"):format(who))
  if kind == "dpo" and not cfg.online then
    if cfg.data or not sim_llm then
      print("offline DPO trains on stored pairs: it makes no API calls" .. (cfg.data_val and " (validation is a DPO loss too)" or ""))
      e.step, e.run = { calls = 0, usd = 0 }, { calls = 0, usd = 0 }
      return e
    end
  end
  if not sim_llm and not (cfg.judge and cfg.judge.base_url) then
    print("the scripted user and no judge endpoint: no API calls")
    e.step, e.run = { calls = 0, usd = 0 }, { calls = 0, usd = 0 }
    return e
  end
  local turns = cfg.single_turn and 0 or R.max_user_turns
  local paper = kind == "eval" and cfg.protocol == "paper"
  local samples
  if paper then   -- the user writes every other message from the first: ceil(max_messages / 2) turns
    local pe = require("clrt.train.paper_eval")
    turns = pe.turn_limits(cfg.max_messages)
    samples = cfg.data and pe.samples(cfg.data, nil, cfg.task_metric, who)
      or pe.world_samples(the_world(), cfg.prompts or 200, cfg.seed or 1, nil)
  else
    samples = samples_of(cfg, cfg.data, not cfg.data and the_world() or nil, who)
  end
  local roles, k = per_future(cfg, samples, turns, A, paper)
  local steps, futures_per_step, val_convs, validations
  if kind == "eval" then
    local n = #samples
    if cfg.prompts then n = math.min(n, cfg.prompts) end
    steps, futures_per_step, val_convs, validations = 1, n, 0, 0
  else
    local P = cfg.prompts_per_step
    futures_per_step = P * R.n * (cfg.single_turn and 1 or R.num_repeat_rollouts)
    steps = cfg.steps or cfg.epochs * math.ceil(#samples / P)
    if cfg.stop_after then steps = math.min(steps, cfg.stop_after) end
    val_convs = 0
    if cfg.data_val then
      val_convs = #require("clrt.train.prompts").dataset_samples(cfg.data_val)
      if cfg.eval.prompts then val_convs = math.min(val_convs, cfg.eval.prompts) end
    end
    local every = cfg.eval.every
    validations = (every > 0 and math.floor(steps / every) or 0) + ((every == 0 or steps % every ~= 0) and 1 or 0)
      + (cfg.eval.before and 1 or 0)
    if val_convs == 0 then validations = 0 end
  end
  local step_roles = scaled(roles, futures_per_step)
  local step_usd, unpriced = dollars(cfg, step_roles)
  local run_roles = scaled(roles, futures_per_step * steps + val_convs * validations)
  local run_usd = dollars(cfg, run_roles)
  print(("assumes: %s; rows sampled for the prompts' sizes: %d of %d%s"):format(
    "about 4 characters a token; every first response valid and every future running all its user turns "
    .. "(an upper bound); no retries; no reply-cache hits; replies of " .. json.encode(A) .. " tokens",
    k, #samples, cfg.data and (" (" .. cfg.data .. ")") or " (the built-in world's prompts)"))
  if kind == "eval" then
    e.step = print_table(("the evaluation: %d conversations, %d user turns each"):format(futures_per_step, turns), step_roles)
    e.run = e.step
  else
    e.step = print_table(("per step: %d futures (%d prompts x n=%d x %d), %d user turns each"):format(futures_per_step,
      cfg.prompts_per_step, R.n, cfg.single_turn and 1 or R.num_repeat_rollouts, turns), step_roles)
    e.run = print_table(("the run: %d steps + %d validations of %d conversations"):format(steps, validations, val_convs), run_roles)
  end
  for model in pairs(unpriced) do print(("no price for model %s: give judge.price / sim_cfg.price for its dollars"):format(model)) end
  e.steps, e.step_usd, e.run_usd, e.step_roles, e.run_roles = steps, step_usd, run_usd, step_roles, run_roles
  return e
end

-- recipes/build_dataset.lua's data engine (clrt.train.data_engine) over `samples` (its tasks;
-- types: name -> {weights}): per conversation the user's opening call, then up to
-- floor(max_messages / 2) assistant turns (cfg.estimate_turns: fewer, e.g. where users end
-- earlier), turn t with a history of 2t - 1 messages of the assumed lengths: `candidates`
-- assistant calls (with assistant.base_url; a local model costs nothing) and candidates x
-- num_repeat_rollouts futures of max_user_turns user turns (their assistant turns too with
-- an endpoint) scored by the task type's metrics. The user's next message is taken from a
-- future (no call). Prints the tables; returns {conversation = roles, run = roles, usd}.
function M.build(cfg, samples, types, opts)
  local A = {}
  for k, v in pairs(M.ASSUME) do A[k] = v end
  for k, v in pairs(opts and opts.assume or {}) do A[k] = v end
  local R = cfg.rollout
  local asst = cfg.assistant and cfg.assistant.base_url ~= nil
  print("build_dataset: estimate=true: the API calls, tokens and dollars to expect (nothing is sent)")
  local log = {}
  local clients = { user = recorder("user", log), judge = cfg.judge and cfg.judge.base_url and recorder("judge", log) or nil }
  local ctx, user = require("clrt.train.context"){ config = cfg, clients = clients }
  local metrics = {}
  for name, t in pairs(types) do metrics[name] = require("clrt.train.reward").load_metrics(t.weights) end
  local a_tokens = math.min(R.max_new_tokens, A.assistant_turn)
  local max_turns = math.floor(cfg.max_messages / 2)
  local turns = math.min(max_turns, cfg.estimate_turns or max_turns)
  local n, K = cfg.candidates, R.num_repeat_rollouts
  local extra = {}   -- candidate c's system message: the proactive or the system prompt's tokens
  local pf = require("clrt.prompt_file")
  for c = 1, n do
    local v = require("clrt.train.data_engine").variant_of(c, n, cfg)
    extra[c] = v == "proactive" and tokens_of(pf.read(cfg.proactive_prompt_file))
      or v == "system" and tokens_of(pf.read(cfg.system_prompt_file)) or 0
  end
  local k, order = sample_order(samples, cfg.seed)
  local roles = {}
  local function add(r, times)
    local t = roles[r.role] or { calls = 0, prompt_tokens = 0, completion_tokens = 0 }
    roles[r.role] = t
    t.calls = t.calls + times / k
    t.prompt_tokens = t.prompt_tokens + r.prompt_tokens * times / k
    t.completion_tokens = t.completion_tokens + r.completion_tokens * times / k
  end
  for i = 1, k do
    local s = samples[order[i]]
    pcall(user.respond, {}, s, ctx)   -- the opening
    for _, r in ipairs(log) do r.completion_tokens = A.user_reply; add(r, 1) end
    for j = #log, 1, -1 do log[j] = nil end
    local history = { { role = "user", content = filler(A.user_message) } }
    for _ = 1, turns do
      local st = {}
      for key, v in pairs(s) do st[key] = v end
      st.prompt = history
      for c = 1, asst and n or 0 do
        add({ role = "assistant", prompt_tokens = tokens_of(json.encode(history)) + 3 + extra[c], completion_tokens = a_tokens }, 1)
      end
      for _, r in ipairs(future_requests(st, cfg, user, ctx, metrics[s.task_type], R.max_user_turns, log, A, false, asst)) do
        add(r, n * K)
      end
      history = copy_messages(history)
      history[#history + 1] = { role = "assistant", content = filler(a_tokens) }
      history[#history + 1] = { role = "user", content = filler(A.user_message) }
    end
  end
  local conv_usd = dollars(cfg, roles)
  local run_roles = scaled(roles, #samples)
  local run_usd, unpriced = dollars(cfg, run_roles)
  print(("assumes: about 4 characters a token; every conversation running %d assistant turns (of at most %d%s); every "
    .. "future running all its user turns; no retries; no reply-cache hits; replies of %s tokens; tasks sampled for the "
    .. "prompts' sizes: %d of %d"):format(turns, max_turns, turns == max_turns and ": an upper bound, a user who ends earlier costs less"
      or ", estimate_turns", json.encode(A), k, #samples))
  print_table(("per conversation: %d candidates x %d futures a turn, %d user turns each%s"):format(n, K, R.max_user_turns,
    asst and "" or "; the local model's turns cost nothing"), roles)
  local total = print_table(("the build: %d conversations"):format(#samples), run_roles)
  for model in pairs(unpriced) do print(("no price for model %s: give its price (sim_cfg.price, judge.price, assistant.price)"):format(model)) end
  return { conversation = roles, run = run_roles, usd = run_usd, conversation_usd = conv_usd, total = total }
end

return M
