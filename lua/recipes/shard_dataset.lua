-- shard_dataset.lua — single-turn tasks into Lost in Conversation's sharded instructions
-- (Laban et al., arXiv 2505.06120, the appendix's sharding process) with an LLM, written in
-- the authors' schema for collabllm_eval.lua protocol=sharded. Every row of input= (process_dataset's
-- eval_test.jsonl: single_turn_prompt, ground_truth, task_metric, single_turn_metadata,
-- task_desc, conv_id) goes through the paper's steps, each checked and each failure counted:
--   1. segmentation (lua/prompts/shard_segment.txt): units of one piece of information each,
--      exact excerpts of the instruction (checked: every segment is one; a reply that is not
--      is asked again judge.parse_retries times, then the row is left out);
--   2. rephrasing (shard_rephrase.txt): the segment that opens the conversation, the high-level
--      intent, becomes the first shard, the others conversational shards by importance
--      (checked: the segments given back are exactly the segments sent, each once);
--   3. verification (shard_verify.txt): the shards together carry all of the instruction
--      ("incomplete" rows are left out);
--   4. validation (validate=true): the solver answers the FULL and the CONCAT instruction
--      validate_runs times each, the task's metric scores every answer, and the row is kept
--      when FULL is solved at all and CONCAT's mean is at least min_concat_ratio x FULL's: the
--      sharded instruction is still solvable with all its shards in one message.
-- The authors also checked every instruction by hand; nothing here replaces that.
--   clrt recipes/shard_dataset.lua input=DIR/eval_test.jsonl out=sharded.json judge.base_url=... [judge.model=...]
--        [solver_model=...] [validate=true] [validate_runs=3] [min_concat_ratio=1] [rows=N]
-- writes out= (a JSON array, the authors' format: {task_id, task, shards = [{shard_id,
-- shard}], single_turn_prompt, ground_truth, single_turn_metadata, task_desc, task_metric,
-- sharding = {segments, validation}}) and OUT.report.json (the counts), and prints the counts.
local config = require("clrt.config")
local data = require("clrt.data")
local json = require("clrt.json")
local llm_reply = require("clrt.llm_reply")
local pf = require("clrt.prompt_file")
local train = require("clrt.train")
local WHO = "shard_dataset"

local M = {}

M.defaults = {
  input = config.optional("string"),            -- process_dataset's eval_test.jsonl (single-turn tasks)
  out = config.optional("string"),              -- the sharded tasks (JSON array); OUT.report.json beside it
  rows = config.optional("number"),             -- at most this many input rows (nil: all)
  judge = train.defaults.shared().judge,        -- the sharding LLM (and the task metrics' judge)
  solver_model = config.optional("string"),     -- validation's assistant on judge.base_url (nil: judge.model)
  validate = true,                              -- step 4: FULL and CONCAT answered and scored
  validate_runs = 3,                            -- answers per setting in step 4
  min_concat_ratio = 1,                         -- keep when mean CONCAT >= this x mean FULL (and FULL > 0)
  solver_max_tokens = 1000,                     -- the solver's answer (the authors' assistant cap)
  reward = { metric_options = config.map({}) }, -- reward.metric_options.<metric>: the task metrics' options
  check_endpoints = true,
  seed = 1,
}

-- The JSON shape of each step's reply (asked for when judge.response_format is set).
local function str(min) return { type = "string", minLength = min } end
M.SCHEMAS = {
  segment = { thought = str(), segments = { type = "array", items = { type = "object", properties = { segment = str(1) },
    required = { "segment" } } } },
  rephrase = { thought = str(), initial_segment = str(1), initial_shard = str(1),
    shards = { type = "array", items = { type = "object", properties = { segment = str(1), shard = str(1) }, required = { "segment", "shard" } } } },
  verify = { thought = str(), coverage = { type = "string", enum = { "complete", "incomplete" } }, missing = str() },
}

