-- clrt.train.ppo — the policy update of one RL step: rows prompt..A1 with a mask over A1's
-- tokens, old log-probs taken before the first update (on-policy) and the reference's from
-- the frozen copy, then train.mini_batches optimizer steps through clrt.train.update, each
-- mini-batch in micro-batches of train.micro_batch_size rows whose gradients accumulate
-- with the mini-batch's token count as denominator.
--   local rows = ppo.training_rows(entries)        -- entries with an advantage
--   local stats = ppo.update(m, ref, opt, rows, cfg.train, lr)
local losses = require("clrt.train.losses")
local update = require("clrt.train.update")
local dp = require("clrt.train.data_parallel")
local M = {}

-- An entry's training row: its prompt's ids, then its first response's.
function M.row_ids(e)
  local ids = {}
  for i, t in ipairs(e.prompt_ids) do ids[i] = t end
  for _, t in ipairs(e.tokens) do ids[#ids + 1] = t end
  return ids
end

-- Rows prompt..A1 (ids), first = #prompt: logp index t scores token t+1, trained for
-- first <= t < #ids. rollout_lp: A1's log-probabilities under the weights that sampled it,
-- when they were not the trained ones (rollout.quant=int8, train.async: an older version;
-- the loss then applies train.async.correction, TIS by default).
-- correction "none" (train.async.correction) trains as if on-policy: no rollout log-probs.
function M.training_rows(entries, correction)
  local rows = {}
  for _, e in ipairs(entries) do
    if e.advantage ~= nil then
      rows[#rows + 1] = { ids = M.row_ids(e), first = #e.prompt_ids, adv = e.advantage,
        rollout_lp = correction ~= "none" and e.logprobs_rollout or nil }
    end
  end
  return rows
end

-- The loss's correction for rows with rollout log-probs: train.async.correction's
-- sequence_mask, else TIS ("none" leaves the rows without them: training_rows).
function M.correction(t)
  return t.async and t.async.correction == "sequence_mask" and "sequence_mask" or "tis"
end

-- The loss's statistics of the rollout/trained mismatch, which a step's row reports.
M.MISMATCH_KEYS = { "tis_weight", "tis_capped", "logp_mismatch", "mismatch_kl", "seq_masked" }

local function has_rollout(rows)
  for _, r in ipairs(rows) do if r.rollout_lp ~= nil then return true end end
  return false
end

-- The [B, T] view of the rows' rollout log-probabilities at their response positions (t =
-- first + j - 1 scores response token j), or nil when no row has them.
function M.rollout_view(rows, T)
  if not has_rollout(rows) then return nil end
  local v = losses.view(#rows, T)
  for b, r in ipairs(rows) do
    if not r.rollout_lp or #r.rollout_lp ~= #r.ids - r.first then
      error(("ppo: row %d has %s rollout log-probabilities for its %d response tokens"):format(b,
        r.rollout_lp and #r.rollout_lp or "no", #r.ids - r.first), 0)
    end
    for j, lp in ipairs(r.rollout_lp) do v.p[(b - 1) * T + r.first + j - 2] = lp end
  end
  return v
end

-- Returns {loss, pg_loss, kl, clipfrac, grad_norm, tokens}: means over the mini-batches,
-- token-weighted across a mini-batch's micro-batches. Under N data-parallel ranks `rows` are
-- the whole step's: each rank runs its share of every mini-batch (divided by the whole
-- mini-batch's tokens), the gradients are summed in update.step and the stats here.
function M.update(m, ref, opt, rows, t, lr)
  local ranks = require("clrt.dist").world_size()
  local L = losses.ppo{ clip = t.clip, kl_coef = t.kl_coef, tis_cap = t.tis_cap, correction = M.correction(t),
    seq_cap = t.async and t.async.seq_cap }
  local nmb = math.max(1, math.min(t.mini_batches, #rows))
  local stats = { loss = 0, pg_loss = 0, kl = 0, clipfrac = 0, grad_norm = 0, tokens = 0 }
  local tis_keys = M.MISMATCH_KEYS
  local mbs = {}
  local ntoks = {}
  for _, mb in ipairs(update.chunks(rows, math.ceil(#rows / nmb))) do
    local parts, ntok = {}, 0
    for _, r in ipairs(mb) do ntok = ntok + (#r.ids - r.first) end
    ntoks[#mbs + 1] = ntok
    local mine = dp.my_rows(mb)
    -- the first mini-batch trains before any update of this step: its training forward is
    -- the sampling-time policy, so its old log-probs are that forward's own (the loss's
    -- default, ratio 1) and need no forward of their own
    local on_policy = #mbs == 0
    -- micro-batches of one prompt's rows (its prompt then runs once) where the model shares
    -- prefixes, else of rows of similar length (each padded to its own longest row)
    local micro = #mine > t.micro_batch_size and update.chunks(update.micro_order(m)(mine), t.micro_batch_size)
      or { mine }
    for _, part in ipairs(#mine > 0 and micro or {}) do
      parts[#parts + 1] = { rows = part, old = not on_policy and update.logprobs(m, part, false) or nil,
        ref = t.kl_coef ~= 0 and update.logprobs(ref, part, false) or nil }
    end
    mbs[#mbs + 1] = parts
  end
  local w = 1 / #mbs
  for k, parts in ipairs(mbs) do
    local ntok = ntoks[k]
    local split = #parts > 1 or ranks > 1   -- the loss divided by the whole mini-batch's tokens
    for _, part in ipairs(parts) do
      local adv = {}
      for b, r in ipairs(part.rows) do adv[b] = r.adv end
      part.batch = function(lp)
        return { old = part.old, ref = part.ref, adv = adv, mask = losses.response_mask(part.rows, lp:size(2)),
          denom = split and ntok or nil, rollout = M.rollout_view(part.rows, lp:size(2)) }
      end
    end
    local results, gnorm = update.step(m, opt, L, parts, lr)
    for _, r in ipairs(results) do
      local s = r.stats
      local share = split and (s.tokens / math.max(ntok, 1)) or 1
      stats.loss = stats.loss + w * r.loss
      stats.pg_loss = stats.pg_loss + w * share * (s.pg_loss or 0)
      stats.kl = stats.kl + w * share * (s.kl or 0)
      stats.clipfrac = stats.clipfrac + w * share * (s.clipfrac or 0)
      for _, k in ipairs(tis_keys) do
        if s[k] then stats[k] = (stats[k] or 0) + w * share * s[k] end
      end
      stats.tokens = stats.tokens + (s.tokens or 0)
    end
    stats.grad_norm = stats.grad_norm + w * gnorm
  end
  local keys = { "loss", "pg_loss", "kl", "clipfrac", "tokens" }
  -- every rank holds the whole step's rows: the same keys everywhere
  if has_rollout(rows) then
    for _, k in ipairs(tis_keys) do keys[#keys + 1] = k end
  end
  return dp.sum(stats, keys)
end

return M
