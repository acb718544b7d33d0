-- clrt.train.reward — from finished conversations to advantages (spec steps 5-6): metric
-- plug-ins loaded by name, every conversation scored once per metric, the multiturn-aware
-- reward in both modes of the spec, and group-normalised (GRPO) advantages.
--   local metrics = reward.load_metrics(cfg.reward.metric_weights)   -- lua/metrics/<name>.lua
--   local s = reward.score_conversation(conv, sample, metrics, ctx)   -- ctx: clrt.train.context
--   local r = reward.reward(list_of_s, weights, "verl")               -- or "mean"
--   local R = reward.batch_rewards(samples, weights, mode)            -- drops, failures, stats
--   local A = reward.group_advantages(R.rewards, groups)              -- (r - mean)/(std + 1e-6)
local M = {}

local function clamp(x, lo, hi) return math.max(lo, math.min(hi, x)) end

-- A failed metric value: a table so it can never be mistaken for a score.
local failed_mt = { __tostring = function(f) return "failed(" .. tostring(f.error) .. ")" end }
function M.failed(err) return setmetatable({ error = err }, failed_mt) end
function M.is_failed(v) return type(v) == "table" and getmetatable(v) == failed_mt end

---------------------------------------------------------------- metrics
local plugins = require("clrt.plugins")
local function metric_known(name) return plugins.find("metrics", name) ~= nil end

