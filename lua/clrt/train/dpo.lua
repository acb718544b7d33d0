-- clrt.train.dpo — preference pairs and the DPO update, shared by collabllm_dpo.lua's
-- offline and online modes (and the pairs the comparison collects in the built-in world).
--   local pairs = dpo.select(entries, rewards, min_gap)   -- best/worst of each prompt's group
--   local p = dpo.encode_pair(tok, row, ropts)             -- a process_dataset DPO row -> token rows
--   local p = dpo.entry_pair(best, worst)                  -- two sampled entries -> token rows
--   dpo.attach_ref(ref, list_of_pairs, micro)              -- reference sums, once per pair
--   local stats = dpo.update(m, opt, list_of_pairs, t, lr) -- one optimizer step
--   local stats = dpo.evaluate(m, list_of_pairs, t)        -- the loss without gradients
-- A token row is {ids = prompt + response, first = #prompt}: logp index t (token t+1) is
-- trained for first <= t < #ids, as in clrt.train.ppo. A pair is {chosen = row, rejected =
-- row, ref_chosen, ref_rejected}. With LoRA the reference is the base model with the
-- adapters off: attach_ref takes whatever model computes it.
local chat = require("clrt.chat")
local losses = require("clrt.train.losses")
local update = require("clrt.train.update")
local M = {}

