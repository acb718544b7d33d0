-- collabllm_eval.lua protocol=sharded (Lost in Conversation, clrt.train.sharded_eval): the
-- statistics against Python's own percentiles and a hand computation; the authors' schema read
-- into FULL / CONCAT / SHARDED tasks (and what clrt cannot score counted); the code task's
-- tests run; the sharded user and the strategy judge; the protocol through a local endpoint
-- that records what each role is sent (the assistant never sees a shard still hidden, the
-- user never a reference or the original instruction); the conversation's score is its last
-- attempt's; and the built-in world end to end with two variants side by side.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local cjson = require("cjson")
local config = require("clrt.config")
local data = require("clrt.data")
local json = require("clrt.json")
local stats = require("clrt.train.sharded_stats")
local sharded_eval = require("clrt.train.sharded_eval")
local sharded_tasks = require("clrt.train.sharded_tasks")
local user = require("interactions.sharded_user")

local root = T.tmpdir()

local function write(path, text)
  local f = assert(io.open(path, "wb")); f:write(text); f:close()
end

---------------------------------------------------------------- statistics
T.case("percentiles and per-task quantities equal Python's statistics.quantiles (numpy's linear rule)", function()
  local lists = { { 1, 0, 1, 1, 0, 1, 1, 1, 0, 1 }, { 0, 0, 0, 0, 0, 0, 0, 0, 0, 1 }, { 0.12, 0.5, 0.33, 0.9, 0.05 },
    { 1, 2, 3, 4, 10 }, { 0.7, 0.7 }, { 0.25, 0.75, 0.5 } }
  local input = root .. "/lists.json"
  write(input, cjson.encode(lists))
  local script = root .. "/quantiles.py"
  write(script, table.concat({
    "import json, statistics, sys",
    "out = []",
    "for xs in json.load(open(sys.argv[1])):",
    "    q = statistics.quantiles(xs, n=10, method='inclusive')",
    "    out.append([statistics.mean(xs), q[0], q[8]])",
    "print(json.dumps(out))" }, "\n"))
  local p = assert(io.popen(("/usr/bin/python3 %q %q"):format(script, input)))
  local want = cjson.decode(p:read("*a"))
  p:close()
  for i, xs in ipairs(lists) do
    local q = stats.instruction(xs)
    T.near(q.performance, want[i][1], 1e-12, "mean " .. i)
    T.near(stats.percentile(xs, 10), want[i][2], 1e-12, "p10 " .. i)
    T.near(q.aptitude, want[i][3], 1e-12, "p90 " .. i)
    T.near(q.unreliability, want[i][3] - want[i][2], 1e-12, "p90 - p10 " .. i)
  end
  -- by hand: ten binary runs with seven successes: p90 at position 8.1 of the sorted list
  -- (0,0,0,1,...) is 1, p10 at 0.9 is 0
  T.eq({ stats.percentile(lists[1], 90), stats.percentile(lists[1], 10) }, { 1, 0 })
  T.eq(stats.instruction({ 0.4 }).unreliability, 0, "one simulation: no spread")
end)

