-- clrt.train.gae — the arithmetic of PPO with a learned value (train.algorithm=ppo), as TRL's
-- PPOTrainer (trl <= 0.10.1, what the CollabLLM authors' scripts/train/ppo.py requires)
-- computes it. Plain Lua lists, one per response: index k is the k-th response token.
--   local r = gae.token_rewards(score, old, ref, kl_coef)    -- -kl_coef (old - ref), + score at the end
--   local adv, ret = gae.advantages(r, values, gamma, lam)   -- GAE(gamma, lambda); ret = adv + values
--   gae.whiten(lists)                                        -- in place, over every token of the batch
--   local loss, grad, clipfrac = gae.value_loss(vpred, old_values, returns, clip, denom)
--   local ev = gae.explained_variance(returns, values)       -- over lists of lists
-- A sampled response is one action per token: the reward of a token is the KL penalty to the
-- reference, and the conversation's score (the multiturn-aware reward) is added to its last
-- token, so the value learns to predict the score discounted over the remaining tokens.
local M = {}

-- Per-token rewards: -kl_coef * (old[k] - ref[k]) (TRL's kl_penalty "kl"), plus score on the
-- last token.
function M.token_rewards(score, old, ref, kl_coef)
  local r = {}
  for k = 1, #old do r[k] = -kl_coef * (old[k] - ref[k]) end
  if #r > 0 then r[#r] = r[#r] + score end
  return r
end

-- Generalised advantage estimation over one response: delta_k = r_k + gamma V_{k+1} - V_k
-- (V after the last token is 0: the episode ends), A_k = delta_k + gamma lam A_{k+1}.
-- Returns advantages and returns (A + V, the value's regression target).
function M.advantages(rewards, values, gamma, lam)
  local n = #rewards
  if #values ~= n then error(("gae.advantages: %d rewards but %d values"):format(n, #values), 2) end
  local adv, ret, last = {}, {}, 0
  for k = n, 1, -1 do
    local next_v = k < n and values[k + 1] or 0
    local delta = rewards[k] + gamma * next_v - values[k]
    last = delta + gamma * lam * last
    adv[k] = last
  end
  for k = 1, n do ret[k] = adv[k] + values[k] end
  return adv, ret
end

-- Mean and unbiased variance over every element of lists of numbers.
local function moments(lists)
  local n, s = 0, 0
  for _, l in ipairs(lists) do for _, x in ipairs(l) do n, s = n + 1, s + x end end
  if n == 0 then return 0, 0, 0 end
  local mean, ss = s / n, 0
  for _, l in ipairs(lists) do for _, x in ipairs(l) do ss = ss + (x - mean) ^ 2 end end
  return mean, n > 1 and ss / (n - 1) or 0, n
end
M.moments = moments

-- Advantages whitened in place across the batch: (x - mean) / sqrt(var + 1e-8), var with
-- Bessel's correction (TRL's masked_whiten).
function M.whiten(lists)
  local mean, var = moments(lists)
  local inv = 1 / math.sqrt(var + 1e-8)
  for _, l in ipairs(lists) do for k = 1, #l do l[k] = (l[k] - mean) * inv end end
  return lists
end

-- Whitened in groups of `size` consecutive responses (0 or nil: all of them, as whiten):
-- TRL whitens over its batch, and the authors' PPO batch is one response (batch_size 1).
function M.whiten_groups(lists, size)
  if not size or size <= 0 or size >= #lists then return M.whiten(lists) end
  for i = 1, #lists, size do
    local group = {}
    for k = i, math.min(i + size - 1, #lists) do group[#group + 1] = lists[k] end
    M.whiten(group)
  end
  return lists
end

-- The clipped value loss of one response's tokens, summed and divided by denom (the
-- mini-batch's token count): 0.5 * max((v - R)^2, (clip(v, V_old - c, V_old + c) - R)^2).
-- Returns the loss, d loss / d vpred per token, and the count of tokens where the clipped
-- term was taken. The coefficient (train.vf_coef) is applied by the caller.
function M.value_loss(vpred, old_values, returns, clip, denom)
  local loss, grad, clipped = 0, {}, 0
  for k = 1, #vpred do
    local v, R, vo = vpred[k], returns[k], old_values[k]
    local vc = math.max(vo - clip, math.min(vo + clip, v))
    local l1, l2 = (v - R) ^ 2, (vc - R) ^ 2
    if l2 > l1 then
      loss = loss + 0.5 * l2
      -- the clipped prediction is constant in v unless v lies inside the clip range
      grad[k] = (vc == v) and (v - R) / denom or 0
      clipped = clipped + 1
    else
      loss = loss + 0.5 * l1
      grad[k] = (v - R) / denom
    end
  end
  return loss / denom, grad, clipped
end

-- 1 - Var(returns - values) / Var(returns) over every token (1: the value explains the
-- returns; 0: no better than their mean; nil when the returns do not vary).
function M.explained_variance(returns, values)
  local diff = {}
  for i, r in ipairs(returns) do
    local d = {}
    for k = 1, #r do d[k] = r[k] - values[i][k] end
    diff[i] = d
  end
  local _, var_r = moments(returns)
  local _, var_d = moments(diff)
  if var_r <= 0 then return nil end
  return 1 - var_d / var_r
end

-- TRL's AdaptiveKLController: the penalty's coefficient moves towards the KL target.
-- kl: the batch's mean per-response KL (sum over its tokens); n: responses in the batch.
function M.adapt_kl(coef, kl, n, target, horizon)
  if not target or target <= 0 then return coef end
  local err = math.max(-0.2, math.min(0.2, kl / target - 1))
  return coef * (1 + err * n / horizon)
end

return M
