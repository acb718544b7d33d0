-- clrt.train.rollout — the conversations of an RL step (spec steps 2-4) and of evaluation:
-- the policy as a function of the conversation, the future-conversation loop with the
-- simulated user, one step's first responses + futures + scores, greedy evaluation on the
-- built-in world and validation on dataset prompts. Everything runs inside clrt.sched tasks,
-- so policy turns of all conversations share batched generate calls while simulator and
-- judge requests are in flight.
--   local policy = rollout.policy(m, tok, cfg, seed)                  -- conv -> reply, ntok, finish
--   local conv, info = rollout.conversation(conv, policy, user, sample, ctx, opts)
--   local entries, timing = rollout.step(m, tok, cfg, samples, ctx, user, metrics, step)
--   local rep = rollout.validate(m, tok, cfg, samples, user, ctx, metrics)
-- cfg is the RL recipe's config (rollout, chat, eval, seed, single_turn); ctx and user come
-- from clrt.train.context.
local reward = require("clrt.train.reward")
local M = {}

-- Roll one conversation forward after the first response (spec step 4). Plain sequential
-- code: run it inside a clrt.sched coroutine and `policy` / `user.respond` may yield.
--   conversation  messages ending with A1 (copied; the input is not modified)
--   policy(conv, sample) -> reply text (or a message table {content=, reasoning_content=}),
--                 tokens generated, finish_reason; nil when the context has no room left
--   user          a lua/interactions plug-in: user.respond(conv, sample, ctx) -> text
-- opts: max_user_turns (2), max_assistant_turns (= max_user_turns: future assistant
--   turns), keep_last_assistant (true: the authors' A1 U1 A2 U2 A3; false: verl's
--   A1 U1 A2 U2 — the last assistant turn is then never generated at all),
--   token_budget (nil = none) with verl's rule: first_tokens (A1's tokens) + every user
--   turn's tokens (count_tokens(text)) + every later assistant turn's tokens; the turn that
--   would cross the budget is discarded and the conversation ends there.
-- A full context (policy returns nil) ends the conversation; no empty turn is added.
-- The simulated user's message with the termination marker stays in the conversation.
-- Returns conv, info {ended = "marker" | "max_user_turns" | "max_assistant_turns" |
--   "token_budget" | "context_full", user_turns, assistant_turns, tokens}; or nil,
--   {dropped = reason} when the user plug-in raised or returned an empty message.
function M.conversation(conversation, policy, user, sample, ctx, opts)
  opts = opts or {}
  local conv = require("clrt.conversation")
  local max_user = opts.max_user_turns or 2
  local max_asst = opts.max_assistant_turns or max_user
  local keep_last = opts.keep_last_assistant ~= false
  local budget = opts.token_budget
  local c = conv.copy(conversation)
  local info = { user_turns = 0, assistant_turns = 0, tokens = opts.first_tokens or 0 }
  local function over(n) return budget and info.tokens + n > budget end
  while true do
    if info.user_turns >= max_user then info.ended = "max_user_turns" break end
    local ok, text = pcall(user.respond, c, sample, ctx)
    if not ok then return nil, { dropped = "simulator failed", error = tostring(text) } end
    if type(text) ~= "string" or conv.trim(text) == "" then
      return nil, { dropped = "simulator failed", error = "empty user message" }
    end
    local nuser = (budget and opts.count_tokens) and opts.count_tokens(text) or 0
    if over(nuser) then info.ended = "token_budget" break end
    c[#c + 1] = { role = "user", content = text }
    info.user_turns = info.user_turns + 1
    info.tokens = info.tokens + nuser
    if conv.has_marker(text, conv.marker(ctx, sample)) then info.ended = "marker" break end
    if info.assistant_turns >= max_asst then info.ended = "max_assistant_turns" break end
    if not keep_last and info.user_turns >= max_user then info.ended = "max_user_turns" break end
    local reply, ntok = policy(c, sample)
    if reply == nil then info.ended = "context_full" break end
    if over(ntok or 0) then info.ended = "token_budget" break end
    local msg = type(reply) == "table" and reply or { content = reply }
    c[#c + 1] = { role = "assistant", content = msg.content or "", reasoning_content = msg.reasoning_content }
    info.assistant_turns = info.assistant_turns + 1
    info.tokens = info.tokens + (ntok or 0)
  end
  return c, info
end

-- Context length: max_len, or the prompt limit plus the future budget, capped by the model.
function M.context_len(m, R)
  local want = R.max_len or ((R.max_prompt_len or 0) + (R.token_budget or R.max_new_tokens or 0))
  return math.min(want, m.config.max_position_embeddings or math.huge)
end

-- Render options every call shares (Qwen3's enable_thinking reaches each render).
function M.render_opts(cfg)
  local c = cfg.chat or {}
  return { add_generation_prompt = true, enable_thinking = c.enable_thinking }
end

-- A generated reply as the conversation keeps it: with chat.strip_think the visible text in
-- `content` and the think block in `reasoning_content` (the chat template renders it back
-- where the model's own template would); ok/why: verl's validity of a first response.
function M.reply_message(cfg, text)
  local conv = require("clrt.conversation")
  local visible, reasoning, ok, why = conv.split_think(text)
  if cfg.chat and cfg.chat.strip_think == false then
    return { role = "assistant", content = text }, ok, why
  end
  return { role = "assistant", content = visible, reasoning_content = reasoning }, ok, why
end

-- The policy as rollout.conversation wants it: a conversation -> the next assistant message, its
-- token count and finish reason; nil when the context has no room for a reply.
function M.policy(m, tok, cfg, seed)
  local stop = clrt.chat.stop_ids(tok)
  local R = cfg.rollout
  local temperature = R.future_temperature or R.temperature
  local ctx_len = M.context_len(m, R)
  local ropts = M.render_opts(cfg)
  return function(conv)
    local ids = clrt.chat.render(tok, conv, ropts)
    local room = ctx_len - #ids
    if room < 1 then return nil, 0 end
    local out = clrt.sched.generate(m, ids, { n = 1, temperature = temperature, top_p = R.top_p,
      max_new_tokens = math.min(R.max_new_tokens, room), stop = stop, tokenizer = tok, seed = seed })[1]
    return (M.reply_message(cfg, out.text or "")), #out.tokens, out.finish_reason
  end
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

-- Options of rollout.conversation from the config (the token budget counts user turns with `tok`).
function M.rollout_opts(cfg, tok, first_tokens)
  local R = cfg.rollout
  return { max_user_turns = R.max_user_turns, max_assistant_turns = R.max_assistant_turns,
    keep_last_assistant = R.keep_last_assistant, token_budget = R.token_budget, first_tokens = first_tokens,
    count_tokens = function(text) return #tok:encode(text, { add_special_tokens = false }) end }
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
  local entries, timing = M.step_local(m, tok, cfg, samples, ctx, user, metrics, step)
  return dp.gather_entries(entries, all_samples, first, ctx), timing
end

function M.step_local(m, tok, cfg, samples, ctx, user, metrics, step)
  local sched = require("clrt.sched")
  local stop = clrt.chat.stop_ids(tok)
  local R = cfg.rollout
  local seed = cfg.seed * 1000003 + step * 101
  local ctx_len = M.context_len(m, R)
  local ropts = M.render_opts(cfg)
  local t0 = clrt.log.now()
  -- Phase 1: first responses, all prompts in one batched generate.
  local fns = {}
  for i, s in ipairs(samples) do
    fns[i] = function()
      local ids = clrt.chat.render(tok, s.prompt, ropts)
      local room = math.max(1, math.min(R.max_new_tokens, ctx_len - #ids))
      -- rollout.quant=int8: each token's temperature-1 log-probability under the int8 weights
      -- that sampled it, for the update's truncated importance sampling
      local outs = sched.generate(m, ids, { n = R.n, temperature = R.temperature, top_p = R.top_p,
        max_new_tokens = room, stop = stop, tokenizer = tok, seed = seed,
        top_logprobs = R.quant == "int8" and 0 or nil })
      return { ids = ids, outs = outs }
    end
  end
  local firsts, errs = sched.run(fns)
  M.check_stop()
  for i in pairs(errs) do error(("collabllm_rl: sampling the first responses of prompt %d failed: %s"):format(i, errs[i]), 0) end
  local t_gen1 = clrt.log.now() - t0
  local entries = {}
  for i, s in ipairs(samples) do
    for _, o in ipairs(firsts[i].outs) do
      local text = o.text or ""
      local msg, valid, why = M.reply_message(cfg, text)
      -- cut by the length limit, empty or malformed: rollout.cutoff_reward and no futures
      local truncated = o.finish_reason ~= "stop" or not valid
      local rollout_lp
      if o.model_logprobs then
        rollout_lp = {}
        for j, t in ipairs(o.model_logprobs) do rollout_lp[j] = t.lp end
      end
      entries[#entries + 1] = { group = i, sample = s, prompt_ids = firsts[i].ids, tokens = o.tokens,
        text = text, message = msg, logprobs_sampled = o.logprobs, logprobs_rollout = rollout_lp, truncated = truncated,
        cutoff_reward = truncated and R.cutoff_reward or nil,
        invalid = o.finish_reason == "stop" and not valid and why or nil, scores = {}, convs = {} }
    end
  end
  -- Phase 2: futures (or the single turn) and their scores, every conversation its own task.
  local policy = M.policy(m, tok, cfg, seed + 1)
  local jobs, owner = {}, {}
  for ei, e in ipairs(entries) do
    if not e.truncated then
      local K = cfg.single_turn and 1 or R.num_repeat_rollouts
      for _ = 1, K do
        jobs[#jobs + 1] = function()
          local conv = M.copy_conv(e.sample.prompt, e.message)
          if not cfg.single_turn then
            local c, info = M.conversation(conv, policy, user, e.sample, ctx, M.rollout_opts(cfg, tok, #e.tokens))
            if not c then return { dropped = info.dropped, error = info.error } end
            conv = c
          end
          return { conv = conv, scores = reward.score_conversation(conv, e.sample, metrics, ctx) }
        end
        owner[#jobs] = ei
      end
    end
  end
  local results, jerrs, info = sched.run(jobs)
  M.check_stop()
  for j = 1, #jobs do
    local e = entries[owner[j]]
    local r = results[j]
    if jerrs[j] or (r and r.dropped) then
      e.dropped = (jerrs[j] and ("error: " .. jerrs[j])) or r.dropped
      e.drop_error = e.drop_error or (r and r.error)
    else
      e.scores[#e.scores + 1] = r.scores
      e.convs[#e.convs + 1] = r.conv
    end
  end
  -- decode steps taken while a metric's program (pass_rate's tests) ran: the engine's work
  -- that a blocking test run would have held back
  return entries, { generate_first_s = t_gen1, rollout_s = clrt.log.now() - t0 - t_gen1,
    engine_steps_during_tests = info and info.engine_steps_during_procs or 0 }
end

-- Greedy conversations with the world's user on held-out prompts -> world.summarize numbers.
function M.evaluate(m, tok, cfg, world, user, ctx)
  local sched = require("clrt.sched")
  local samples = world.eval_prompts(cfg.eval.prompts, cfg.eval.seed)
  local ecfg = { rollout = {}, seed = cfg.seed }
  for k, v in pairs(cfg.rollout) do ecfg.rollout[k] = v end
  ecfg.rollout.temperature = cfg.eval.temperature
  ecfg.rollout.future_temperature = cfg.eval.temperature
  local policy = M.policy(m, tok, ecfg, cfg.eval.seed)
  local fns = {}
  for i, s in ipairs(samples) do
    fns[i] = function()
      local first = policy(s.prompt)
      local conv = M.copy_conv(s.prompt, first or "")
      local c = M.conversation(conv, policy, user, s, ctx, { max_user_turns = cfg.rollout.max_user_turns,
        max_assistant_turns = cfg.rollout.max_assistant_turns, keep_last_assistant = true })
      return { sample = s, conversation = c or conv }
    end
  end
  local results, errs = sched.run(fns)
  for i in pairs(errs) do error("collabllm_rl: evaluation conversation " .. i .. " failed: " .. errs[i], 0) end
  return world.summarize(results), results
end

-- Validation on dataset samples (data_val= during RL, and collabllm_eval.lua): a greedy
-- first response, futures with the simulated user as in training, every metric in
-- `metrics`. cfg: rollout, chat, eval.temperature. Returns a report {conversations,
-- dropped, invalid, failed = {metric = n}, metrics = {metric = mean}, first_reply_ask_rate,
-- tokens_per_conversation (words after the prompt)} and the per-sample results.
function M.validate(m, tok, cfg, samples, user, ctx, metrics)
  local sched, conversation = require("clrt.sched"), require("clrt.conversation")
  local ecfg = { rollout = {}, chat = cfg.chat }
  for k, v in pairs(cfg.rollout) do ecfg.rollout[k] = v end
  ecfg.rollout.temperature, ecfg.rollout.future_temperature = cfg.eval.temperature, cfg.eval.temperature
  local policy = M.policy(m, tok, ecfg, cfg.eval.seed or 0)
  local fns = {}
  for i, s in ipairs(samples) do
    fns[i] = function()
      local first, ntok, finish = policy(s.prompt)
      if first == nil then return { sample = s, invalid = "prompt leaves no room for a reply" } end
      local _, ok, why = M.reply_message(ecfg, first.content or "")
      local conv = M.copy_conv(s.prompt, first)
      if finish ~= "stop" or not ok then
        return { sample = s, conversation = conv, invalid = (finish ~= "stop") and "first reply cut at the length limit" or why }
      end
      local c, info = M.conversation(conv, policy, user, s, ctx, M.rollout_opts(ecfg, tok, ntok))
      if not c then return { sample = s, dropped = info.dropped, error = info.error } end
      return { sample = s, conversation = c, scores = reward.score_conversation(c, s, metrics, ctx) }
    end
  end
  local results, errs = sched.run(fns)
  local rep = { conversations = 0, dropped = 0, invalid = 0, failed = {}, metrics = {} }
  local sums, counts, asks, words = {}, {}, 0, 0
  for i = 1, #samples do
    local r = results[i]
    if errs[i] or not r or r.dropped then
      rep.dropped = rep.dropped + 1
      rep.first_drop = rep.first_drop or tostring(errs[i] or (r.dropped .. ": " .. tostring(r.error)))
    else
      rep.conversations = rep.conversations + 1
      if r.invalid then rep.invalid = rep.invalid + 1 end
      for _, mt in ipairs(metrics) do
        -- an invalid first reply scores 0 on every metric, as it earns reward 0 in training
        local v = r.scores and r.scores[mt.name] or 0
        if reward.is_failed(v) then rep.failed[mt.name] = (rep.failed[mt.name] or 0) + 1
        else sums[mt.name] = (sums[mt.name] or 0) + v; counts[mt.name] = (counts[mt.name] or 0) + 1 end
      end
      local first = conversation.first_reply(r.conversation, r.sample)
      if first and conversation.asks_question(first) then asks = asks + 1 end
      for _, msg in ipairs(conversation.after_prompt(r.conversation, r.sample)) do
        words = words + conversation.word_count(msg.content)
      end
    end
  end
  for name, n in pairs(counts) do rep.metrics[name] = sums[name] / n end
  local n = math.max(rep.conversations, 1)
  rep.first_reply_ask_rate, rep.tokens_per_conversation = asks / n, words / n
  return rep, results
end

-- A validation report as metrics.jsonl fields: val/<metric>, val/failed/<metric>, ...
function M.val_row(rep, row)
  for name, v in pairs(rep.metrics) do row["val/" .. name] = v end
  for name, v in pairs(rep.failed) do row["val/failed/" .. name] = v end
  row["val/first_reply_ask_rate"] = rep.first_reply_ask_rate
  row["val/tokens_per_conversation"] = rep.tokens_per_conversation
  row["val/dropped"], row["val/invalid"] = rep.dropped, rep.invalid
  return row
end


-- Ctrl-C (which a scheduler task may have caught as its own error) or a refused API key
-- stops the run here, between phases, with one line.
function M.check_stop()
  clrt.check_interrupt()
  local llm = package.loaded["clrt.llm"]
  local auth = llm and llm.take_auth_error()
  if auth then error("collabllm_rl: " .. auth .. "; fix the key (or its api_key_env) and resume", 0) end
end

-- Why a step's samples were lost: {cause = count} and the first error message. A step
-- fails when more than max_drop_fraction of its first responses that went on to futures
-- and scores were dropped, or a metric failed on every conversation it scored.
function M.step_failure(cfg, entries, R)
  local causes, first = {}, nil
  for _, e in ipairs(entries) do
    if e.dropped then
      local cause = e.dropped:match("^error: ") and "task error" or e.dropped
      causes[cause] = (causes[cause] or 0) + 1
      first = first or (e.drop_error and (e.dropped .. ": " .. tostring(e.drop_error))) or e.dropped
    end
  end
  local scored = #entries - R.dropped - R.truncated
  local all_failed = {}
  for name, n in pairs(R.failed or {}) do
    if n > 0 and R.metrics[name] == nil then
      all_failed[#all_failed + 1] = name
      if not first then
        for _, e in ipairs(entries) do
          for _, sc in ipairs(e.scores) do
            local v = sc[name]
            if reward.is_failed(v) then first = first or ("metric " .. name .. ": " .. tostring(v.error)) end
          end
        end
      end
    end
  end
  table.sort(all_failed)
  -- the share of the samples that went on to the simulator and judges (a first reply cut
  -- at the length limit is scored 0 without them)
  local sent = #entries - R.truncated
  local frac = sent > 0 and R.dropped / sent or 0
  local failed = frac > cfg.max_drop_fraction or #all_failed > 0
  local why
  if failed then
    why = frac > cfg.max_drop_fraction
      and ("%d of %d samples dropped"):format(R.dropped, sent)
      or ("metric %s failed on every conversation (%d scored)"):format(table.concat(all_failed, ", "), scored)
  end
  return failed, why, causes, first
end

-- A step's row on the log with its failure marked (dropped/<cause>, failed_step = 1); a failed
-- step is printed and counted. Returns the run's count of failed steps so far, and raises
-- once it reaches cfg.max_failed_steps.
function M.log_step(lg, cfg, step, row, entries, R, failed_steps)
  local failed, why, causes, first_msg = M.step_failure(cfg, entries, R)
  for cause, n in pairs(causes) do row["dropped/" .. cause] = n end
  if failed then row.failed_step = 1 end
  lg:log(step, row)
  if not failed then return failed_steps end
  failed_steps = failed_steps + 1
  lg:print(("step %d failed (%d of %d allowed): %s; first: %s"):format(step, failed_steps, cfg.max_failed_steps,
    why, tostring(first_msg)))
  if failed_steps >= cfg.max_failed_steps then
    error(("collabllm_rl: stopped after %d failed steps (max_failed_steps); step %d: %s; first: %s")
      :format(failed_steps, step, why, tostring(first_msg)), 0)
  end
  return failed_steps
end

M.make_policy = M.policy

return M