T.case("report: per task type and overall over tasks, mean ± SE, the SHARDED - FULL gap, drops and failures apart", function()
  local a = { id = "a", task = "math" }
  local b = { id = "b", task = "math" }
  local c = { id = "c", task = "code" }
  local res = {}
  local function add(t, setting, scores)
    for _, s in ipairs(scores) do res[#res + 1] = { sample = t, setting = setting, score = s, attempts = { { turn = 1, score = s } } } end
  end
  add(a, "full", { 1, 1, 1, 1 }); add(b, "full", { 1, 0, 1, 1 }); add(c, "full", { 1, 1, 0, 1 })
  add(a, "concat", { 1, 1, 1, 0 }); add(b, "concat", { 0, 1, 1, 1 }); add(c, "concat", { 1, 1, 1, 1 })
  add(a, "sharded", { 1, 0, 0, 1 }); add(b, "sharded", { 0, 0, 0, 1 }); add(c, "sharded", { 0, 1, 0, 0 })
  res[#res + 1] = { sample = a, setting = "sharded", dropped = "simulator failed", error = "down" }
  res[#res + 1] = { sample = b, setting = "sharded", failed = "accuracy: judge down" }
  local rep = stats.report(res, sharded_eval.SETTINGS)
  T.eq({ rep.conversations, rep.dropped, rep.failed }, { 36, 1, 1 })
  T.eq(rep.task_order, { "code", "math" })
  local S = rep.settings.sharded.groups
  -- by hand: per task P = .5, .25, .25; A (p90 of 4 runs) = 1, .7, .7 (b: sorted 0,0,0,1, pos 2.7);
  -- U = A - p10 (p10 = 0 for all three)
  T.near(S.math.performance.mean, 0.375, 1e-12)
  T.near(S.math.performance.se, math.sqrt(((0.5 - 0.375) ^ 2 + (0.25 - 0.375) ^ 2) / 1) / math.sqrt(2), 1e-12)
  T.near(S.math.aptitude.mean, (1 + 0.7) / 2, 1e-12)
  T.near(S.overall.performance.mean, 1 / 3, 1e-12)
  T.near(S.overall.aptitude.mean, 0.8, 1e-12)
  T.near(S.overall.unreliability.mean, 0.8, 1e-12)
  T.eq({ S.overall.instructions, S.math.instructions, S.overall.simulations_min, S.overall.simulations_max }, { 3, 2, 4, 4 })
  local F = rep.settings.full.groups
  T.near(F.overall.performance.mean, (1 + 0.75 + 0.75) / 3, 1e-12)
  T.near(rep.gap.overall.performance, 1 / 3 - 2.5 / 3, 1e-12)
  T.near(rep.gap.overall.relative_performance, (1 / 3 - 2.5 / 3) / (2.5 / 3), 1e-12)
  -- FULL's unreliability by hand: a 0 (all ones), b and c 1 - 0.3 = 0.7 (sorted 0,1,1,1: p10 at 0.3)
  T.near(F.overall.unreliability.mean, 1.4 / 3, 1e-12)
  T.near(rep.gap.overall.unreliability, 0.8 - 1.4 / 3, 1e-12)
end)

---------------------------------------------------------------- the authors' schema
-- Rows as the authors' file holds them (microsoft/lost_in_conversation: task-specific keys
-- per task; "shard" texts), one a task.
local CODE_TESTS = cjson.encode({ { input = "[1, 2, -4]", output = "true", testtype = "functional" },
  { input = "[1, 2, 3]", output = "false", testtype = "functional" } })
local ROWS = {
  { task_id = "sharded-gsm8k-1", task = "math", question = "Ann has 3 boxes of 6 pens. How many pens?",
    answer = "3 boxes of 6 is 3*6 = 18\n#### 18",
    shards = { { shard_id = 1, shard = "how many pens does ann have" }, { shard_id = 2, shard = "she has 3 boxes" },
      { shard_id = 3, shard = "each box holds 6 pens" } } },
  { task_id = "sharded-HumanEval/3", task = "code", source = "humaneval",
    prompt = "def below_zero(operations):\n    \"\"\"True if the balance ever falls below zero.\"\"\"\n",
    metadata = { func_name = "below_zero" }, public_test_cases = CODE_TESTS,
    shards = { { shard_id = 1, shard = "a function about bank balance" }, { shard_id = 2, shard = "the input is a list of operations" },
      { shard_id = 3, shard = "return True once it goes below zero" } } },
  { task_id = "sharded-totto-9", task = "data2text", table_highlighted_html = "<table><tr><td>1998</td></tr></table>",
    fewshot_descriptions = "An example.", metadata = { page = "Films" }, references = { "The film came out in 1998.", "In 1998." },
    shards = { { shard_id = 1, shard = "<table><tr><td>1998</td></tr></table>" }, { shard_id = 2, shard = "page: Films" } } },
  { task_id = "wmt-1", task = "translation", document_de = "Guten Tag.\nWie geht es?", document_en = "Good day.\nHow are you?",
    shards = { { shard_id = 1, shard = "Guten Tag." }, { shard_id = 2, shard = "Wie geht es?" } } },
  { task_id = "sharded_summary_1", task = "summary", shards = { { shard_id = 0, shard = "", doc_idxs = { 1 } } } },
  { task_id = "sharded-spider-1", task = "database", shards = { { shard_id = 1, shard = "stadiums" } } },
}

T.case("the published schema: FULL and CONCAT prompts, metric and reference per task; what clrt cannot score counted", function()
  local path = root .. "/sharded.json"
  write(path, cjson.encode(ROWS))
  local tasks, skipped = sharded_tasks.read(path, "t")
  T.eq(#tasks, 4)
  T.eq({ skipped.summary.rows, skipped.database.rows }, { 1, 1 })
  local by = {}
  for _, t in ipairs(tasks) do by[t.task] = t end
  local m = by.math
  T.eq({ m.task_metric, m.ground_truth, m.single_turn_prompt, m.full }, { "accuracy", "18", ROWS[1].question, ROWS[1].question })
  T.eq(m.concat, "- how many pens does ann have\n- she has 3 boxes\n- each box holds 6 pens")
  T.eq(m.shards[1], { id = 1, text = "how many pens does ann have" })
  local c = by.code
  T.eq({ c.task_metric, c.single_turn_metadata.entry_point }, { "pass_rate", "below_zero" })
  T.ok(c.full:find("def below_zero", 1, true), "FULL: the HumanEval prompt")
  T.eq(c.concat, "a function about bank balance\n- the input is a list of operations\n- return True once it goes below zero")
  T.ok(c.tests:find("class TestCases(unittest.TestCase)", 1, true))
  local d = by.data2text
  T.eq({ d.task_metric, d.ground_truth, d.user_voice, d.every_turn_answer }, { "bleu_score", "The film came out in 1998.", "scripted", true })
  T.ok(d.full:find("page: Films", 1, true) and d.full:find("<td>1998</td>", 1, true), "FULL: table and context")
  T.ok(d.concat:find("Hint 2:\npage: Films", 1, true) and not d.concat:find("An example.", 1, true), "CONCAT: the hints only")
  local tr = by.translation
  T.eq({ tr.task_metric, tr.ground_truth }, { "bleu_score", "Good day.\nHow are you?" })
  T.ok(tr.scripted_turn(2, tr.shards[2]):find("Chunk 2:\nWie geht es?", 1, true))
  -- JSONL reads the same; tasks= keeps the named ones
  local jl = root .. "/sharded.jsonl"
  data.write_jsonl(jl, ROWS)
  local only = sharded_tasks.read(jl, "t", { math = true })
  T.eq({ #only, only[1].id }, { 1, "sharded-gsm8k-1" })
  -- the authors' README names the text "shard_text"
  local alt = sharded_tasks.task({ task_id = "x", task = "math", question = "q", answer = "#### 2",
    shards = { { shard_id = 1, shard_text = "q" } } }, "r")
  T.eq(alt.shards[1].text, "q")
end)

T.case("only the endpoints some task calls are checked: data2text and translation need no user and no judge", function()
  local sr = require("clrt.train.sharded_recipe")
  local path = root .. "/sharded.json"
  write(path, cjson.encode(ROWS))
  local by = {}
  for _, t in ipairs(sharded_tasks.read(path, "t")) do by[t.task] = t end
  T.eq({ sr.needs_user({ by.translation, by.data2text }, "llm"), sr.needs_judge({ by.translation, by.data2text }) }, { false, false })
  T.eq({ sr.needs_user({ by.math }, "llm"), sr.needs_user({ by.math }, "scripted"), sr.needs_judge({ by.math }) }, { true, false, true })
  T.eq(sr.needs_judge({ by.code }), true, "the strategy judge classifies code replies")
  T.eq(sr.needs_judge({ by.math }, {}), false, "the world classifies by its own rule")
  T.eq(sr.needs_judge({ by.translation }, nil, sr.metric_options({ bleu_score = { extract = true } })), true,
    "BLEU with the extractor on asks the judge")
end)

T.case("a malformed row is one line naming the file and the row", function()
  local function bad(row, pattern)
    local path = root .. "/bad.json"
    write(path, cjson.encode({ row }))
    T.raises(function() sharded_tasks.read(path, "collabllm_eval") end, pattern)
  end
  local shards = { { shard_id = 1, shard = "a" } }
  bad({ task = "math", question = "q", answer = "1", shards = shards }, "no \"task_id\"")
  bad({ task_id = "m", task = "math", answer = "1", shards = shards }, "bad.json[0] (task_id m): no \"question\" text")
  bad({ task_id = "m", task = "math", question = "q", answer = "1", shards = {} }, "\"shards\" must be a non-empty list")
  bad({ task_id = "m", task = "math", question = "q", answer = "1", shards = { { shard_id = 1, shard = "a" }, { shard_id = 1, shard = "b" } } },
    "shard_id 1 appears twice")
  bad({ task_id = "m", task = "math", question = "q", answer = "1", shards = { { shard_id = 1, shard = 7 } } }, "no \"shard\" text")
  -- an empty shard text (two in the released translation file) leaves its row out, counted
  local path0 = root .. "/empty.json"
  write(path0, cjson.encode({ ROWS[1], { task_id = "m", task = "math", question = "q", answer = "1",
    shards = { { shard_id = 1, shard = "a" }, { shard_id = 2, shard = "  " } } } }))
  local kept, skipped = sharded_tasks.read(path0, "t")
  T.eq({ #kept, skipped.math.rows, skipped.math.why }, { 1, 1, "shard_id 2 has an empty text" })
  bad({ task_id = "m", task = "math", question = "q", answer = "1", shards = { "a bare string" } }, "must be an object")
  bad({ task_id = "m", task = "x", single_turn_prompt = "q", task_metric = "exact_match", user_voice = "llm", shards = shards },
    "user_voice may only be")
  local path = root .. "/twice.json"
  write(path, cjson.encode({ ROWS[1], ROWS[1] }))
  T.raises(function() sharded_tasks.read(path, "t") end, "task_id sharded-gsm8k-1 appears twice")
  write(path, cjson.encode({ ROWS[5] }))
  T.raises(function() sharded_tasks.read(path, "t") end, "no task clrt can score; left out: summary (1 rows: needs SummHay")
  write(path, "[{\"task_id\": ")
  T.raises(function() sharded_tasks.read(path, "t") end, "is not a JSON array")
end)

T.case("the code task's tests made from the call-based cases pass a right solution and fail a wrong one", function()
  local t = sharded_tasks.task(ROWS[2], "r")
  local function run(solution)
    local dir = root .. "/code"
    require("clrt.files").mkdir_p(dir)
    write(dir .. "/prog.py", solution .. "\n" .. t.tests .. "\nunittest.main(argv=['x'], exit=True)\n")
    return os.execute(("/usr/bin/python3 %q > /dev/null 2>&1"):format(dir .. "/prog.py"))
  end
  T.eq(run("def below_zero(ops):\n    b = 0\n    for o in ops:\n        b += o\n        if b < 0:\n            return True\n    return False\n"), 0)
  T.ok(run("def below_zero(ops):\n    return False\n") ~= 0, "a wrong solution fails")
  -- one JSON argument a line (LiveCodeBench's call-based input)
  local row2 = { task_id = "lcb-1", task = "code", source = "lcb_easy", question_content = "Add two numbers.", starter_code = "",
    metadata = { func_name = "add" }, public_test_cases = cjson.encode({ { input = "1\n[2, 3]", output = "[3, 4]", testtype = "functional" } }),
    shards = { { shard_id = 1, shard = "add numbers" } } }
  t = sharded_tasks.task(row2, "r")
  T.eq(run("def add(a, xs):\n    return [a + x for x in xs]\n"), 0, "two arguments, a list back")
  -- stdin cases and rows without a function name are not run
  local row = {}
  for k, v in pairs(ROWS[2]) do row[k] = v end
  row.public_test_cases = cjson.encode({ { input = "1\n", output = "2\n", testtype = "stdin" } })
  T.eq(select(2, sharded_tasks.task(row, "r")), "stdin test cases are not run")
  row.metadata = {}
  T.ok(select(2, sharded_tasks.task(row, "r")):find("func_name"))
end)

T.case("a code task through pass_rate's sandbox: the reply's last fenced block against the generated tests", function()
  local ok, why = pcall(require("metrics.pass_rate").prepare, {})
  if not ok then T.skip("pass_rate's sandbox: " .. tostring(why)) end
  local task = sharded_tasks.task(ROWS[2], "r")
  task.user_voice = "scripted"
  local right = "Here it is:\n```python\ndef below_zero(ops):\n    b = 0\n    for o in ops:\n        b += o\n"
    .. "        if b < 0:\n            return True\n    return False\n```"
  local reply
  local policy = function() return reply end
  local ctx = { metric_options = require("clrt.train.sharded_recipe").metric_options({ pass_rate = { timeout = 60 } }) }
  local cfg = { simulations = 1, seed = 1, max_turns_per_shard = 1 }
  for _, case in ipairs({ { right, 1 }, { "```python\ndef below_zero(ops):\n    return False\n```", 0 } }) do
    reply = case[1]
    for _, r in ipairs(sharded_eval.run(policy, cfg, { task }, user, function() return "answer_attempt" end, ctx)) do
      T.eq(r.failed, nil, tostring(r.failed)); T.eq(r.score, case[2], r.setting)
    end
  end
end)

---------------------------------------------------------------- the user and the judge
T.case("the protocol's prompts: a header naming the authors' prompt and the paper's elements, every placeholder listed", function()
  local pf = require("clrt.prompt_file")
  for name, source in pairs({ sharded_user = "prompts/user_agent.txt", sharded_strategy = "prompts/system_turn_categorization.txt",
      sharded_user_lm_intent = "2505.06120", shard_segment = "prompts/lazification_segment.txt",
      shard_rephrase = "prompts/lazification_conversational.txt", shard_verify = "prompts/lazification_verification.txt" }) do
    local f = assert(io.open(pf.path(name), "rb")); local raw = f:read("*a"); f:close()
    local h = raw:match("^(.-)\n%-%-%-\n")
    T.ok(h, name .. ": a header ended by '---'")
    T.ok(h:find("Written for clrt", 1, true) and h:find(source, 1, true), name .. " names what it carries from " .. source)
    for _, ph in ipairs(pf.placeholders(pf.read(name))) do T.ok(h:find("{" .. ph .. "}", 1, true), name .. ": {" .. ph .. "} listed") end
  end
end)

-- A client that records what it is sent and answers with queued replies.
local function client(replies)
  local c = { calls = {} }
  function c:chat(msgs, opts)
    self.calls[#self.calls + 1] = { messages = msgs, opts = opts }
    return { content = table.remove(replies, 1) or error("no reply queued") }
  end
  return c
end

local function view(task, revealed)
  return setmetatable({ revealed = revealed or {} }, { __index = task })
end

T.case("sharded_user: opens with the first shard as it is, then one hidden shard a turn; a bad shard id is refused", function()
  local task = sharded_tasks.task(ROWS[1], "r")
  local ctx = { extract_json = require("clrt.llm").extract_json, sharded_voice = "llm", user_options = { response_format = true } }
  local text, said = user.respond({}, view(task), ctx)
  T.eq({ text, said.shard_id }, { "how many pens does ann have", 1 })
  local chat = { { role = "user", content = text }, { role = "assistant", content = "How many boxes?" } }
  ctx.user = client({ '{"thought": "t", "response": "3 boxes", "shard_id": 2}' })
  text, said = user.respond(chat, view(task, { [1] = true }), ctx)
  T.eq({ text, said.shard_id }, { "3 boxes", 2 })
  local sent = ctx.user.calls[1].messages[1].content
  T.ok(sent:find("How many boxes?", 1, true), "the chat so far")
  T.ok(sent:find('"shard":"she has 3 boxes"', 1, true) and sent:find('"shard":"each box holds 6 pens"', 1, true), "the hidden shards")
  for _, secret in ipairs({ ROWS[1].question, "18", "3*6" }) do T.ok(not sent:find(secret, 1, true), "never " .. secret) end
  T.eq(ctx.user.calls[1].opts.response_format.json_schema.schema.required, { "thought", "response", "shard_id" })
  -- a shard already out, one that does not exist, an empty message: asked again, then refused
  ctx.user = client({ '{"thought": "t", "response": "again", "shard_id": 2}', '{"thought": "t", "response": "x", "shard_id": 9}' })
  T.raises(function() user.respond(chat, view(task, { [1] = true, [2] = true }), ctx) end, "shard_id 9 is not a shard still hidden")
  T.eq(#ctx.user.calls, 2)
  ctx.user = client({ '{"thought": "t", "response": "no", "shard_id": -1}' })
  T.eq(select(2, user.respond(chat, view(task, { [1] = true }), ctx)).shard_id, -1, "no shard is a valid turn")
  -- scripted: the next hidden shard in order
  ctx.sharded_voice = "scripted"
  T.eq({ user.respond(chat, view(task, { [1] = true, [2] = true }), ctx) }, { "each box holds 6 pens", { shard_id = 3,
    thought = "the next shard as it is" } })
  T.raises(function() user.respond(chat, view(task, { [1] = true, [2] = true, [3] = true }), ctx) end, "every shard is out")
  -- user_lm: the model's intent holds the shards out and the next one, never the others
  ctx.sharded_voice = "user_lm"
  ctx.user = client({ "ok its 3 boxes" })
  text, said = user.respond(chat, view(task, { [1] = true }), ctx, { seed_key = "k" })
  T.eq({ text, said.shard_id }, { "ok its 3 boxes", 2 })
  local intent = ctx.user.calls[1].messages[1]
  T.eq(intent.role, "system")
  T.ok(intent.content:find("she has 3 boxes", 1, true) and intent.content:find("how many pens does ann have", 1, true))
  T.ok(not intent.content:find("6 pens", 1, true), "user_lm never sees the shards after the next one")
end)

T.case("answer_attempt: the judge sees the shards, the answer's description and the last reply, and names its type", function()
  local m = require("metrics.answer_attempt")
  local task = sharded_tasks.task(ROWS[1], "r")
  local sample = sharded_eval.sample_of(task, nil)
  local c = { { role = "user", content = "how many pens" }, { role = "assistant", content = "Earlier reply" },
    { role = "user", content = "3 boxes" }, { role = "assistant", content = "That is 18 pens." } }
  local ctx = { extract_json = require("clrt.llm").extract_json, judge_options = { response_format = true },
    judge = client({ '{"thought": "t", "response_type": "guess"}', '{"thought": "t", "response_type": "answer_attempt"}' }) }
  local v, note = m.compute(c, sample, ctx)
  T.eq({ v, note.parts.response_type }, { 1, "answer_attempt" })
  T.eq(#ctx.judge.calls, 2, "an unknown type is asked again")
  local sent = ctx.judge.calls[1].messages[1].content
  T.ok(sent:find("That is 18 pens.", 1, true) and not sent:find("Earlier reply", 1, true), "the last reply only")
  T.ok(sent:find("each box holds 6 pens", 1, true) and sent:find(sharded_tasks.ANSWER.math, 1, true))
  T.eq(ctx.judge.calls[1].opts.response_format.json_schema.schema.properties.response_type.enum[2], "clarification")
  ctx.judge = client({ '{"thought": "t", "response_type": "clarification"}' })
  T.eq({ m.compute(c, sample, ctx) }, { 0, { rationale = "t", parts = { response_type = "clarification" } } })
end)

---------------------------------------------------------------- the protocol
T.case("a conversation's score is its last answer attempt's; a correct one ends it; tasks whose every reply answers skip the judge", function()
  -- a two-shard document task scored by BLEU on the whole reply (the authors' data2text)
  local ref = "the cat sat on the mat"
  local task = sharded_tasks.task({ task_id = "d", task = "doc", single_turn_prompt = "Describe the cat.", ground_truth = ref,
    task_metric = "bleu_score", user_voice = "scripted", shards = { { shard_id = 1, shard = "describe it" }, { shard_id = 2, shard = "a cat" } } }, "r")
  -- the assistant's k-th reply in a conversation is replies[k]
  local replies
  local policy = function(c)
    local k = 1
    for _, m in ipairs(c) do if m.role == "assistant" then k = k + 1 end end
    return replies[k]
  end
  local judged = 0
  local classify = function() judged = judged + 1; return "answer_attempt" end
  local ctx = { metric_options = require("clrt.train.sharded_recipe").metric_options({}) }
  local cfg = { simulations = 1, seed = 1, max_turns_per_shard = 2 }
  local function sharded_run(user_plugin, cls)
    for _, r in ipairs(sharded_eval.run(policy, cfg, { task }, user_plugin or user, cls or classify, ctx)) do
      if r.setting == "sharded" then return r end
    end
  end
  replies = { ref, "xyz" }
  local sh = sharded_run()
  T.eq({ #sh.attempts, sh.ended, sh.score }, { 1, "solved", 1 }, "a BLEU of 1 is correct: the conversation ends")
  replies = { "the cat sat", "xyz" }
  sh = sharded_run()
  T.eq({ #sh.attempts, sh.ended }, { 2, "all shards" })
  T.ok(sh.attempts[1].score > 0.1, "the first attempt is partly right")
  T.eq(sh.attempts[2].score, 0, "'xyz' shares nothing with the reference")
  T.eq(sh.score, 0, "the last attempt counts, not the best")
  T.eq({ sh.conversation[1].content, sh.conversation[3].content }, { "describe it", "a cat" })
  T.eq(judged, 3, "every SHARDED reply judged, FULL and CONCAT none")
  task.every_turn_answer = true
  judged = 0
  sharded_run()
  T.eq(judged, 0, "a task whose replies are all answers is never judged")
  -- no answer attempt at all scores 0; a user who never reveals stops at the turn bound
  task.every_turn_answer = nil
  local shy = { name = "shy", respond = function(c) if #c == 0 then return "describe it", { shard_id = 1 } end
    return "hmm", { shard_id = -1 } end }
  replies = { "a", "b", "c", "d", "e" }
  sh = sharded_run(shy, function() return "clarification" end)
  T.eq({ sh.score, #sh.attempts, sh.ended, sh.shards_revealed }, { 0, 0, "max_user_turns", 1 })
  T.eq(#sh.conversation, 8, "2 user turns per shard, each answered")
end)

if os.execute("command -v curl > /dev/null 2>&1") ~= 0 then
  io.write("skip (endpoint cases): curl is not installed\n")
end

T.case("through an endpoint: the user never sees a reference or the instruction, the assistant never a hidden shard", function()
  if os.execute("command -v curl > /dev/null 2>&1") ~= 0 then T.skip("curl is not installed") end
  local reqlog = root .. "/requests.jsonl"
  local p = assert(io.popen(("/usr/bin/python3 %s/tests/support/fake_collab_endpoint.py %s --lifetime 300"):format(T.source_dir(), reqlog)))
  local port, pid = (p:read("*l") or ""):match("^(%d+) (%d+)$")
  T.cleanup(function() if pid then os.execute("kill " .. pid .. " 2>/dev/null") end p:close() end)
  assert(port, "the fake endpoint did not start")
  local url = ("http://127.0.0.1:%s/v1"):format(port)
  local rows = {
    ROWS[1],
    { task_id = "sharded-gsm8k-2", task = "math", question = "Bo reads 4 pages a day for 5 days. How many pages?",
      answer = "#### 20", shards = { { shard_id = 1, shard = "pages bo read" }, { shard_id = 2, shard = "4 pages each day" },
        { shard_id = 3, shard = "for 5 days" }, { shard_id = 4, shard = "give a number" } } },
  }
  local path = root .. "/math.json"
  write(path, cjson.encode(rows))
  local tasks = sharded_tasks.read(path, "t")
  local ev = require("recipes.collabllm_eval")
  local cfg = ev.parse_args({ "protocol=sharded", "model=unused", "data=" .. path, "sim_cfg.base_url=" .. url, "judge.base_url=" .. url })
  local ctx = require("clrt.train.context"){ config = cfg, who = "t" }
  ctx.sharded_voice = "llm"
  ctx.metric_options = require("clrt.train.sharded_recipe").metric_options({})
  -- the assistant: checks that no hidden shard ever reaches it, then asks or answers
  local seen, leaks = 0, {}
  local policy = function(c, sample)
    seen = seen + 1
    local text = cjson.encode(c)
    if sample.revealed then
      for _, s in ipairs(sample.shards) do
        if not sample.revealed[s.id] and text:find(s.text, 1, true) then leaks[#leaks + 1] = s.text end
      end
      for _, s in ipairs(sample.shards) do
        if not sample.revealed[s.id] then return "Which detail is missing?" end
      end
    end
    return "ANSWER: " .. tostring(sample.ground_truth)
  end
  local res = sharded_eval.run(policy, { simulations = 3, seed = 1, max_turns_per_shard = 2 }, tasks, user,
    sharded_eval.judge_classifier(ctx.metric_options), ctx)
  T.eq(#res, 2 * 3 * 3)
  T.eq(leaks, {}, "the assistant never saw a hidden shard")
  local users, judged, accuracy = 0, 0, 0
  for _, body in ipairs(data.read_jsonl(reqlog)) do
    local props = body.response_format.json_schema.schema.properties
    local text = cjson.encode(body.messages)
    if props.shard_id then
      users = users + 1
      for _, r in ipairs(rows) do
        T.ok(not text:find(r.question, 1, true), "the user never sees the original instruction")
        T.ok(not text:find(sharded_tasks.gsm8k_answer(r.answer), 1, true), "the user never sees the reference")
      end
    elseif props.response_type then judged = judged + 1
    elseif props.accuracy then
      accuracy = accuracy + 1
      T.ok(text:find("18", 1, true) or text:find("20", 1, true), "the accuracy judge is given the reference")
    end
  end
  local turns, attempts = 0, 0
  for _, r in ipairs(res) do
    T.eq(r.dropped, nil, tostring(r.error)); T.eq(r.failed, nil)
    if r.setting == "sharded" then
      turns = turns + #r.strategies
      attempts = attempts + #r.attempts
      T.eq(r.conversation[1].content, r.sample.shards[1].text, "the user opens with the first shard")
      T.ok(r.ended == "solved" or r.ended == "all shards" or r.ended == "max_user_turns", tostring(r.ended))
      local last = r.attempts[#r.attempts]
      T.eq(r.score, last and last.score or 0)
      -- every revealed shard's text reached the chat once, in a user turn
      for _, rv in ipairs(r.reveals) do T.eq(r.conversation[2 * rv.turn - 1].role, "user") end
    else
      T.eq(#r.conversation, 2); T.eq(r.conversation[1].content, r.setting == "full" and r.sample.full or r.sample.concat)
    end
  end
  T.eq(judged, turns, "one strategy judgement per SHARDED reply, none in FULL or CONCAT")
  T.eq(accuracy, attempts + 2 * 2 * 3, "the task metric on every SHARDED attempt and every FULL / CONCAT reply")
  T.ok(users > 0 and attempts > 0)
  local rep = sharded_eval.report(res, { simulations = 3, max_turns_per_shard = 2 })
  T.eq(rep.settings.sharded.groups.math.instructions, 2)
  T.eq(rep.settings.full.groups.overall.simulations_min, 3)
  -- the recipe on the same file and endpoint, a real (tiny) model as the assistant
  local dir = require("support.tiny_model")(root .. "/policy", { seed = 5, max_position = 4096 })
  local out = root .. "/math_eval"
  ev.main(ev.parse_args({ "protocol=sharded", "model=" .. dir, "data=" .. path, "sim_cfg.base_url=" .. url,
    "judge.base_url=" .. url, "simulations=2", "rollout.max_new_tokens=6", "out=" .. out }))
  local saved = cjson.decode(T.read(out .. "/eval.json"))
  T.eq({ saved.conversations + saved.dropped + saved.failed, saved.failed, saved.data, saved.sim }, { 12, 0, path, "llm" })
  T.ok(saved.api.all.calls > 0, "the simulator's and judges' calls are counted")
  for _, set in ipairs({ "full", "concat", "sharded" }) do T.eq(saved.settings[set].groups.math.instructions, 2, set) end
  local details = data.read_jsonl(out .. "/eval_details.jsonl")
  T.eq(#details, 12)
  T.eq(details[1].conversation[1], { role = "system", content = require("clrt.prompt_file").read("collabllm_system") },
    "system_prompt=default on data=: the system prompt clrt's models train with")
end)

---------------------------------------------------------------- the built-in world
local config_sft = require("recipes.collabllm_sft")
local start = config_sft.main(config.parse(config_sft.defaults, {
  "run_dir=" .. root .. "/sft", "train.steps=2", "train.batch_size=8", "world.conversations=60",
  "arch.hidden_size=32", "arch.intermediate_size=64", "arch.num_hidden_layers=2", "train.val_every=0",
}, config_sft.world_config()))
local world = require("collab_world.world")

T.case("the world: under-specified requests as two-shard tasks, with its scripted user and strategy rule", function()
  local rows = world.sharded_tasks(6, 3)
  local ids = {}
  for _, r in ipairs(rows) do
    T.ok(not ids[r.task_id], "distinct"); ids[r.task_id] = true
    local t = assert(sharded_tasks.task(r, "world"))
    T.eq(#t.shards, 2)
    T.ok(not t.shards[1].text:find(t.shards[2].text:sub(1, -2), 1, true), "the first shard lacks the fact")
    T.ok(t.full:find(t.shards[2].text:sub(1, -2), 1, true), "FULL holds it")
    T.eq(t.task_metric, "exact_match")
  end
  T.eq(world.strategy({ { role = "assistant", content = "Which city?" } }), "clarification")
  T.eq(world.strategy({ { role = "assistant", content = "Trip plan: fly to Rome." } }), "answer_attempt")
end)

T.case("protocol=sharded on the world end to end: eval.json, the table, another system prompt side by side", function()
  local ev = require("recipes.collabllm_eval")
  local out = root .. "/world_eval"
  local rep = ev.main(ev.parse_args({ "protocol=sharded", "model=" .. start, "prompts=3", "simulations=2", "out=" .. out,
    "rollout.max_new_tokens=8", "compare_system_prompt=none" }))
  local saved = cjson.decode(T.read(out .. "/eval.json"))
  T.eq({ saved.protocol, saved.simulations, saved.temperature, saved.sim }, { "sharded", 2, 1.0, "scripted" })
  T.eq(#saved.variants, 2)
  for _, name in ipairs(saved.variants) do
    local r = saved.by_variant[name]
    for _, set in ipairs({ "full", "concat", "sharded" }) do
      local g = r.settings[set].groups.overall
      T.eq(g.instructions, 3, set)
      for _, q in ipairs({ "performance", "aptitude", "unreliability" }) do
        T.eq(type(g[q].mean), "number", set .. " " .. q); T.eq(type(g[q].se), "number", set .. " " .. q .. " se")
      end
    end
    T.eq(type(r.gap.overall.performance), "number")
  end
  T.eq(saved.by_variant[saved.variants[2]].system_prompt, "none")
  T.eq(rep.conversations + rep.dropped + rep.failed, 3 * 3 * 2)
  local details = data.read_jsonl(out .. "/eval_details.jsonl")
  T.eq(#details, 18)
  local by_id = {}
  for _, r in ipairs(world.sharded_tasks(3, 12345)) do by_id[r.task_id] = r end   -- the recipe's seed
  for _, d in ipairs(details) do
    local row = by_id[d.id]
    T.ok(row, "a world task " .. tostring(d.id))
    T.eq(d.conversation[1], { role = "system", content = world.system_prompt })
    if d.setting == "full" then T.eq(d.conversation[2].content, row.single_turn_prompt) end
    if d.setting == "sharded" then
      T.eq(d.conversation[2].content, row.shards[1].shard, "the request without its fact first")
      if d.conversation[4] then T.eq(d.conversation[4], { role = "user", content = row.shards[2].shard }, "then the fact") end
      T.ok(#d.conversation <= 5, "two shards: at most two user turns before all are out")
    end
  end
  local plain = data.read_jsonl(out .. "/eval_details_variant2.jsonl")
  T.eq(plain[1].conversation[1].role, "user", "system_prompt=none: no system message")
  T.raises(function() ev.main(ev.parse_args({ "protocol=sharded", "model=" .. start, "simulations=0" })) end, "simulations must be")
  -- a context too small for any reply: nothing scored is a failed evaluation, not an empty table
  T.raises(function() ev.main(ev.parse_args({ "protocol=sharded", "model=" .. start, "prompts=1", "simulations=1",
    "rollout.max_len=4", "out=" .. root .. "/none" })) end, "was scored (3 dropped, 0 failed; first: context full")
  T.raises(function() ev.main(ev.parse_args({ "protocol=sharded", "model=" .. start, "max_turns_per_shard=0" })) end,
    "max_turns_per_shard must be")
  T.raises(function() ev.main(ev.parse_args({ "protocol=sharded", "model=" .. start, "sim=collabllm_user" })) end,
    "protocol=sharded plays its user as")
end)

T.run()
