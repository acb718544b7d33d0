-- clrt.api.usage — what a run's API calls used and cost: per role (the simulated user, each
-- judge, the extractor) for a step and for the whole run.
--   local acc = usage.ledger{path = RUN_DIR .. "/api_usage.json", resume = true, warn = print}
--   local step = acc:add(clrt.llm records of the step)   -- summed, added to the run's total
--   acc:row(step, row)                                     -- the metrics.jsonl fields
--   acc.total                                              -- the run so far (summary.json)
-- The run's total is kept in api_usage.json (written atomically every step) so a resumed run
-- goes on from what was spent before; steps a resumed run does again were paid twice and are
-- counted twice. Calls answered from the reply cache cost nothing and count as hits. A model
-- without a price is counted in tokens, not in dollars, and named once through warn.
local files = require("clrt.files")
local json = require("clrt.json")
local M = {}

local FIELDS = { "calls", "prompt_tokens", "cached_tokens", "completion_tokens", "usd", "cache_hits", "cache_misses",
  "rate_wait_s", "unpriced_calls", "failed_calls" }

local function blank()
  local t = {}
  for _, f in ipairs(FIELDS) do t[f] = 0 end
  return t
end

local function add_into(dst, src)
  for _, f in ipairs(FIELDS) do dst[f] = (dst[f] or 0) + (src[f] or 0) end
end

-- Records -> {all = sums, roles = {role = sums}}. A record's role is its call's role, else
-- "other".
function M.summarize(records)
  local s = { all = blank(), roles = {} }
  for _, r in ipairs(records) do
    local role = r.role or "other"
    local t = s.roles[role]
    if not t then t = blank(); s.roles[role] = t end
    local one = { calls = 1, prompt_tokens = r.prompt_tokens or 0, cached_tokens = r.cached_tokens or 0,
      completion_tokens = r.completion_tokens or 0, usd = r.cost_usd or 0, rate_wait_s = r.rate_wait_s or 0,
      cache_hits = r.cache == "hit" and 1 or 0, cache_misses = r.cache == "miss" and 1 or 0,
      unpriced_calls = (r.unpriced and r.ok) and 1 or 0, failed_calls = r.ok and 0 or 1 }
    add_into(t, one)
    add_into(s.all, one)
  end
  return s
end

local Ledger = {}
Ledger.__index = Ledger

function M.ledger(opts)
  opts = opts or {}
  local self = setmetatable({ path = opts.path, warn = opts.warn or function() end, warned = {},
    total = { all = blank(), roles = {} } }, Ledger)
  if opts.resume and self.path and files.exists(self.path) then
    local ok, saved = pcall(json.decode, files.read(self.path), self.path)
    if ok and type(saved) == "table" and type(saved.all) == "table" then
      add_into(self.total.all, saved.all)
      for role, t in pairs(saved.roles or {}) do
        self.total.roles[role] = blank()
        add_into(self.total.roles[role], t)
      end
      if type(saved.last_step_usd) == "number" then self.total.last_step_usd = saved.last_step_usd end
    else
      self.warn(("api usage: %s is unreadable; the run's spend starts again from 0"):format(self.path))
    end
  end
  return self
end

-- not_a_step: calls outside a training step (the last validation); they count in the total
-- but not as the cost of a step (budget.max_usd expects each step to cost what the last did).
function Ledger:add(records, not_a_step)
  local s = M.summarize(records)
  if not not_a_step then self.total.last_step_usd = s.all.usd end
  for _, r in ipairs(records) do
    if r.unpriced and r.ok and not self.warned[r.model] then
      self.warned[r.model] = true
      self.warn(("api usage: no price for model %s (at %s): its tokens are counted, its dollars are not; "
        .. "give one with judge.price / sim_cfg.price"):format(tostring(r.model), tostring(r.base_url)))
    end
  end
  add_into(self.total.all, s.all)
  for role, t in pairs(s.roles) do
    self.total.roles[role] = self.total.roles[role] or blank()
    add_into(self.total.roles[role], t)
  end
  if self.path and require("clrt.dist").is_main() then
    files.write_atomic(self.path, json.encode(self.total) .. "\n")
  end
  self.last = s
  return s
end

-- A step's sums as metrics.jsonl fields: api/usd, api/usd_total, api/prompt_tokens,
-- api/cached_tokens, api/completion_tokens, api/tokens_total (the run's), api/calls,
-- api/cache_hits, api/cache_misses, api/rate_wait_s, and per role api/<role>/{usd,
-- prompt_tokens, cached_tokens, completion_tokens, calls, cache_hits}.
function Ledger:row(s, row)
  local a, tot = s.all, self.total.all
  row["api/usd"], row["api/usd_total"] = a.usd, tot.usd
  row["api/prompt_tokens"], row["api/cached_tokens"], row["api/completion_tokens"] = a.prompt_tokens, a.cached_tokens,
    a.completion_tokens
  row["api/tokens_total"] = tot.prompt_tokens + tot.completion_tokens
  row["api/calls"], row["api/cache_hits"], row["api/cache_misses"] = a.calls, a.cache_hits, a.cache_misses
  row["api/rate_wait_s"] = a.rate_wait_s
  if a.unpriced_calls > 0 then row["api/unpriced_calls"] = a.unpriced_calls end
  for role, t in pairs(s.roles) do
    local p = "api/" .. role .. "/"
    row[p .. "usd"], row[p .. "calls"], row[p .. "cache_hits"] = t.usd, t.calls, t.cache_hits
    row[p .. "prompt_tokens"], row[p .. "cached_tokens"], row[p .. "completion_tokens"] = t.prompt_tokens, t.cached_tokens,
      t.completion_tokens
  end
  return row
end

-- A total as one line for the end of a run.
function M.line(total)
  local a = total.all
  return ("api spend: $%.4f over %d calls (%d prompt tokens, %d of them cached; %d completion tokens); "
    .. "reply cache %d hits, %d misses; %.1f s waiting for rate limits"):format(a.usd, a.calls, a.prompt_tokens,
    a.cached_tokens, a.completion_tokens, a.cache_hits, a.cache_misses, a.rate_wait_s)
end

return M
