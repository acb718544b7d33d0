-- process_dataset.lua — turn a CollabLLM multiturn dataset (the published schema,
-- JSONL as `datasets` exports it: one row per conversation x turn x candidate with
-- prompt, completion, conv_id, turn_id, score, single_turn_prompt, single_turn_completion,
-- single_turn_metadata, sessions, rewards) into RL and SFT files, as the spec says:
--
--   RL rows:  prompt = [system] + row.prompt; ground_truth = row.single_turn_completion
--             (else row.ground_truth, else row.completion, else ""); interaction_kwargs =
--             {name = "collabllm", single_turn_prompt, task_desc}; deduplicated by prompt
--             (first occurrence kept, in file order). single_turn_prompt, task_desc and
--             single_turn_metadata are also copied to the top level, where metrics and
--             simulated users read them; the remaining fields go to extra_info, without
--             the bulky sessions / rewards unless keep_sessions=true.
--   SFT rows: per conv_id, the row with the largest turn_id, then the best score (file
--             order breaks ties); messages = [system] + prompt + [assistant: completion].
--   Split:    a seeded shuffle (clrt.rng, seed 42) with ceil(0.1 * n) validation rows, the
--             sizes of `datasets`' train_test_split(test_size=0.1); the permutation itself
--             is clrt's, not numpy's.
--
--   clrt recipes/process_dataset.lua input=data/collabllm-multiturn-math-hard.jsonl out_dir=data/math-hard
-- writes out_dir/{rl,sft}_{train,validation}.jsonl.
local config = clrt.config
local data = clrt.data

