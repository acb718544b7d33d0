-- clrt.train.ppo_value — the update of train.algorithm=ppo: PPO with a learned value, as the
-- CollabLLM authors train it (TRL's PPOTrainer, trl <= 0.10.1). One step:
--   1. old log-probs and values of every row (prompt..A1) from one forward of the policy with
--      its value head (clrt.train.value_head), the reference's log-probs;
--   2. per response token the reward -kl_coef (old - ref), plus the conversation's score
--      (the multiturn-aware reward) on its last token; GAE(train.gamma, train.lam) gives
--      advantages and returns; the advantages are whitened over the step's tokens (or over
--      groups of train.whiten_size responses: TRL whitens per batch);
--   3. train.ppo_epochs passes of train.mini_batches optimizer steps, each over its rows in
--      micro-batches: the PPO-clip
--      loss on the advantages (no KL term: the KL is in the reward) plus train.vf_coef times
--      the clipped value loss; the value's gradient reaches the trunk through the hidden state.
--   4. the KL coefficient adapts towards train.kl_target (TRL's AdaptiveKLController; 0: fixed).
--   local rows = ppo_value.training_rows(entries)     -- entries with a reward
--   local stats, kl_coef = ppo_value.update(m, ref, head, opt, rows, cfg.train, lr, kl_coef)
local losses = require("clrt.train.losses")
local update = require("clrt.train.update")
local gae = require("clrt.train.gae")
local ppo = require("clrt.train.ppo")
local tensor = require("clrt.tensor")
local ffi = require("ffi")
local M = {}

-- Rows prompt..A1 (ids), first = #prompt (logp column t scores token t+1: the response's
-- columns are first .. #ids-1), score = the entry's reward.
function M.training_rows(entries, correction)
  local rows = {}
  for _, e in ipairs(entries) do
    if e.reward ~= nil and #e.tokens > 0 then
      rows[#rows + 1] = { ids = ppo.row_ids(e), first = #e.prompt_ids, score = e.reward,
        rollout_lp = correction ~= "none" and e.logprobs_rollout or nil }
    end
  end
  return rows
end

local function col_values(lp, b, r)
  local T1 = lp:size(2)
  local p = ffi.cast("float *", lp:data_ptr()) + (b - 1) * T1
  local out = {}
  for col = r.first, #r.ids - 1 do out[#out + 1] = p[col - 1] end
  return out
end

-- Step 1 and 2 over rows already split into parts: each row gets old, ref, values, rewards,
-- adv (whitened), returns. Returns the batch's statistics.
function M.prepare(m, ref, head, parts, t, kl_coef)
  local all = {}
  for _, part in ipairs(parts) do
    local ids = {}
    for b, r in ipairs(part.rows) do ids[b] = r.ids end
    local lp, hidden = m:logprobs(ids, { grad = false, hidden = true })
    local rlp = ref:logprobs(ids, { grad = false })
    part.old = lp
    for b, r in ipairs(part.rows) do
      r.old, r.ref, r.values = col_values(lp, b, r), col_values(rlp, b, r), {}
      for col = r.first, #r.ids - 1 do r.values[#r.values + 1] = head:value(hidden, b, col) end
      all[#all + 1] = r
    end
  end
  local advs, rets, vals, kl_sum, nonscore = {}, {}, {}, 0, 0
  for i, r in ipairs(all) do
    r.rewards = gae.token_rewards(r.score, r.old, r.ref, kl_coef)
    r.adv, r.returns = gae.advantages(r.rewards, r.values, t.gamma, t.lam)
    advs[i], rets[i], vals[i] = r.adv, r.returns, r.values
    for k = 1, #r.old do
      kl_sum = kl_sum + (r.old[k] - r.ref[k])
      nonscore = nonscore - kl_coef * (r.old[k] - r.ref[k])
    end
  end
  gae.whiten_groups(advs, t.whiten_size)   -- train.whiten_size responses a group (0: the step)
  local ret_mean, ret_var, ntok = gae.moments(rets)
  local val_mean = gae.moments(vals)
  return { kl_per_response = kl_sum / math.max(#all, 1), kl = kl_sum / math.max(ntok, 1),
    non_score_reward = nonscore / math.max(#all, 1), returns_mean = ret_mean, returns_var = ret_var,
    values_mean = val_mean, explained_variance = gae.explained_variance(rets, vals), responses = #all }
end

-- One part's forward and backward: the PPO-clip loss on the per-token advantages and the
-- clipped value loss (its coefficient applied), both divided by the mini-batch's tokens.
function M.part_step(m, head, L, part, t, ntok)
  local ids, adv = {}, {}
  for b, r in ipairs(part.rows) do
    ids[b] = r.ids
    local a = {}
    for k = 1, #r.adv do a[r.first + k - 1] = r.adv[k] end   -- by logp column
    adv[b] = a
  end
  local lp, hidden = m:logprobs(ids, { grad = true, hidden = true })
  local pg, st = L:forward(lp, { old = part.old, adv = adv, mask = losses.response_mask(part.rows, lp:size(2)),
    denom = ntok, rollout = ppo.rollout_view(part.rows, lp:size(2)) })
  local dlogp = L:backward() or tensor.zeros({ lp:size(1), lp:size(2) })
  local dhidden = tensor.zeros({ hidden:size(1), hidden:size(2), hidden:size(3) })
  local vf, vclip, vsum = 0, 0, 0
  for b, r in ipairs(part.rows) do
    local vpred = {}
    for col = r.first, #r.ids - 1 do vpred[#vpred + 1] = head:value(hidden, b, col) end
    local l, g, clipped = gae.value_loss(vpred, r.values, r.returns, t.cliprange_value, ntok)
    vf, vclip = vf + l, vclip + clipped
    for k = 1, #vpred do
      vsum = vsum + vpred[k]
      head:accumulate(hidden, b, r.first + k - 1, t.vf_coef * g[k], dhidden)
    end
  end
  m:backward(dlogp, dhidden)
  return { loss = pg + t.vf_coef * vf, pg_loss = pg, value_loss = vf, vf_clipped = vclip, vpred_sum = vsum,
    stats = st }
end

-- The mini-batches once per PPO epoch, in the same order each time (TRL reshuffles them).
function M.epoch_order(mbs, epochs)
  local out = {}
  for _ = 1, epochs do for _, mb in ipairs(mbs) do out[#out + 1] = mb end end
  return out
end

-- Returns the step's statistics and the KL coefficient for the next step.
function M.update(m, ref, head, opt, rows, t, lr, kl_coef)
  if require("clrt.dist").world_size() > 1 then
    error("clrt.train.ppo_value: train.algorithm=ppo runs on one rank (its value head is not shared across ranks); run without mpirun", 0)
  end
  local L = losses.ppo{ clip = t.clip, kl_coef = 0, clip_c = false, tis_cap = t.tis_cap, correction = ppo.correction(t),
    seq_cap = t.async and t.async.seq_cap }
  local nmb = math.max(1, math.min(t.mini_batches, #rows))
  local mbs, all_parts = {}, {}
  for _, mb in ipairs(update.chunks(rows, math.ceil(#rows / nmb))) do
    local ntok = 0
    for _, r in ipairs(mb) do ntok = ntok + (#r.ids - r.first) end
    local micro = #mb > t.micro_batch_size and update.chunks(update.micro_order(m)(mb), t.micro_batch_size) or { mb }
    local parts = {}
    for _, p in ipairs(micro) do
      parts[#parts + 1] = { rows = p }
      all_parts[#all_parts + 1] = parts[#parts]
    end
    mbs[#mbs + 1] = { parts = parts, ntok = ntok }
  end
  local stats = M.prepare(m, ref, head, all_parts, t, kl_coef)
  stats.kl_coef = kl_coef
  local sums = { loss = 0, pg_loss = 0, value_loss = 0, clipfrac = 0, vf_clipfrac = 0, grad_norm = 0, tokens = 0,
    vpred_mean = 0 }
  local epochs = t.ppo_epochs or 1
  local w = 1 / (#mbs * epochs)
  for _, mb in ipairs(M.epoch_order(mbs, epochs)) do
    local vclip, vsum = 0, 0
    for _, part in ipairs(mb.parts) do
      local r = M.part_step(m, head, L, part, t, mb.ntok)
      sums.loss = sums.loss + w * r.loss
      sums.pg_loss = sums.pg_loss + w * r.pg_loss
      sums.value_loss = sums.value_loss + w * r.value_loss
      sums.clipfrac = sums.clipfrac + w * (r.stats.clipfrac or 0) * (r.stats.tokens or 0) / math.max(mb.ntok, 1)
      sums.tokens = sums.tokens + (r.stats.tokens or 0)
      for _, k in ipairs(ppo.MISMATCH_KEYS) do   -- rollout.quant=int8, train.async
        if r.stats[k] then sums[k] = (sums[k] or 0) + w * r.stats[k] * (r.stats.tokens or 0) / math.max(mb.ntok, 1) end
      end
      vclip, vsum = vclip + r.vf_clipped, vsum + r.vpred_sum
    end
    sums.vf_clipfrac = sums.vf_clipfrac + w * vclip / math.max(mb.ntok, 1)
    sums.vpred_mean = sums.vpred_mean + w * vsum / math.max(mb.ntok, 1)
    sums.grad_norm = sums.grad_norm + w * update.optimizer_step(m, opt, lr)
    m:zero_grad()
    head:step(lr)
  end
  for k, v in pairs(sums) do stats[k] = v end
  local next_coef = gae.adapt_kl(kl_coef, stats.kl_per_response, stats.responses, t.kl_target, t.kl_horizon)
  return stats, next_coef
end

return M
