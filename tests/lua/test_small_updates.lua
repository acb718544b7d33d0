-- The shortcuts of the small model's updates: SFT micro-batches grouped by length (each padded
-- only to its own longest row) give the whole batch's gradient, and the RL update takes the
-- first mini-batch's old log-probs from its own training forward; both against the plain
-- computation.
local T = require("clrt.test")
local sft = require("clrt.sft")
local ppo = require("clrt.train.ppo")
local update = require("clrt.train.update")
local losses = require("clrt.train.losses")
local rng = require("clrt.rng")

local ARCH = { vocab_size = 61, hidden_size = 32, intermediate_size = 48, num_hidden_layers = 2,
  num_attention_heads = 2, num_key_value_heads = 2, max_position_embeddings = 64,
  rms_norm_eps = 1e-6, rope_theta = 10000.0, tie_word_embeddings = true }

-- n rows of random ids with lengths 4..40 in a shuffled order; mask: the second half trained
local function items_of(n, seed)
  local g = rng.new(seed)
  local out = {}
  for i = 1, n do
    local len = 4 + math.floor(g:random() * 37)
    local ids, mask = {}, {}
    for t = 1, len do ids[t], mask[t] = math.floor(g:random() * 61), t > len / 2 and 1 or 0 end
    out[i] = { ids = ids, mask = mask }
  end
  return out
end

-- name -> Lua array of every value of each tensor in a name -> tensor table
local function values_of(tensors)
  local out = {}
  for name, t in pairs(tensors) do
    local x = t:contiguous():reshape({ -1 })
    local c = {}
    for i = 1, x:numel() do c[i] = x:get(i) end
    out[name] = c
  end
  return out
end
local function grads_copy(m) return values_of(m:grads()) end
local function params_copy(m) return values_of(m:params()) end

local function max_diff(a, b)
  local d, scale = 0, 0
  for name, xs in pairs(a) do
    for i, x in ipairs(xs) do
      d = math.max(d, math.abs(x - b[name][i]))
      scale = math.max(scale, math.abs(x))
    end
  end
  return d, scale
end

