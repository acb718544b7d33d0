-- The DPO loss (clrt.train.losses.dpo): values worked out by hand, an independent PyTorch
-- implementation of the formula on fixed log-probs (tests/reference/dpo_ref.py writes
-- tests/fixtures/dpo/dpo_ref.json), the gradient against central finite differences, the
-- micro-batch contract (denom) and the errors on malformed batches.
local T = require("clrt.test")
local losses = require("clrt.train.losses")
local cjson = require("cjson")

-- A [B, T] view of doubles from a Lua matrix.
local function view_of(rows)
  local B, Tn = #rows, #rows[1]
  local v = losses.view(B, Tn)
  for b = 1, B do for t = 1, Tn do v.p[(b - 1) * Tn + t - 1] = rows[b][t] end end
  return v
end

-- one pair: chosen sums -2 - 0.5 = -2.5 (ref -3), rejected -1 - 1 = -2 (ref -1.5);
-- z = 0.5 * ((-2.5 + 3) - (-2 + 1.5)) = 0.5
local HAND = { logp = { { -1, -2, -0.5 }, { -1, -1, -3 } }, mask = { { 0, 1, 1 }, { 1, 1, 0 } },
  ref_chosen = { -3 }, ref_rejected = { -1.5 } }

T.case("hand-computed loss, gradient and stats", function()
  local L = losses.dpo{ beta = 0.5 }
  local loss, st = L:forward(view_of(HAND.logp), { mask = view_of(HAND.mask),
    ref_chosen = HAND.ref_chosen, ref_rejected = HAND.ref_rejected })
  -- -log sigmoid(0.5) = log(1 + e^-0.5)
  T.near(loss, 0.47407698418010669, 1e-12, "loss")
  -- d loss/d z = -sigmoid(-0.5) = -0.3775406687981454; times beta on chosen, -beta on rejected
  local gc, gr = L:grad_row(1, 3), L:grad_row(2, 3)
  T.near(gc[1], 0, 0); T.near(gc[2], -0.1887703343990727, 1e-12); T.near(gc[3], -0.1887703343990727, 1e-12)
  T.near(gr[1], 0.1887703343990727, 1e-12); T.near(gr[2], 0.1887703343990727, 1e-12); T.near(gr[3], 0, 0)
  T.near(st.reward_chosen, 0.25, 1e-12); T.near(st.reward_rejected, -0.25, 1e-12)
  T.near(st.reward_margin, 0.5, 1e-12); T.eq(st.reward_accuracy, 1); T.eq(st.pairs, 1); T.eq(st.tokens, 4)
  T.near(st.logp_chosen, -2.5, 1e-12); T.near(st.logp_rejected, -2, 1e-12)
  -- label smoothing 0.25: 0.75 * log(1 + e^-z) + 0.25 * log(1 + e^z) = log(1 + e^-z) + 0.25 z
  local Ls = losses.dpo{ beta = 0.5, label_smoothing = 0.25 }
  local loss2 = Ls:forward(view_of(HAND.logp), { mask = view_of(HAND.mask),
    ref_chosen = HAND.ref_chosen, ref_rejected = HAND.ref_rejected })
  T.near(loss2, 0.47407698418010669 + 0.125, 1e-12, "smoothed loss")
  -- d/dz = -0.75 sigmoid(-z) + 0.25 sigmoid(z) = -sigmoid(-z) + 0.25
  T.near(Ls:grad_row(1, 3)[2], 0.5 * (-0.3775406687981454 + 0.25), 1e-12)
  -- an f32 tensor works like a view
  local lp = require("clrt.tensor").from(HAND.logp)
  local loss3 = L:forward(lp, { mask = view_of(HAND.mask), ref_chosen = HAND.ref_chosen, ref_rejected = HAND.ref_rejected })
  T.near(loss3, 0.47407698418010669, 1e-6)
  local d = L:backward()
  T.eq(d:size(1), 2); T.eq(d:size(2), 3)
end)

