-- recipes/build_dataset.lua, the authors' multiturn data engine on clrt's RL machinery:
-- the built-in world's tasks with its scripted user and a small local model (the world's SFT
-- start) -> published-schema rows -> process_dataset.lua -> one SFT, DPO and RL step each,
-- and the SFT model on the world's held-out tasks;
-- the same seed gives the same rows; a build killed with kill -9 goes on where it stopped and
-- ends with the rows of one that never stopped; tasks in the four input formats against a
-- local fake endpoint playing assistant, user and judges, which checks that no assistant
-- request carries a task's whole request and no user request its reference; bad rows; tasks
-- whose user ends the chat at once or whose every candidate fails.
local T = require("clrt.test")
local data = require("clrt.data")
local config = require("clrt.config")
local files = require("clrt.files")
local json = require("clrt.json")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local build = require("recipes.build_dataset")
local tasks = require("clrt.train.tasks")
local sft = require("recipes.collabllm_sft")
local pd = require("recipes.process_dataset")
local world = require("collab_world.world")

local PY = "/usr/bin/python3"
local src = T.source_dir()
local root = T.tmpdir()

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local start
local function start_model()
  if start then return start end
  -- trained enough that its replies end (a reply cut at rollout.max_new_tokens is no candidate)
  local cfg = config.parse(sft.defaults, { "run_dir=" .. root .. "/sft", "train.steps=400", "train.batch_size=8",
    "world.conversations=800", "arch.hidden_size=32", "arch.intermediate_size=64", "arch.num_hidden_layers=2",
    "train.val_every=0", "train.warmup_steps=20" }, sft.world_config())
  start = sft.main(cfg)
  return start
end

