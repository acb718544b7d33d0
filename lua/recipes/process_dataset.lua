-- process_dataset.lua — the published CollabLLM multiturn datasets (JSONL as `datasets`
-- exports them: one row per (conversation, turn, candidate) with prompt, completion,
-- conv_id, turn_id, score, single_turn_prompt, single_turn_completion, single_turn_metadata,
-- sessions, rewards) into the files the recipes read (docs/method.md, "Datasets"):
--   RL rows   {prompt = [system] + row.prompt, ground_truth = single_turn_completion,
--              single_turn_metadata, interaction_kwargs = {single_turn_prompt, task_desc},
--              conv_id, turn_id}, deduplicated by prompt;
--   SFT rows  {messages = [system] + prompt + [assistant: completion], conv_id, turn_id,
--              score} for each conv_id's row with the largest turn_id, then the best score;
--   DPO pairs {prompt = [system] + row.prompt, chosen, rejected (completions), score_chosen,
--              score_rejected, conv_id, turn_id} per (conv_id, turn_id) with two or more
--              scored candidates: chosen = the highest score (the first in file order on a
--              tie), rejected = the lowest (the last on a tie), kept when the gap is at least
--              min_gap (the authors' to_dpo_dataset with their notebook's minimum_gap 0.1).
-- The split comes first and is by conversation: conversations that share a prompt (the same
-- message list) are joined into one group, the groups are shuffled with `seed`, and the first
-- ones go to test until it holds test_fraction of the conversations. So no conversation and
-- no prompt is on both sides (verl splits rows after deduplication, so turns and candidates
-- of one conversation land on both; the published math-hard has ~3 candidates per prompt).
-- Our seeded shuffle is not the `datasets` library's permutation.
--   clrt recipes/process_dataset.lua input=FILE.jsonl out=DIR [task_desc=...] [test_fraction=0.1]
--        [seed=42] [min_gap=0.1] [sft_min_accuracy=0.5] [system_prompt_file=PATH]
-- writes rl_train, rl_test, sft_train, sft_test, dpo_train, dpo_test, eval_test (.jsonl: the
-- test conversations' distinct single-turn tasks, for collabllm_eval.lua protocol=paper) and
-- prints counts.
local config = require("clrt.config")
local data = require("clrt.data")

local M = {}

-- The system prompt before every prompt: lua/prompts/collabllm_system.txt, the authors'
-- system prompt (which verl's process_dataset uses too) in clrt's words; its header lists
-- what it carries. system_prompt_file=PATH uses another text as it is (e.g. theirs).
M.SYSTEM_FILE = "collabllm_system"
M.SYSTEM_PROMPT = require("clrt.prompt_file").read(M.SYSTEM_FILE)

M.defaults = {
  input = config.optional("string"),
  out = config.optional("string"),
  task_desc = config.optional("string"),
  test_fraction = 0.1,
  seed = 42,
  min_gap = 0.1,   -- DPO: smallest score gap between chosen and rejected (authors' notebook)
  system_prompt_file = config.optional("string"),   -- nil: lua/prompts/collabllm_system.txt
  -- SFT: keep a conversation only when the mean of its chosen row's rewards.accuracy is at
  -- least this (the authors' scripts/train/sft.py --lower_bound_metric rewards.accuracy
  -- --lower_bound 0.5 for math-hard); a row without rewards.accuracy is left out, as theirs
  -- is. nil: no filter.
  sft_min_accuracy = config.optional("number"),
}

-- The task description the simulated user is told, from the dataset's name when not given.
function M.task_desc_for(path)
  local p = tostring(path):lower()
  if p:find("math", 1, true) then return "question answering" end
  if p:find("code", 1, true) then return "code generation" end
  if p:find("medium", 1, true) or p:find("doc", 1, true) then return "document editing" end
  return "question answering"
end

local function check_row(r, where)
  if type(r) ~= "table" then error(where .. ": not a JSON object", 0) end
  if type(r.prompt) ~= "table" or #r.prompt == 0 then error(where .. ": 'prompt' must be a non-empty list of messages", 0) end
  for i, m in ipairs(r.prompt) do
    if type(m) ~= "table" or type(m.role) ~= "string" or type(m.content) ~= "string" then
      error(("%s: prompt[%d] must be {role, content} strings"):format(where, i), 0)
    end
  end
  for _, k in ipairs({ "completion", "single_turn_prompt" }) do
    if type(r[k]) ~= "string" then error(("%s: '%s' must be a string"):format(where, k), 0) end
  end
  if r.conv_id == nil or r.conv_id == data.json.null then error(where .. ": 'conv_id' is missing", 0) end
  if type(r.turn_id) ~= "number" then error(where .. ": 'turn_id' must be a number", 0) end
  if r.score == data.json.null then r.score = nil end
  if r.score ~= nil and type(r.score) ~= "number" then error(where .. ": 'score' must be a number", 0) end
  if r.single_turn_metadata == data.json.null then r.single_turn_metadata = nil end
end

local system_prompt = M.SYSTEM_PROMPT

local function with_system(msgs)
  local out = { { role = "system", content = system_prompt } }
  for _, m in ipairs(msgs) do out[#out + 1] = { role = m.role, content = m.content } end
  return out
end

local function prompt_key(msgs)
  local parts = {}
  for i, m in ipairs(msgs) do parts[i] = m.role .. "\0" .. m.content end
  return table.concat(parts, "\1")
end

function M.rl_rows(rows, task_desc)
  local out, seen = {}, {}
  for _, r in ipairs(rows) do
    local key = prompt_key(r.prompt)
    if not seen[key] then
      seen[key] = true
      out[#out + 1] = {
        prompt = with_system(r.prompt),
        ground_truth = r.single_turn_completion,
        single_turn_metadata = r.single_turn_metadata,
        interaction_kwargs = { single_turn_prompt = r.single_turn_prompt, task_desc = task_desc },
        conv_id = r.conv_id, turn_id = r.turn_id,
      }
    end
  end
  return out
end

-- The mean of a row's rewards.accuracy (a list of per-session values, or one number), or nil.
function M.mean_accuracy(r)
  local a = type(r.rewards) == "table" and r.rewards.accuracy
  if type(a) == "number" then return a end
  if type(a) ~= "table" or #a == 0 then return nil end
  local sum = 0
  for _, v in ipairs(a) do
    if type(v) ~= "number" then return nil end
    sum = sum + v
  end
  return sum / #a
end

-- SFT rows (see the header); min_accuracy: the authors' filter on the chosen row of each
-- conversation (nil: none). Returns the rows and how many conversations the filter left out.
function M.sft_rows(rows, min_accuracy)
  local best, order = {}, {}
  for _, r in ipairs(rows) do
    local id = tostring(r.conv_id)
    local b = best[id]
    if not b then order[#order + 1] = id end
    if not b or r.turn_id > b.turn_id or (r.turn_id == b.turn_id and (r.score or -math.huge) > (b.score or -math.huge)) then
      best[id] = r
    end
  end
  local out, filtered = {}, 0
  for _, id in ipairs(order) do
    local r = best[id]
    local acc = min_accuracy and M.mean_accuracy(r)
    if min_accuracy and (acc == nil or acc < min_accuracy) then
      filtered = filtered + 1
    else
      local msgs = with_system(r.prompt)
      msgs[#msgs + 1] = { role = "assistant", content = r.completion }
      out[#out + 1] = { messages = msgs, conv_id = r.conv_id, turn_id = r.turn_id, score = r.score }
    end
  end
  return out, filtered
end

-- Pairs for DPO (see the header): one per (conv_id, turn_id) group whose score gap is at
-- least min_gap. Rows without a numeric score cannot be ranked and are left out.
function M.dpo_rows(rows, min_gap)
  local groups, order = {}, {}
  for _, r in ipairs(rows) do
    if type(r.score) == "number" then
      local key = tostring(r.conv_id) .. "\0" .. tostring(r.turn_id)
      if not groups[key] then groups[key] = {}; order[#order + 1] = key end
      local g = groups[key]
      g[#g + 1] = r
    end
  end
  local out = {}
  for _, key in ipairs(order) do
    local g = groups[key]
    if #g >= 2 then
      local best, worst = g[1], g[1]
      for i = 2, #g do
        if g[i].score > best.score then best = g[i] end
        if g[i].score <= worst.score then worst = g[i] end
      end
      if best.score - worst.score >= min_gap then
        out[#out + 1] = { prompt = with_system(best.prompt), chosen = best.completion, rejected = worst.completion,
          score_chosen = best.score, score_rejected = worst.score, conv_id = best.conv_id, turn_id = best.turn_id }
      end
    end
  end
  return out
end

-- The metric of a task's performance in the paper (BLEU on documents, pass rate on code,
-- accuracy on math), by the task description the simulated user is given.
M.TASK_METRIC = { ["question answering"] = "accuracy", ["document editing"] = "bleu_score",
  ["code generation"] = "pass_rate" }

-- The paper's evaluation set (collabllm_eval.lua protocol=paper): one row per distinct
-- single-turn task of the rows (the first in file order), {single_turn_prompt, ground_truth =
-- single_turn_completion, single_turn_metadata, task_desc, task_metric, conv_id}. The
-- simulated user opens each conversation from an empty chat, so no multi-turn prompt is kept.
function M.eval_rows(rows, task_desc)
  local out, seen = {}, {}
  for _, r in ipairs(rows) do
    local key = r.single_turn_prompt
    if not seen[key] then
      seen[key] = true
      out[#out + 1] = { single_turn_prompt = r.single_turn_prompt, ground_truth = r.single_turn_completion,
        single_turn_metadata = r.single_turn_metadata, task_desc = task_desc, task_metric = M.TASK_METRIC[task_desc],
        conv_id = r.conv_id }
    end
  end
  return out
end

-- Rows -> train, test with no conversation and no prompt on both sides (see the header).
-- Returns train rows, test rows and the number of conversations on each side.
function M.split(rows, test_fraction, seed)
  -- union-find over conversations, joined by the prompts they share
  local parent, conv_order, by_prompt = {}, {}, {}
  local function find(x)
    while parent[x] ~= x do parent[x] = parent[parent[x]]; x = parent[x] end
    return x
  end
  for _, r in ipairs(rows) do
    local id = tostring(r.conv_id)
    if not parent[id] then parent[id] = id; conv_order[#conv_order + 1] = id end
    local key = prompt_key(r.prompt)
    local other = by_prompt[key]
    if not other then by_prompt[key] = id
    else
      local a, b = find(id), find(other)
      if a ~= b then parent[b] = a end
    end
  end
  local members, groups = {}, {}
  for _, id in ipairs(conv_order) do
    local root = find(id)
    if not members[root] then members[root] = {}; groups[#groups + 1] = root end
    local m = members[root]
    m[#m + 1] = id
  end
  local shuffled = data.shuffle(groups, seed)
  local want = math.floor(test_fraction * #conv_order + 0.5)
  local in_test, ntest = {}, 0
  for _, root in ipairs(shuffled) do
    if ntest >= want then break end
    for _, id in ipairs(members[root]) do in_test[id] = true end
    ntest = ntest + #members[root]
  end
  local train, test = {}, {}
  for _, r in ipairs(rows) do
    if in_test[tostring(r.conv_id)] then test[#test + 1] = r else train[#train + 1] = r end
  end
  return train, test, #conv_order - ntest, ntest
end

M.OUTPUTS = { "rl_train", "rl_test", "sft_train", "sft_test", "dpo_train", "dpo_test", "eval_test" }

function M.main(cfg)
  if not cfg.input then error("process_dataset: input= is required (a JSONL file)", 0) end
  if not cfg.out then error("process_dataset: out= is required (a folder)", 0) end
  if type(cfg.test_fraction) ~= "number" or cfg.test_fraction < 0 or cfg.test_fraction >= 1 then
    error("process_dataset: test_fraction must be a number in [0, 1), got " .. tostring(cfg.test_fraction), 0)
  end
  if type(cfg.min_gap) ~= "number" or cfg.min_gap < 0 then
    error("process_dataset: min_gap must be a number >= 0, got " .. tostring(cfg.min_gap), 0)
  end
  if cfg.sft_min_accuracy ~= nil and (type(cfg.sft_min_accuracy) ~= "number" or cfg.sft_min_accuracy ~= cfg.sft_min_accuracy) then
    error("process_dataset: sft_min_accuracy must be a number, got " .. tostring(cfg.sft_min_accuracy), 0)
  end
  system_prompt = cfg.system_prompt_file and require("clrt.prompt_file").read(cfg.system_prompt_file) or M.SYSTEM_PROMPT
  -- every row checked before anything is written; line numbers are the file's own
  local rows, line_of = data.read_dataset(cfg.input)
  for i, r in ipairs(rows) do check_row(r, ("%s line %d"):format(cfg.input, line_of[i])) end
  local task_desc = cfg.task_desc or M.task_desc_for(cfg.input)
  local train, test, ntrain_conv, ntest_conv = M.split(rows, cfg.test_fraction, cfg.seed)
  print(("process_dataset: %d rows, %d conversations -> train %d / test %d conversations")
    :format(#rows, ntrain_conv + ntest_conv, ntrain_conv, ntest_conv))
  require("clrt.files").mkdir_p(cfg.out)
  local sft_train, out_train = M.sft_rows(train, cfg.sft_min_accuracy)
  local sft_test, out_test = M.sft_rows(test, cfg.sft_min_accuracy)
  if cfg.sft_min_accuracy then
    print(("process_dataset: sft_min_accuracy=%g left out %d train / %d test conversations (mean rewards.accuracy below it or missing)")
      :format(cfg.sft_min_accuracy, out_train, out_test))
  end
  local outs = {
    rl_train = M.rl_rows(train, task_desc), rl_test = M.rl_rows(test, task_desc),
    sft_train = sft_train, sft_test = sft_test,
    dpo_train = M.dpo_rows(train, cfg.min_gap), dpo_test = M.dpo_rows(test, cfg.min_gap),
    eval_test = M.eval_rows(test, task_desc),
  }
  for _, name in ipairs(M.OUTPUTS) do
    data.write_jsonl(cfg.out .. "/" .. name .. ".jsonl", outs[name])
    print(("process_dataset: %-9s %5d rows -> %s/%s.jsonl"):format(name, #outs[name], cfg.out, name))
  end
  return outs
end

local argv = { ... }
if argv[1] == "recipes.process_dataset" then return M end
local function parse(a) return config.parse(M.defaults, a) end
if require("clrt.recipe_help").handle("process_dataset", "recipes.process_dataset", argv, parse) then return end
M.main(parse(argv))
