-- clrt.train.data_engine — the authors' multiturn data engine (Wuyxin/collabllm
-- scripts/engine/build_dataset.py with collabllm/synthetic.py, read as facts), on the RL
-- machinery: from single-turn tasks (clrt.train.tasks) to conversations whose every
-- assistant turn has several scored candidates, in the published collabllm-multiturn schema.
-- For each task a simulated user who holds the whole task opens an empty chat; at each
-- assistant turn `candidates` replies are sampled (the first floor(candidates *
-- proactive_ratio) with the proactive prompt as their system message, the next up to
-- floor(candidates * system_prompt_ratio) with the CollabLLM system prompt, the rest with
-- the chat alone, as the authors split them); each is scored by the multiturn-aware reward
-- with clrt.train.rollout.score_candidates — the futures and metrics of an RL step — and
-- clrt.train.reward.batch_rewards; the best continues the chat, and the user's next message
-- is the one it met in its longest future (the authors' rule; asked afresh when no future
-- reached one). The chat ends when the user ends it or at max_messages messages.
--   local results = engine.build(states, env)
-- states: {sample = a clrt.train.tasks sample} each (a batch built together: every phase's
-- generation and HTTP of all of them in flight at once). env: cfg (the recipe's), ctx, user,
-- tok (the policy's tokenizer, nil for an endpoint without one), m (a local model) or client
-- (ctx.assistant: an OpenAI-compatible endpoint), metrics_of(task_type), weights_of(task_type),
-- prompts = {proactive = text, system = text}. results[i] = {status = "conversation" |
-- "ended_at_once" | "candidates_failed" | "user_failed", ended, rows, turns, candidates,
-- truncated, dropped, error}.
local conversation = require("clrt.conversation")
local json = require("clrt.json")
local rng = require("clrt.rng")
local sched = require("clrt.sched")
local failure = require("clrt.train.failure")
local policy_mod = require("clrt.train.policy")
local reward = require("clrt.train.reward")
local rollout = require("clrt.train.rollout")
local M = {}

-- Candidate c of n: "proactive", "system" or "plain" (synthetic.py: the first
-- int(n * proact_prompt_ratio) replies use the proactive prompt, which drops any system
-- message; the first int(n * add_system_prompt_ratio) chats get the system prompt).
function M.variant_of(c, n, cfg)
  if c <= math.floor(n * cfg.proactive_ratio) then return "proactive" end
  if c <= math.floor(n * cfg.system_prompt_ratio) then return "system" end
  return "plain"
end

local function messages(list)
  local out = {}
  for i, m in ipairs(list) do out[i] = { role = m.role, content = m.content } end
  return json.array(out)
end

-- The chat a candidate of `variant` is sampled from: the history, after its system message.
local function variant_prompt(history, variant, prompts)
  local out = {}
  if variant ~= "plain" then out[1] = { role = "system", content = prompts[variant] } end
  for _, m in ipairs(history) do out[#out + 1] = { role = m.role, content = m.content } end
  return out
end

-- The task's sample as it stands at this turn: its prompt is the history (no system message).
local function turn_sample(st)
  local s = {}
  for k, v in pairs(st.sample) do s[k] = v end
  s.prompt = messages(st.history)
  return s
end

local function conv_key(st, what) return ("build/conv %s/%s"):format(tostring(st.sample.id), what) end

-- An OpenAI-compatible endpoint as the policy of the futures (clrt.train.policy's shape):
-- sampled at rollout.future_temperature (else rollout.temperature) with a seed named by who asks (clrt.rng.seed_of), so a
-- deterministic endpoint repeats; its calls carry the future's key (the API bill's tag).
function M.endpoint_policy(client, cfg)
  local R = cfg.rollout
  return function(conv, _, key)
    local r = client:chat(messages(conv), { temperature = R.future_temperature or R.temperature, top_p = R.top_p,
      max_tokens = R.max_new_tokens,
      seed = key and rng.seed_of(cfg.seed, key) or nil, tag = key and (key:gsub("/turn %d+$", "")) or nil })
    return (policy_mod.reply_message(cfg, r.content or "")), (r.usage or {}).completion_tokens or 0, r.finish_reason or "stop"
  end
end

-- Every state's candidates at this turn, as clrt.train.entry records (group = the state's
-- index, response = the candidate's), from the local model (one batched generate) or the
-- endpoint (every request in flight at once).
local function candidates(states, env, turn_label)
  local cfg, n = env.cfg, env.cfg.candidates
  local entries = {}
  if env.m then
    local vs = {}
    for si, st in ipairs(states) do
      local counts, order = {}, {}
      for c = 1, n do
        local v = M.variant_of(c, n, cfg)
        if not counts[v] then counts[v] = 0; order[#order + 1] = v end
        counts[v] = counts[v] + 1
      end
      local c0 = 0
      for _, v in ipairs(order) do
        vs[#vs + 1] = { si = si, variant = v, n = counts[v], c0 = c0,
          prompt = variant_prompt(st.history, v, env.prompts), key = conv_key(st, ("turn %d/%s"):format(st.turn, v)) }
        c0 = c0 + counts[v]
      end
    end
    local sampled = rollout.first_responses(env.m, env.tok, cfg, vs, env.ctx, {
      key_of = function(i) return vs[i].key end, n_of = function(i) return vs[i].n end,
      progress = turn_label .. ": candidates" })
    for _, e in ipairs(sampled) do
      local v = vs[e.group]
      e.response = v.c0 + e.response
      e.group = v.si
      e.sample = states[v.si].turn_sample
      entries[#entries + 1] = e
    end
  else
    local R, fns, who = cfg.rollout, {}, {}
    for si, st in ipairs(states) do
      for c = 1, n do
        local key = conv_key(st, ("turn %d/candidate %d"):format(st.turn, c))
        fns[#fns + 1] = function()
          return env.client:chat(messages(variant_prompt(st.history, M.variant_of(c, n, cfg), env.prompts)),
            { temperature = R.temperature, top_p = R.top_p, max_tokens = R.max_new_tokens, seed = rng.seed_of(cfg.seed, key),
              tag = key })
        end
        who[#fns] = { si = si, c = c }
      end
    end
    local replies, errs = sched.run(fns, { progress = turn_label .. ": candidates" })
    failure.check_stop(env.ctx)
    for j, w in ipairs(who) do
      local st = states[w.si]
      if errs[j] then
        st.candidates, st.dropped = st.candidates + 1, st.dropped + 1
        st.error = st.error or errs[j]
      else
        local r = replies[j]
        entries[#entries + 1] = rollout.first_entry(cfg, { group = w.si, response = w.c, sample = st.turn_sample,
          prompt_ids = {}, tokens = {}, text = r.content or "", finish_reason = r.finish_reason or "stop" })
      end
    end
  end
  return entries
end

-- The published row of one scored candidate: its prompt (the history), completion, score,
-- the futures (sessions: each whole conversation from the first user message) and every
-- weighted metric's value per session with each session's MR (rewards; null where a metric
-- failed or does not apply).
local function row_of(st, e, score, weights)
  local names = {}
  for name in pairs(weights) do names[#names + 1] = name end
  table.sort(names)
  local rewards = { MR = json.array({}) }
  for _, name in ipairs(names) do rewards[name] = json.array({}) end
  local sessions = json.array({})
  for k, conv in ipairs(e.convs) do
    sessions[k] = messages(conv)
    for _, name in ipairs(names) do
      local v = e.scores[k][name]
      rewards[name][k] = type(v) == "number" and v or json.null
    end
    local mr = reward.reward({ e.scores[k] }, weights, "mean")   -- one session: sum_m w_m s_m
    rewards.MR[k] = mr == nil and json.null or mr
  end
  local s = st.sample
  return { prompt = messages(st.history), completion = e.message.content, score = score, conv_id = s.id,
    turn_id = #st.history, single_turn_prompt = s.single_turn_prompt, single_turn_completion = s.ground_truth,
    single_turn_metadata = s.single_turn_metadata, sessions = sessions, rewards = rewards }
end

-- The user's next message after `best` joined the history: the one in its longest future
-- (the last of the longest on a tie, as the authors' sorted(...)[-1]), or nil when no future
-- went on past it.
local function next_user_message(st, best)
  local pick
  for _, conv in ipairs(best.convs) do
    if #conv > #st.history and (not pick or #conv >= #pick) then pick = conv end
  end
  local msg = pick and pick[#st.history + 1]
  if msg and msg.role == "user" then return msg.content end
  return nil
end

-- The first failed metric of an entry's futures, as one line (why no MR came of them).
function M.first_failure(e)
  for _, sc in ipairs(e.scores) do
    for name, v in pairs(sc) do
      if reward.is_failed(v) then return ("metric %s failed: %s"):format(name, tostring(v.error)) end
    end
  end
  return "no future was scored"
end

local function finish(st, status, ended)
  st.done, st.status, st.ended = true, status, ended
end

-- One user turn for each state in `list` (the opening, or a turn no future reached), through
-- rollout.conversation with one user turn and no assistant turn; key_of(st) names it.
local function user_turns(list, env, label, key_of)
  local fns = {}
  for i, st in ipairs(list) do
    fns[i] = function()
      local sample = turn_sample(st)
      return { rollout.conversation(sample.prompt, function() return nil end, env.user, sample,
        rollout.tagged_ctx(env.ctx, key_of(st)), { max_user_turns = 1, max_assistant_turns = 0, seed_key = key_of(st) }) }
    end
  end
  local outs, errs = sched.run(fns, { progress = label })
  failure.check_stop(env.ctx)
  for i, st in ipairs(list) do
    local c, info = outs[i] and outs[i][1], outs[i] and outs[i][2]
    if errs[i] or not c then
      st.error = st.error or errs[i] or (info and (info.error or info.dropped))
      finish(st, #st.rows > 0 and "conversation" or "user_failed", "user_failed")
    else
      local said = c[#c].content
      st.history[#st.history + 1] = { role = "user", content = said }
      if info.ended == "marker" then
        finish(st, #st.rows > 0 and "conversation" or "ended_at_once", #st.rows > 0 and "user_ended" or "ended_at_once")
      end
    end
  end
end

function M.build(states, env)
  local cfg = env.cfg
  for _, st in ipairs(states) do
    st.history, st.rows, st.turn = {}, {}, 0
    st.candidates, st.truncated, st.dropped, st.turns_done = 0, 0, 0, 0
  end
  user_turns(states, env, "conversations: the user opens", function(st) return conv_key(st, "open") end)
  while true do
    local live = {}
    for _, st in ipairs(states) do if not st.done then live[#live + 1] = st end end
    if #live == 0 then break end
    local label = ("conversations: turn %d"):format(live[1].turn + 1)
    for _, st in ipairs(live) do
      st.turn = st.turn + 1
      st.turn_sample = turn_sample(st)
    end
    local entries = candidates(live, env, label)
    -- the futures and scores, once per task type (each has its metrics and weights)
    local by_type, types = {}, {}
    for _, e in ipairs(entries) do
      local t = live[e.group].sample.task_type
      if not by_type[t] then by_type[t] = {}; types[#types + 1] = t end
      table.insert(by_type[t], e)
    end
    local per_state = {}
    for _, t in ipairs(types) do
      rollout.score_candidates(by_type[t], env.policy, env.tok, cfg, env.ctx, env.user, env.metrics_of(t), {
        key_of = function(e, k)
          return conv_key(live[e.group], ("turn %d/candidate %d/future %d"):format(live[e.group].turn, e.response, k))
        end,
        progress = label .. ": futures and scores" })
      local R = reward.batch_rewards(by_type[t], env.weights_of(t), cfg.reward.mode)
      for i, e in ipairs(by_type[t]) do
        e.reward = R.rewards[i]
        per_state[e.group] = per_state[e.group] or {}
        table.insert(per_state[e.group], e)
      end
    end
    local need_user = {}
    for si, st in ipairs(live) do
      local best, scored = nil, 0
      for _, e in ipairs(per_state[si] or {}) do
        st.candidates = st.candidates + 1
        if e.truncated then st.truncated = st.truncated + 1
        elseif e.reward == nil then
          st.dropped = st.dropped + 1
          st.error = st.error or (e.dropped and tostring(e.drop_error or e.dropped)) or M.first_failure(e)
        else
          scored = scored + 1
          st.rows[#st.rows + 1] = row_of(st, e, e.reward, env.weights_of(st.sample.task_type))
          if not best or e.reward > best.reward or (e.reward == best.reward and e.response < best.response) then best = e end
        end
      end
      if scored == 0 then
        finish(st, #st.rows > 0 and "conversation" or "candidates_failed", "candidates_failed")
      else
        st.turns_done = st.turns_done + 1
        st.history[#st.history + 1] = { role = "assistant", content = best.message.content }
        if #st.history >= cfg.max_messages then finish(st, "conversation", "max_messages")
        else
          local said = next_user_message(st, best)
          if said then
            st.history[#st.history + 1] = { role = "user", content = said }
            if conversation.has_marker(said, conversation.marker(env.ctx, st.sample)) then finish(st, "conversation", "user_ended")
            elseif #st.history >= cfg.max_messages then finish(st, "conversation", "max_messages") end
          else
            need_user[#need_user + 1] = st
          end
        end
      end
    end
    if #need_user > 0 then
      user_turns(need_user, env, label .. ": the user's next message", function(st) return conv_key(st, ("turn %d/user"):format(st.turn)) end)
      for _, st in ipairs(need_user) do
        if not st.done and #st.history >= cfg.max_messages then finish(st, "conversation", "max_messages") end
      end
    end
  end
  local out = {}
  for i, st in ipairs(states) do
    out[i] = { status = st.status, ended = st.ended, rows = st.rows, turns = st.turns_done,
      messages = #st.history, candidates = st.candidates, truncated = st.truncated, dropped = st.dropped,
      error = st.error and tostring(st.error) or nil }
  end
  return out
end

return M