-- The best- and worst-scored entry of every group (the n responses of one prompt) whose
-- gap is at least min_gap; entries without a reward (dropped) take no part. The first best
-- and the last worst in order win ties (process_dataset.dpo_rows' rule). Returns a list of
-- {group, chosen = entry, rejected = entry, score_chosen, score_rejected} in group order.
function M.select(entries, rewards, min_gap)
  local best, worst, order = {}, {}, {}
  for i, e in ipairs(entries) do
    local r = rewards[i]
    if r ~= nil then
      local g = e.group
      if not best[g] then order[#order + 1] = g end
      if not best[g] or r > best[g].r then best[g] = { e = e, r = r } end
      if not worst[g] or r <= worst[g].r then worst[g] = { e = e, r = r } end
    end
  end
  table.sort(order)
  local out = {}
  for _, g in ipairs(order) do
    local b, w = best[g], worst[g]
    if b.e ~= w.e and b.r - w.r >= min_gap then
      out[#out + 1] = { group = g, chosen = b.e, rejected = w.e, score_chosen = b.r, score_rejected = w.r }
    end
  end
  return out
end

-- A sampled entry (clrt.train.entry, from clrt.train.rollout.step) as a token row.
function M.entry_row(e)
  local ids = {}
  for i, t in ipairs(e.prompt_ids) do ids[i] = t end
  for _, t in ipairs(e.tokens) do ids[#ids + 1] = t end
  return { ids = ids, first = #e.prompt_ids }
end

function M.entry_pair(sel)
  return { chosen = M.entry_row(sel.chosen), rejected = M.entry_row(sel.rejected) }
end

-- prompt + one assistant reply rendered with the chat template: the trained tokens are the
-- reply's (the last run of the template's assistant mask, its end-of-turn token included);
-- anything the template adds after it is cut (it cannot change earlier log-probs).
local function reply_row(tok, prompt, reply, ropts)
  local msgs = {}
  for i, msg in ipairs(prompt) do msgs[i] = msg end
  msgs[#msgs + 1] = { role = "assistant", content = reply }
  local ids, mask = chat.render(tok, msgs, ropts)
  local last = #mask
  while last > 0 and mask[last] ~= 1 do last = last - 1 end
  if last == 0 then return nil end
  local first = last
  while first > 1 and mask[first - 1] == 1 do first = first - 1 end
  local out = {}
  for i = 1, last do out[i] = ids[i] end
  return { ids = out, first = first - 1 }
end

-- A token row cut to max_length tokens (0 or nil: as it is), as TRL's DPO truncation_mode:
-- "keep_end" drops tokens from the start (the prompt first; a reply that loses its start
-- keeps the rest, less its first token, which nothing left predicts), "keep_start" drops
-- them from the end. nil when no reply token is left to train.
-- (TRL 0.18.1 cuts the padded batch, so a row shorter than the batch's longest can lose
-- leading tokens too; clrt cuts each row by its own length.)
function M.truncate_row(row, max_length, mode)
  if not max_length or max_length <= 0 or #row.ids <= max_length then return row end
  local ids, first = {}, row.first
  if mode == "keep_start" then
    for i = 1, max_length do ids[i] = row.ids[i] end
  else
    local drop = #row.ids - max_length
    for i = drop + 1, #row.ids do ids[#ids + 1] = row.ids[i] end
    first = math.max(first - drop, 1)
  end
  if first >= #ids then return nil end
  return { ids = ids, first = first }
end

-- A DPO row of process_dataset.lua ({prompt, chosen, rejected, ...}) as a pair of token rows;
-- opts.max_length / opts.truncation: M.truncate_row.
function M.encode_pair(tok, row, ropts, opts)
  opts = opts or {}
  local c = reply_row(tok, row.prompt, row.chosen, ropts)
  local r = reply_row(tok, row.prompt, row.rejected, ropts)
  c = c and M.truncate_row(c, opts.max_length, opts.truncation)
  r = r and M.truncate_row(r, opts.max_length, opts.truncation)
  if not c or not r then return nil end
  return { chosen = c, rejected = r }
end

-- The rows of a list of pairs, interleaved chosen, rejected (losses.dpo's layout).
local function rows_of(list)
  local rows = {}
  for _, p in ipairs(list) do rows[#rows + 1] = p.chosen; rows[#rows + 1] = p.rejected end
  return rows
end

-- The reference's summed log-probs of every pair that has none yet (a pair keeps them, so
-- each is computed once however often the pair is trained on), `micro` pairs per forward.
function M.attach_ref(ref, list, micro)
  local todo = {}
  for _, p in ipairs(list) do if p.ref_chosen == nil then todo[#todo + 1] = p end end
  for _, part in ipairs(update.chunks(todo, micro)) do
    local rows = rows_of(part)
    local lp = update.logprobs(ref, rows, false)
    local sums = losses.sequence_logps(lp, losses.response_mask(rows, lp:size(2)))
    for k, p in ipairs(part) do p.ref_chosen, p.ref_rejected = sums[2 * k - 1], sums[2 * k] end
  end
end

local function parts_of(list, micro)
  local parts = {}
  for _, part in ipairs(update.chunks(list, micro)) do
    local rows = rows_of(part)
    local rc, rr = {}, {}
    for k, p in ipairs(part) do rc[k], rr[k] = p.ref_chosen, p.ref_rejected end
    parts[#parts + 1] = { rows = rows, batch = function(lp)
      return { mask = losses.response_mask(rows, lp:size(2)), ref_chosen = rc, ref_rejected = rr, denom = #list }
    end }
  end
  return parts
end

-- Pair-weighted means of the parts' stats.
local KEYS = { "reward_chosen", "reward_rejected", "reward_margin", "reward_accuracy", "logp_chosen", "logp_rejected" }
local function combine(results, n)
  local st = { loss = 0, pairs = n, tokens = 0 }
  for _, k in ipairs(KEYS) do st[k] = 0 end
  for _, r in ipairs(results) do
    st.loss = st.loss + r.loss
    st.tokens = st.tokens + r.stats.tokens
    for _, k in ipairs(KEYS) do st[k] = st[k] + r.stats[k] * r.stats.pairs / math.max(n, 1) end
  end
  return st
end

-- One optimizer step over `list` (every pair with its reference sums), micro-batches of
-- t.micro_batch_size pairs whose gradients accumulate to the mean over all pairs.
-- t: beta, label_smoothing, micro_batch_size. Returns the stats with grad_norm.
function M.update(m, opt, list, t, lr)
  local L = losses.dpo{ beta = t.beta, label_smoothing = t.label_smoothing }
  local results, gnorm = update.step(m, opt, L, parts_of(list, t.micro_batch_size), lr)
  local st = combine(results, #list)
  st.grad_norm = gnorm
  return st
end

function M.evaluate(m, list, t)
  local L = losses.dpo{ beta = t.beta, label_smoothing = t.label_smoothing }
  return combine(update.evaluate(m, L, parts_of(list, t.micro_batch_size)), #list)
end

return M