-- The small start's answers after a question are seldom right, so exact match alone would
-- rank a guess first and end every chat at its first turn: asks_question makes asking win
-- often enough that conversations go on.
local function world_args(out, extra)
  local a = { "out=" .. out, "model=" .. start_model(), "world_tasks=6", "candidates=3", "rollout.num_repeat_rollouts=2",
    "tasks_in_flight=3", "seed=3", "max_messages=6", 'reward.metric_weights={"asks_question":1,"exact_match":1,"token_amount":-0.02}' }
  for _, x in ipairs(extra or {}) do a[#a + 1] = x end
  return a
end
local function run_build(args) return build.main(build.parse_args(args)) end

local SCHEMA = { "prompt", "completion", "score", "conv_id", "turn_id", "single_turn_prompt", "single_turn_completion",
  "single_turn_metadata", "sessions", "rewards" }

-- rows of one conversation by turn, in file order
local function by_conv(rows)
  local out = {}
  for _, r in ipairs(rows) do
    out[r.conv_id] = out[r.conv_id] or {}
    local c = out[r.conv_id]
    c[r.turn_id] = c[r.turn_id] or {}
    table.insert(c[r.turn_id], r)
  end
  return out
end

T.case("the world's tasks -> build_dataset -> process_dataset -> one SFT, DPO and RL step", function()
  local out = root .. "/world"
  local _, c = run_build(world_args(out))
  local rows = data.read_jsonl(out .. "/multiturn.jsonl")
  T.ok(c.conversations >= 4, ("conversations built: %d of 6"):format(c.conversations))
  T.eq(#rows, c.rows)
  T.eq(c.finished, 6, "every task has its file")
  for _, r in ipairs(rows) do
    for _, k in ipairs(SCHEMA) do T.ok(r[k] ~= nil, "a row has " .. k) end
    T.eq(r.prompt[1].role, "user", "the user opens; no system message")
    T.eq(r.prompt[#r.prompt].role, "user")
    T.eq(r.turn_id, #r.prompt, "turn_id = the prompt's length (the authors' flattening)")
    T.eq(#r.sessions, 2, "num_repeat_rollouts futures")
    T.eq(#r.rewards.MR, 2); T.eq(#r.rewards.exact_match, 2); T.eq(#r.rewards.token_amount, 2); T.eq(#r.rewards.asks_question, 2)
    local mean = (r.rewards.MR[1] + r.rewards.MR[2]) / 2
    T.near(r.score, mean, 1e-12, "score: the mean of the sessions' MR (the authors')")
    for k = 1, 2 do
      T.near(r.rewards.MR[k], r.rewards.asks_question[k] + r.rewards.exact_match[k] - 0.02 * r.rewards.token_amount[k], 1e-12,
        "MR = sum w s")
      for i, msg in ipairs(r.prompt) do T.eq(r.sessions[k][i], msg, "a session continues the prompt") end
      T.eq(r.sessions[k][#r.prompt + 1], { role = "assistant", content = r.completion }, "after the candidate")
    end
    T.eq(r.single_turn_metadata.value ~= nil, true, "the metadata keeps the user's hidden fact")
  end
  -- the best candidate continues the chat
  local continued = 0
  for _, turns in pairs(by_conv(rows)) do
    for t, list in pairs(turns) do
      local nxt = turns[t + 2]
      if nxt then
        local best = list[1]
        for _, r in ipairs(list) do if r.score > best.score then best = r end end
        T.eq(nxt[1].prompt[t + 1], { role = "assistant", content = best.completion }, "turn t+1 follows the best of turn t")
        continued = continued + 1
      end
    end
  end
  T.ok(continued > 0, "some conversation went on past its first turn")
  local counts = json.decode(T.read(out .. "/counts.json"))
  T.eq(counts.rows, #rows); T.eq(counts.tasks, 6)

  -- process_dataset reads the rows unchanged (a short system prompt: the world's context is 256 tokens)
  local sys = root .. "/system.txt"
  files.write_atomic(sys, world.system_prompt)
  local pdir = root .. "/world_data"
  local outs = pd.main(config.parse(pd.defaults, { "input=" .. out .. "/multiturn.jsonl", "out=" .. pdir,
    "test_fraction=0.2", "min_gap=0", "system_prompt_file=" .. sys, "task_desc=" .. world.task_desc }))
  T.ok(#outs.sft_train > 0 and #outs.dpo_train > 0 and #outs.rl_train > 0, "SFT, DPO and RL rows")
  local s_dir = sft.main(config.parse(sft.defaults, { "model=" .. start, "data=" .. pdir .. "/sft_train.jsonl",
    "run_dir=" .. root .. "/w_sft", "train.steps=1", "train.batch_size=2", "max_len=256", "train.lr=1e-3" }))
  T.ok(files.exists(s_dir .. "/config.json"), "SFT wrote its model")
  local sm = data.read_jsonl(root .. "/w_sft/metrics.jsonl")
  T.ok(sm[1].loss ~= nil, "an SFT step")
  -- the SFT model on the world's held-out tasks (the paper's protocol: the user opens each chat)
  local ev = require("recipes.collabllm_eval")
  ev.main(ev.parse_args({ "model=" .. s_dir, "prompts=4", "out=" .. root .. "/w_eval", "rollout.max_new_tokens=8", "max_messages=4" }))
  local rep = json.decode(T.read(root .. "/w_eval/eval.json"))
  T.eq(rep.conversations, 4); T.eq(type(rep.overall.task_performance.mean), "number")
  local dpo = require("recipes.collabllm_dpo")
  dpo.main(config.parse(dpo.defaults_for("verl", false), { "model=" .. start, "data=" .. pdir .. "/dpo_train.jsonl",
    "run_dir=" .. root .. "/w_dpo", "steps=1", "train.batch_size=2", "min_gap=0", "eval.before=false", "eval.after=false",
    "rollout.max_len=256" }))
  local dm = data.read_jsonl(root .. "/w_dpo/metrics.jsonl")
  T.ok(dm[1].loss ~= nil and dm[1].pairs > 0, "a DPO step on the built pairs")
  local rl = require("recipes.collabllm_rl")
  rl.main(config.parse(rl.defaults, { "model=" .. start, "data=" .. pdir .. "/rl_train.jsonl", "run_dir=" .. root .. "/w_rl",
    "steps=1", "prompts_per_step=2", "rollout.n=2", "rollout.num_repeat_rollouts=1", "rollout.max_new_tokens=12",
    "rollout.max_len=256", "rollout.max_prompt_len=224", "rollout.token_budget=256", "sim=scripted",
    'reward.metric_weights={"exact_match":1,"token_amount":-0.02}', "eval.before=false", "eval.after=false" }))
  local rm = data.read_jsonl(root .. "/w_rl/metrics.jsonl")
  T.ok(rm[1].reward ~= nil and (rm[1].dropped or 0) == 0, "an RL step: the scripted user reads the hidden fact from the metadata")
end)

T.case("the same seed builds the same rows; another seed other rows", function()
  local a = T.read(root .. "/world/multiturn.jsonl") or (run_build(world_args(root .. "/world")) and T.read(root .. "/world/multiturn.jsonl"))
  run_build(world_args(root .. "/world_again"))
  T.eq(T.read(root .. "/world_again/multiturn.jsonl"), a, "two builds, the same rows")
  run_build(world_args(root .. "/world_seed4", { "seed=4" }))
  T.ok(T.read(root .. "/world_seed4/multiturn.jsonl") ~= a, "seed=4 samples other candidates")
  -- the same out= with another setting is refused, naming it
  T.raises(function() run_build(world_args(root .. "/world_again", { "candidates=2" })) end, "candidates=3, not 2")
end)

T.case("kill -9 in the middle, then the same command: no conversation lost or repeated", function()
  -- one task at a time, so the kill lands between two of the 24 tasks' files
  local args = world_args(root .. "/killed", { "world_tasks=24", "tasks_in_flight=1" })
  run_build(world_args(root .. "/unkilled", { "world_tasks=24", "tasks_in_flight=1" }))
  local want = T.read(root .. "/unkilled/multiturn.jsonl")
  local bin = os.getenv("CLRT_BIN") or arg[-1]
  if bin:sub(1, 1) ~= "/" then bin = os.getenv("PWD") .. "/" .. bin end
  local quoted = {}
  for i, a in ipairs(args) do quoted[i] = sh_quote(a) end
  local cmd = ("OMP_NUM_THREADS=1 exec %s %s %s > %s 2>&1"):format(sh_quote(bin), sh_quote(src .. "/lua/recipes/build_dataset.lua"),
    table.concat(quoted, " "), sh_quote(root .. "/killed.log"))
  local p = assert(io.popen(("sh -c %s & echo $!"):format(sh_quote(cmd))))
  local pid = tonumber(p:read("*l"))
  p:close()
  local dir = root .. "/killed/conversations"
  local seen = 0
  for _ = 1, 6000 do
    seen = files.is_dir(dir) and #files.list(dir) or 0
    if seen >= 2 or files.exists(root .. "/killed/multiturn.jsonl") then break end
    os.execute("sleep 0.01")
  end
  os.execute("kill -9 " .. pid)
  os.execute("sleep 0.2")
  T.ok(not files.exists(root .. "/killed/multiturn.jsonl"), "killed before the end (make the build longer if this fails)")
  local names = files.list(dir)
  T.ok(#names >= 2 and #names < 24, ("%d of 24 tasks written before the kill"):format(#names))
  -- a finished task is never built again: a mark put into one stays
  local first = dir .. "/" .. names[1]
  local rec = json.decode(T.read(first))
  rec.marked = true
  files.write_atomic(first, json.encode(rec) .. "\n")
  local _, c = run_build(args)
  T.eq(json.decode(T.read(first)).marked, true, "the finished task was skipped, not built again")
  T.eq(c.finished, 24)
  T.eq(T.read(root .. "/killed/multiturn.jsonl"), want, "the rows of a build that never stopped")
end)

-- the fake endpoint (tests/support/fake_collab_endpoint.py) as assistant, user and judges
local endpoint
local function fake()
  if endpoint then return endpoint end
  if os.execute(PY .. " -c 'import http.server' >/dev/null 2>&1") ~= 0 then T.skip("no /usr/bin/python3 for the fake endpoint") end
  local log = root .. "/requests.jsonl"
  local p = assert(io.popen(("%s %s/tests/support/fake_collab_endpoint.py %s --lifetime 600"):format(PY, src, sh_quote(log))))
  local port, pid = (p:read("*l") or ""):match("^(%d+) (%d+)$")
  T.cleanup(function() if pid then os.execute("kill " .. pid .. " 2>/dev/null") end p:close() end)
  assert(port, "the fake endpoint did not start")
  endpoint = { url = ("http://127.0.0.1:%s/v1"):format(port), log = log }
  return endpoint
end

local function requests()
  local out = {}
  local f = io.open(endpoint.log, "rb")
  if not f then return out end
  for line in f:lines() do out[#out + 1] = json.decode(line) end
  f:close()
  return out
end

local function role_of(body)
  if body.model == "fake-assistant" then return "assistant" end
  local props = ((((body.response_format or {}).json_schema or {}).schema or {}).properties) or {}
  if props.response then return "user" end
  if props.final_completion then return "extractor" end
  if props.interactivity then return "interactivity" end
  if props.accuracy then return "accuracy" end
  return "?"
end

-- Tasks in the four formats, each with a request and a reference that appear nowhere else.
local TEST_CODE = "import unittest\nclass TestCases(unittest.TestCase):\n    def test_mean(self):\n"
  .. "        self.assertEqual(task_func([1, 2, 3])[0], 2.0)\n"
local FIXTURE = {
  { task = "Plan the quiz night budget for the Heron Street club.", reference = "REF-HERON: spend 120 dollars.",
    task_type = "qa", metadata = { source = "own" } },
  { problem = "Find the remainder when 7 to the power 222 is divided by 5.", solution = "REF-MATH: the remainder is 4.",
    level = "Level 5", type = "Number Theory" },
  { task_id = "BigCodeBench/9001", instruct_prompt = "Write task_func(values) returning the mean and spread of the list.",
    canonical_solution = "    return REF_CODE_BODY\n", code_prompt = "def task_func(values):\n", test = TEST_CODE,
    entry_point = "task_func", libs = "[]" },
  { request = "Rewrite the notice about the Larkspur garden gate repairs in a friendlier tone.",
    target = "REF-DOC: Dear neighbours, the Larkspur gate is being mended this week." },
  { task = "Summarise the Juniper bakery opening hours for a poster.", reference = "REF-JUNIPER: 7 to 15 daily.",
    task_type = "question answering" },
}
local function whole_tasks() return { FIXTURE[1].task, FIXTURE[2].problem, FIXTURE[3].instruct_prompt, FIXTURE[4].request, FIXTURE[5].task } end
local REFERENCES = { "REF-HERON", "REF-MATH", "REF_CODE_BODY", "REF-DOC", "REF-JUNIPER" }

local function fixture_args(out, extra)
  local e = fake()
  local tiny = root .. "/tiny"
  if not files.exists(tiny .. "/tokenizer.json") then require("support.tiny_model")(tiny, { seed = 2 }) end
  local path = root .. "/tasks.jsonl"
  if not files.exists(path) then
    local lines = {}
    for i, r in ipairs(FIXTURE) do lines[i] = json.encode(r) end
    files.write_atomic(path, table.concat(lines, "\n") .. "\n")
  end
  -- pass_rate needs the code's modules in the sandbox, which this machine may lack
  -- (tests/lua/test_pass_rate_*.lua cover it): the code tasks are weighed without it here
  local a = { "input=" .. path, "out=" .. out, "assistant.base_url=" .. e.url, "assistant.model=fake-assistant",
    "sim_cfg.base_url=" .. e.url, "judge.base_url=" .. e.url, "tokenizer=" .. tiny, "candidates=2",
    "rollout.num_repeat_rollouts=2", "max_messages=6", "seed=5", 'task_types.code.weights={"interactivity":1,"tokens_read":-0.5}' }
  for _, x in ipairs(extra or {}) do a[#a + 1] = x end
  return a
end

T.case("tasks in the four formats against a fake endpoint: no task reaches the assistant, no reference the user", function()
  local out = root .. "/fixtures"
  local _, c = run_build(fixture_args(out))
  local rows = data.read_jsonl(out .. "/multiturn.jsonl")
  T.ok(#rows > 0 and c.conversations > 0, ("%d rows from %d conversations"):format(#rows, c.conversations))
  T.eq(c.finished, 5)
  for _, r in ipairs(rows) do
    for _, k in ipairs(SCHEMA) do T.ok(r[k] ~= nil, "a row has " .. k) end
    T.eq(r.single_turn_prompt, whole_tasks()[r.conv_id], "the task of its line")
  end
  -- the readers: each format's task, reference, type and metadata where the user and metrics look
  local samples = tasks.read(root .. "/tasks.jsonl", { types = build.task_types(build.parse_args(fixture_args(out)), nil) })
  local want = { { "qa", "question answering", "REF-HERON: spend 120 dollars." }, { "qa", "question answering", "REF-MATH: the remainder is 4." },
    { "code", "code generation", "def task_func(values):\n    return REF_CODE_BODY\n" },
    { "document", "document editing", "REF-DOC: Dear neighbours, the Larkspur gate is being mended this week." },
    { "qa", "question answering", "REF-JUNIPER: 7 to 15 daily." } }
  for i, s in ipairs(samples) do
    T.eq({ s.task_type, s.task_desc, s.ground_truth, s.single_turn_prompt }, { want[i][1], want[i][2], want[i][3], whole_tasks()[i] })
    T.eq(s.prompt, {}, "the chat starts empty: the user opens it")
  end
  T.eq(samples[1].single_turn_metadata, { source = "own" })
  T.eq(samples[2].single_turn_metadata, { level = "Level 5", type = "Number Theory" })
  local md = samples[3].single_turn_metadata
  T.eq({ md.task_id, md.entry_point, md.test, md.libs }, { "BigCodeBench/9001", "task_func", TEST_CODE, "[]" })
  T.ok(md.extraction_requirement:find("def task_func(values):", 1, true), "the extraction requirement names the code prompt")
  local by_role, leaks = {}, {}
  for _, body in ipairs(requests()) do
    local role = role_of(body)
    by_role[role] = (by_role[role] or 0) + 1
    local text = json.encode(body.messages)
    if role == "assistant" then
      for _, t in ipairs(whole_tasks()) do if text:find(json.encode(t):sub(2, -2), 1, true) then leaks[#leaks + 1] = "assistant saw: " .. t end end
    elseif role == "user" then
      for _, ref in ipairs(REFERENCES) do if text:find(ref, 1, true) then leaks[#leaks + 1] = "user saw: " .. ref end end
    end
  end
  T.eq(leaks, {}, "requests that carried what their role must not see")
  T.ok((by_role.assistant or 0) > 0 and (by_role.user or 0) > 0 and (by_role.accuracy or 0) > 0, json.encode(by_role))
  -- the checks can see: the user is shown the whole task, the accuracy judge the reference
  local user_sees, judge_sees = false, false
  for _, body in ipairs(requests()) do
    local text = json.encode(body.messages)
    for _, t in ipairs(whole_tasks()) do
      if role_of(body) == "user" and text:find(json.encode(t):sub(2, -2), 1, true) then user_sees = true end
    end
    for _, ref in ipairs(REFERENCES) do
      if role_of(body) == "accuracy" and text:find(ref, 1, true) then judge_sees = true end
    end
  end
  T.ok(user_sees and judge_sees, "the user sees the task and the judge the reference")
  -- the API bill: the assistant's calls are counted with the user's and the judges'
  local bill = json.decode(T.read(out .. "/api_usage.json"))
  T.ok(bill.roles.assistant and bill.roles.assistant.calls > 0, "the assistant's calls are billed")
  -- a deterministic endpoint and the same seed: the same rows
  run_build(fixture_args(root .. "/fixtures_again"))
  T.eq(T.read(root .. "/fixtures_again/multiturn.jsonl"), T.read(out .. "/multiturn.jsonl"))
  -- budget.max_usd stops the build after a batch, resumable; a higher budget finishes it with the same rows
  local budget_out = root .. "/fixtures_budget"
  T.raises(function() run_build(fixture_args(budget_out, { "tasks_in_flight=2", "budget.max_usd=0.001" })) end,
    "budget.max_usd=0.001 reached")
  T.ok(#files.list(budget_out .. "/conversations") == 2, "the first batch's tasks are kept")
  run_build(fixture_args(budget_out, { "tasks_in_flight=2", "budget.max_usd=10" }))
  T.eq(T.read(budget_out .. "/multiturn.jsonl"), T.read(out .. "/multiturn.jsonl"), "resumed under a higher budget: the same rows")
  local spent = json.decode(T.read(budget_out .. "/api_usage.json")).all
  T.ok(spent.usd > 0.001, "the bill goes on from what was spent before")
  -- an input edited under a build is refused, never paired with another task's conversations
  local edited = root .. "/tasks_edited.jsonl"
  files.copy(root .. "/tasks.jsonl", edited)
  local a = fixture_args(root .. "/fixtures_edited", { "limit=2" })
  a[1] = "input=" .. edited
  run_build(a)
  local lines = {}
  for i = #FIXTURE, 1, -1 do lines[#lines + 1] = json.encode(FIXTURE[i]) end
  files.write_atomic(edited, table.concat(lines, "\n") .. "\n")
  T.raises(function() run_build(a) end, "was built from another task than line 1")
  -- estimate=true before anything is sent
  local n0 = #requests()
  local e = build.main(build.parse_args(fixture_args(root .. "/never", { "estimate=true" })))
  T.eq(#requests(), n0, "estimate=true sends nothing")
  T.ok(e.run.assistant.calls > 0 and e.run.user.calls > 0 and e.usd ~= nil, "calls per role")
  T.ok(not files.exists(root .. "/never"), "and writes nothing")
end)

T.case("bad rows: one line each naming line and field, skipped and counted; max_bad_rows stops", function()
  local path = root .. "/bad.jsonl"
  files.write_atomic(path, table.concat({
    json.encode({ task = "Good one.", reference = "ok", task_type = "qa" }),
    "{not json",
    json.encode({ task = "No reference here.", task_type = "qa" }),
    json.encode({ task = "Odd type.", reference = "x", task_type = "poetry" }),
    json.encode({ instruct_prompt = "Code without tests.", canonical_solution = "pass", entry_point = "f" }),
    json.encode({ problem = "1 + 1?", solution = "2" }),
  }, "\n") .. "\n")
  local types = build.task_types(build.parse_args({ "input=" .. path }), nil)
  local said = {}
  local samples, bad = tasks.read(path, { types = types, max_bad_rows = 10, warn = function(l) said[#said + 1] = l end })
  T.eq(#samples, 2); T.eq(bad, 4)
  T.eq(samples[2].task_type, "qa"); T.eq(samples[2].id, 6, "a task's id is its line")
  T.eq(said, {
    "clrt.train.tasks: " .. path .. ":2: (line): not JSON, skipped",
    "clrt.train.tasks: " .. path .. ":3: reference: missing or empty (the reference answer the metrics compare with), skipped",
    "clrt.train.tasks: " .. path .. ":4: task_type: unknown task type \"poetry\" (known: code, document, qa), skipped",
    "clrt.train.tasks: " .. path .. ":5: test: must be a non-empty string, skipped",
  })
  T.raises(function() tasks.read(path, { types = types, max_bad_rows = 3, warn = function() end }) end,
    "more than max_bad_rows=3 bad rows (the last at line 5)")
  T.raises(function() build.main(build.parse_args({ "input=" .. path, "out=" .. root .. "/bad_out", "max_bad_rows=1",
    "estimate=true" })) end, "max_bad_rows=1")
end)

T.case("a task whose user ends the chat at once, or whose every candidate fails, is recorded as such", function()
  local e = fake()
  local user_file, metric_file, path = root .. "/quick_user.lua", root .. "/picky.lua", root .. "/odd.jsonl"
  -- a user who leaves at once when the task says so, else asks and then ends
  files.write_atomic(user_file, [=[
return { respond = function(conv, sample)
  if sample.single_turn_prompt:find("LEAVE", 1, true) then return "[[TERMINATE CHAT]]" end
  if #conv == 0 then return "Help me with my task." end
  return "Thanks. [[TERMINATE CHAT]]"
end }
]=])
  -- a metric that cannot score one task
  files.write_atomic(metric_file, [[
return { name = "picky", compute = function(conv, sample)
  if sample.single_turn_prompt:find("BROKEN", 1, true) then error("picky: cannot score this task") end
  return 1
end }
]])
  files.write_atomic(path, table.concat({
    json.encode({ task = "LEAVE at once.", reference = "r1", task_type = "qa" }),
    json.encode({ task = "A BROKEN task.", reference = "r2", task_type = "qa" }),
    json.encode({ task = "A fine task.", reference = "r3", task_type = "qa" }),
  }, "\n") .. "\n")
  local out = root .. "/odd"
  local _, c = run_build({ "input=" .. path, "out=" .. out, "assistant.base_url=" .. e.url, "assistant.model=fake-assistant",
    "sim=" .. user_file, ('reward.metric_weights={"%s":1}'):format(metric_file), "candidates=2", "rollout.num_repeat_rollouts=1",
    "check_endpoints=false" })
  T.eq(c.ended_at_once, 1); T.eq(c.candidates_failed, 1); T.eq(c.conversations, 1)
  local r1 = json.decode(T.read(out .. "/conversations/000001.json"))
  T.eq(r1.status, "ended_at_once"); T.eq(#r1.rows, 0)
  local r2 = json.decode(T.read(out .. "/conversations/000002.json"))
  T.eq(r2.status, "candidates_failed"); T.eq(#r2.rows, 0)
  local rows = data.read_jsonl(out .. "/multiturn.jsonl")
  T.eq(#rows, 2, "the fine task's two candidates, nothing of the others")
  for _, r in ipairs(rows) do T.eq(r.conv_id, 3) end
  local counts = json.decode(T.read(out .. "/counts.json"))
  T.eq(counts.ended_at_once, 1); T.eq(counts.candidates_failed, 1)
end)

T.run()