T.case("SFT micro-batches: grouped by length, every row once", function()
  local items = items_of(23, 7)
  local parts = sft.parts(items, 5)
  T.eq(#parts, 5)
  local seen, prev, padded = {}, 0, 0
  for _, p in ipairs(parts) do
    local longest = 0
    for _, it in ipairs(p.rows) do
      T.ok(#it.ids >= prev, "rows in order of length across the micro-batches")
      prev = #it.ids
      longest = math.max(longest, #it.ids)
      T.ok(not seen[it], "a row in two micro-batches")
      seen[it] = true
    end
    padded = padded + longest * #p.rows
  end
  local n = 0
  for _ in pairs(seen) do n = n + 1 end
  T.eq(n, #items)
  -- the same rows in their given order, chunked: more padding
  local plain = 0
  for _, chunk in ipairs(update.chunks(items, 5)) do
    local longest = 0
    for _, it in ipairs(chunk) do longest = math.max(longest, #it.ids) end
    plain = plain + longest * #chunk
  end
  T.ok(padded < plain, ("grouped %d positions, plain %d"):format(padded, plain))
end)

T.case("SFT micro-batches: the accumulated gradient and loss are the whole batch's", function()
  local items = items_of(11, 3)
  local m = clrt.model.new(ARCH, { seed = 5 })
  local loss1, n1 = sft.accumulate(m, items, nil)
  local whole = grads_copy(m)
  m:zero_grad()
  local loss2, n2 = sft.accumulate(m, items, 3)
  local split = grads_copy(m)
  T.eq(n1, n2)
  T.near(loss2, loss1, 1e-5 * math.abs(loss1))
  local d, scale = max_diff(whole, split)
  T.ok(scale > 0, "a gradient")
  T.ok(d <= 1e-5 * scale, ("gradient differs by %g (scale %g)"):format(d, scale))
  m:free()
end)

-- The RL update as written without the shortcut: every mini-batch's old log-probs from a
-- forward of the policy before the step's first update.
local function plain_update(m, ref, opt, rows, t, lr)
  local L = losses.ppo{ clip = t.clip, kl_coef = t.kl_coef }
  local mbs = {}
  for _, mb in ipairs(update.chunks(rows, math.ceil(#rows / t.mini_batches))) do
    mbs[#mbs + 1] = { rows = mb, old = update.logprobs(m, mb, false), ref = update.logprobs(ref, mb, false) }
  end
  for _, part in ipairs(mbs) do
    local adv = {}
    for b, r in ipairs(part.rows) do adv[b] = r.adv end
    part.batch = function(lp)
      return { old = part.old, ref = part.ref, adv = adv, mask = losses.response_mask(part.rows, lp:size(2)) }
    end
    update.step(m, opt, L, { part }, lr)
  end
end

T.case("RL update: the first mini-batch's old log-probs are its training forward's", function()
  local g = rng.new(11)
  local rows = {}
  for i = 1, 12 do
    local it = items_of(1, 100 + i)[1]
    rows[i] = { ids = it.ids, first = math.floor(#it.ids / 2), adv = g:random() * 2 - 1 }
  end
  local t = { clip = 0.2, kl_coef = 0.5, mini_batches = 3, micro_batch_size = 128 }
  local ref = clrt.model.new(ARCH, { seed = 9 })
  local a, b = clrt.model.new(ARCH, { seed = 9 }), clrt.model.new(ARCH, { seed = 9 })
  -- a large step, so that later mini-batches see a policy that has moved (ratios ~= 1)
  local oa = clrt.optim.adamw(a, { lr = 0.05, grad_clip = 1.0 })
  local ob = clrt.optim.adamw(b, { lr = 0.05, grad_clip = 1.0 })
  local st = ppo.update(a, ref, oa, rows, t, 0.05)
  plain_update(b, ref, ob, rows, t, 0.05)
  T.ok(st.clipfrac > 0, "later mini-batches are clipped: the policy moved")
  local d, scale = max_diff(params_copy(a), params_copy(b))
  T.ok(scale > 0, "parameters")
  T.ok(d <= 1e-6 * scale, ("parameters differ by %g (scale %g)"):format(d, scale))
  oa:free(); ob:free(); a:free(); b:free(); ref:free()
end)

T.case("RL update: micro-batches grouped by length give the whole mini-batch's step", function()
  local g = rng.new(13)
  local rows = {}
  for i = 1, 12 do
    local it = items_of(1, 200 + i)[1]
    rows[i] = { ids = it.ids, first = math.floor(#it.ids / 2), adv = g:random() * 2 - 1 }
  end
  local ref = clrt.model.new(ARCH, { seed = 9 })
  local a, b = clrt.model.new(ARCH, { seed = 9 }), clrt.model.new(ARCH, { seed = 9 })
  local oa = clrt.optim.adamw(a, { lr = 0.01, grad_clip = 1.0 })
  local ob = clrt.optim.adamw(b, { lr = 0.01, grad_clip = 1.0 })
  local t = { clip = 0.2, kl_coef = 0.5, mini_batches = 2 }
  t.micro_batch_size = 2
  local st = ppo.update(a, ref, oa, rows, t, 0.01)
  t.micro_batch_size = 128
  local st_whole = ppo.update(b, ref, ob, rows, t, 0.01)
  T.near(st.loss, st_whole.loss, 1e-5 * math.abs(st_whole.loss))
  T.eq(st.tokens, st_whole.tokens)
  -- Adam's steps are lr-sized whatever the gradient's scale; summation order moves them by
  -- far less than 1% of one (a wrong micro-batch moves them by whole steps)
  local d = max_diff(params_copy(a), params_copy(b))
  T.ok(d <= 1e-2 * 0.01, ("parameters differ by %g, one step is 0.01"):format(d))
  oa:free(); ob:free(); a:free(); b:free(); ref:free()
end)

T.case("RL update: a prompt's rows share micro-batches and run its prompt once", function()
  -- 3 prompts x 4 responses, interleaved as a data-parallel gather may leave them
  local g = rng.new(17)
  local prompts = {}
  for p = 1, 3 do prompts[p] = items_of(1, 300 + p)[1].ids end
  local rows = {}
  for i = 1, 12 do
    local p = (i - 1) % 3 + 1
    local ids = {}
    for _, x in ipairs(prompts[p]) do ids[#ids + 1] = x end
    for _ = 1, 1 + (i * 7) % 9 do ids[#ids + 1] = math.floor(g:random() * ARCH.vocab_size) end
    rows[i] = { ids = ids, first = #prompts[p], adv = g:random() * 2 - 1, prompt = p }
  end
  local order = update.by_prompt(rows)
  T.eq(#order, 12)
  for k = 1, 12 do
    T.eq(order[k].prompt, rows[1 + 4 * math.floor((k - 1) / 4)].prompt, "groups are contiguous, first come first")
    if k % 4 ~= 1 then T.ok(#order[k].ids >= #order[k - 1].ids, "each group shortest first") end
  end
  local mixed = update.by_prompt({ { ids = { 1, 2 } }, rows[2], { ids = { 3 }, first = 0 }, rows[5] })
  T.ok(mixed[1].first == 0 and mixed[2].first == nil and mixed[3] == rows[2] and mixed[4] == rows[5],
    "rows without a prompt form one group of their own, shortest first")
  local ref = clrt.model.new(ARCH, { seed = 9 })
  local a, b = clrt.model.new(ARCH, { seed = 9 }), clrt.model.new(ARCH, { seed = 9 })
  b:set_share_prefix(false)
  local oa = clrt.optim.adamw(a, { lr = 0.01, grad_clip = 1.0 })
  local ob = clrt.optim.adamw(b, { lr = 0.01, grad_clip = 1.0 })
  local t = { clip = 0.2, kl_coef = 0.5, mini_batches = 1, micro_batch_size = 4 }
  local st = ppo.update(a, ref, oa, rows, t, 0.01)
  local positions = a:logprobs_positions()
  local st_plain = ppo.update(b, ref, ob, rows, t, 0.01)
  T.ok(positions < b:logprobs_positions() / 2, ("the last micro-batch ran %d positions shared, %d not"):format(
    positions, b:logprobs_positions()))
  T.near(st.loss, st_plain.loss, 1e-5 * math.abs(st_plain.loss))
  T.eq(st.tokens, st_plain.tokens)
  local d = max_diff(params_copy(a), params_copy(b))
  T.ok(d <= 1e-2 * 0.01, ("parameters differ by %g, one step is 0.01"):format(d))
  oa:free(); ob:free(); a:free(); b:free(); ref:free()
end)

T.run()
