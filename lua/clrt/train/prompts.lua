-- clrt.train.prompts — where an RL run's prompts come from: a process_dataset.lua JSONL
-- file (rows checked up front, over-long prompts left out) or a world the recipe passes in
-- (the built-in one: examples/collab_world/world.lua; its warm start: clrt.train.warm_start).
-- who names the calling recipe in every error ("collabllm_rl", "collabllm_eval", ...).
--   local samples = prompts.dataset_samples(path, who)
--   local kept, dropped, limit = prompts.filter_prompts(m, tok, cfg, samples, what, who)
--   local dataset, val_set, notes = prompts.load_sets(m, tok, cfg, who)
--   local batch = prompts.step_prompts(cfg, world, dataset, step)
local policy = require("clrt.train.policy")
local chat = require("clrt.chat")
local M = {}

-- A step's prompts depend only on (seed, step), so a resumed run sees the same ones. A data
-- set is read in a fresh seeded order each epoch (a file is often grouped by task); a step
-- that crosses an epoch's end takes the rest from the next epoch's order.
function M.step_prompts(cfg, world, dataset, step)
  if dataset then return M.epoch_batch(dataset, cfg.seed, step, cfg.prompts_per_step) end
  return world.rl_prompts(cfg.prompts_per_step, cfg.seed * 100003 + step)
end

-- Items (step-1)*size+1 .. step*size of one long sequence of seeded per-epoch orders of
-- list: a step's batch depends only on (seed, step), and one that crosses an epoch's end
-- takes the rest from the next epoch's order.
function M.epoch_batch(list, seed, step, size)
  local data, out, n, orders = require("clrt.data"), {}, #list, {}
  for i = 1, size do
    local k = (step - 1) * size + i - 1
    local epoch = math.floor(k / n)
    orders[epoch] = orders[epoch] or data.shuffle(list, seed * 7919 + epoch)
    out[i] = orders[epoch][k % n + 1]
  end
  return out
end

-- process_dataset.lua's RL rows -> samples the metrics and users understand.
-- Every row is checked here, before any step: a bad row is an error naming file and line.
function M.dataset_samples(path, who)
  local rows, line_of = require("clrt.data").read_dataset(path)
  local out = {}
  for i, r in ipairs(rows) do
    local where = ("%s: %s:%d: "):format(who or "clrt.train.prompts", path, line_of[i])
    if type(r) ~= "table" then error(where .. "a row must be a JSON object", 0) end
    local kw = r.interaction_kwargs or {}
    if type(kw) ~= "table" then error(where .. "interaction_kwargs must be an object", 0) end
    if type(r.prompt) ~= "table" or #r.prompt == 0 then error(where .. "no \"prompt\" list of messages", 0) end
    for j, msg in ipairs(r.prompt) do
      if type(msg) ~= "table" or type(msg.role) ~= "string" or type(msg.content) ~= "string" then
        error(where .. ("prompt message %d needs a \"role\" and a \"content\" string"):format(j), 0)
      end
    end
    out[i] = { id = tostring(i), prompt = r.prompt, ground_truth = r.ground_truth,
      single_turn_prompt = kw.single_turn_prompt, task_desc = kw.task_desc,
      single_turn_metadata = r.single_turn_metadata }
  end
  return out
end

-- The run's data= and data_val= sets (nil when not given), over-long prompts left out
-- (validation cut to eval.prompts), and a line per set saying what was kept.
function M.load_sets(m, tok, cfg, who)
  local dataset, val_set, notes = nil, nil, {}
  if cfg.data then
    local dropped, limit
    dataset, dropped, limit = M.filter_prompts(m, tok, cfg, M.dataset_samples(cfg.data, who), cfg.data, who)
    notes[#notes + 1] = ("%s: %d prompts, %d longer than %d tokens left out"):format(cfg.data, #dataset, dropped, limit)
  end
  if cfg.data_val then
    local dropped, limit
    val_set, dropped, limit = M.filter_prompts(m, tok, cfg, M.dataset_samples(cfg.data_val, who), cfg.data_val, who)
    while cfg.eval.prompts and #val_set > cfg.eval.prompts do table.remove(val_set) end
    notes[#notes + 1] = ("%s: %d validation prompts, %d longer than %d tokens left out"):format(cfg.data_val, #val_set, dropped, limit)
  end
  return dataset, val_set, notes
end

-- Dataset prompts that leave room for a response (verl's filter_overlong_prompts): a prompt
-- longer than max_prompt_len, or with no room left in the context, is left out and counted.
function M.filter_prompts(m, tok, cfg, samples, what, who)
  local R = cfg.rollout
  local ctx_len = policy.context_len(m, R)
  local limit = math.min(R.max_prompt_len or math.huge, ctx_len - 1)
  local ropts = policy.render_opts(cfg)
  local kept, longest = {}, 0
  for _, s in ipairs(samples) do
    local n = #chat.render(tok, s.prompt, ropts)
    if n <= limit then kept[#kept + 1] = s else longest = math.max(longest, n) end
  end
  local dropped = #samples - #kept
  if #kept == 0 then
    error(("%s: every prompt of %s is longer than %d tokens (max_prompt_len %s, context %d; longest %d)")
      :format(who or "clrt.train.prompts", what, limit, tostring(R.max_prompt_len), ctx_len, longest), 0)
  end
  return kept, dropped, limit
end

return M
