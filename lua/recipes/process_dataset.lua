-- process_dataset.lua — the published CollabLLM multiturn datasets (JSONL as `datasets`
-- exports them: one row per (conversation, turn, candidate) with prompt, completion,
-- conv_id, turn_id, score, single_turn_prompt, single_turn_completion, ...) into the files
-- the recipes read (shared/spec/collabllm.md, "Datasets"):
--   RL rows   {prompt = [system] + row.prompt, ground_truth = single_turn_completion,
--              interaction_kwargs = {single_turn_prompt, task_desc}}, deduplicated by prompt;
--   SFT rows  {messages = [system] + prompt + [assistant: completion]} for each conv_id's row
--              with the largest turn_id, then the best score.
-- Rows are split 90/10 (train/test) with seed 42 before either is built; our seeded shuffle
-- is not the `datasets` library's permutation, so the split is reproducible here but not
-- row-for-row the same as verl's.
--   clrt recipes/process_dataset.lua input=FILE.jsonl out=DIR [task_desc=...] [test_fraction=0.1] [seed=42]
local config = require("clrt.config")
local data = require("clrt.data")

local M = {}

M.SYSTEM_PROMPT = table.concat({
  "You are a helpful, proactive and collaborative assistant.",
  "When a request is ambiguous or misses information you need, ask a short clarifying question",
  "instead of assuming; suggest useful next steps when it helps; keep answers concise; and say so",
  "plainly when you do not know something.",
}, " ")

M.defaults = {
  input = config.optional("string"),
  out = config.optional("string"),
  task_desc = config.optional("string"),
  test_fraction = 0.1,
  seed = 42,
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
  if r.conv_id == nil then error(where .. ": 'conv_id' is missing", 0) end
  if type(r.turn_id) ~= "number" then error(where .. ": 'turn_id' must be a number", 0) end
end

local function with_system(msgs)
  local out = { { role = "system", content = M.SYSTEM_PROMPT } }
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
      }
    end
  end
  return out
end

function M.sft_rows(rows)
  local best, order = {}, {}
  for _, r in ipairs(rows) do
    local id = tostring(r.conv_id)
    local b = best[id]
    if not b then order[#order + 1] = id end
    if not b or r.turn_id > b.turn_id or (r.turn_id == b.turn_id and (r.score or -math.huge) > (b.score or -math.huge)) then
      best[id] = r
    end
  end
  local out = {}
  for _, id in ipairs(order) do
    local r = best[id]
    local msgs = with_system(r.prompt)
    msgs[#msgs + 1] = { role = "assistant", content = r.completion }
    out[#out + 1] = { messages = msgs, conv_id = r.conv_id, turn_id = r.turn_id, score = r.score }
  end
  return out
end

function M.main(cfg)
  if not cfg.input then error("process_dataset: input= is required (a JSONL file)", 0) end
  if not cfg.out then error("process_dataset: out= is required (a folder)", 0) end
  local rows = data.read_jsonl(cfg.input)
  for i, r in ipairs(rows) do check_row(r, ("%s line %d"):format(cfg.input, i)) end
  local task_desc = cfg.task_desc or M.task_desc_for(cfg.input)
  local train, test = data.split(rows, 1 - cfg.test_fraction, cfg.seed)
  os.execute(("mkdir -p '%s'"):format(cfg.out:gsub("'", "'\\''")))
  local outs = {
    rl_train = M.rl_rows(train, task_desc), rl_test = M.rl_rows(test, task_desc),
    sft_train = M.sft_rows(train), sft_test = M.sft_rows(test),
  }
  for _, name in ipairs({ "rl_train", "rl_test", "sft_train", "sft_test" }) do
    data.write_jsonl(cfg.out .. "/" .. name .. ".jsonl", outs[name])
    print(("process_dataset: %-9s %5d rows -> %s/%s.jsonl"):format(name, #outs[name], cfg.out, name))
  end
  return outs
end

local argv = { ... }
if argv[1] == "recipes.process_dataset" then return M end
M.main(config.parse(M.defaults, argv))
