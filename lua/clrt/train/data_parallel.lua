-- clrt.train.data_parallel — an RL step over N data-parallel ranks (clrt.dist). Each rank
-- rolls out its contiguous share of the step's prompts (a prompt's group never straddles
-- ranks; sampling seeds depend on the prompt, not the rank), then every rank receives every
-- rank's finished entries, so rewards, advantages, metrics and the training rows are computed
-- from the whole step the same way on every rank and as one process would. The PPO update
-- then gives each rank its share of every mini-batch's rows (clrt.train.ppo), and the
-- gradients are summed before each optimizer step (clrt.train.update). With one rank every
-- function here returns its input.
--   local mine, first = dp.my_prompts(samples)   -- (rank, size: another rank's, for its async worker)
--   entries = dp.gather_entries(entries, samples, first, ctx)
--   dp.check_params(m, steps_done, every)    -- the ranks' parameters agree (every 50 steps)
local dist = require("clrt.dist")
local json = require("clrt.json")
local llm = require("clrt.llm")
local entry = require("clrt.train.entry")
local M = {}

-- This rank's contiguous share of the step's prompts and the index of its first one; rank
-- and size given: that rank's share of that many (an async rollout worker is no rank itself).
function M.my_prompts(samples, rank, size)
  if (size or dist.world_size()) == 1 then return samples, 1 end
  local first, last = dist.share(#samples, rank, size)
  local mine = {}
  for i = first, last do mine[#mine + 1] = samples[i] end
  return mine, first
end

-- JSON null where a value was absent: back to nil, recursively.
local function strip_nulls(v)
  if type(v) ~= "table" then return v end
  for k, x in pairs(v) do
    if x == json.null then v[k] = nil else strip_nulls(x) end
  end
  return v
end
M.strip_nulls = strip_nulls

-- Every rank's entries (their groups renumbered to the step's prompt order), in prompt order,
-- on every rank; the ranks' request counters (ctx.counters) and clrt.llm records are summed
-- into this rank's, so the step's row counts every rank's requests.
function M.gather_entries(entries, samples, first, ctx)
  if dist.world_size() == 1 then return entries end
  local mine = {}
  for i, e in ipairs(entries) do mine[i] = entry.portable(e, first - 1) end
  local payload = json.encode({ entries = json.array(mine), counters = ctx and ctx.counters or {},
    calls = json.array(llm.drain_records()) })
  local all, counters, calls = {}, {}, {}
  for r = 0, dist.world_size() - 1 do
    local part = strip_nulls(json.decode(dist.broadcast_string(payload, r), "rank " .. r .. "'s entries"))
    for _, p in ipairs(part.entries) do all[#all + 1] = entry.from_portable(p, samples[p.group]) end
    for k, n in pairs(part.counters or {}) do counters[k] = (counters[k] or 0) + n end
    for _, c in ipairs(part.calls or {}) do calls[#calls + 1] = c end
  end
  if ctx and ctx.counters then
    for k in pairs(ctx.counters) do ctx.counters[k] = nil end
    for k, n in pairs(counters) do ctx.counters[k] = n end
  end
  llm.add_records(calls)
  return all
end

-- Every `every` steps (50 when nil; 0: never) after step `done`, all ranks must hold the same
-- parameters (clrt.dist.check_params: an error naming the step otherwise).
function M.check_params(m, done, every)
  every = every or 50
  if dist.world_size() > 1 and every > 0 and done > 0 and done % every == 0 then dist.check_params(m, done) end
end

-- This rank's share of a mini-batch's rows (all of them with one rank).
function M.my_rows(rows)
  if dist.world_size() == 1 then return rows end
  local first, last = dist.share(#rows)
  local mine = {}
  for i = first, last do mine[#mine + 1] = rows[i] end
  return mine
end

-- A sum over ranks of the numbers in a table (keys every rank has).
function M.sum(t, keys)
  if dist.world_size() == 1 then return t end
  local v = {}
  for i, k in ipairs(keys) do v[i] = t[k] or 0 end
  dist.all_reduce_numbers(v, "sum")
  for i, k in ipairs(keys) do t[k] = v[i] end
  return t
end

return M
