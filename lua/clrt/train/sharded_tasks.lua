-- clrt.train.sharded_tasks — Lost in Conversation's sharded instructions (arXiv 2505.06120) as
-- collabllm_eval protocol=sharded runs them: the file the authors released
-- (microsoft/lost_in_conversation data/sharded_instructions_600.json, a JSON array; JSONL
-- is read too) or one shard_dataset.lua wrote, each row read into a task that holds its shards,
-- the FULL prompt (the original instruction), the CONCAT prompt (every shard in one message),
-- the clrt metric that scores an answer and what the strategy judge and the simulated user
-- need. docs/method.md ("Lost in Conversation") lists the schema and each task's keys.
--   local tasks, skipped = sharded_tasks.read(path, who)   -- skipped: {task name = rows left out}
--   local task = sharded_tasks.task(row, where)            -- one row (nil, why when clrt cannot score it)
-- A row: {task_id, task, shards = [{shard_id, shard}, ...], <the task's own keys>}. The
-- authors' tasks clrt scores with its own metrics: math (accuracy), code (pass_rate on tests
-- made from the row's call-based test cases), data2text and translation (bleu_score). A row
-- with single_turn_prompt and task_metric (shard_dataset's, the built-in world's) is scored by
-- that metric whatever its task. summary (SummHay's insight judge), database (Spider's
-- databases) and actions (BFCL) need what clrt does not have: such rows are left out and
-- counted. A malformed row is an error naming the file and the row.
local json = require("clrt.json")
local M = {}

-- At most this many shards in a row: the authors' have up to about a dozen; a file that
-- claims thousands is not an instruction.
M.MAX_SHARDS = 64

-- What a complete answer looks like, for the strategy judge (our words; the authors' tasks
-- each carry such a sentence).
M.ANSWER = {
  math = "a single final number (an integer, a decimal, a fraction or a negative number)",
  code = "a complete Python function, defined with def and returning a value, that solves the whole problem; "
    .. "an explanation in words without the function is not an answer",
  data2text = "one sentence describing the table",
  translation = "an English translation of the whole German document given so far",
  generic = "a complete, final response to the user's whole request (not a plan, a template or a question)",
}

local function bullets(shards, from)
  local out = {}
  for i = from, #shards do out[#out + 1] = "- " .. shards[i].text end
  return table.concat(out, "\n")
end

-- The CONCAT message of a generic task: the first shard (the high-level intent) on its own
-- line, every other shard a bullet under it (the authors' layout for code; math bullets all).
function M.concat_text(shards)
  if #shards == 1 then return shards[1].text end
  return shards[1].text .. "\n" .. bullets(shards, 2)
end

local function need_string(row, key, where)
  local v = row[key]
  if type(v) ~= "string" or v == "" then error(("%s: no \"%s\" text"):format(where, key), 0) end
  return v
end

-- The row's shards in file order as {id, text}; the first is the intent the user opens with.
-- nil and why when a shard's text is empty (the row is left out and counted).
function M.shards_of(row, where)
  local list = row.shards
  if type(list) ~= "table" or #list == 0 then error(where .. ": \"shards\" must be a non-empty list", 0) end
  if #list > M.MAX_SHARDS then error(("%s: %d shards (at most %d)"):format(where, #list, M.MAX_SHARDS), 0) end
  local out, seen = {}, {}
  for i, s in ipairs(list) do
    local at = ("%s: shards[%d]"):format(where, i)
    if type(s) ~= "table" then error(at .. " must be an object {shard_id, shard}", 0) end
    local id = tonumber(s.shard_id)
    if not id or id % 1 ~= 0 or id < 0 then error(at .. ": shard_id must be a whole number >= 0, got " .. tostring(s.shard_id), 0) end
    if seen[id] then error(("%s: shard_id %d appears twice"):format(at, id), 0) end
    seen[id] = true
    -- the released files say "shard"; the authors' README names the key "shard_text"
    local text = s.shard ~= nil and s.shard or s.shard_text
    if type(text) ~= "string" then error(at .. ": no \"shard\" text", 0) end
    -- an empty one is left out with its row, not an error: the released translation file has two
    if text:match("^%s*$") then return nil, ("shard_id %d has an empty text"):format(id) end
    out[i] = { id = id, text = text }
  end
  return out
end

-- The reference of a GSM8K answer: the text after its "####" (the authors' evaluator).
function M.gsm8k_answer(answer)
  local gold = answer:match("####%s*(.-)%s*$")
  return (gold and gold ~= "") and gold or answer
end

-- A list of test cases from a JSON string (LiveCodeBench's public_test_cases); nil when the
-- text is not JSON (the released private cases are compressed pickles clrt cannot read).
local function test_cases(text)
  if type(text) ~= "string" then return type(text) == "table" and text or nil end
  local ok, t = pcall(json.decode, text)
  return (ok and type(t) == "table") and t or nil
end

-- A Python string literal for any text (JSON's string syntax is valid Python).
local function py_string(s) return json.encode(tostring(s)) end

-- unittest source for call-based test cases: each case's input is one JSON value per line
-- (the arguments), its output the JSON of the return value; the solution's function is a
-- global of the module the tests run in (pass_rate's harness, as BigCodeBench's). A result
-- is compared after a JSON round trip, so tuples equal lists as they do in the JSON cases.
function M.unittest_source(func_name, cases)
  local lines = { "import json", "import unittest", "", "", "class TestCases(unittest.TestCase):" }
  for i, c in ipairs(cases) do
    lines[#lines + 1] = ("    def test_case_%d(self):"):format(i)
    lines[#lines + 1] = ("        args = [json.loads(a) for a in %s.split('\\n') if a.strip()]"):format(py_string(c.input))
    lines[#lines + 1] = ("        expected = json.loads(%s)"):format(py_string(c.output))
    lines[#lines + 1] = ("        got = %s(*args)"):format(func_name)
    lines[#lines + 1] = "        self.assertEqual(json.loads(json.dumps(got)), expected)"
  end
  return table.concat(lines, "\n") .. "\n"
end

-- Each task of the authors' that clrt scores: what FULL and CONCAT send, the metric and its
-- inputs. Each returns the task's fields, or nil and why the row cannot be run.
local AUTHORS = {}

function AUTHORS.math(row, shards, where)
  local question = need_string(row, "question", where)
  local gold = M.gsm8k_answer(need_string(row, "answer", where))
  return { full = question, concat = bullets(shards, 1), task_metric = "accuracy",
    single_turn_prompt = question, ground_truth = gold, answer_description = M.ANSWER.math }
end

function AUTHORS.code(row, shards, where)
  local md = type(row.metadata) == "table" and row.metadata or {}
  local fn = md.func_name
  if type(fn) ~= "string" or not fn:match("^[%a_][%w_]*$") then
    return nil, "no metadata.func_name (a Python name): stdin programs are not run"
  end
  local cases, public_only = {}, false
  for _, key in ipairs({ "public_test_cases", "private_test_cases" }) do
    if row[key] ~= nil then
      local list = test_cases(row[key])
      if not list then public_only = true
      else
        for _, c in ipairs(list) do
          if type(c) ~= "table" or type(c.input) ~= "string" or type(c.output) ~= "string" then
            error(("%s: %s: a case must be {input, output} strings"):format(where, key), 0)
          end
          if c.testtype and c.testtype ~= "functional" then return nil, "stdin test cases are not run" end
          cases[#cases + 1] = c
        end
      end
    end
  end
  if #cases == 0 then return nil, "no readable test cases" end
  local full
  if row.source == "humaneval" then
    full = "Complete this Python function:\n```python\n" .. need_string(row, "prompt", where) .. "\n```"
  else
    full = need_string(row, "question_content", where)
  end
  local starter = type(row.starter_code) == "string" and row.starter_code ~= "" and
    ("\n\nStart from this code:\n```python\n" .. row.starter_code .. "\n```") or ""
  return { full = full .. starter, concat = M.concat_text(shards) .. starter, task_metric = "pass_rate",
    single_turn_prompt = full, tests = M.unittest_source(fn, cases), single_turn_metadata = { entry_point = fn },
    answer_description = M.ANSWER.code, public_tests_only = public_only or nil }
end

function AUTHORS.data2text(row, shards, where)
  local refs = row.references
  if type(refs) ~= "table" or type(refs[1]) ~= "string" then error(where .. ": \"references\" must be a list of texts", 0) end
  local context = {}
  local keys = {}
  for k in pairs(type(row.metadata) == "table" and row.metadata or {}) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do context[#context + 1] = ("%s: %s"):format(k, tostring(row.metadata[k])) end
  local ask = "Write one clear, natural sentence that describes the table below, focusing on its highlighted cells."
  local full = ("%s\n\nTable:\n%s\n\nContext:\n%s\n\nDescriptions of other tables, for reference:\n%s"):format(ask,
    need_string(row, "table_highlighted_html", where), table.concat(context, "\n"), tostring(row.fewshot_descriptions or ""))
  local hints = {}
  for i, s in ipairs(shards) do hints[i] = ("Hint %d:\n%s"):format(s.id, s.text) end
  -- the authors' user reveals one hint a turn as it is, and every reply is an answer attempt
  return { full = full, concat = ask .. "\n\n" .. table.concat(hints, "\n\n"), task_metric = "bleu_score",
    ground_truth = refs[1], answer_description = M.ANSWER.data2text, user_voice = "scripted", every_turn_answer = true }
end

function AUTHORS.translation(row, shards, where)
  local de, en = need_string(row, "document_de", where), need_string(row, "document_en", where)
  local ask = "Translate this German document into English."
  local chunks = {}
  for i, s in ipairs(shards) do chunks[i] = ("Chunk %d:\n%s"):format(i, s.text) end
  return { full = ask .. "\n\n" .. de,
    concat = ask .. " It comes in chunks; translate it whole, without the chunk labels.\n\n" .. table.concat(chunks, "\n\n"),
    task_metric = "bleu_score", ground_truth = en, answer_description = M.ANSWER.translation,
    user_voice = "scripted", every_turn_answer = true,
    -- the user's turns frame each chunk (the authors' translation user does the same)
    scripted_turn = function(k, shard)
      if k == 1 then
        return "I am translating a German document into English as it comes in. After each chunk, translate the "
          .. "whole document so far, not only the newest chunk.\n\nChunk 1:\n" .. shard.text
      end
      return ("Here is the next chunk. Translate the whole document so far.\n\nChunk %d:\n%s"):format(k, shard.text)
    end }
end

-- What rows of these tasks would need, for the count of rows left out.
M.UNSUPPORTED = { summary = "SummHay's insight judge", database = "Spider's databases", actions = "BFCL's evaluator" }

-- A task from one row; nil and why when clrt cannot score it. where names the row in errors.
function M.task(row, where)
  if type(row) ~= "table" or json.is_array(row) then error(where .. ": a row must be a JSON object", 0) end
  local id = row.task_id
  if (type(id) ~= "string" or id == "") and type(id) ~= "number" then error(where .. ": no \"task_id\"", 0) end
  local name = need_string(row, "task", where)
  where = ("%s (task_id %s)"):format(where, tostring(id))
  local generic = type(row.single_turn_prompt) == "string" and type(row.task_metric) == "string"
  -- checked before the shards: the released summary rows' shards are document lists, no text
  if not generic and not AUTHORS[name] then
    return nil, M.UNSUPPORTED[name] and ("needs " .. M.UNSUPPORTED[name]) or "a task clrt has no metric for"
  end
  local shards, empty = M.shards_of(row, where)
  if not shards then return nil, empty end
  local t, why
  if row.user_voice ~= nil and row.user_voice ~= "scripted" then
    error(where .. ": user_voice may only be \"scripted\" (the task's user reveals each shard as it is)", 0)
  end
  if generic then
    -- shard_dataset's rows and the world's: the single-turn task as process_dataset writes it
    t = { full = row.single_turn_prompt, concat = M.concat_text(shards), task_metric = row.task_metric,
      single_turn_prompt = row.single_turn_prompt, ground_truth = row.ground_truth,
      single_turn_metadata = row.single_turn_metadata, tests = row.tests,
      answer_description = type(row.answer_description) == "string" and row.answer_description or M.ANSWER.generic,
      user_voice = row.user_voice }
  else
    t, why = AUTHORS[name](row, shards, where)
  end
  if not t then return nil, why end
  t.id, t.task, t.shards, t.task_desc = tostring(id), name, shards, row.task_desc or name
  return t
end

-- The rows of a file: a JSON array (the authors' files) or JSONL (one object a line).
function M.rows(path, who)
  local files = require("clrt.files")
  local text = files.exists(path) and files.read(path)
  if not text then error(("%s: cannot read %s"):format(who, path), 0) end
  if text:match("^%s*%[") then
    local ok, rows = pcall(json.decode, text, path)
    if not ok then error(("%s: %s is not a JSON array: %s"):format(who, path, tostring(rows)), 0) end
    local where = {}
    for i = 1, #rows do where[i] = ("%s[%d]"):format(path, i - 1) end
    return rows, where
  end
  local rows, line_of = require("clrt.data").read_dataset(path)
  local where = {}
  for i = 1, #rows do where[i] = ("%s:%d"):format(path, line_of[i]) end
  return rows, where
end

-- Every task of a file; rows clrt cannot score are left out and counted by task name (with
-- the first reason). only: a set of task names to keep (nil: all). Errors start with who.
function M.read(path, who, only)
  who = who or "clrt.train.sharded_tasks"
  local rows, where = M.rows(path, who)
  local tasks, skipped, ids = {}, {}, {}
  for i, row in ipairs(rows) do
    local ok, t, why = pcall(M.task, row, who .. ": " .. where[i])
    if not ok then error(t, 0) end
    local name = type(row) == "table" and row.task
    if only and not only[name] then
      -- not asked for
    elseif not t then
      local s = skipped[name] or { rows = 0, why = why }
      s.rows = s.rows + 1
      skipped[name] = s
    else
      if ids[t.id] then error(("%s: %s: task_id %s appears twice"):format(who, where[i], t.id), 0) end
      ids[t.id] = true
      tasks[#tasks + 1] = t
    end
  end
  if #tasks == 0 then
    local parts = {}
    for name, s in pairs(skipped) do parts[#parts + 1] = ("%s (%d rows: %s)"):format(tostring(name), s.rows, s.why) end
    table.sort(parts)
    error(("%s: %s has no task clrt can score%s"):format(who, path, #parts > 0 and ("; left out: " .. table.concat(parts, ", ")) or ""), 0)
  end
  return tasks, skipped
end

return M