local function ask(ctx, step, text, check)
  local props, keys = M.SCHEMAS[step], {}
  for k in pairs(props) do if k ~= "thought" then keys[#keys + 1] = k end end
  table.sort(keys)
  local order = { "thought", unpack(keys) }
  local jo = ctx.judge_options or {}
  local req = { temperature = jo.temperature or 0, max_tokens = jo.max_tokens or 2048, top_p = jo.top_p, role = "sharder/" .. step }
  if jo.response_format then
    req.response_format = { type = "json_schema", json_schema = { name = "shard_" .. step, schema = { type = "object",
      properties = props, required = order, additionalProperties = false } } }
  end
  return llm_reply.ask_json(ctx.judge, { { role = "user", content = text } }, req, check,
    { parse_retries = jo.parse_retries, extract_json = ctx.extract_json, what = WHO .. " " .. step,
      counters = ctx.counters, counter = "judge" })
end

-- Step 1's reply -> the segments, or nil and why.
function M.check_segments(obj, instruction)
  if type(obj.segments) ~= "table" or #obj.segments == 0 then return nil, "no segments" end
  local out, seen = {}, {}
  for i, s in ipairs(obj.segments) do
    local text = type(s) == "table" and llm_reply.text(s.segment)
    if not text or text:match("^%s*$") then return nil, ("segment %d has no text"):format(i) end
    if not instruction:find(text, 1, true) then return nil, ("segment %d is not an excerpt of the instruction: %s"):format(i, text:sub(1, 80)) end
    if seen[text] then return nil, "segment given twice: " .. text:sub(1, 80) end
    seen[text] = true
    out[#out + 1] = text
  end
  if #out < 2 then return nil, "one segment: nothing to shard" end
  return out
end

-- Step 2's reply -> the shards' texts (the initial shard first), or nil and why.
function M.check_rephrase(obj, segments)
  local want = {}
  for _, s in ipairs(segments) do want[s] = true end
  local used = {}
  local function use(seg)
    if not want[seg] then return ("not a segment sent: %s"):format(tostring(seg):sub(1, 80)) end
    if used[seg] then return "a segment used twice: " .. seg:sub(1, 80) end
    used[seg] = true
  end
  local first = llm_reply.text(obj.initial_shard)
  if not first or first:match("^%s*$") then return nil, "no initial_shard" end
  local why = use(llm_reply.text(obj.initial_segment))
  if why then return nil, "initial_segment is " .. why end
  local out = { first }
  if type(obj.shards) ~= "table" then return nil, "no shards list" end
  for i, s in ipairs(obj.shards) do
    local text = type(s) == "table" and llm_reply.text(s.shard)
    if not text or text:match("^%s*$") then return nil, ("shard %d has no text"):format(i) end
    why = use(type(s) == "table" and llm_reply.text(s.segment))
    if why then return nil, ("shard %d's segment is %s"):format(i, why) end
    out[#out + 1] = text
  end
  for _, s in ipairs(segments) do
    if not used[s] then return nil, "a segment is missing from the shards: " .. s:sub(1, 80) end
  end
  return out
end

local function check_coverage(obj)
  if obj.coverage == "complete" or obj.coverage == "incomplete" then return obj.coverage end
  return nil, "coverage is not complete or incomplete: " .. tostring(obj.coverage)
end

-- The solver's mean score over runs answers to one message, or nil and why.
local function solve(ctx, cfg, metric, sample, text)
  local total = 0
  for k = 1, cfg.validate_runs do
    local msgs = { { role = "user", content = text } }
    local reply = ctx.judge:chat(msgs, { model = cfg.solver_model, temperature = 1.0, max_tokens = cfg.solver_max_tokens,
      role = "solver", cache = false, tag = ("validate %s %d"):format(sample.id, k) })
    msgs[2] = { role = "assistant", content = reply.content or "" }
    local v = train.reward.score_conversation(msgs, sample, { metric }, ctx)[metric.name]
    if v == nil or train.reward.is_failed(v) then return nil, ("%s: %s"):format(metric.name, tostring(v and v.error or "does not apply")) end
    total = total + v
  end
  return total / cfg.validate_runs
end

-- One input row through the four steps: the sharded task, or nil and the step that left it out
-- (and why).
function M.shard_row(row, i, ctx, cfg, metrics)
  local instruction = row.single_turn_prompt
  local ok, segments = pcall(ask, ctx, "segment", pf.fill(pf.read("shard_segment"), { instruction = instruction }, "shard_segment"),
    function(o) return M.check_segments(o, instruction) end)
  if not ok then return nil, "segmentation", segments end
  local seg_list = {}
  for k, s in ipairs(segments) do seg_list[k] = { segment = s } end
  local shards
  ok, shards = pcall(ask, ctx, "rephrase", pf.fill(pf.read("shard_rephrase"),
    { instruction = instruction, segments = json.encode(json.array(seg_list)) }, "shard_rephrase"),
    function(o) return M.check_rephrase(o, segments) end)
  if not ok then return nil, "rephrasing", shards end
  local lines = {}
  for k, s in ipairs(shards) do lines[k] = "- " .. s end
  local coverage, obj
  ok, coverage, obj = pcall(ask, ctx, "verify", pf.fill(pf.read("shard_verify"),
    { instruction = instruction, shards = table.concat(lines, "\n") }, "shard_verify"), check_coverage)
  if not ok then return nil, "verification", coverage end
  if coverage ~= "complete" then return nil, "incomplete", llm_reply.text(obj.missing) or "" end
  local out = { task_id = "sharded-" .. tostring(row.conv_id or i), task = tostring(row.task_desc or row.task_metric),
    shards = {}, single_turn_prompt = instruction, ground_truth = row.ground_truth, single_turn_metadata = row.single_turn_metadata,
    task_desc = row.task_desc, task_metric = row.task_metric, sharding = { segments = segments } }
  for k, s in ipairs(shards) do out.shards[k] = { shard_id = k, shard = s } end
  if cfg.validate then
    local task = assert(require("clrt.train.sharded_tasks").task(out, "shard_dataset"))
    local sample = require("clrt.train.sharded_eval").sample_of(task, nil)
    local full, why = solve(ctx, cfg, metrics[row.task_metric], sample, task.full)
    if not full then return nil, "validation", why end
    local concat
    concat, why = solve(ctx, cfg, metrics[row.task_metric], sample, task.concat)
    if not concat then return nil, "validation", why end
    out.sharding.validation = { full = full, concat = concat, runs = cfg.validate_runs }
    if full == 0 or concat < cfg.min_concat_ratio * full then
      return nil, "concat", ("FULL %.3f, CONCAT %.3f over %d runs"):format(full, concat, cfg.validate_runs)
    end
  end
  return out
end

M.OUTCOMES = { "kept", "segmentation", "rephrasing", "verification", "incomplete", "validation", "concat" }

function M.main(cfg, clients)
  if not cfg.input then error("shard_dataset: input= is required (process_dataset's eval_test.jsonl)", 0) end
  if not cfg.out then error("shard_dataset: out= is required (the sharded tasks' JSON file)", 0) end
  for _, k in ipairs({ "validate_runs", "solver_max_tokens" }) do
    if type(cfg[k]) ~= "number" or cfg[k] < 1 or cfg[k] % 1 ~= 0 then error(("shard_dataset: %s must be a whole number >= 1, got %s"):format(k, tostring(cfg[k])), 0) end
  end
  if type(cfg.min_concat_ratio) ~= "number" or cfg.min_concat_ratio < 0 then
    error("shard_dataset: min_concat_ratio must be a number >= 0, got " .. tostring(cfg.min_concat_ratio), 0)
  end
  local rows, line_of = data.read_dataset(cfg.input)
  local names = {}
  for i, r in ipairs(rows) do
    local where = ("shard_dataset: %s:%d: "):format(cfg.input, line_of[i])
    if type(r) ~= "table" or type(r.single_turn_prompt) ~= "string" or r.single_turn_prompt == "" then
      error(where .. "no \"single_turn_prompt\" text (process_dataset's eval_test.jsonl rows have one)", 0)
    end
    if type(r.task_metric) ~= "string" then error(where .. "no \"task_metric\"", 0) end
    names[r.task_metric] = 1
  end
  while cfg.rows and #rows > cfg.rows do table.remove(rows) end
  local ctx = train.context{ config = { sim = "scripted", judge = cfg.judge, seed = cfg.seed,
    reward = { metric_options = require("clrt.train.sharded_recipe").metric_options(cfg.reward.metric_options) } },
    who = WHO, clients = clients }
  if not ctx.judge then error("shard_dataset: judge.base_url is required (the sharding LLM)", 0) end
  local metrics = {}
  if cfg.validate then
    for _, m in ipairs(train.reward.load_metrics(names, ctx.metric_options)) do metrics[m.name] = m end
  end
  train.endpoints.check(ctx, { { metric = { uses_judge = true } } }, cfg, WHO)
  local fns = {}
  for i, r in ipairs(rows) do fns[i] = function() return { M.shard_row(r, i, ctx, cfg, metrics) } end end
  local results, errs = require("clrt.sched").run(fns, { progress = "shard_dataset: rows" })
  local kept, counts, examples = {}, {}, {}
  for _, o in ipairs(M.OUTCOMES) do counts[o] = 0 end
  for i in ipairs(rows) do
    local r = results[i]
    if errs[i] then r = { nil, "validation", errs[i] } end
    if r[1] then kept[#kept + 1] = r[1]; counts.kept = counts.kept + 1
    else
      counts[r[2]] = counts[r[2]] + 1
      examples[r[2]] = examples[r[2]] or ("%s:%d: %s"):format(cfg.input, line_of[i], tostring(r[3]))
    end
  end
  data.write_atomic(cfg.out, json.encode(json.array(kept)) .. "\n")
  local report = { input = cfg.input, rows = #rows, counts = counts, first_reason = examples, validate = cfg.validate,
    validate_runs = cfg.validate_runs, min_concat_ratio = cfg.min_concat_ratio, sharder = cfg.judge.model,
    solver = cfg.solver_model or cfg.judge.model }
  data.write_atomic(cfg.out:gsub("%.json$", "") .. ".report.json", json.encode(report) .. "\n")
  for _, o in ipairs(M.OUTCOMES) do
    print(("shard_dataset: %-12s %5d%s"):format(o, counts[o], examples[o] and ("  (first: " .. examples[o]:sub(1, 160) .. ")") or ""))
  end
  print(("shard_dataset: %d of %d rows sharded -> %s"):format(counts.kept, #rows, cfg.out))
  return kept, report
end

local argv = { ... }
if argv[1] == "recipes.shard_dataset" then return M end
local function parse(a) return config.parse(M.defaults, a) end
if require("clrt.recipe_help").handle(WHO, "recipes.shard_dataset", argv, parse) then return end
M.main(parse(argv))
