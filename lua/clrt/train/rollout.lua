-- clrt.train.rollout — the conversations of an RL step (spec steps 2-4): the
-- future-conversation loop with the simulated user, and one step's first responses, futures
-- and their scores as clrt.train.entry records. Everything runs inside clrt.sched tasks, so
-- policy turns of all conversations share batched generate calls while simulator and judge
-- requests are in flight. The policy is clrt.train.policy's; evaluation and validation are
-- clrt.train.validation; whether the step failed is clrt.train.failure's to say.
--   local conv, info = rollout.conversation(conv, policy, user, sample, ctx, opts)
--   local entries, timing = rollout.step(m, tok, cfg, samples, ctx, user, metrics, step)
--   local entries = rollout.first_responses(m, tok, cfg, samples, ctx, {key_of =, n_of =})  -- phase 1 alone
--   rollout.score_candidates(entries, policy, tok, cfg, ctx, user, metrics, {key_of =})  -- phase 2: futures, scores
-- cfg is the recipe's config (rollout, chat, seed, single_turn, dist); ctx and user come from
-- clrt.train.context (ctx.who names the recipe in errors).
local chat = require("clrt.chat")
local conv = require("clrt.conversation")
local sched = require("clrt.sched")
local clock = require("clrt.log").now
local entry = require("clrt.train.entry")
local failure = require("clrt.train.failure")
local policy_mod = require("clrt.train.policy")
local reward = require("clrt.train.reward")
local M = {}