local defaults = {
  input = "",                     -- the multiturn JSONL file
  out_dir = "",                   -- where the four files go
  type = "both",                  -- "rl", "sft" or "both"
  task_desc = "general ask-for-assistance task",
  validation_size = 0.1,
  seed = 42,
  keep_sessions = false,          -- keep sessions / rewards in RL extra_info
  system_prompt = [[You are a helpful, proactive and interactive assistant. Work out what the user really wants and keep track of everything said so far. When a request is unclear or is missing details you need, ask a specific clarifying question instead of guessing. Offer concrete suggestions and next steps, and make it easy to reply, for example by proposing a few options. Keep your answers concise and well organised, and avoid needless repetition. Match the user's tone. If you do not know something, say so plainly and suggest where the user could find out. Be accurate, and keep asking for feedback as the work goes on.]],
}

local M = {}

local function need(row, where, key)
  if row[key] == nil or row[key] == data.json.null then
    error(("%s: row has no '%s'"):format(where, key), 0)
  end
  return row[key]
end

local function check_messages(msgs, where)
  if type(msgs) ~= "table" or (next(msgs) ~= nil and #msgs == 0) then
    error(where .. ": 'prompt' is not a list of messages", 0)
  end
  for i, m in ipairs(msgs) do
    if type(m) ~= "table" or type(m.role) ~= "string" or type(m.content) ~= "string" then
      error(("%s: prompt message %d is not {role, content}"):format(where, i), 0)
    end
  end
  return msgs
end

local function with_system(system, msgs)
  local out = data.json.array({ { role = "system", content = system } })
  for _, m in ipairs(msgs) do out[#out + 1] = { role = m.role, content = m.content } end
  return out
end

-- Python's `a or b` on fields: a missing, null or empty string falls through.
local function str(v)
  if v == nil or v == data.json.null or v == "" then return nil end
  return v
end

function M.rl_rows(rows, cfg)
  local out, seen = {}, {}
  for _, r in ipairs(rows) do
    local row, where = r.row, r.where
    local prompt = with_system(cfg.system_prompt, check_messages(need(row, where, "prompt"), where))
    local key = data.json.encode(prompt)
    if not seen[key] then
      seen[key] = true
      local stp = need(row, where, "single_turn_prompt")
      local task_desc = str(row.task_desc) or cfg.task_desc
      local gt = str(row.ground_truth) or str(row.single_turn_completion) or str(row.completion) or ""
      local extra = {}
      for k, v in pairs(row) do
        if k ~= "prompt" and k ~= "ground_truth" and (cfg.keep_sessions or (k ~= "sessions" and k ~= "rewards")) then
          extra[k] = v
        end
      end
      out[#out + 1] = {
        prompt = prompt, ground_truth = gt,
        single_turn_prompt = stp, task_desc = task_desc,
        single_turn_metadata = row.single_turn_metadata,
        interaction_kwargs = { name = "collabllm", single_turn_prompt = stp, task_desc = task_desc },
        extra_info = extra,
      }
    end
  end
  return out
end

function M.sft_rows(rows, cfg)
  local best, order = {}, {}
  for i, r in ipairs(rows) do
    local row, where = r.row, r.where
    local conv = need(row, where, "conv_id")
    local turn = need(row, where, "turn_id")
    local score = need(row, where, "score")
    if type(turn) ~= "number" then error(where .. ": turn_id is not a number", 0) end
    if type(score) ~= "number" then error(where .. ": score is not a number", 0) end
    local key = type(conv) .. ":" .. tostring(conv)
    local b = best[key]
    if not b then
      order[#order + 1] = key
      best[key] = r
    else
      local br = b.row
      if turn > br.turn_id or (turn == br.turn_id and score > br.score) then best[key] = r end
    end
  end
  local out = {}
  for _, key in ipairs(order) do
    local row, where = best[key].row, best[key].where
    local msgs = with_system(cfg.system_prompt, check_messages(need(row, where, "prompt"), where))
    local completion = need(row, where, "completion")
    if type(completion) ~= "string" then error(where .. ": completion is not a string", 0) end
    msgs[#msgs + 1] = { role = "assistant", content = completion }
    out[#out + 1] = { messages = msgs, conv_id = row.conv_id, turn_id = row.turn_id, score = row.score }
  end
  return out
end

function M.split(rows, cfg)
  local n = #rows
  local nval = math.ceil(cfg.validation_size * n)
  if cfg.validation_size >= 1 then nval = math.floor(cfg.validation_size) end
  local shuffled = data.shuffle(rows, cfg.seed)
  local train, val = {}, {}
  for i = 1, n do
    if i <= n - nval then train[#train + 1] = shuffled[i] else val[#val + 1] = shuffled[i] end
  end
  return train, val
end

function M.main(argv)
  local cfg = config.parse(defaults, argv)
  if cfg.input == "" or cfg.out_dir == "" then
    error("process_dataset: give input=FILE.jsonl and out_dir=DIR", 0)
  end
  if cfg.type ~= "rl" and cfg.type ~= "sft" and cfg.type ~= "both" then
    error("process_dataset: type must be rl, sft or both", 0)
  end
  local rows = {}
  for line, row in data.lines(cfg.input) do
    rows[#rows + 1] = { row = row, where = ("%s:%d"):format(cfg.input, line) }
  end
  os.execute(("mkdir -p '%s'"):format(cfg.out_dir:gsub("'", "'\\''")))
  local kinds = cfg.type == "both" and { "rl", "sft" } or { cfg.type }
  for _, kind in ipairs(kinds) do
    local out = kind == "rl" and M.rl_rows(rows, cfg) or M.sft_rows(rows, cfg)
    local train, val = M.split(out, cfg)
    data.write_jsonl(cfg.out_dir .. "/" .. kind .. "_train.jsonl", train)
    data.write_jsonl(cfg.out_dir .. "/" .. kind .. "_validation.jsonl", val)
    print(("%s: %d input rows -> %d %s rows: %d train, %d validation"):format(
      "process_dataset", #rows, #out, kind, #train, #val))
  end
end

M.defaults = defaults

-- Run when executed as a script (`clrt recipes/process_dataset.lua ...`); a test may
-- instead `dofile` it with PROCESS_DATASET_LIBRARY set and call the functions.
if not rawget(_G, "PROCESS_DATASET_LIBRARY") then
  local ok, err = pcall(M.main, arg)
  if not ok then
    io.stderr:write(tostring(err), "\n")
    os.exit(1)
  end
end
return M
