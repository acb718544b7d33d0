-- clrt.sft — supervised fine-tuning on chat conversations: render with the model's chat
-- template (loss on every assistant message and its end-of-turn token), right-pad rows
-- (never crop: a conversation longer than max_len is left out and counted), and the masked
-- token-mean NLL (clrt.train.losses.nll) through the shared update loop (clrt.train.update).
-- Used by recipes/collabllm_sft.lua and by
-- the RL recipe's warm start.
local chat = require("clrt.chat")
local losses = require("clrt.train.losses")
local update = require("clrt.train.update")
local dist = require("clrt.dist")
local interrupt = require("clrt.core.interrupt")

local M = {}

-- conversations: list of message lists (or {messages = ...}). Returns items {ids, mask}
-- and the number left out for length. render_opts go to clrt.chat.render (enable_thinking).
function M.encode(tok, conversations, max_len, render_opts)
  local items, too_long = {}, 0
  for i, c in ipairs(conversations) do
    local msgs = c.messages or c
    if type(msgs) ~= "table" or #msgs == 0 then
      error(("sft: conversation %d has no messages"):format(i), 2)
    end
    local ids, mask = chat.render(tok, msgs, render_opts)
    local trained = 0
    for _, x in ipairs(mask) do trained = trained + x end
    if #ids > max_len then
      too_long = too_long + 1
    elseif trained > 0 then
      items[#items + 1] = { ids = ids, mask = mask }
    end
  end
  return items, too_long
end

-- Right-pad a batch: rows (padded with pad_id), lengths.
M.pad = update.pad

local nll = losses.nll()

-- The NLL criterion's batch for items: lp[b][t] predicts token t+1, so its weight is mask[t+1].
local function nll_batch(items, denom)
  return function(lp)
    local B, T = lp:size(1), lp:size(2)
    local v = losses.view(B, T)
    for b, it in ipairs(items) do
      for t = 1, #it.ids - 1 do
        if it.mask[t + 1] == 1 then v.p[(b - 1) * T + t - 1] = 1 end
      end
    end
    return { mask = v, denom = denom }
  end
end

local function count_tokens(items)
  local n = 0
  for _, it in ipairs(items) do
    for t = 2, #it.ids do n = n + it.mask[t] end
  end
  return n
end

-- The micro-batches of one optimizer step over `items` (`micro` rows each, grouped by length
-- with update.by_length: the world's conversations split in two pad 12% of their positions
-- instead of 27%; all at once when micro is nil or >= #items): each loss is divided by the
-- whole batch's token count, so the accumulated gradient is that of the batch's token-mean
-- loss. Returns parts, tokens. denom: the token count to divide by when items are this
-- rank's share of a larger batch.
function M.parts(items, micro, denom)
  local n = denom or count_tokens(items)
  micro = micro or #items
  if micro >= #items and not denom then return { { rows = items, batch = nll_batch(items, nil) } }, n end
  local parts = {}
  for _, part in ipairs(update.chunks(update.by_length(items), micro)) do
    parts[#parts + 1] = { rows = part, batch = nll_batch(part, math.max(n, 1)) }
  end
  return parts, n
end

-- This rank's contiguous share of a list (all of it with one rank).
local function my_share(list)
  local first, last = dist.share(#list)
  local mine = {}
  for i = first, last do mine[#mine + 1] = list[i] end
  return mine
end

local function total(results)
  local loss = 0
  for _, r in ipairs(results) do loss = loss + r.loss end
  return loss
end

-- Forward (and backward unless opts.grad == false) of the masked token-mean NLL over a
-- batch. Returns loss, tokens. opts.denom: divide by this many tokens (a mini-batch's total
-- when accumulating).
function M.step(m, items, opts)
  opts = opts or {}
  local parts = { { rows = items, batch = nll_batch(items, opts.denom) } }
  local results = opts.grad == false and update.evaluate(m, nll, parts) or update.accumulate(m, nll, parts)
  return results[1].loss, count_tokens(items)
end

-- One optimizer step's gradient over `items` in micro-batches of `micro` rows.
function M.accumulate(m, items, micro)
  local parts, n = M.parts(items, micro)
  return total(update.accumulate(m, nll, parts)), n
end

-- Mean loss over items, no gradient. shared: the items are split across the data-parallel
-- ranks and the totals summed (every rank gets the same mean).
function M.evaluate(m, items, batch_size, shared)
  if shared and dist.world_size() > 1 then
    local sums = { 0, 0 }
    local mine = my_share(items)
    if #mine > 0 then
      local mean = M.evaluate(m, mine, batch_size)
      sums[2] = count_tokens(mine)
      sums[1] = mean * sums[2]
    end
    dist.all_reduce_numbers(sums, "sum")
    return sums[2] > 0 and sums[1] / sums[2] or 0 / 0
  end
  local total, tokens = 0, 0
  for i = 1, #items, batch_size do
    local batch = {}
    for j = i, math.min(#items, i + batch_size - 1) do batch[#batch + 1] = items[j] end
    local l, n = M.step(m, batch, { grad = false })
    total, tokens = total + l * n, tokens + n
  end
  return tokens > 0 and total / tokens or 0 / 0
end

-- Train for cfg.steps optimizer steps (or cfg.epochs over the data), batches drawn in a
-- seeded shuffled order. cfg: batch_size (conversations per optimizer step),
-- micro_batch_size (conversations per forward/backward; gradients accumulate over the
-- batch with its token count as the denominator, so the step equals one big batch),
-- lr, decay ("constant" | "cosine" | "linear"), min_lr_ratio, warmup_steps, steps | epochs,
-- weight_decay, grad_clip, seed, val_every. logger: a clrt.log run (or nil).
-- Resuming and checkpoints: start_step (steps already done), optimizer_state (its
-- optimizer.safetensors), stop_after (end after that step), on_step(step, opt, last_step)
-- (called after every step, e.g. to save a checkpoint). Under N data-parallel ranks
-- (clrt.dist) each rank trains on its share of every batch; check_every: steps between
-- checks that every rank holds the same parameters (0: never).
function M.train(m, train_items, val_items, cfg, logger)
  local schedule = require("clrt.train.schedule")
  local data = require("clrt.data")
  local opt = require("clrt.optim").adamw(m, { lr = cfg.lr, weight_decay = cfg.weight_decay or 0,
    grad_clip = cfg.grad_clip or 1.0, betas = cfg.betas })
  local bs = cfg.batch_size
  local per_epoch = math.max(1, math.floor(#train_items / bs))
  local steps = cfg.steps or (cfg.epochs or 1) * per_epoch
  local order, pos, epoch = nil, 1, 0
  local function next_batch()
    if not order or pos + bs - 1 > #order then
      epoch = epoch + 1
      order = data.shuffle(train_items, (cfg.seed or 0) * 7919 + epoch)
      pos = 1
    end
    local b = {}
    for i = pos, pos + bs - 1 do b[#b + 1] = order[i] end
    pos = pos + bs
    return b
  end
  -- resuming after `start_step` steps: the optimizer state from its checkpoint, and the same
  -- batches as an uninterrupted run (the order depends only on seed, epoch and position)
  local start = cfg.start_step or 0
  if cfg.optimizer_state then opt:load(cfg.optimizer_state) end
  for _ = 1, start do next_batch() end
  local last_step = math.min(steps, cfg.stop_after or steps)
  local last = {}
  for step = start, last_step - 1 do
    interrupt.check()
    local t0 = os.clock()
    local lr = schedule.lr(step, { lr = cfg.lr, min_lr_ratio = cfg.min_lr_ratio, warmup_steps = cfg.warmup_steps or 0,
      total_steps = steps, decay = cfg.decay })
    -- with N ranks each takes its share of the batch, divided by the whole batch's tokens;
    -- update.step sums the gradients across ranks, and the losses are summed here
    local batch = next_batch()
    local share = dist.world_size() > 1 and my_share(batch) or batch
    local parts, ntok = M.parts(share, cfg.micro_batch_size, share ~= batch and count_tokens(batch) or nil)
    local results, gnorm = update.step(m, opt, nll, parts, lr)
    local loss = dist.all_reduce_numbers({ total(results) }, "sum")[1]
    if dist.world_size() > 1 and (cfg.check_every or 0) > 0 and (step + 1) % cfg.check_every == 0 then
      dist.check_params(m, step + 1)
    end
    local row = { loss = loss, lr = lr, grad_norm = gnorm, tokens = ntok, epoch = epoch }
    if val_items and #val_items > 0 and ((cfg.val_every or 0) > 0 and (step + 1) % cfg.val_every == 0 or step == steps - 1) then
      row.val_loss = M.evaluate(m, val_items, cfg.micro_batch_size or bs, true)
    end
    row.cpu_seconds = os.clock() - t0
    if logger then logger:log(step + 1, row) end
    last = row
    if cfg.on_step then cfg.on_step(step + 1, opt, last_step) end
  end
  opt:free()
  return last
end

return M