-- Roll one conversation forward after the first response (spec step 4). Plain sequential
-- code: run it inside a clrt.sched coroutine and `policy` / `user.respond` may yield.
--   conversation  messages ending with A1 (copied; the input is not modified)
--   policy(conv, sample, key) -> reply text (or a message table {content=, reasoning_content=}),
--                 tokens generated, finish_reason; nil when the context has no room left;
--                 key names the turn's random stream (clrt.sched's seed_key)
--   user          a lua/interactions plug-in: user.respond(conv, sample, ctx, turn) -> text
--                 (turn.seed_key: opts.seed_key .. "/user t", nil without one)
-- opts: max_user_turns (2), max_assistant_turns (= max_user_turns: future assistant
--   turns), keep_last_assistant (true: the authors' A1 U1 A2 U2 A3; false: verl's
--   A1 U1 A2 U2 — the last assistant turn is then never generated at all),
--   token_budget (nil = none) with verl's rule: first_tokens (A1's tokens) + every user
--   turn's tokens (count_tokens(text)) + every later assistant turn's tokens; the turn that
--   would cross the budget is discarded and the conversation ends there; seed_key: who
--   asks (e.g. "rl/step 3/prompt 2/response 1/future 2"), the policy's turn t then samples
--   from the stream seed_key .. "/turn t", whatever order the conversations' turns reach the
--   engine in (nil: the engine's fallback, the rendered prompt); on_turn(role, conv, said):
--   called after each message is added (said: the user plug-in's second value, nil for the
--   assistant), it may return a reason to end the conversation there (Lost in
--   Conversation's protocol ends at a correct answer attempt or once every shard is out).
-- A full context (policy returns nil) ends the conversation; no empty turn is added.
-- The simulated user's message with the termination marker stays in the conversation.
-- The user plug-in may return a second value, a table (collabllm_user: its parsed reply);
-- its "thought" and "current_answer" are kept in info.user_notes, never in the conversation
-- (the judges and the policy must not see them).
-- Returns conv, info {ended = "marker" | "max_user_turns" | "max_assistant_turns" |
--   "token_budget" | "context_full", user_turns, assistant_turns, tokens, user_notes =
--   {{message = index in conv, thought =, current_answer =}}}; or nil,
--   {dropped = reason} when the user plug-in raised or returned an empty message.
function M.conversation(conversation, policy, user, sample, ctx, opts)
  opts = opts or {}
  local max_user = opts.max_user_turns or 2
  local max_asst = opts.max_assistant_turns or max_user
  local keep_last = opts.keep_last_assistant ~= false
  local budget = opts.token_budget
  local c = conv.copy(conversation)
  local info = { user_turns = 0, assistant_turns = 0, tokens = opts.first_tokens or 0, user_notes = {} }
  local function over(n) return budget and info.tokens + n > budget end
  while true do
    if info.user_turns >= max_user then info.ended = "max_user_turns" break end
    -- the turn's own key (user_lm seeds its request with it: reruns repeat the user's words)
    local turn = { seed_key = opts.seed_key and ("%s/user %d"):format(opts.seed_key, info.user_turns + 1) or nil }
    local ok, text, said = pcall(user.respond, c, sample, ctx, turn)
    if not ok then return nil, { dropped = "simulator failed", error = tostring(text) } end
    if type(text) ~= "string" or conv.trim(text) == "" then
      return nil, { dropped = "simulator failed", error = "empty user message" }
    end
    local nuser = (budget and opts.count_tokens) and opts.count_tokens(text) or 0
    if over(nuser) then info.ended = "token_budget" break end
    c[#c + 1] = { role = "user", content = text }
    if type(said) == "table" and (said.thought ~= nil or said.current_answer ~= nil) then
      local llm_reply = require("clrt.llm_reply")
      info.user_notes[#info.user_notes + 1] = { message = #c, thought = llm_reply.text(said.thought),
        current_answer = llm_reply.text(said.current_answer) }
    end
    info.user_turns = info.user_turns + 1
    info.tokens = info.tokens + nuser
    if conv.has_marker(text, conv.marker(ctx, sample)) then info.ended = "marker" break end
    local stop = opts.on_turn and opts.on_turn("user", c, said)
    if stop then info.ended = stop break end
    if info.assistant_turns >= max_asst then info.ended = "max_assistant_turns" break end
    if not keep_last and info.user_turns >= max_user then info.ended = "max_user_turns" break end
    local key = opts.seed_key and ("%s/turn %d"):format(opts.seed_key, info.assistant_turns + 1) or nil
    local reply, ntok = policy(c, sample, key)
    if reply == nil then info.ended = "context_full" break end
    if over(ntok or 0) then info.ended = "token_budget" break end
    local msg = type(reply) == "table" and reply or { content = reply }
    c[#c + 1] = { role = "assistant", content = msg.content or "", reasoning_content = msg.reasoning_content }
    info.assistant_turns = info.assistant_turns + 1
    info.tokens = info.tokens + (ntok or 0)
    stop = opts.on_turn and opts.on_turn("assistant", c)
    if stop then info.ended = stop break end
  end
  return c, info
end

-- The prompt's messages followed by a reply (a text or a message table).
function M.copy_conv(prompt, reply)
  local c = {}
  for i, msg in ipairs(prompt) do c[i] = { role = msg.role, content = msg.content } end
  if type(reply) == "table" then
    c[#c + 1] = { role = "assistant", content = reply.content, reasoning_content = reply.reasoning_content }
  else
    c[#c + 1] = { role = "assistant", content = reply }
  end
  return c
end

-- Options of rollout.conversation from the config (the token budget counts user turns with
-- `tok`; with none, an endpoint's policy and no tokenizer, user turns count 0 against it).
function M.rollout_opts(cfg, tok, first_tokens, seed_key)
  local R = cfg.rollout
  return { max_user_turns = R.max_user_turns, max_assistant_turns = R.max_assistant_turns,
    keep_last_assistant = R.keep_last_assistant, token_budget = R.token_budget, first_tokens = first_tokens,
    seed_key = seed_key,
    count_tokens = tok and function(text) return #tok:encode(text, { add_special_tokens = false }) end or nil }
end

-- Sample n first responses per prompt, roll K futures from each, score every conversation.
-- Returns entries (one per first response) and timing. Under N data-parallel ranks this rank
-- rolls out its share of `samples` and the entries of all of them come back, in order, on
-- every rank (clrt.train.data_parallel); timing is this rank's.
function M.step(m, tok, cfg, samples, ctx, user, metrics, step)
  local dp = require("clrt.train.data_parallel")
  dp.check_params(m, step - 1, cfg.dist and cfg.dist.check_every)
  local all_samples, first = samples, nil
  samples, first = dp.my_prompts(all_samples)
  local entries, timing = M.step_local(m, tok, cfg, samples, ctx, user, metrics, step, first)
  return dp.gather_entries(entries, all_samples, first, ctx), timing
end

-- Every sampling request names who asks (clrt.sched's seed_key): step, prompt (its index in
-- the step's prompts on all ranks: `first` is this rank's first), response, future and turn,
-- so a rerun with the same seed samples the same tokens whatever the HTTP timing.
function M.step_local(m, tok, cfg, samples, ctx, user, metrics, step, first)
  first = first or 1
  local t0 = clock()
  local cache0 = M.prefix_cache_totals(m)
  local engine0 = require("clrt.gen.scheduler").times(m)
  local entries, info1 = M.first_responses(m, tok, cfg, samples, ctx, {
    key_of = function(i) return ("rl/step %d/prompt %d"):format(step, first + i - 1) end,
    progress = ("step %d: first responses, prompts"):format(step) })
  local t_gen1 = clock() - t0
  local info = M.score_candidates(entries, policy_mod.new(m, tok, cfg, cfg.seed), tok, cfg, ctx, user, metrics, {
    key_of = function(e, k)
      return ("rl/step %d/prompt %d/response %d/future %d"):format(step, first + e.group - 1, e.response, k)
    end,
    progress = ("step %d: futures and scores"):format(step) })
  -- decode steps taken while a metric's program (pass_rate's tests) ran: the engine's work
  -- that a blocking test run would have held back
  local cache1 = M.prefix_cache_totals(m)
  local prompt_tokens = cache1.prompt_tokens - cache0.prompt_tokens
  local engine1 = require("clrt.gen.scheduler").times(m)
  return entries, { generate_first_s = t_gen1, rollout_s = clock() - t0 - t_gen1,
    engine_steps_during_tests = info and info.engine_steps_during_procs or 0,
    -- the policy engine's seconds in prefills and in decode steps (sampling included), and the
    -- seconds the rollouts waited on the simulator and judges with no engine work to do
    prefill_s = math.max(0, engine1.prefill_s - engine0.prefill_s),
    decode_s = math.max(0, engine1.decode_s - engine0.decode_s),
    wait_http_s = ((info1 and info1.wait_http_s) or 0) + ((info and info.wait_http_s) or 0),
    -- the share of the step's prompt tokens served from the prefix cache (nil: cache off)
    prefix_cache_hit_rate = cache1.on and prompt_tokens > 0
      and (cache1.cached_tokens - cache0.cached_tokens) / prompt_tokens or nil }
end

-- Phase 1: the first responses of every sample from the local model m, all prompts in one
-- batched generate; entries in sample order (group = the sample's index, response = the
-- sample's k-th). o.key_of(i): the random stream of sample i's responses (its n samples are
-- that stream's); o.n_of(i): how many (rollout.n); o.progress: the progress line's label.
-- Returns the entries and clrt.sched.run's info.
function M.first_responses(m, tok, cfg, samples, ctx, o)
  local stop = chat.stop_ids(tok)
  local R = cfg.rollout
  local ctx_len = policy_mod.context_len(m, R)
  local ropts = policy_mod.render_opts(cfg)
  local fns = {}
  for i, s in ipairs(samples) do
    fns[i] = function()
      local ids = chat.render(tok, s.prompt, ropts)
      local room = math.max(1, math.min(R.max_new_tokens, ctx_len - #ids))
      -- rollout.quant=int8 (or train.async's worker: keep_logprobs): each token's
      -- temperature-1 log-probability under the weights that sampled it, for the update's
      -- importance weights
      local outs = sched.generate(m, ids, { n = o.n_of and o.n_of(i) or R.n, temperature = R.temperature, top_p = R.top_p,
        top_k = (R.top_k or 0) > 0 and R.top_k or nil,   -- rollout.top_k (0: all tokens)
        max_new_tokens = room, stop = stop, tokenizer = tok, seed = cfg.seed,
        seed_key = o.key_of(i),
        top_logprobs = (R.quant == "int8" or R.keep_logprobs) and 0 or nil })
      return { ids = ids, outs = outs }
    end
  end
  local firsts, errs, info1 = sched.run(fns, { progress = o.progress })
  failure.check_stop(ctx)
  for i in pairs(errs) do
    error(("%s: sampling the first responses of prompt %d failed: %s"):format(ctx.who or "clrt.train.rollout", i, errs[i]), 0)
  end
  local entries = {}
  for i, s in ipairs(samples) do
    for r, out in ipairs(firsts[i].outs) do
      local text = out.text or ""
      local rollout_lp
      if out.model_logprobs then
        rollout_lp = {}
        for j, t in ipairs(out.model_logprobs) do rollout_lp[j] = t.lp end
      end
      entries[#entries + 1] = M.first_entry(cfg, { group = i, response = r, sample = s, prompt_ids = firsts[i].ids,
        tokens = out.tokens, text = text, finish_reason = out.finish_reason, logprobs_sampled = out.logprobs,
        logprobs_rollout = rollout_lp })
    end
  end
  return entries, info1
end

-- An entry (clrt.train.entry) from a sampled first response f = {group, response, sample,
-- prompt_ids, tokens, text, finish_reason, logprobs_sampled, logprobs_rollout}: cut by the
-- length limit, empty or malformed, it is truncated (rollout.cutoff_reward, no futures).
function M.first_entry(cfg, f)
  local msg, valid, why = policy_mod.reply_message(cfg, f.text)
  local truncated = f.finish_reason ~= "stop" or not valid
  return entry.new{ group = f.group, response = f.response, sample = f.sample, prompt_ids = f.prompt_ids, tokens = f.tokens,
    text = f.text, message = msg, logprobs_sampled = f.logprobs_sampled, logprobs_rollout = f.logprobs_rollout,
    truncated = truncated,
    cutoff_reward = truncated and cfg.rollout.cutoff_reward or nil,
    invalid = f.finish_reason == "stop" and not valid and why or nil }
end

-- Phase 2, the multiturn-aware reward's evidence: every entry that is not truncated gets
-- rollout.num_repeat_rollouts futures (one, with no user turn, under single_turn) with the
-- simulated user and `policy` (clrt.train.policy's shape: the local model, or any function
-- of (conv, sample, key) -> message, tokens, finish_reason), each scored by every metric;
-- every conversation its own clrt.sched task. The futures' conversations, scores and what is
-- known of them go onto the entries (entry.add_future; a lost one: entry.drop). The RL and
-- DPO steps (through M.step) and recipes/build_dataset.lua all score candidates here.
-- o.key_of(e, k): who asks for future k of entry e (its turns' streams and its API bill's tag);
-- o.progress: the progress line's label. Returns clrt.sched.run's info.
function M.score_candidates(entries, policy, tok, cfg, ctx, user, metrics, o)
  local R = cfg.rollout
  local jobs, owner = {}, {}
  for ei, e in ipairs(entries) do
    if not e.truncated then
      local K = cfg.single_turn and 1 or R.num_repeat_rollouts
      for k = 1, K do
        local key = o.key_of(e, k)
        jobs[#jobs + 1] = function()
          -- the future's API calls carry its key, so its tokens and dollars can be told apart
          local fctx = M.tagged_ctx(ctx, key)
          local conv, info = M.copy_conv(e.sample.prompt, e.message), nil
          if not cfg.single_turn then
            local c, i = M.conversation(conv, policy, user, e.sample, fctx, M.rollout_opts(cfg, tok, #e.tokens, key))
            if not c then return { dropped = i.dropped, error = i.error } end
            conv, info = c, i
          end
          local scores, notes = reward.score_conversation(conv, e.sample, metrics, fctx)
          return { conv = conv, scores = scores, about = { key = key, future = k, metric_notes = notes, ended = info and info.ended,
            user_turns = info and info.user_turns, assistant_turns = info and info.assistant_turns,
            tokens = info and info.tokens, user_notes = info and info.user_notes } }
        end
        owner[#jobs] = ei
      end
    end
  end
  local results, jerrs, info = sched.run(jobs, { progress = o.progress })
  failure.check_stop(ctx)
  local bills = M.bills_by_tag(require("clrt.llm").records())
  for j = 1, #jobs do
    local e = entries[owner[j]]
    local r = results[j]
    if jerrs[j] or (r and r.dropped) then
      entry.drop(e, (jerrs[j] and ("error: " .. jerrs[j])) or r.dropped, r and r.error)
    else
      r.about.api = bills[r.about.key]
      entry.add_future(e, r.conv, r.scores, r.about)
    end
  end
  return info
end

-- ctx for one future: its user and judge clients tag every request with `tag` (clrt.llm
-- records it beside the call's usage; it is not sent), everything else is ctx's own.
function M.tagged_ctx(ctx, tag)
  local function wrap(client)
    if type(client) ~= "table" or type(client.chat) ~= "function" then return client end
    return setmetatable({ chat = function(_, messages, opts)
      local o = {}
      for k, v in pairs(opts or {}) do o[k] = v end
      o.tag = tag
      return client:chat(messages, o)
    end }, { __index = client })
  end
  return setmetatable({ user = wrap(ctx.user), client = wrap(ctx.client), judge = wrap(ctx.judge) }, { __index = ctx })
end

-- clrt.llm's records of this step -> {tag = {calls, prompt_tokens, cached_tokens,
-- completion_tokens, usd, roles = {role = usd}}} (clrt.api.usage's sums).
function M.bills_by_tag(records)
  local by = {}
  for _, r in ipairs(records) do
    if r.tag then
      by[r.tag] = by[r.tag] or {}
      table.insert(by[r.tag], r)
    end
  end
  local out = {}
  for tag, list in pairs(by) do
    local s = require("clrt.api.usage").summarize(list)
    local roles = {}
    for role, t in pairs(s.roles) do roles[role] = t.usd end
    out[tag] = { calls = s.all.calls, prompt_tokens = s.all.prompt_tokens, cached_tokens = s.all.cached_tokens,
      completion_tokens = s.all.completion_tokens, usd = s.all.usd, roles = roles }
  end
  return out
end

-- The prefix cache's running totals of prompt tokens asked for and served (clrt.gen.prefix_cache);
-- on = false when the model has none (off, or a model that cannot reuse keys and values).
function M.prefix_cache_totals(m)
  local pc = require("clrt.gen.prefix_cache").of(m)
  if not pc then return { on = false, prompt_tokens = 0, cached_tokens = 0 } end
  return { on = true, prompt_tokens = pc.prompt_tokens, cached_tokens = pc.cached_tokens }
end

return M
