-- clrt.train.losses — the training losses, each a criterion with one contract (torch7 style):
--   local L = losses.ppo{clip = 0.2, kl_coef = 0.001, ...}   -- or losses.nll()
--   local loss, stats = L:forward(logp, batch)                -- logp: f32 tensor [B, T]
--   local dlogp = L:backward()                                -- f32 tensor [B, T], or nil
-- logp[b][t] is the policy's log-probability of token t+1 of row b (m:logprobs); dlogp is
-- d loss / d logp, what m:backward takes; nil when no token is trained (nothing to add).
-- The per-token arrays in `batch` (mask, old, ref) are tensors of logp's shape or views
-- from losses.view; the loops run over flat FFI arrays, in the order the earlier
-- table-based code used, so figures stay identical to the last digit. losses.dpo is the
-- third: pairs of rows, sequence sums against reference sums given per pair.
local ffi = require("ffi")
local tensor = require("clrt.tensor")
local M = {}

-- A flat [B, T] array of doubles with optional per-row lengths (ragged rows: positions past
-- len[b] are never read). p is any FFI pointer indexable as p[(b-1)*T + t-1].
function M.view(B, T, lens)
  return { p = ffi.new("double[?]", math.max(1, B * T)), B = B, T = T, lens = lens }
end

-- A tensor (or a view) as a view: the tensor is brought to the CPU as contiguous f32.
local function as_view(x, what)
  if x == nil then return nil end
  if not tensor.is_tensor(x) then return x end
  if x:dim() ~= 2 then error(("losses: %s must be a [B, T] tensor, got %s"):format(what, tensor.shape_str(x)), 3) end
  local h = x
  if h:device() ~= "cpu" then h = h:cpu() end
  if h:dtype() ~= "f32" then h = h:float() end
  h = h:contiguous()
  return { p = ffi.cast("float *", h:data_ptr()), B = h:size(1), T = h:size(2), keep = h }
end
M.as_view = as_view

