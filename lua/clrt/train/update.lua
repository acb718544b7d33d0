-- clrt.train.update — the one update loop SFT and RL share: a batch of rows split into
-- micro-batches, each forward -> criterion:forward -> criterion:backward -> m:backward, the
-- gradients accumulating (every micro-batch's loss divided by the whole batch's token count,
-- so the sum is the batch's token-mean), then one optimizer step.
--   local rows_lp = update.logprobs(m, rows, grad)          -- f32 [B, T-1], rows {ids = {...}}
--   local results = update.accumulate(m, L, parts)          -- parts {rows =, batch =}
--   local results, grad_norm = update.step(m, opt, L, parts, lr)
--   local parts = update.chunks(list, size)                 -- consecutive groups of `size`
--   local rows = update.by_length(rows)                     -- shortest first (micro-batching)
--   local rows = update.by_prompt(rows)                     -- rows of one prompt together
-- results[i] = {loss =, stats =} of part i, in order.
local M = {}

-- Right-pad rows of token ids: rows (padded with pad_id), lengths, T.
function M.pad(items, pad_id)
  local T = 0
  for _, it in ipairs(items) do if #it.ids > T then T = #it.ids end end
  local rows, lens = {}, {}
  for b, it in ipairs(items) do
    local r = {}
    for t = 1, T do r[t] = it.ids[t] or pad_id end
    rows[b], lens[b] = r, #it.ids
  end
  return rows, lens, T
end

-- The model's log-probabilities of rows (ragged; T the longest): [B, T-1]. The id lists go
-- to the model as they are (it pads with 0 in its own buffer), not through a padded B x T
-- copy in Lua tables.
-- Rows that carry `first` (RL and DPO rows: their prompt's length) score only what follows
-- it: the output layer skips the prompt's positions, whose log-probs no loss reads.
function M.logprobs(model, rows, grad)
  local ids, context = {}, {}
  for b, r in ipairs(rows) do
    ids[b] = r.ids
    if context and type(r.first) == "number" then context[b] = r.first else context = nil end
  end
  return model:logprobs(ids, { grad = grad, context = context })
end

-- Rows ordered by length (ties in their given order): consecutive micro-batches of the
-- result hold rows of similar length, each padded only to its own longest row. A step's
-- gradient is then the same sum in another order.
function M.by_length(rows)
  local order = {}
  for i = 1, #rows do order[i] = i end
  table.sort(order, function(a, b)
    local la, lb = #rows[a].ids, #rows[b].ids
    if la ~= lb then return la < lb end
    return a < b
  end)
  local out = {}
  for i, k in ipairs(order) do out[i] = rows[k] end
  return out
end

-- Rows that share a prompt (the same `first` and the same leading ids: an RL group) next to
-- each other, groups in the order they first come, each group shortest first: consecutive
-- micro-batches then hold whole groups, whose prompt the model runs once (m:set_share_prefix).
function M.by_prompt(rows)
  local groups, key_of = {}, {}
  for i, r in ipairs(rows) do
    local k = "-"
    if type(r.first) == "number" and r.first > 0 then
      k = r.first .. ":" .. table.concat(r.ids, ",", 1, math.min(r.first, #r.ids))
    end
    local g = key_of[k]
    if not g then
      g = {}
      groups[#groups + 1] = g
      key_of[k] = g
    end
    g[#g + 1] = i
  end
  local out = {}
  for _, g in ipairs(groups) do
    table.sort(g, function(a, b)
      local la, lb = #rows[a].ids, #rows[b].ids
      if la ~= lb then return la < lb end
      return a < b
    end)
    for _, i in ipairs(g) do out[#out + 1] = rows[i] end
  end
  return out
end

-- The micro-batch order for model m: by_prompt where it shares prefixes, else by_length.
function M.micro_order(m)
  return m:share_prefix() and M.by_prompt or M.by_length
end

-- Split a list into consecutive parts of at most `size` (all in one when size is nil).
function M.chunks(list, size)
  size = math.max(1, size or #list)
  local out = {}
  for i = 1, #list, size do
    local part = {}
    for j = i, math.min(#list, i + size - 1) do part[#part + 1] = list[j] end
    out[#out + 1] = part
  end
  return out
end

-- One part's forward (and backward into the model's gradients when grad is true).
local function run_part(m, criterion, part, grad)
  local lp = M.logprobs(m, part.rows, grad)
  local batch = type(part.batch) == "function" and part.batch(lp) or part.batch
  local loss, stats = criterion:forward(lp, batch)
  if grad then
    local d = criterion:backward()
    if d then m:backward(d) end
  end
  return { loss = loss, stats = stats }
end

-- Forward and backward of every part; the gradients add up in the model. part.batch is
-- what the criterion's forward takes beside logp (a function of logp when it depends on
-- the padded length). On a terminal the micro-batches count down (clrt.progress).
function M.accumulate(m, criterion, parts)
  local results = {}
  local bar = require("clrt.progress").new("update: micro-batches", #parts)
  for i, part in ipairs(parts) do
    results[i] = run_part(m, criterion, part, true)
    bar:set(i)
  end
  bar:finish()
  return results
end

-- accumulate, then one optimizer step at `lr` and the gradients zeroed. Returns the parts'
-- results and the gradient norm (before clipping) that the optimizer reports. With several
-- data-parallel ranks each holds its share of the batch (every part's loss divided by the
-- whole batch's token count): the gradients are summed across ranks before the step, so
-- every rank takes the step one process would take over the whole batch.
-- On the host each rank updates only its slice of the parameters (opt:step_sharded); on a
-- GPU the gradients are all-reduced (NCCL) and every rank takes the whole step.
function M.optimizer_step(m, opt, lr)
  if opt:sharded() then return opt:step_sharded({ lr = lr }) end
  require("clrt.dist").all_reduce_grads(m)
  return opt:step({ lr = lr })
end

function M.step(m, opt, criterion, parts, lr)
  local results = M.accumulate(m, criterion, parts)
  local gnorm = M.optimizer_step(m, opt, lr)
  m:zero_grad()
  return results, gnorm
end

-- Loss of rows without gradient (validation): one forward per part.
function M.evaluate(m, criterion, parts)
  local results = {}
  for i, part in ipairs(parts) do results[i] = run_part(m, criterion, part, false) end
  return results
end

return M
