-- train.algorithm=ppo (PPO with a value head, as TRL's PPOTrainer that the CollabLLM authors
-- use): the per-token rewards, GAE, whitening, the clipped value loss and its gradient, the
-- policy loss with per-token advantages, the explained variance and the adaptive KL against an
-- independent PyTorch computation (tests/reference/gae_ref.py -> tests/fixtures/ppo/gae_ref.json);
-- the model's hidden states (the value head's input) against the output layer they feed, and
-- the gradient that enters through them against finite differences; a PPO run on the built-in
-- world logs its value figures, checkpoints its value head and resumes bit for bit.
local T = require("clrt.test")
local cjson = require("cjson")
local ffi = require("ffi")
local gae = require("clrt.train.gae")
local losses = require("clrt.train.losses")
local value_head = require("clrt.train.value_head")

local fx = cjson.decode(T.read(T.source_dir() .. "/tests/fixtures/ppo/gae_ref.json"))

local function close(a, b, tol, what)
  T.ok(math.abs(a - b) <= tol * math.max(1, math.abs(b)), ("%s: %.12g, expected %.12g"):format(what, a, b))
end
local function close_rows(a, b, tol, what)
  T.eq(#a, #b, what .. ": rows")
  for i = 1, #b do
    T.eq(#a[i], #b[i], what .. ": length of row " .. i)
    for k = 1, #b[i] do close(a[i][k], b[i][k], tol, ("%s[%d][%d]"):format(what, i, k)) end
  end
end

T.case("rewards, GAE, whitening, value loss, explained variance and adaptive KL equal PyTorch's within 1e-9", function()
  T.ok(#fx.cases >= 4, "fixture cases")
  for _, c in ipairs(fx.cases) do
    local rewards, raw, ret, adv = {}, {}, {}, {}
    for i = 1, #c.scores do
      rewards[i] = gae.token_rewards(c.scores[i], c.old[i], c.ref[i], c.kl_coef)
      raw[i], ret[i] = gae.advantages(rewards[i], c.values[i], c.gamma, c.lam)
      adv[i] = {}
      for k, v in ipairs(raw[i]) do adv[i][k] = v end
    end
    gae.whiten(adv)
    close_rows(rewards, c.rewards, 1e-9, c.name .. ": rewards")
    close_rows(raw, c.advantages_raw, 1e-9, c.name .. ": advantages")
    close_rows(ret, c.returns, 1e-9, c.name .. ": returns")
    close_rows(adv, c.advantages, 1e-9, c.name .. ": whitened advantages")
    local ntok = 0
    for i = 1, #c.vpred do ntok = ntok + #c.vpred[i] end
    local loss, clipped, grads = 0, 0, {}
    for i = 1, #c.vpred do
      local l, g, n = gae.value_loss(c.vpred[i], c.values[i], ret[i], c.cliprange_value, ntok)
      loss, clipped = loss + l, clipped + n
      grads[i] = {}
      for k, v in ipairs(g) do grads[i][k] = c.vf_coef * v end
    end
    close(loss, c.vf_loss, 1e-9, c.name .. ": value loss")
    close(clipped / ntok, c.vf_clipfrac, 1e-12, c.name .. ": value clip fraction")
    close_rows(grads, c.dvpred, 1e-9, c.name .. ": d(vf_coef * value loss)/d vpred")
    close(gae.explained_variance(ret, c.values), c.explained_variance, 1e-9, c.name .. ": explained variance")
    close(gae.adapt_kl(c.kl_coef, (function()
      local s = 0
      for i = 1, #c.old do for k = 1, #c.old[i] do s = s + c.old[i][k] - c.ref[i][k] end end
      return s / #c.old
    end)(), #c.old, c.kl_target, c.kl_horizon), c.next_kl_coef, 1e-12, c.name .. ": next KL coefficient")
  end
end)

T.case("the policy loss on per-token advantages (no dual clip, no KL term) equals TRL's in PyTorch", function()
  for _, c in ipairs(fx.cases) do
    local B, L = #c.logp, 0
    for i = 1, B do L = math.max(L, #c.logp[i]) end
    local lp, old, mask = losses.view(B, L), losses.view(B, L), losses.view(B, L)
    local adv = {}
    for b = 1, B do
      adv[b] = {}
      for k = 1, L do
        local i = (b - 1) * L + k - 1
        local inside = k <= #c.logp[b]
        lp.p[i], old.p[i], mask.p[i] = inside and c.logp[b][k] or 0, inside and c.old[b][k] or 0, inside and 1 or 0
        adv[b][k] = inside and c.advantages[b][k] or 0
      end
    end
    local Lc = losses.ppo{ clip = c.cliprange, kl_coef = 0, clip_c = false }
    local loss = Lc:forward(lp, { old = old, adv = adv, mask = mask })
    close(loss, c.pg_loss, 1e-9, c.name .. ": policy loss")
    local g = {}
    for b = 1, B do g[b] = {}; for k = 1, #c.logp[b] do g[b][k] = Lc:grad_row(b, L)[k] end end
    close_rows(g, c.dlogp, 1e-9, c.name .. ": d policy loss / d logp")
  end
end)

local cfg = { vocab_size = 37, hidden_size = 16, intermediate_size = 24, num_hidden_layers = 2, num_attention_heads = 4,
  num_key_value_heads = 2, max_position_embeddings = 32, rms_norm_eps = 1e-6 }
local toks = { { 1, 5, 7, 9, 3, 30 }, { 2, 4, 6 }, { 36, 0, 11, 12 } }

T.case("hidden states are the output layer's input: logp = log_softmax(h W^T)[next]", function()
  local m = clrt.model.new(cfg, { seed = 4 })
  local lp, h = m:logprobs(toks, { grad = false, hidden = true })
  T.eq(h:size(3), cfg.hidden_size)
  local W = m:params()["lm_head.weight"] or m:params()["model.embed_tokens.weight"]
  local wp, hp, lpp = ffi.cast("float *", W:data_ptr()), ffi.cast("float *", h:data_ptr()), ffi.cast("float *", lp:data_ptr())
  local C, V, T1 = cfg.hidden_size, cfg.vocab_size, lp:size(2)
  for b, row in ipairs(toks) do
    for t = 1, T1 do
      local off = ((b - 1) * T1 + t - 1) * C
      if t < #row then
        local logits, mx = {}, -math.huge
        for v = 0, V - 1 do
          local s = 0
          for i = 0, C - 1 do s = s + hp[off + i] * wp[v * C + i] end
          logits[v] = s
          mx = math.max(mx, s)
        end
        local z = 0
        for v = 0, V - 1 do z = z + math.exp(logits[v] - mx) end
        close(lpp[(b - 1) * T1 + t - 1], logits[row[t + 1]] - mx - math.log(z), 1e-4, ("logp[%d][%d]"):format(b, t))
      else
        for i = 0, C - 1 do T.eq(hp[off + i], 0, "no hidden state past a row's end") end
      end
    end
  end
end)

T.case("the value loss's gradient through the hidden states matches finite differences", function()
  local m = clrt.model.new(cfg, { seed = 4 })
  local head = value_head.new(cfg.hidden_size, 9)
  -- L = sum over positions with a target of c_t * value(h_t): a value loss's shape
  local coef = function(b, t) return math.sin(b * 1.3 + t * 0.7) end
  local function loss_of(model)
    local lp, h = model:logprobs(toks, { grad = false, hidden = true })
    local s = 0
    for b, row in ipairs(toks) do for t = 1, #row - 1 do s = s + coef(b, t) * head:value(h, b, t) end end
    return s, lp
  end
  local lp, h = m:logprobs(toks, { grad = true, hidden = true })
  local dh = clrt.tensor.zeros({ h:size(1), h:size(2), h:size(3) })
  for b, row in ipairs(toks) do for t = 1, #row - 1 do head:accumulate(h, b, t, coef(b, t), dh) end end
  m:zero_grad()
  m:backward(clrt.tensor.zeros({ lp:size(1), lp:size(2) }), dh)
  local checked = 0
  for _, name in ipairs({ "model.layers.1.mlp.down_proj.weight", "model.norm.weight", "model.layers.0.self_attn.q_proj.weight",
    "model.embed_tokens.weight" }) do
    local p, g = m:params()[name], m:grads()[name]
    local pp, gp = ffi.cast("float *", p:data_ptr()), ffi.cast("float *", g:data_ptr())
    for _, i in ipairs({ 0, 7, 19 }) do
      local keep, eps = pp[i], 1e-2
      pp[i] = keep + eps; m:params_changed()
      local up = loss_of(m)
      pp[i] = keep - eps; m:params_changed()
      local down = loss_of(m)
      pp[i] = keep; m:params_changed()
      local fd = (up - down) / (2 * eps)
      T.ok(math.abs(gp[i] - fd) <= 2e-3 + 2e-2 * math.abs(fd), ("%s[%d]: backward %.6g, finite differences %.6g"):format(name, i, gp[i], fd))
      checked = checked + (math.abs(fd) > 1e-4 and 1 or 0)
    end
  end
  T.ok(checked >= 6, "enough nonzero gradients were compared (" .. checked .. ")")
  -- the head's own gradient: d L / d b = sum of the coefficients; d L / d w by finite differences
  local sum = 0
  for b, row in ipairs(toks) do for t = 1, #row - 1 do sum = sum + coef(b, t) end end
  close(head.gb, sum, 1e-12, "d L / d bias")
  local wp = ffi.cast("float *", head.w:data_ptr())
  for _, i in ipairs({ 0, 5, 15 }) do
    local keep, eps = wp[i], 1e-2
    wp[i] = keep + eps
    local up = loss_of(m)
    wp[i] = keep - eps
    local down = loss_of(m)
    wp[i] = keep
    close(head.gw[i], (up - down) / (2 * eps), 1e-3, ("d L / d w[%d]"):format(i))
  end
  -- Adam's first step moves every parameter by lr against the sign of its gradient
  local before, grads = {}, {}
  for i = 0, cfg.hidden_size - 1 do before[i], grads[i] = wp[i], head.gw[i] end
  local b0 = ffi.cast("float *", head.b:data_ptr())[0]
  head:step(1e-3)
  for i = 0, cfg.hidden_size - 1 do
    local want = before[i] - 1e-3 * grads[i] / (math.abs(grads[i]) + 1e-8)
    T.ok(math.abs(wp[i] - want) < 1e-7, ("Adam step w[%d]: %.9g, expected %.9g"):format(i, wp[i], want))
    T.eq(head.gw[i], 0, "gradients zeroed after the step")
  end
  T.ok(math.abs(ffi.cast("float *", head.b:data_ptr())[0] - (b0 - 1e-3 * (sum > 0 and 1 or -1))) < 1e-7, "Adam step b")
  m:logprobs(toks, { grad = true })
  T.raises(function() m:backward(clrt.tensor.zeros({ lp:size(1), lp:size(2) }), clrt.tensor.zeros({ 2, 2, 2 })) end, "dhidden has shape")
end)

T.case("algorithm=ppo on the built-in world: value figures logged, value head checkpointed, resume bit for bit", function()
  local config, data = require("clrt.config"), require("clrt.data")
  local sft, rl = require("recipes.collabllm_sft"), require("recipes.collabllm_rl")
  local root = T.tmpdir()
  local start = sft.main(config.parse(sft.defaults, {
    "run_dir=" .. root .. "/sft", "train.steps=6", "train.batch_size=8", "world.conversations=100",
    "arch.hidden_size=32", "arch.intermediate_size=64", "arch.num_hidden_layers=2", "train.val_every=0",
  }, sft.world_config()))
  local function args(dir, extra)
    local a = { "config=" .. rl.world_config_path(), "model=" .. start, "run_dir=" .. dir, "steps=4", "prompts_per_step=3",
      "rollout.n=2", "rollout.num_repeat_rollouts=1", "rollout.max_new_tokens=10", "seed=5", "eval.before=false",
      "eval.after=false", "save_every=2", "sample_every=0", "train.algorithm=ppo", "train.lr=1e-3", "train.ppo_epochs=2" }
    for _, x in ipairs(extra or {}) do a[#a + 1] = x end
    return a
  end
  local function rows(dir)
    local out = {}
    for _, r in ipairs(data.read_jsonl(dir .. "/metrics.jsonl")) do
      local c = {}
      for k, v in pairs(r) do if not (k:find("^time") or k == "tokens_per_s" or k == "elapsed") then c[k] = v end end
      out[r.step] = c
    end
    return out
  end
  rl.main(config.parse(rl.defaults, args(root .. "/straight")))
  local a = rows(root .. "/straight")
  for step = 1, 4 do
    for _, k in ipairs({ "value/loss", "value/explained_variance", "returns/mean", "kl_penalty_coef", "pg_loss" }) do
      T.eq(type(a[step][k]), "number", ("step %d logs %s"):format(step, k))
    end
  end
  T.ok(a[1]["value/loss"] > 0, "the value loss is positive")
  io.write("  step 4: ", require("clrt.json").encode(a[4]), "\n")
  T.eq(a[1].kl_penalty_coef, 0.2, "the KL penalty starts at train.kl_penalty_coef")
  T.ok(a[3].kl_penalty_coef ~= a[2].kl_penalty_coef, "and adapts towards train.kl_target")
  local ck = root .. "/straight/checkpoint-4/value_head.safetensors"
  T.ok(T.read(ck), "the checkpoint holds the value head")
  local saved = value_head.load(ck, 32)
  local fresh = value_head.new(32, 5)
  local moved = 0
  for i = 0, 31 do moved = moved + math.abs(ffi.cast("float *", saved.w:data_ptr())[i] - ffi.cast("float *", fresh.w:data_ptr())[i]) end
  T.ok(moved > 0 and saved.t == 16, ("the head trained: |dw| %.3g, %d Adam steps (2 epochs x 2 mini-batches x 4 steps)"):format(moved, saved.t))
  rl.main(config.parse(rl.defaults, args(root .. "/stopped", { "stop_after=2" })))
  rl.main(rl.parse_args({ "resume=" .. root .. "/stopped" }))
  local b = rows(root .. "/stopped")
  for step = 1, 4 do T.eq(b[step], a[step], "step " .. step) end
  T.raises(function() rl.check_config(config.parse(rl.defaults, { "train.algorithm=ppo2" })) end, "train.algorithm")
end)

T.run()
