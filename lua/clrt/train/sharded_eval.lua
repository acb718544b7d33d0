-- clrt.train.sharded_eval — Lost in Conversation's protocol (Laban et al., arXiv 2505.06120;
-- microsoft/lost_in_conversation), collabllm_eval.lua protocol=sharded: every sharded task
-- (clrt.train.sharded_tasks) is simulated `simulations` times in each of three settings, all
-- conversations in flight together (clrt.sched):
--   full     one user message holding the original instruction, one assistant reply
--   concat   one user message holding every shard (the first, the intent, then the others
--            as bullets), one assistant reply
--   sharded  the simulated user (lua/interactions/sharded_user.lua) opens with the first shard
--            and reveals at most one more each turn; after every assistant reply a strategy
--            judge says what the reply is (answer_attempt, clarification, interrogation,
--            discussion, hedge, refuse, missing); each answer attempt is scored by the task's
--            metric. The conversation ends at a correct attempt (score 1), after the reply to
--            the last shard, or at max_turns_per_shard user turns per shard (clrt's bound: the
--            authors' loop has none).
-- A conversation's score is its last answer attempt's (0 when it made none), as the authors'
-- simulator keeps it; a FULL or CONCAT reply is always scored (their single-turn simulator
-- extracts an answer without classifying). Tasks whose every reply is an answer (data2text,
-- translation: the authors classify none) skip the judge. A conversation whose simulator
-- failed is dropped; one whose judge or metric failed is left out as failed (never a 0);
-- both are counted. clrt.train.sharded_stats turns the scores into performance, aptitude
-- and unreliability.
--   local results = sharded_eval.run(policy, cfg, tasks, user, classify, ctx)
--   local rep = sharded_eval.report(results, cfg)
--   sharded_eval.print_table(rep); sharded_eval.print_comparison({{name =, report =}, ...})
-- cfg: simulations, seed, max_turns_per_shard, system (the assistant's system text or nil).
-- classify(conversation, sample, ctx) -> a response type (M.judge_classifier's or the world's).
local reward = require("clrt.train.reward")
local rollout = require("clrt.train.rollout")
local stats = require("clrt.train.sharded_stats")
local M = {}

M.SETTINGS = { "full", "concat", "sharded" }
M.SIMULATIONS = 10   -- the paper's simulations per instruction and setting

local function opening(system)
  return system and { { role = "system", content = system } } or {}
end

local function copy(list)
  local out = {}
  for i, m in ipairs(list) do out[i] = { role = m.role, content = m.content } end
  return out
end

-- The sample metrics and the user read for one task: the task's fields and the prompt the
-- assistant starts from (its system message, if any).
function M.sample_of(task, system)
  local s = {}
  for k, v in pairs(task) do s[k] = v end
  s.prompt = opening(system)
  return s
end

-- The strategy judge as a classifier: lua/metrics/answer_attempt.lua (an LLM judge through
-- ctx.judge), its note naming the response type.
function M.judge_classifier(options)
  local m = reward.load_metrics({ answer_attempt = 1 }, options)[1]
  return function(conversation, sample, ctx)
    local v, note = m.compute(conversation, sample, ctx)
    local ty = note and note.parts and note.parts.response_type
    if type(ty) ~= "string" then error("answer_attempt: the judge named no response type (got " .. tostring(v) .. ")", 0) end
    return ty
  end
end

-- One metric's score of a conversation, or nil and why it failed.
local function score(metric, conversation, sample, ctx)
  local v = reward.score_conversation(conversation, sample, { metric }, ctx)[metric.name]
  if v == nil then return nil, metric.name .. " does not apply to task " .. tostring(sample.id) end
  if reward.is_failed(v) then return nil, metric.name .. ": " .. tostring(v.error) end
  return v
end

-- FULL or CONCAT: one message, one reply, scored.
local function single_turn(policy, sample, text, metric, ctx, key)
  local c = copy(sample.prompt)
  c[#c + 1] = { role = "user", content = text }
  local reply = policy(c, sample, key .. "/turn 1")
  if reply == nil then return { dropped = "context full", error = "no room for the reply" } end
  local msg = type(reply) == "table" and reply or { content = reply }
  c[#c + 1] = { role = "assistant", content = msg.content or "" }
  local v, why = score(metric, c, sample, ctx)
  if v == nil then return { failed = why, conversation = c } end
  return { score = v, attempts = { { turn = 1, score = v } }, strategies = {}, conversation = c }
end

-- SHARDED: the user reveals shards, every reply is classified, attempts are scored.
local function sharded(policy, sample, user, classify, metric, ctx, cfg, key)
  -- this conversation's own record of what is out (never shared between conversations)
  local view = setmetatable({ revealed = {} }, { __index = sample })
  local rec = { attempts = {}, strategies = {}, reveals = {} }
  local user_turns, assistant_turns, out = 0, 0, 0
  local function on_turn(role, c, said)
    if role == "user" then
      user_turns = user_turns + 1
      local id = type(said) == "table" and said.shard_id or nil
      if id ~= nil and id ~= -1 and not view.revealed[id] then
        view.revealed[id] = true
        out = out + 1
        rec.reveals[#rec.reveals + 1] = { turn = user_turns, shard_id = id }
      end
      return nil
    end
    assistant_turns = assistant_turns + 1
    local ty = "answer_attempt"
    if not sample.every_turn_answer then
      local ok, t = pcall(classify, c, view, ctx)
      if not ok or type(t) ~= "string" then rec.failed = "strategy judge: " .. tostring(t) return "judge failed" end
      ty = t
    end
    rec.strategies[#rec.strategies + 1] = ty
    if ty == "answer_attempt" then
      local v, why = score(metric, c, view, ctx)
      if v == nil then rec.failed = why return "metric failed" end
      rec.attempts[#rec.attempts + 1] = { turn = assistant_turns, score = v }
      if v >= 1 then return "solved" end
    end
    if out >= #sample.shards then return "all shards" end
    return nil
  end
  local cap = cfg.max_turns_per_shard * #sample.shards
  local c, info = rollout.conversation(sample.prompt, policy, user, view, ctx, { max_user_turns = cap,
    max_assistant_turns = cap, keep_last_assistant = true, seed_key = key, on_turn = on_turn })
  if not c then return { dropped = info.dropped, error = info.error } end
  -- no reply at all (the context full before the first): nothing of the assistant's to score
  if assistant_turns == 0 then return { dropped = "context full", error = "no room for the first reply", conversation = c } end
  local last = rec.attempts[#rec.attempts]
  return { score = last and last.score or 0, attempts = rec.attempts, strategies = rec.strategies, reveals = rec.reveals,
    failed = rec.failed, conversation = c, ended = info.ended, shards_revealed = out }
end

-- Every task x setting x simulation. policy(conv, sample, key) -> reply (clrt.train.policy's).
function M.run(policy, cfg, tasks, user, classify, ctx)
  local sched = require("clrt.sched")
  local names = {}
  for _, t in ipairs(tasks) do names[t.task_metric] = 1 end
  local by_name, loaded = {}, reward.load_metrics(names, ctx.metric_options)
  for _, mt in ipairs(loaded) do by_name[mt.name] = mt end
  -- the code tasks' modules must be in pass_rate's sandbox before any conversation
  tasks = reward.check_samples(loaded, tasks, ctx.metric_options, print)
  local fns, what = {}, {}
  for _, t in ipairs(tasks) do
    local sample = M.sample_of(t, cfg.system)
    local metric = by_name[t.task_metric]
    for _, setting in ipairs(M.SETTINGS) do
      for k = 1, cfg.simulations do
        local key = ("sharded/%s/%s/sim %d"):format(setting, t.id, k)
        what[#what + 1] = { sample = sample, setting = setting, simulation = k }
        fns[#fns + 1] = function()
          local tctx = rollout.tagged_ctx(ctx, key)
          if setting == "sharded" then return sharded(policy, sample, user, classify, metric, tctx, cfg, key) end
          return single_turn(policy, sample, setting == "full" and t.full or t.concat, metric, tctx, key)
        end
      end
    end
  end
  local results, errs = sched.run(fns, { progress = "lost in conversation: conversations" })
  require("clrt.train.failure").check_stop(ctx)
  for i, w in ipairs(what) do
    local r = results[i] or { dropped = "error", error = errs[i] }
    r.sample, r.setting, r.simulation = w.sample, w.setting, w.simulation
    results[i] = r
  end
  return results
end

-- The report of a run: clrt.train.sharded_stats's, with the settings' order and the
-- simulations asked for.
function M.report(results, cfg)
  local rep = stats.report(results, M.SETTINGS)
  rep.protocol, rep.setting_order, rep.simulations = "sharded", M.SETTINGS, cfg.simulations
  rep.max_turns_per_shard = cfg.max_turns_per_shard
  return rep
end

local function cell(s)
  if not s or not s.mean then return ("%15s"):format("-") end
  return ("%6.3f ± %6.3f"):format(s.mean, s.se)
end

-- The printed table: per setting, each task type and overall; then SHARDED against FULL.
function M.print_table(rep)
  print(("%-8s %-22s %5s %5s  %15s  %15s  %15s"):format("setting", "task", "inst", "sims", "performance",
    "aptitude A90", "unrel. U90-10"))
  local names = {}
  for _, n in ipairs(rep.task_order) do names[#names + 1] = n end
  names[#names + 1] = "overall"
  for _, set in ipairs(rep.setting_order) do
    local s = rep.settings[set]
    for _, name in ipairs(names) do
      local g = s and s.groups[name]
      if g then
        local sims = g.simulations_min == g.simulations_max and tostring(g.simulations_min)
          or (g.simulations_min .. "-" .. g.simulations_max)
        print(("%-8s %-22s %5d %5s  %s  %s  %s"):format(set:upper(), name, g.instructions, sims, cell(g.performance),
          cell(g.aptitude), cell(g.unreliability)))
      end
    end
  end
  for _, name in ipairs(names) do
    local d = rep.gap and rep.gap[name]
    if d and d.performance then
      print(("SHARDED - FULL %-22s performance %+.3f%s, aptitude %+.3f, unreliability %+.3f"):format(name, d.performance,
        d.relative_performance and (" (%+.0f%%)"):format(100 * d.relative_performance) or "", d.aptitude or 0, d.unreliability or 0))
    end
  end
  local st = rep.settings.sharded and rep.settings.sharded.strategy
  if st and st.conversations > 0 then
    local parts = {}
    for ty, n in pairs(st.types) do parts[#parts + 1] = ("%s %d"):format(ty, n) end
    table.sort(parts)
    print(("SHARDED replies: %s; answer attempts per conversation %.2f; conversations without one %d of %d"):format(
      table.concat(parts, ", "), st.attempts / st.conversations, st.no_attempt, st.conversations))
  end
end

-- Models or system prompts side by side: one line per variant and group, each setting's
-- performance, SHARDED's relative change from FULL, aptitude and unreliability.
function M.print_comparison(variants)
  print(("%-22s %-34s %7s %7s %7s %8s %7s %7s"):format("task", "variant", "FULL", "CONCAT", "SHARDED", "S-F %",
    "A90 S", "U S"))
  local names = {}
  for _, n in ipairs(variants[1].report.task_order) do names[#names + 1] = n end
  names[#names + 1] = "overall"
  local function mean(v, set, name, key)
    local s = v.report.settings[set]
    local g = s and s.groups[name]
    return g and g[key].mean
  end
  local function num(x, fmt) return x and (fmt):format(x) or "-" end
  for _, name in ipairs(names) do
    for _, v in ipairs(variants) do
      local d = v.report.gap and v.report.gap[name]
      print(("%-22s %-34s %7s %7s %7s %8s %7s %7s"):format(name, v.name:sub(1, 34), num(mean(v, "full", name, "performance"), "%.3f"),
        num(mean(v, "concat", name, "performance"), "%.3f"), num(mean(v, "sharded", name, "performance"), "%.3f"),
        num(d and d.relative_performance and 100 * d.relative_performance, "%+.0f"),
        num(mean(v, "sharded", name, "aptitude"), "%.3f"), num(mean(v, "sharded", name, "unreliability"), "%.3f")))
    end
  end
end

return M