-- A run's reward settings ({metric_weights =, metric_options =}) before anything loads:
-- every weight names a metric plug-in and is a finite number, every options entry names a
-- metric and is a table. Raises one line per bad key, each starting with who.
function M.check_config(rcfg, who)
  local json, errs = require("clrt.json"), {}
  local w = rcfg.metric_weights
  if type(w) ~= "table" or next(w) == nil then
    errs[#errs + 1] = who .. ": reward.metric_weights must name at least one metric, got " .. json.encode(w or {})
  else
    for name, v in pairs(w) do
      if not metric_known(name) then
        errs[#errs + 1] = ("%s: reward.metric_weights: unknown metric '%s' (no metrics/%s.lua in %s; known: %s; a file: its path)")
          :format(who, tostring(name), tostring(name), plugins.searched("metrics"), table.concat(plugins.known("metrics"), ", "))
      elseif type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge then
        errs[#errs + 1] = ("%s: reward.metric_weights.%s must be a finite number, got %s"):format(who, name, json.encode(v))
      end
    end
  end
  for name, v in pairs(rcfg.metric_options or {}) do
    if not metric_known(name) then
      errs[#errs + 1] = ("%s: reward.metric_options: unknown metric '%s'"):format(who, tostring(name))
    elseif type(v) ~= "table" then
      errs[#errs + 1] = ("%s: reward.metric_options.%s must be a table of options, got %s"):format(who, name, tostring(v))
    elseif v.prompt_file ~= nil then   -- a judge's prompt of one's own: readable before anything runs
      local ok, err = pcall(require("clrt.prompt_file").read, v.prompt_file)
      if not ok then errs[#errs + 1] = ("%s: reward.metric_options.%s.prompt_file: %s"):format(who, name, tostring(err)) end
    end
  end
  if #errs > 0 then error(table.concat(errs, "\n"), 0) end
end

-- Load lua/metrics/<name>.lua for every metric named in weights (a weight of 0 still loads:
-- the value is logged even when it does not count). A plug-in's prepare(options), when it
-- has one, runs here with reward.metric_options[name]: a metric that cannot work on this
-- machine (pass_rate without its sandbox) stops the run before it starts.
function M.load_metrics(weights, options)
  local out = {}
  local names = {}
  for name in pairs(weights) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local ok, m = pcall(plugins.load, "metrics", name)
    local where = plugins.find("metrics", name) or ("metrics/" .. tostring(name) .. ".lua")
    if not ok then error(("clrt.train.reward: cannot load metric '%s' (%s): %s"):format(name, where, m), 2) end
    if type(m) ~= "table" or type(m.compute) ~= "function" then
      error(("clrt.train.reward: %s must return {name = ..., compute = function(conversation, sample, ctx)}"):format(where), 2)
    end
    if type(m.prepare) == "function" then m.prepare((options or {})[name] or {}) end
    out[#out + 1] = { name = name, compute = m.compute, metric = m }
  end
  return out
end

-- Before the first step, with the run's samples: a plug-in's check_samples(samples, options), when
-- it has one, may stop the run (pass_rate: a module the code tasks need is missing in the
-- sandbox) or return the samples to keep and how many it left out (logged once).
-- Returns the samples to run.
function M.check_samples(metrics, samples, options, log)
  for _, m in ipairs(metrics) do
    if m.metric and type(m.metric.check_samples) == "function" then
      local kept, left_out = m.metric.check_samples(samples, (options or {})[m.name] or {})
      if left_out and left_out > 0 and log then
        log(("%s: %d of %d rows left out before the run"):format(m.name, left_out, #samples))
      end
      samples = kept or samples
    end
  end
  return samples
end

-- Run every metric on one finished conversation, once each: a metric that raises or
-- returns a non-finite / non-number value is recorded as failed. Nothing is retried here
-- (DESIGN.md "Retries in two places": the judge's unusable replies are asked again in
-- clrt.llm_reply, transport failures in the HTTP client); opts is accepted and ignored.
-- A metric whose plug-in has applies(sample) returning false (pass_rate on a row without
-- tests) is not applicable: left out of the result, neither a score nor a failure.
-- A metric may return a second value, a table saying why (a judge's "thought" and its parts:
-- metrics.lib.judge.note); it is kept beside the score for the run's rollouts.jsonl, never
-- in the scores themselves (the reward reads only numbers).
-- Returns {name = number | rl.failed(err)}, {name = the metric's note} (names without one absent).
function M.score_conversation(conversation, sample, metrics, ctx, opts)
  local out, notes = {}, {}
  for _, m in ipairs(metrics) do
    if not (m.metric and m.metric.applies) or m.metric.applies(sample) then
      local ok, v, note = pcall(m.compute, conversation, sample, ctx)
      if ok and type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge then
        out[m.name] = v
        if type(note) == "table" then notes[m.name] = note end
      else
        out[m.name] = M.failed(ok and ("returned " .. tostring(v) .. ", not a finite number") or tostring(v))
      end
    end
  end
  return out, notes
end

-- The reward of one first response from the scores of its K future conversations.
--   verl: r = sum_m clamp(w_m * mean_k s_m(conv_k), -1, 1)
--   mean: r = mean_k sum_m w_m * s_m(conv_k)
-- Failed values never count as 0: in verl mode a metric's mean is over the conversations
-- where it succeeded; in mean mode a conversation with any failed weighted metric is left
-- out. When nothing is left to average (every conversation failed a weighted metric),
-- the reward is nil and the caller drops the sample.
-- Returns r (or nil), info {metrics = {name = mean over successes}, failed = {name = count}}.
function M.reward(scores, weights, mode)
  mode = mode or "verl"
  local names = {}
  for name in pairs(weights) do names[#names + 1] = name end
  table.sort(names)
  local info = { metrics = {}, failed = {} }
  for _, name in ipairs(names) do
    local sum, n, nf = 0, 0, 0
    for _, s in ipairs(scores) do
      local v = s[name]
      if type(v) == "number" then sum, n = sum + v, n + 1 elseif v ~= nil then nf = nf + 1 end
    end
    info.metrics[name] = n > 0 and sum / n or nil
    if nf > 0 then info.failed[name] = nf end
  end
  if #scores == 0 then return nil, info end
  if mode == "verl" then
    local r = 0
    for _, name in ipairs(names) do
      local w = weights[name]
      local mean = info.metrics[name]
      if w ~= 0 and mean ~= nil then
        r = r + clamp(w * mean, -1, 1)
      elseif w ~= 0 and info.failed[name] then   -- failed everywhere: no reward to give
        return nil, info
      end                                         -- not applicable anywhere: no term
    end
    return r, info
  elseif mode == "mean" then
    local total, n = 0, 0
    for _, s in ipairs(scores) do
      local sum, ok = 0, true
      for _, name in ipairs(names) do
        local w = weights[name]
        if w ~= 0 and s[name] ~= nil then
          if type(s[name]) ~= "number" then ok = false break end
          sum = sum + w * s[name]
        end
      end
      if ok then total, n = total + sum, n + 1 end
    end
    if n == 0 then return nil, info end
    return total / n, info
  end
  error("rl.reward: mode must be 'verl' or 'mean', got " .. tostring(mode), 2)
end

-- Rewards for a batch of first responses. Each sample is
--   {group = prompt id, scores = {per-conversation score tables}, truncated = bool, dropped = reason}
-- truncated (hit the length limit, empty or malformed): no futures, reward s.cutoff_reward
-- (the recipe's rollout.cutoff_reward, set on the entry), else M.CUTOFF_REWARD (-1, verl's
-- stated rule; the recipes' default too);
-- dropped (the simulator failed after its retries, or every conversation failed a metric):
-- no reward, excluded from its group's statistics and from the loss.
-- Returns {rewards = {r or nil}, dropped = n, truncated = n, failed = {metric = count},
--          metrics = {name = batch mean}, drop_reasons = {reason = count}}.
M.CUTOFF_REWARD = -1
function M.batch_rewards(samples, weights, mode)
  local out = { rewards = {}, dropped = 0, truncated = 0, failed = {}, metrics = {}, drop_reasons = {} }
  local msum, mcount = {}, {}
  for i, s in ipairs(samples) do
    local r, info
    if s.dropped then
      out.dropped = out.dropped + 1
      out.drop_reasons[s.dropped] = (out.drop_reasons[s.dropped] or 0) + 1
    elseif s.truncated then
      out.truncated = out.truncated + 1
      r = s.cutoff_reward or M.CUTOFF_REWARD
    else
      r, info = M.reward(s.scores or {}, weights, mode)
      for name, n in pairs(info.failed) do out.failed[name] = (out.failed[name] or 0) + n end
      for name, v in pairs(info.metrics) do
        msum[name] = (msum[name] or 0) + v
        mcount[name] = (mcount[name] or 0) + 1
      end
      if r == nil then
        out.dropped = out.dropped + 1
        local why = "metric failed"
        out.drop_reasons[why] = (out.drop_reasons[why] or 0) + 1
      end
    end
    out.rewards[i] = r
  end
  for name, v in pairs(msum) do out.metrics[name] = v / mcount[name] end
  return out
end

---------------------------------------------------------------- advantages
-- GRPO: A_i = (r_i - mean_g) / (std_g + eps) within each group g (the n responses of one
-- prompt). std is the UNBIASED sample standard deviation (divide by n - 1), as verl's
-- compute_grpo_outcome_advantage uses torch.std, whose default is Bessel-corrected.
-- A group with one scored member gets mean 0 and std 1 (verl's rule), so A = r / (1 + eps).
-- A group whose rewards are all equal gets A = 0 (std 0, numerator 0). Samples with a nil
-- reward (dropped) get A = 0 and do not enter their group's statistics.
-- rewards[i] and groups[i] for i = 1..n (rewards may have nil holes: pass n explicitly).
-- opts.eps (1e-6), opts.scale_by_std (true; false gives Dr. GRPO-style r - mean).
-- Returns A (list), stats {mean, std, min, max of A over the scored samples, groups_all_equal}.
function M.group_advantages(rewards, groups, opts, n)
  opts = opts or {}
  local eps = opts.eps or 1e-6
  local scale = opts.scale_by_std ~= false
  n = n or #groups
  local members = {}
  for i = 1, n do
    if rewards[i] ~= nil then
      local g = groups[i]
      if g == nil then error("rl.group_advantages: sample " .. i .. " has no group", 2) end
      members[g] = members[g] or {}
      table.insert(members[g], i)
    end
  end
  local A = {}
  for i = 1, n do A[i] = 0 end
  local equal_groups = 0
  for _, idx in pairs(members) do
    local k = #idx
    local mean, std
    if k == 1 then
      mean, std = 0, 1
    else
      local s = 0
      for _, i in ipairs(idx) do s = s + rewards[i] end
      mean = s / k
      local v = 0
      for _, i in ipairs(idx) do v = v + (rewards[i] - mean) ^ 2 end
      std = math.sqrt(v / (k - 1))
      if v == 0 then equal_groups = equal_groups + 1 end
    end
    for _, i in ipairs(idx) do
      A[i] = scale and (rewards[i] - mean) / (std + eps) or (rewards[i] - mean)
    end
  end
  local st = { groups_all_equal = equal_groups }
  local cnt, s, s2 = 0, 0, 0
  for i = 1, n do
    if rewards[i] ~= nil then
      cnt, s, s2 = cnt + 1, s + A[i], s2 + A[i] * A[i]
      st.min = math.min(st.min or A[i], A[i])
      st.max = math.max(st.max or A[i], A[i])
    end
  end
  if cnt > 0 then
    st.mean = s / cnt
    st.std = math.sqrt(math.max(0, s2 / cnt - st.mean * st.mean))
  end
  return A, st
end

---------------------------------------------------------------- statistics
---------------------------------------------------------------- small helpers
-- Mean, population std, min and max of a list of numbers (nil entries skipped).
function M.stats(xs, n)
  local cnt, s, s2, lo, hi = 0, 0, 0, nil, nil
  for i = 1, n or #xs do
    local x = xs[i]
    if type(x) == "number" then
      cnt, s, s2 = cnt + 1, s + x, s2 + x * x
      lo = lo and math.min(lo, x) or x
      hi = hi and math.max(hi, x) or x
    end
  end
  if cnt == 0 then return { n = 0 } end
  local mean = s / cnt
  return { n = cnt, mean = mean, std = math.sqrt(math.max(0, s2 / cnt - mean * mean)), min = lo, max = hi }
end

return M
