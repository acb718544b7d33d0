-- clrt.train.sharded_stats — Lost in Conversation's quantities (arXiv 2505.06120) from
-- simulated conversations. For one instruction simulated N times in one setting, with scores
-- S = {S_1 .. S_N} in [0, 1]:
--   performance    P = mean(S)
--   aptitude       A = percentile_90(S)
--   unreliability  U = percentile_90(S) - percentile_10(S)
-- Percentiles by linear interpolation between the sorted scores (numpy.percentile's
-- default). Per task type and overall, each is averaged over the instructions (mean ±
-- standard error over instructions; clrt.train.paper_eval.mean_se). Scores stay in [0, 1];
-- the paper prints them x100.
--   local q = stats.instruction({1, 0, 1, 1})       -- {n, performance, aptitude, unreliability}
--   local rep = stats.report(results, {"full", "concat", "sharded"})
local mean_se = require("clrt.train.paper_eval").mean_se
local M = {}

-- The p-th percentile (0..100) of a list of numbers, linear between order statistics.
function M.percentile(xs, p)
  local s = {}
  for i, x in ipairs(xs) do s[i] = x end
  table.sort(s)
  local n = #s
  if n == 0 then return nil end
  local pos = (n - 1) * p / 100
  local lo = math.floor(pos)
  local frac = pos - lo
  if lo + 1 >= n then return s[n] end
  return s[lo + 1] + frac * (s[lo + 2] - s[lo + 1])
end

-- The three quantities of one instruction's scores.
function M.instruction(scores)
  local m = mean_se(scores)
  local p90, p10 = M.percentile(scores, 90), M.percentile(scores, 10)
  return { n = #scores, performance = m.mean, aptitude = p90, unreliability = p90 - p10 }
end

M.QUANTITIES = { "performance", "aptitude", "unreliability" }

-- results: the conversations ({sample = task, setting, score, dropped, failed, strategies,
-- attempts}); settings: their order. Returns {settings = {name = {groups = {task type and
-- "overall" = {instructions, simulations, performance, aptitude, unreliability (each mean ±
-- se), ...}}}}, gap = SHARDED - FULL per group, task_order, conversations, dropped, failed}.
function M.report(results, settings)
  local scores, order, tasks_of = {}, {}, {}
  local rep = { conversations = 0, dropped = 0, failed = 0, settings = {}, dropped_by = {} }
  local strategy = {}
  for _, r in ipairs(results) do
    local set = r.setting
    if r.dropped then
      rep.dropped = rep.dropped + 1
      rep.dropped_by[r.dropped] = (rep.dropped_by[r.dropped] or 0) + 1
      rep.first_drop = rep.first_drop or (tostring(r.dropped) .. ": " .. tostring(r.error))
    elseif r.failed then
      rep.failed = rep.failed + 1
      rep.first_failure = rep.first_failure or tostring(r.failed)
    else
      rep.conversations = rep.conversations + 1
      local t = r.sample
      scores[set] = scores[set] or {}
      if not scores[set][t.id] then
        scores[set][t.id] = {}
        order[set] = order[set] or {}
        table.insert(order[set], t.id)
        tasks_of[t.id] = t.task
      end
      table.insert(scores[set][t.id], r.score)
      local st = strategy[set] or { types = {}, attempts = 0, no_attempt = 0, conversations = 0 }
      strategy[set] = st
      st.conversations = st.conversations + 1
      st.attempts = st.attempts + #(r.attempts or {})
      if #(r.attempts or {}) == 0 then st.no_attempt = st.no_attempt + 1 end
      for _, ty in ipairs(r.strategies or {}) do st.types[ty] = (st.types[ty] or 0) + 1 end
    end
  end
  local task_names = {}
  for _, name in pairs(tasks_of) do task_names[name] = true end
  rep.task_order = {}
  for name in pairs(task_names) do rep.task_order[#rep.task_order + 1] = name end
  table.sort(rep.task_order)
  for _, set in ipairs(settings) do
    local per = { overall = {} }
    local sims = {}
    for _, id in ipairs(order[set] or {}) do
      local q = M.instruction(scores[set][id])
      local name = tasks_of[id]
      per[name] = per[name] or {}
      table.insert(per[name], q)
      table.insert(per.overall, q)
      sims[name] = sims[name] or {}
      table.insert(sims[name], q.n)
      sims.overall = sims.overall or {}
      table.insert(sims.overall, q.n)
    end
    local groups = {}
    for name, list in pairs(per) do
      local g = { instructions = #list }
      for _, key in ipairs(M.QUANTITIES) do
        local xs = {}
        for i, q in ipairs(list) do xs[i] = q[key] end
        g[key] = mean_se(xs)
      end
      local s = sims[name] or {}
      g.simulations_min, g.simulations_max = math.huge, 0
      for _, n in ipairs(s) do g.simulations_min, g.simulations_max = math.min(g.simulations_min, n), math.max(g.simulations_max, n) end
      if #s == 0 then g.simulations_min = 0 end
      groups[name] = g
    end
    rep.settings[set] = { groups = groups, strategy = strategy[set] }
  end
  rep.gap = M.gap(rep, "sharded", "full")
  return rep
end

-- to - from per group and quantity (both present), with the relative change of performance
-- ((to - from) / from; the paper's "degradation" of SHARDED against FULL).
function M.gap(rep, to, from)
  local a, b = rep.settings[to], rep.settings[from]
  if not (a and b) then return nil end
  local out = {}
  for name, g in pairs(a.groups) do
    local f = b.groups[name]
    if f then
      local d = {}
      for _, key in ipairs(M.QUANTITIES) do
        if g[key].mean and f[key].mean then d[key] = g[key].mean - f[key].mean end
      end
      if d.performance and f.performance.mean ~= 0 then d.relative_performance = d.performance / f.performance.mean end
      out[name] = d
    end
  end
  return out
end

return M
