-- Truncated importance sampling (rollout.quant=int8: rollouts sample from int8 weights, the
-- update trains the f32 ones): the PPO loss with batch.rollout against PyTorch autograd of
-- verl's formula (tests/reference/tis_ref.py -> tests/fixtures/ppo/tis_ref.json), a
-- hand-computed token, the rollout log-probabilities' alignment with the training rows, and
-- an RL update whose rollout log-probabilities come from the model's own int8 generation.
local T = require("clrt.test")
local cjson = require("cjson")
local losses = require("clrt.train.losses")
local ppo = require("clrt.train.ppo")

local function view_of(rows)
  local B, Tn = #rows, #rows[1]
  local v = losses.view(B, Tn)
  for b = 1, B do for t = 1, Tn do v.p[(b - 1) * Tn + t - 1] = rows[b][t] end end
  return v
end

T.case("loss, gradient and statistics match PyTorch autograd of verl's TIS", function()
  local fx = cjson.decode(T.read(T.source_dir() .. "/tests/fixtures/ppo/tis_ref.json"))
  T.eq(#fx.cases, 3, "fixture cases")
  for _, c in ipairs(fx.cases) do
    local L = losses.ppo{ clip = c.clip, kl_coef = c.kl_coef, tis_cap = c.tis_cap }
    local loss, st = L:forward(view_of(c.logp), { old = c.old ~= cjson.null and view_of(c.old) or nil,
      rollout = view_of(c.rollout), ref = view_of(c.ref), adv = c.adv, mask = view_of(c.mask) })
    T.near(loss, c.loss, 1e-10, c.name .. ": loss")
    for _, k in ipairs({ "pg_loss", "tis_weight", "tis_capped", "logp_mismatch" }) do
      T.near(st[k], c.stats[k], 1e-10, c.name .. ": " .. k)
    end
    for b = 1, #c.logp do T.near(L:grad_row(b, #c.logp[1]), c.grad[b], 1e-10, c.name .. ": gradient row " .. b) end
  end
end)

T.case("sequence_mask (train.async.correction): loss, gradient and statistics match PyTorch autograd", function()
  local fx = cjson.decode(T.read(T.source_dir() .. "/tests/fixtures/ppo/seq_mask_ref.json"))
  T.eq(#fx.cases, 3, "fixture cases")
  local masked = 0
  for _, c in ipairs(fx.cases) do
    local L = losses.ppo{ clip = c.clip, kl_coef = c.kl_coef, correction = "sequence_mask", seq_cap = c.seq_cap }
    local loss, st = L:forward(view_of(c.logp), { old = view_of(c.old), rollout = view_of(c.rollout), ref = view_of(c.ref),
      adv = c.adv, mask = view_of(c.mask) })
    T.near(loss, c.loss, 1e-10, c.name .. ": loss")
    for _, k in ipairs({ "pg_loss", "tis_weight", "logp_mismatch", "mismatch_kl", "seq_masked" }) do
      T.near(st[k], c.stats[k], 1e-10, c.name .. ": " .. k)
    end
    for b = 1, #c.logp do T.near(L:grad_row(b, #c.logp[1]), c.grad[b], 1e-10, c.name .. ": gradient row " .. b) end
    masked = masked + c.stats.seq_masked
  end
  T.ok(masked > 0, "a case masks rows")
  T.raises(function() losses.ppo{ correction = "token_mask" } end, "correction must be")
  T.raises(function() losses.ppo{ seq_cap = -1 } end, "seq_cap must be a finite number > 0")
end)

-- One token, A = 1, on-policy (ratio 1, unclipped): pg = -A * ratio * w, d pg / d logp = -w,
-- w = min(exp(old - rollout), C). old = -1, rollout = -1.5: w = e^0.5 = 1.6487...; C = 1.5 caps it.
T.case("a hand-computed token: the weight, its cap, and no rollout means no weight", function()
  local function one(rollout, cap)
    local L = losses.ppo{ kl_coef = 0, tis_cap = cap }
    local loss, st = L:forward(view_of({ { -1 } }), { adv = { 1 }, rollout = rollout and view_of({ { rollout } }) })
    return loss, L:grad_row(1, 1)[1], st
  end
  local loss, g, st = one(-1.5, 2)
  T.near(loss, -math.exp(0.5), 1e-12)
  T.near(g, -math.exp(0.5), 1e-12)
  T.near(st.tis_weight, math.exp(0.5), 1e-12)
  T.near(st.logp_mismatch, 0.5, 1e-12)
  T.eq(st.tis_capped, 0)
  loss, g, st = one(-1.5, 1.5)
  T.near(loss, -1.5, 1e-12)
  T.near(g, -1.5, 1e-12)
  T.eq(st.tis_capped, 1)
  loss, g, st = one(nil, 2)
  T.near(loss, -1, 1e-12)
  T.eq(st.tis_weight, nil, "without rollout log-probs there is no weight")
  T.raises(function() losses.ppo{ tis_cap = 0 } end, "tis_cap must be a finite number > 0")
end)

T.case("rollout log-probabilities land on the response's positions of each row", function()
  -- row 1: prompt of 3, response of 2 (logp positions 3, 4 score tokens 4, 5); row 2: 2 + 3
  local rows = { { ids = { 1, 2, 3, 4, 5 }, first = 3, rollout_lp = { -0.1, -0.2 } },
    { ids = { 6, 7, 8, 9, 10 }, first = 2, rollout_lp = { -0.3, -0.4, -0.5 } } }
  local v = ppo.rollout_view(rows, 4)
  local got = {}
  for i = 0, 7 do got[i + 1] = v.p[i] end
  T.eq(got, { 0, 0, -0.1, -0.2, 0, -0.3, -0.4, -0.5 })
  T.eq(ppo.rollout_view({ { ids = { 1, 2 }, first = 1 } }, 1), nil)
  T.raises(function() ppo.rollout_view({ { ids = { 1, 2, 3 }, first = 1, rollout_lp = { -1 } } }, 2) end,
    "row 1 has 1 rollout log-probabilities for its 2 response tokens")
end)

-- The policy samples with int8 weights (their temperature-1 log-probabilities kept by the
-- engine); the update's TIS weights are then near 1 and the mismatch small but not zero.
-- Rollout log-probabilities equal to the f32 ones give weight 1: the same step as none.
T.case("an RL update over the model's own int8 rollouts", function()
  local root = T.source_dir() .. "/tests/fixtures/model/"
  local m = clrt.model.load(root .. "llama_gqa")
  local ref = clrt.model.load(root .. "llama_gqa")
  m:set_quant("int8")
  local prompts = { { 3, 17, 5, 9 }, { 1, 2, 3 } }
  local outs = require("clrt.sched").generate(m, prompts[1], { n = 2, temperature = 1, max_new_tokens = 8, seed = 5,
    top_logprobs = 0 })
  m:set_quant("none")
  local entries = {}
  for i, o in ipairs(outs) do
    local lps = {}
    for j, t in ipairs(o.model_logprobs) do lps[j] = t.lp end
    T.eq(#lps, #o.tokens, "one rollout log-prob per token")
    entries[i] = { prompt_ids = prompts[1], tokens = o.tokens, advantage = i == 1 and 1 or -1, logprobs_rollout = lps }
  end
  local rows = ppo.training_rows(entries)
  local t = { clip = 0.2, kl_coef = 0.001, mini_batches = 1, micro_batch_size = 8, tis_cap = 2 }
  local opt = clrt.optim.adamw(m, { lr = 1e-3 })
  local st = ppo.update(m, ref, opt, rows, t, 1e-3)
  print(("int8 rollouts: mean |logp_train - logp_rollout| %.4g, mean TIS weight %.4g"):format(st.logp_mismatch, st.tis_weight))
  T.ok(st.logp_mismatch > 0 and st.logp_mismatch < 0.05, "mismatch " .. st.logp_mismatch)
  T.ok(math.abs(st.tis_weight - 1) < 0.05, "TIS weight " .. st.tis_weight)
  opt:free()
  -- weight exactly 1: rollout log-probs equal to the f32 ones (the same step as without them)
  local a, b = clrt.model.load(root .. "llama_gqa"), clrt.model.load(root .. "llama_gqa")
  local lp = require("clrt.train.update").logprobs(a, rows, false)
  for bi, r in ipairs(rows) do
    r.rollout_lp = {}
    for j = 1, #r.ids - r.first do r.rollout_lp[j] = lp:get(bi, r.first + j - 1) end
  end
  local oa, ob = clrt.optim.adamw(a, { lr = 1e-2 }), clrt.optim.adamw(b, { lr = 1e-2 })
  local sa = ppo.update(a, ref, oa, rows, t, 1e-2)
  for _, r in ipairs(rows) do r.rollout_lp = nil end
  local sb = ppo.update(b, ref, ob, rows, t, 1e-2)
  T.eq(sa.tis_weight, 1)
  T.eq(sb.tis_weight, nil)
  T.eq(sa.loss, sb.loss, "the same loss")
  local pa, pb = a:params(), b:params()
  for name, p in pairs(pa) do T.eq(p:totable(), pb[name]:totable(), name) end
  oa:free(); ob:free(); a:free(); b:free(); m:free(); ref:free()
end)

T.run()
