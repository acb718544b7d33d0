-- shard_dataset.lua: single-turn tasks into sharded instructions by the paper's steps, each
-- checked and each failure counted (segments that are not excerpts, segments lost in the
-- rephrasing, incomplete coverage, a CONCAT the solver cannot solve as well as FULL), through
-- a client that records what each step is sent; the file it writes reads back as tasks in the
-- authors' schema.
local T = require("clrt.test")
local cjson = require("cjson")
local config = require("clrt.config")
local data = require("clrt.data")
local sd = require("recipes.shard_dataset")
local sharded_tasks = require("clrt.train.sharded_tasks")

local root = T.tmpdir()

local Q1 = "Write a birthday card for my friend Paul in French."
local Q2 = "Plan a trip to Rome for three days."
local Q3 = "Book a meeting for Friday at noon."
local Q4 = "Order pizza with olives for dinner."

-- The sharding LLM, the solver and the judges, by what each request asks for. Per
-- instruction: Q1 goes through, Q2's segments are not excerpts, Q3 loses a segment in the
-- rephrasing, Q4 is judged incomplete; the solver answers FULL right and CONCAT right for Q1.
local function fake(calls, concat_fails)
  local c = {}
  function c:chat(msgs, opts)
    local text = msgs[1].content
    local name = opts.response_format and opts.response_format.json_schema.name
    calls[#calls + 1] = { name = name or "solver", text = text, opts = opts }
    local function has(q) return text:find(q, 1, true) end
    local reply
    if name == "shard_segment" then
      if has(Q1) then reply = { thought = "t", segments = { { segment = "Write a birthday card" }, { segment = "for my friend Paul" },
        { segment = "in French" } } }
      elseif has(Q2) then reply = { thought = "t", segments = { { segment = "plan a holiday" }, { segment = "Rome" } } }
      elseif has(Q3) then reply = { thought = "t", segments = { { segment = "Book a meeting" }, { segment = "for Friday" }, { segment = "at noon" } } }
      else reply = { thought = "t", segments = { { segment = "Order pizza" }, { segment = "with olives" } } } end
    elseif name == "shard_rephrase" then
      if has(Q3) then
        reply = { thought = "t", initial_segment = "Book a meeting", initial_shard = "a meeting", shards = { { segment = "for Friday", shard = "on friday" } } }
      elseif has(Q1) then
        reply = { thought = "t", initial_segment = "Write a birthday card", initial_shard = "birthday card",
          shards = { { segment = "for my friend Paul", shard = "its for my friend paul" }, { segment = "in French", shard = "in french pls" } } }
      else
        reply = { thought = "t", initial_segment = "Order pizza", initial_shard = "pizza", shards = { { segment = "with olives", shard = "olives" } } }
      end
    elseif name == "shard_verify" then
      reply = has(Q4) and { thought = "t", coverage = "incomplete", missing = "for dinner" } or { thought = "t", coverage = "complete", missing = "" }
    elseif name == "accuracy" then
      -- the solver's reply is the conversation's last message: RIGHT scores 1
      reply = { thought = "t", accuracy = text:find("RIGHT", 1, true) and 1 or 0 }
    elseif name == nil then
      local is_concat = text:find("\n- ", 1, true) ~= nil
      return { content = (is_concat and concat_fails) and "WRONG" or "RIGHT" }
    else error("unexpected request " .. tostring(name)) end
    return { content = cjson.encode(reply) }
  end
  c.base_url, c.model = "fake", "fake-model"
  return c
end

local function rows()
  local out = {}
  for i, q in ipairs({ Q1, Q2, Q3, Q4 }) do
    out[i] = { conv_id = "c" .. i, single_turn_prompt = q, ground_truth = "REF-" .. i, task_metric = "accuracy",
      task_desc = "question answering", single_turn_metadata = {} }
  end
  return out
end

local function run(extra, concat_fails)
  local input = root .. "/eval_test.jsonl"
  data.write_jsonl(input, rows())
  local out = root .. "/sharded.json"
  local calls = {}
  local args = { "input=" .. input, "out=" .. out, "check_endpoints=false", "validate_runs=2", "judge.base_url=http://127.0.0.1:1/v1" }
  for _, a in ipairs(extra or {}) do args[#args + 1] = a end
  local real = print
  print = function() end
  local ok, kept, report = pcall(sd.main, config.parse(sd.defaults, args), { judge = fake(calls, concat_fails) })
  print = real
  assert(ok, kept)
  return kept, report, calls, out
end

T.case("the paper's steps, each checked and counted; the file reads back as sharded tasks", function()
  local kept, report, calls, out = run()
  T.eq(report.counts, { kept = 1, segmentation = 1, rephrasing = 1, verification = 0, incomplete = 1, validation = 0, concat = 0 })
  T.ok(report.first_reason.segmentation:find("not an excerpt", 1, true), report.first_reason.segmentation)
  T.ok(report.first_reason.rephrasing:find("missing from the shards: at noon", 1, true), report.first_reason.rephrasing)
  T.eq(report.first_reason.incomplete:match(": (.*)$"), "for dinner")
  T.eq(#kept, 1)
  local row = kept[1]
  T.eq(row.task_id, "sharded-c1")
  T.eq(row.shards, { { shard_id = 1, shard = "birthday card" }, { shard_id = 2, shard = "its for my friend paul" },
    { shard_id = 3, shard = "in french pls" } })
  T.eq({ row.single_turn_prompt, row.ground_truth, row.task_metric }, { Q1, "REF-1", "accuracy" })
  T.eq(row.sharding.validation, { full = 1, concat = 1, runs = 2 })
  -- what each step was sent: the instruction; the segments to rephrase; the shards to verify;
  -- the solver FULL and CONCAT twice each (only Q1 reached it), the reference only to the judge
  local n = {}
  for _, c in ipairs(calls) do
    n[c.name] = (n[c.name] or 0) + 1
    if c.name ~= "accuracy" then T.ok(not c.text:find("REF-", 1, true), c.name .. " never sees the reference") end
  end
  T.eq({ n.shard_segment, n.solver, n.accuracy }, { 4 + 1, 4, 4 }, "Q2's bad segments asked again once")
  local solver_texts = {}
  for _, c in ipairs(calls) do if c.name == "solver" then solver_texts[c.text] = true end end
  T.ok(solver_texts[Q1], "FULL is the instruction")
  T.ok(solver_texts["birthday card\n- its for my friend paul\n- in french pls"], "CONCAT is every shard in one message")
  -- the file: the authors' schema, read by protocol=sharded
  local tasks = sharded_tasks.read(out, "t")
  T.eq({ #tasks, tasks[1].id, tasks[1].task, tasks[1].task_metric }, { 1, "sharded-c1", "question answering", "accuracy" })
  local rep = cjson.decode(T.read(root .. "/sharded.report.json"))
  T.eq(rep.counts.kept, 1)
end)

T.case("validation: a sharding whose CONCAT the solver cannot solve is left out and counted; validate=false skips it", function()
  local kept, report, calls = run({}, true)
  T.eq({ #kept, report.counts.concat }, { 0, 1 })
  T.ok(report.first_reason.concat:find("FULL 1.000, CONCAT 0.000 over 2 runs", 1, true), report.first_reason.concat)
  kept, report, calls = run({ "validate=false" }, true)
  T.eq({ #kept, report.counts.kept, report.counts.concat }, { 1, 1, 0 })
  for _, c in ipairs(calls) do T.ok(c.name ~= "solver", "no solver without validation") end
  T.raises(function() sd.main(config.parse(sd.defaults, { "out=x.json" })) end, "input= is required")
  T.raises(function() run({ "validate_runs=0" }) end, "validate_runs must be")
end)

T.case("check_segments and check_rephrase refuse what the paper's rules exclude", function()
  T.eq({ sd.check_segments({ segments = { { segment = "a b" } } }, "a b c") }, { nil, "one segment: nothing to shard" })
  T.eq(select(2, sd.check_segments({ segments = { { segment = "a" }, { segment = "a" } } }, "a b")), "segment given twice: a")
  T.eq(sd.check_segments({ segments = { { segment = "a" }, { segment = "c" } } }, "a b c"), { "a", "c" })
  T.eq(select(2, sd.check_rephrase({ initial_segment = "a", initial_shard = "A", shards = { { segment = "a", shard = "x" } } }, { "a", "c" })),
    "shard 1's segment is a segment used twice: a")
  T.eq(sd.check_rephrase({ initial_segment = "c", initial_shard = "C", shards = { { segment = "a", shard = "x" } } }, { "a", "c" }),
    { "C", "x" }, "the initial shard first, whichever segment it is")
end)

T.run()