-- The [B, T] mask of each row's response positions: t in [first, #ids) of a row
-- {ids, first} (the log-prob at t scores token t+1; the prompt's are not trained).
function M.response_mask(rows, T)
  local v = M.view(#rows, T)
  for b, r in ipairs(rows) do
    for t = 1, T do v.p[(b - 1) * T + t - 1] = (t >= r.first and t < #r.ids) and 1 or 0 end
  end
  return v
end

local function same_shape(a, v, what)
  if v and (v.B ~= a.B or v.T ~= a.T) then
    error(("losses: %s is [%d, %d], logp is [%d, %d]"):format(what, v.B, v.T, a.B, a.T), 3)
  end
end

-- The gradient array as an f32 tensor for m:backward.
local function grad_tensor(g, B, T)
  local t = tensor.zeros({ B, T })
  local p = ffi.cast("float *", t:data_ptr())
  for i = 0, B * T - 1 do p[i] = g[i] end
  return t
end

local function clamp(x, lo, hi) return math.max(lo, math.min(hi, x)) end

local Criterion = {}
Criterion.__index = Criterion
function Criterion:backward()
  if not self.grad then return nil end
  return grad_tensor(self.grad, self.B, self.T)
end
-- The gradient of row b as a Lua list of n numbers (tests and the rl.ppo_loss shim).
function Criterion:grad_row(b, n)
  local out = {}
  for t = 1, n do out[t] = self.grad and self.grad[(b - 1) * self.T + t - 1] or 0 end
  return out
end

---------------------------------------------------------------- NLL
-- Masked token-mean negative log-likelihood (SFT). batch.mask[b][t] == 1 marks trained
-- positions (the weight of token t+1); batch.denom divides (default: the masked count), so
-- micro-batches of one optimizer step pass the whole batch's count.
-- stats: {tokens}. With no masked token the loss is 0 and backward gives nil.
function M.nll()
  return setmetatable({ kind = "nll" }, Criterion)
end

function Criterion:_nll(logp, batch)
  local lp = as_view(logp, "logp")
  local mask = as_view(batch.mask, "mask")
  same_shape(lp, mask, "mask")
  local B, T = lp.B, lp.T
  local n = 0
  for i = 0, B * T - 1 do if mask.p[i] == 1 then n = n + 1 end end
  self.B, self.T, self.grad = B, T, nil
  if n == 0 then return 0, { tokens = 0 } end
  local denom = batch.denom or n
  local g = batch.grad ~= false and ffi.new("double[?]", B * T) or nil
  local loss = 0
  local gv = -1 / denom
  for b = 0, B - 1 do
    for t = 0, T - 1 do
      local i = b * T + t
      if mask.p[i] == 1 then
        loss = loss - lp.p[i]
        if g then g[i] = gv end
      end
    end
  end
  self.grad = g
  return loss / denom, { tokens = n }
end

---------------------------------------------------------------- PPO-clip + KL
-- Token-level loss over rows b = 1..B (only the first response's tokens: the caller masks
-- prompt and future turns out). batch:
--   old    log pi at sampling time (default logp itself: on-policy, ratio 1)
--   ref    log pi_ref of the frozen reference (needed when kl_coef ~= 0)
--   adv    adv[b] a number per row, or adv[b][t] per token
--   mask   1 for trained tokens, 0 otherwise (default all 1)
--   denom  token count of the token-mean (default the sum of the mask; pass the mini-batch's
--          count when accumulating micro-batches), scale (multiplies loss and gradient)
--   rollout  log pi_rollout of each sampled token where the rollout sampled from other
--          weights than the trained ones (rollout.quant=int8), or nil: truncated importance
--          sampling (verl's TIS) then weights each token's policy loss
-- options: clip (0.2), clip_high (= clip), clip_c (3: verl's dual clip for A < 0; false =
--   off), kl_coef (0.001), kl_type ("low_var_kl" | "kl" | "mse" | "abs"), tis_cap (2:
--   TIS's C), correction ("tis": the token weight below; "sequence_mask": each row weighted
--   by its sequence ratio exp(sum_t mask * (old - rollout)), and left out (weight 0) where
--   that exceeds seq_cap, 3 by default: TRL's vllm_importance_sampling_mode sequence_mask
--   with vllm_importance_sampling_cap).
-- Loss (verl's compute_policy_loss "vanilla" + kl_penalty, token-mean):
--   ratio = exp(clamp(logp - old, -20, 20))
--   pg    = max(-A*ratio, -A*clamp(ratio, 1-clip, 1+clip_high)); if A < 0: min(pg, -A*clip_c)
--   with rollout: pg *= min(exp(old - rollout), tis_cap), a constant in logp (verl's TIS)
--   kl    = low_var_kl: d = clamp(ref - logp, -20, 20); clamp(exp(d) - d - 1, -10, 10)
--   loss  = scale * sum_t mask * (pg + kl_coef * kl) / denom
-- stats: {loss, pg_loss, kl (mean KL term), clipfrac, approx_kl (mean of old - logp, verl's
--   ppo_kl), ratio_mean, ratio_max, tokens}; with rollout also tis_weight (the weight's mean),
--   tis_capped (share of tokens at the cap), logp_mismatch (mean |old - rollout|),
--   mismatch_kl (mean of rollout - old: the k1 estimate of KL(pi_rollout || pi_old) on the
--   sampled tokens) and, with sequence_mask, seq_masked (the share of rows left out).
function M.ppo(o, extra)
  -- Every option lives in the one table: a second table would be silently ignored.
  if extra ~= nil then error("losses.ppo: pass the options (clip, kl_coef, ...) in the first table", 2) end
  o = o or {}
  local c = { kind = "ppo", clip = o.clip or 0.2, kl_coef = o.kl_coef or 0.001, kl_type = o.kl_type or "low_var_kl" }
  c.clip_high = o.clip_high or c.clip
  c.tis_cap = o.tis_cap or 2
  if type(c.tis_cap) ~= "number" or not (c.tis_cap > 0) or c.tis_cap == math.huge then
    error("losses.ppo: tis_cap must be a finite number > 0, got " .. tostring(c.tis_cap), 2)
  end
  c.correction = o.correction or "tis"
  if c.correction ~= "tis" and c.correction ~= "sequence_mask" then
    error("losses.ppo: correction must be \"tis\" or \"sequence_mask\", got " .. tostring(c.correction), 2)
  end
  c.seq_cap = o.seq_cap or 3
  if type(c.seq_cap) ~= "number" or not (c.seq_cap > 0) or c.seq_cap == math.huge then
    error("losses.ppo: seq_cap must be a finite number > 0, got " .. tostring(c.seq_cap), 2)
  end
  c.clip_c = o.clip_c
  if c.clip_c == nil then c.clip_c = 3 end
  if c.clip_c and c.clip_c <= 1 then error("losses.ppo: clip_c must be > 1 (or false)", 2) end
  local kt = c.kl_type
  if kt ~= "low_var_kl" and kt ~= "kl" and kt ~= "mse" and kt ~= "abs" then
    error("losses.ppo: unknown kl_type " .. tostring(kt), 2)
  end
  return setmetatable(c, Criterion)
end

function Criterion:_ppo(logp, a)
  local lp = as_view(logp, "logp")
  local old = as_view(a.old, "old") or lp
  local ref = as_view(a.ref, "ref")
  local mask = as_view(a.mask, "mask")
  local rollout = as_view(a.rollout, "rollout")
  same_shape(lp, old, "old"); same_shape(lp, ref, "ref"); same_shape(lp, mask, "mask"); same_shape(lp, rollout, "rollout")
  local clip, clip_high, clip_c = self.clip, self.clip_high, self.clip_c
  local tis_cap, rollout_ = self.tis_cap, rollout and rollout.p
  local kl_coef, kl_type = self.kl_coef, self.kl_type
  local scale = a.scale or 1
  if kl_coef ~= 0 and not ref then error("losses.ppo: ref_logp is required when kl_coef ~= 0", 3) end
  local B, T, lens = lp.B, lp.T, lp.lens
  local adv = a.adv
  local lp_, old_, ref_, mask_ = lp.p, old.p, ref and ref.p, mask and mask.p
  local ntok = 0
  for b = 0, B - 1 do
    local n = lens and lens[b + 1] or T
    for t = 0, n - 1 do ntok = ntok + (mask_ and mask_[b * T + t] or 1) end
  end
  local denom = a.denom or ntok
  local st = { tokens = ntok, pg_loss = 0, kl = 0, clipfrac = 0, approx_kl = 0, ratio_mean = 0, ratio_max = -math.huge }
  if rollout then st.tis_weight, st.tis_capped, st.logp_mismatch, st.mismatch_kl = 0, 0, 0, 0 end
  -- sequence_mask: each row's weight from its whole response, before its tokens
  local seq_w
  if rollout_ and self.correction == "sequence_mask" then
    seq_w, st.seq_masked = {}, 0
    local rows = 0
    for b = 0, B - 1 do
      local n, sum, any = lens and lens[b + 1] or T, 0, false
      for t = 0, n - 1 do
        local mt = mask_ and mask_[b * T + t] or 1
        if mt ~= 0 then sum, any = sum + mt * (old_[b * T + t] - rollout_[b * T + t]), true end
      end
      local r = math.exp(clamp(sum, -20, 20))
      if any then
        rows = rows + 1
        if r > self.seq_cap then r = 0; st.seq_masked = st.seq_masked + 1 end
      end
      seq_w[b] = r
    end
    st.seq_masked = st.seq_masked / math.max(rows, 1)
  end
  self.B, self.T, self.grad = B, T, nil
  if denom <= 0 then
    st.loss, st.ratio_max = 0, 0
    return 0, st
  end
  local g = ffi.new("double[?]", math.max(1, B * T))
  local w = scale / denom
  local loss = 0
  for b = 0, B - 1 do
    local ab = adv[b + 1]
    local n = lens and lens[b + 1] or T
    for t = 0, n - 1 do
      local i = b * T + t
      local mt = mask_ and mask_[i] or 1
      if mt ~= 0 then
        local A = type(ab) == "table" and ab[t + 1] or ab
        local lpv = lp_[i]
        local d = lpv - old_[i]
        local dc = clamp(d, -20, 20)
        local ratio = math.exp(dc)
        local dratio = (d == dc) and ratio or 0          -- d ratio / d logp
        local l1 = -A * ratio
        local l2 = -A * clamp(ratio, 1 - clip, 1 + clip_high)
        local pg, dpg
        if l2 > l1 then
          pg, dpg = l2, 0                                  -- clipped: constant in logp
          st.clipfrac = st.clipfrac + mt
        else
          pg, dpg = l1, -A * dratio
        end
        if clip_c and A < 0 then
          local l3 = -A * clip_c
          if l3 < pg then pg, dpg = l3, 0 end
        end
        if rollout_ then   -- TIS: the sampled token's weight pi_old / pi_rollout, capped
          local dr = old_[i] - rollout_[i]
          local tis
          if seq_w then tis = seq_w[b]
          else
            tis = math.exp(clamp(dr, -20, 20))
            if tis >= tis_cap then tis = tis_cap; st.tis_capped = st.tis_capped + mt end
          end
          pg, dpg = pg * tis, dpg * tis
          st.tis_weight = st.tis_weight + mt * tis
          st.logp_mismatch = st.logp_mismatch + mt * math.abs(dr)
          st.mismatch_kl = st.mismatch_kl - mt * dr
        end
        local kl, dkl = 0, 0
        if kl_coef ~= 0 then
          local x = ref_[i] - lpv                          -- ref - logp
          if kl_type == "low_var_kl" then
            local xc = clamp(x, -20, 20)
            local e = math.exp(xc)
            kl = e - xc - 1
            -- d/dlogp of exp(x) - x - 1 with x = ref - logp is 1 - exp(x)
            dkl = (x == xc) and (1 - e) or 0
            if kl > 10 then kl, dkl = 10, 0 elseif kl < -10 then kl, dkl = -10, 0 end
          elseif kl_type == "kl" then                      -- k1: logp - ref
            kl, dkl = -x, 1
          elseif kl_type == "mse" then                     -- k2: 0.5 (logp - ref)^2
            kl, dkl = 0.5 * x * x, -x
          else                                             -- abs
            kl, dkl = math.abs(x), (x < 0) and 1 or ((x > 0) and -1 or 0)
          end
        end
        loss = loss + mt * (pg + kl_coef * kl)
        g[i] = w * mt * (dpg + kl_coef * dkl)
        st.pg_loss = st.pg_loss + mt * pg
        st.kl = st.kl + mt * kl
        st.approx_kl = st.approx_kl + mt * (-d)
        st.ratio_mean = st.ratio_mean + mt * ratio
        if ratio > st.ratio_max then st.ratio_max = ratio end
      end
    end
  end
  st.loss = loss * w
  for _, k in ipairs({ "pg_loss", "kl", "clipfrac", "approx_kl", "ratio_mean", "tis_weight", "tis_capped", "logp_mismatch",
                          "mismatch_kl" }) do
    if st[k] then st[k] = st[k] / math.max(ntok, 1e-30) end
  end
  if st.ratio_max == -math.huge then st.ratio_max = 0 end
  self.grad = g
  return st.loss, st
end

---------------------------------------------------------------- DPO (sigmoid)
-- Direct preference optimisation (Rafailov et al. 2023, TRL's loss_type "sigmoid" with
-- label smoothing = the conservative cDPO). Rows come in pairs: row 2k-1 is pair k's chosen
-- response, row 2k its rejected one (each prompt + response). batch:
--   mask          1 on the response's tokens (the positions whose log-probs are summed)
--   ref_chosen    ref_chosen[k]: the frozen reference's summed log-prob of pair k's chosen
--   ref_rejected  the same for the rejected response (computed once per pair by the caller)
--   denom         pairs of the mean (default B/2; pass the whole batch's count when
--                 accumulating micro-batches), scale (multiplies loss and gradient)
-- options: beta (0.1), label_smoothing (0; in [0, 0.5)).
-- Loss per pair, with pi = sum_t mask * logp and ref the reference's sums:
--   z    = beta * ((pi_c - ref_c) - (pi_r - ref_r))
--   loss = -(1 - ls) * log sigmoid(z) - ls * log sigmoid(-z)
-- and d loss / d logp = g * beta * mask on the chosen row, -g * beta * mask on the rejected
-- one, g = -(1 - ls) * sigmoid(-z) + ls * sigmoid(z).
-- stats: {loss, reward_chosen, reward_rejected (beta * (pi - ref), means), reward_margin,
--   reward_accuracy (share of pairs with chosen reward > rejected), logp_chosen,
--   logp_rejected (mean sums), pairs, tokens}.
function M.dpo(o)
  o = o or {}
  local c = { kind = "dpo", beta = o.beta or 0.1, label_smoothing = o.label_smoothing or 0 }
  if type(c.beta) ~= "number" or not (c.beta > 0) or c.beta == math.huge then
    error("losses.dpo: beta must be a finite number > 0, got " .. tostring(c.beta), 2)
  end
  local ls = c.label_smoothing
  if type(ls) ~= "number" or not (ls >= 0 and ls < 0.5) then
    error("losses.dpo: label_smoothing must be in [0, 0.5), got " .. tostring(ls), 2)
  end
  return setmetatable(c, Criterion)
end

-- log sigmoid(x) without overflow for large |x|.
local function log_sigmoid(x)
  if x >= 0 then return -math.log(1 + math.exp(-x)) end
  return x - math.log(1 + math.exp(x))
end
local function sigmoid(x)
  if x >= 0 then return 1 / (1 + math.exp(-x)) end
  local e = math.exp(x)
  return e / (1 + e)
end
M.log_sigmoid = log_sigmoid

-- Summed log-probs of each row over its mask (pi in the formula above): a list of B numbers.
function M.sequence_logps(logp, mask)
  local lp = as_view(logp, "logp")
  local mk = as_view(mask, "mask")
  same_shape(lp, mk, "mask")
  local out = {}
  for b = 0, lp.B - 1 do
    local s = 0
    for t = 0, lp.T - 1 do
      local i = b * lp.T + t
      if mk.p[i] ~= 0 then s = s + mk.p[i] * lp.p[i] end
    end
    out[b + 1] = s
  end
  return out
end

function Criterion:_dpo(logp, a)
  local lp = as_view(logp, "logp")
  local mask = as_view(a.mask, "mask")
  if not mask then error("losses.dpo: batch.mask (the response tokens) is required", 3) end
  same_shape(lp, mask, "mask")
  local B, T = lp.B, lp.T
  if B % 2 ~= 0 then error(("losses.dpo: rows come in (chosen, rejected) pairs; got %d rows"):format(B), 3) end
  local P = B / 2
  local rc, rr = a.ref_chosen, a.ref_rejected
  if type(rc) ~= "table" or type(rr) ~= "table" then
    error("losses.dpo: batch.ref_chosen and batch.ref_rejected (one number per pair) are required", 3)
  end
  for k = 1, P do
    if type(rc[k]) ~= "number" or type(rr[k]) ~= "number" then
      error(("losses.dpo: pair %d has no reference log-prob (ref_chosen/ref_rejected)"):format(k), 3)
    end
  end
  local pi = M.sequence_logps(lp, mask)
  local beta, ls = self.beta, self.label_smoothing
  local denom = a.denom or P
  local w = (a.scale or 1) / denom
  local st = { pairs = P, tokens = 0, reward_chosen = 0, reward_rejected = 0, reward_margin = 0,
    reward_accuracy = 0, logp_chosen = 0, logp_rejected = 0 }
  for i = 0, B * T - 1 do st.tokens = st.tokens + mask.p[i] end
  self.B, self.T, self.grad = B, T, nil
  if P == 0 then st.loss = 0; return 0, st end
  local g = ffi.new("double[?]", B * T)
  local loss = 0
  for k = 1, P do
    local c, r = 2 * k - 2, 2 * k - 1                      -- 0-based rows
    local rew_c = beta * (pi[c + 1] - rc[k])
    local rew_r = beta * (pi[r + 1] - rr[k])
    local z = rew_c - rew_r
    loss = loss - (1 - ls) * log_sigmoid(z) - ls * log_sigmoid(-z)
    local dz = -(1 - ls) * sigmoid(-z) + ls * sigmoid(z)   -- d loss / d z
    local gc, gr = w * dz * beta, -w * dz * beta
    for t = 0, T - 1 do
      g[c * T + t] = gc * mask.p[c * T + t]
      g[r * T + t] = gr * mask.p[r * T + t]
    end
    st.reward_chosen = st.reward_chosen + rew_c
    st.reward_rejected = st.reward_rejected + rew_r
    st.reward_margin = st.reward_margin + z
    if z > 0 then st.reward_accuracy = st.reward_accuracy + 1 end
    st.logp_chosen = st.logp_chosen + pi[c + 1]
    st.logp_rejected = st.logp_rejected + pi[r + 1]
  end
  for _, key in ipairs({ "reward_chosen", "reward_rejected", "reward_margin", "reward_accuracy", "logp_chosen", "logp_rejected" }) do
    st[key] = st[key] / P
  end
  st.loss = loss * w
  self.grad = g
  return st.loss, st
end

function Criterion:forward(logp, batch)
  if self.kind == "nll" then return self:_nll(logp, batch or {}) end
  if self.kind == "dpo" then return self:_dpo(logp, batch or {}) end
  return self:_ppo(logp, batch or {})
end

-- The PPO loss over Lua tables of rows (ragged allowed), for scripts and tests:
--   losses.ppo_rows{logp =, old_logp =, ref_logp =, adv =, mask =, clip =, kl_coef =, ...}
-- returns {loss, dlogp = [b][t], stats...}.
-- Rows of a table of tables as a flat view of width max(#row) with per-row lengths.
local function view_of(rows, B, T, lens)
  local v = M.view(B, T, lens)
  for b = 1, B do
    local r = rows[b]
    for t = 1, #r do v.p[(b - 1) * T + t - 1] = r[t] end
  end
  return v
end

function M.ppo_rows(a, extra)
  if extra ~= nil then error("losses.ppo_rows: pass the options (clip, kl_coef, ...) in the first table", 2) end
  local logp, old, ref, mask = a.logp, a.old_logp, a.ref_logp, a.mask
  local B, T, lens = #logp, 0, {}
  for b = 1, B do
    local n = #logp[b]
    local orow, rrow, m = old and old[b] or logp[b], ref and ref[b], mask and mask[b]
    if #orow ~= n or (rrow and #rrow ~= n) or (m and #m ~= n) then
      error(("losses.ppo_rows: row %d lengths differ (logp %d, old %d, ref %s, mask %s)"):format(
        b, n, #orow, rrow and #rrow or "-", m and #m or "-"), 2)
    end
    lens[b], T = n, math.max(T, n)
  end
  local ok, L = pcall(M.ppo, { clip = a.clip, clip_high = a.clip_high, clip_c = a.clip_c,
    kl_coef = a.kl_coef, kl_type = a.kl_type })
  if not ok then error(L, 2) end
  local lv = view_of(logp, B, T, lens)
  local batch = { old = old and view_of(old, B, T, lens), ref = ref and view_of(ref, B, T, lens),
    mask = mask and view_of(mask, B, T, lens), adv = a.adv, denom = a.denom, scale = a.scale }
  local ok2, loss, st = pcall(L.forward, L, lv, batch)
  if not ok2 then error(loss, 2) end
  st.loss = loss
  st.dlogp = {}
  for b = 1, B do st.dlogp[b] = L:grad_row(b, lens[b]) end
  return st
end

return M