T.case("matches the PyTorch implementation on fixed log-probs", function()
  local fx = cjson.decode(T.read(T.source_dir() .. "/tests/fixtures/dpo/dpo_ref.json"))
  T.ok(#fx.cases >= 4, "fixture cases")
  for _, c in ipairs(fx.cases) do
    local L = losses.dpo{ beta = c.beta, label_smoothing = c.label_smoothing }
    local loss, st = L:forward(view_of(c.logp), { mask = view_of(c.mask), ref_chosen = c.ref_chosen,
      ref_rejected = c.ref_rejected })
    T.near(loss, c.loss, 1e-10, c.name .. ": loss")
    T.near(st.reward_chosen, c.reward_chosen, 1e-10, c.name .. ": reward_chosen")
    T.near(st.reward_rejected, c.reward_rejected, 1e-10, c.name .. ": reward_rejected")
    T.near(st.reward_accuracy, c.reward_accuracy, 1e-12, c.name .. ": reward_accuracy")
    for b = 1, #c.logp do
      local g = L:grad_row(b, #c.logp[1])
      for t = 1, #g do T.near(g[t], c.grad[b][t], 1e-10, ("%s: grad[%d][%d]"):format(c.name, b, t)) end
    end
  end
end)

T.case("gradient equals central finite differences", function()
  local fx = cjson.decode(T.read(T.source_dir() .. "/tests/fixtures/dpo/dpo_ref.json"))
  local c = fx.cases[2]   -- three pairs with label smoothing
  local L = losses.dpo{ beta = c.beta, label_smoothing = c.label_smoothing }
  local batch = { mask = view_of(c.mask), ref_chosen = c.ref_chosen, ref_rejected = c.ref_rejected }
  local lp = view_of(c.logp)
  L:forward(lp, batch)
  local B, Tn = #c.logp, #c.logp[1]
  local analytic = {}
  for b = 1, B do analytic[b] = L:grad_row(b, Tn) end
  local eps = 1e-6
  local probe = losses.dpo{ beta = c.beta, label_smoothing = c.label_smoothing }
  local worst = 0
  for b = 1, B do
    for t = 1, Tn do
      local i = (b - 1) * Tn + t - 1
      local x = lp.p[i]
      lp.p[i] = x + eps; local up = probe:forward(lp, batch)
      lp.p[i] = x - eps; local down = probe:forward(lp, batch)
      lp.p[i] = x
      local fd = (up - down) / (2 * eps)
      worst = math.max(worst, math.abs(fd - analytic[b][t]))
      T.near(analytic[b][t], fd, 1e-7, ("d loss / d logp[%d][%d]"):format(b, t))
    end
  end
  T.ok(worst < 1e-7, "worst difference " .. worst)
end)

T.case("micro-batches with the whole batch's pair count add up to the whole batch", function()
  local fx = cjson.decode(T.read(T.source_dir() .. "/tests/fixtures/dpo/dpo_ref.json"))
  local c = fx.cases[4]   -- four pairs
  local L = losses.dpo{ beta = c.beta }
  local whole = L:forward(view_of(c.logp), { mask = view_of(c.mask), ref_chosen = c.ref_chosen, ref_rejected = c.ref_rejected })
  local gw = {}
  for b = 1, 8 do gw[b] = L:grad_row(b, #c.logp[1]) end
  local sum = 0
  for half = 0, 1 do
    local rows, mrows, rc, rr = {}, {}, {}, {}
    for k = 1, 2 do
      local pk = half * 2 + k
      rows[#rows + 1], rows[#rows + 2] = c.logp[2 * pk - 1], c.logp[2 * pk]
      mrows[#mrows + 1], mrows[#mrows + 2] = c.mask[2 * pk - 1], c.mask[2 * pk]
      rc[k], rr[k] = c.ref_chosen[pk], c.ref_rejected[pk]
    end
    sum = sum + L:forward(view_of(rows), { mask = view_of(mrows), ref_chosen = rc, ref_rejected = rr, denom = 4 })
    for b = 1, 4 do
      local g = L:grad_row(b, #c.logp[1])
      for t = 1, #g do T.near(g[t], gw[half * 4 + b][t], 1e-12) end
    end
  end
  T.near(sum, whole, 1e-12, "sum of the micro-batch losses")
end)

T.case("malformed batches and options are refused with a clear error", function()
  local L = losses.dpo{ beta = 0.5 }
  T.raises(function() L:forward(view_of({ { -1 }, { -1 }, { -1 } }), { mask = view_of({ { 1 }, { 1 }, { 1 } }),
    ref_chosen = { 0 }, ref_rejected = { 0 } }) end, "pairs")
  T.raises(function() L:forward(view_of(HAND.logp), { mask = view_of(HAND.mask) }) end, "ref_chosen")
  T.raises(function() L:forward(view_of(HAND.logp), { mask = view_of(HAND.mask), ref_chosen = {}, ref_rejected = { 1 } }) end, "pair 1")
  T.raises(function() L:forward(view_of(HAND.logp), { ref_chosen = { 0 }, ref_rejected = { 0 } }) end, "mask")
  T.raises(function() losses.dpo{ beta = 0 } end, "beta")
  T.raises(function() losses.dpo{ label_smoothing = 0.5 } end, "label_smoothing")
end)

T.run()
