-- collabllm_eval.lua protocol=paper (the CollabLLM paper's evaluation, clrt.train.paper_eval):
-- the conversation loop from an empty chat (the user opens; the marker or max_messages ends
-- it), the statistics (mean, standard error, per task and overall, failed judges left out),
-- the built-in world end to end with its scripted user, and the published schema end to end:
-- process_dataset's eval_test.jsonl (one row per distinct single-turn test task) evaluated with
-- a local endpoint as simulated user and judges, which records what it is sent.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local data = require("clrt.data")
local cjson = require("cjson")
local config = require("clrt.config")
local paper = require("clrt.train.paper_eval")
local conv = require("clrt.conversation")
local scripted = require("interactions.scripted_user")

local root = T.tmpdir()

T.case("mean and standard error; per-task groups; a failed judge is left out and counted", function()
  local s = paper.mean_se({ 1, 2, 3, 4 })
  T.eq(s.n, 4); T.near(s.mean, 2.5, 1e-12); T.near(s.se, math.sqrt(5 / 3 / 4), 1e-12)
  T.eq(paper.mean_se({ 7 }).se, 0)
  local failed = require("clrt.train.reward").failed("judge down")
  local function r(task, perf, itr, k) return { sample = { task = task, task_metric = "accuracy" }, task_performance = perf,
    itr = itr, tokens_read_k = k, messages = 4 } end
  local rep = paper.report({ r("math", 1, 0.5, 0.2), r("math", 0, failed, 0.4), r("docs", 1, 1, 0.1),
    { sample = { task = "docs" }, dropped = "simulator failed", error = "x" } }, {})
  T.eq(rep.conversations, 3); T.eq(rep.dropped, 1); T.eq(rep.failed.itr, 1)
  T.near(rep.tasks.math.task_performance.mean, 0.5, 1e-12); T.eq(rep.tasks.math.itr.n, 1)
  T.near(rep.overall.itr.mean, 0.75, 1e-12); T.near(rep.overall.tokens_read_k.mean, 0.7 / 3, 1e-12)
  T.eq(rep.overall.task_performance.n, 3); T.eq(rep.overall.task_metric, "accuracy")
  T.eq(rep.task_order, { "docs", "math" })
end)

T.case("max_messages: user and assistant messages, starting with the user", function()
  for n, want in pairs({ [14] = { 7, 7 }, [13] = { 7, 6 }, [1] = { 1, 0 }, [2] = { 1, 1 } }) do
    local u, a = paper.turn_limits(n)
    T.eq({ u, a }, want, "max_messages=" .. n)
  end
end)

T.case("protocol=paper defaults to the authors' caps (assistant 1024, user 1024); prefix keeps the training ones", function()
  local ev = require("recipes.collabllm_eval")
  local cfg = ev.parse_args({ "model=m", "data=eval_test.jsonl" })
  T.eq({ cfg.protocol, cfg.rollout.max_new_tokens, cfg.sim_cfg.max_tokens }, { "paper", 1024, 1024 })
  T.eq(cfg.itr, "verl")
  local pre = ev.parse_args({ "model=m", "data=rl_test.jsonl", "protocol=prefix" })
  T.eq({ pre.rollout.max_new_tokens, pre.sim_cfg.max_tokens }, { 2048, 512 }, "prefix: the RL recipe's (verl's)")
  local mine = ev.parse_args({ "model=m", "data=x.jsonl", "rollout.max_new_tokens=300", "sim_cfg.max_tokens=200" })
  T.eq({ mine.rollout.max_new_tokens, mine.sim_cfg.max_tokens }, { 300, 200 }, "the command line wins")
  T.raises(function() ev.itr_rubric(ev.parse_args({ "model=m", "itr=mine" })) end, "itr must be verl or authors")
end)

-- the built-in world's SFT start (tiny) for the end-to-end cases
local config_sft = require("recipes.collabllm_sft")
local start = config_sft.main(config.parse(config_sft.defaults, {
  "run_dir=" .. root .. "/sft", "train.steps=2", "train.batch_size=8", "world.conversations=60",
  "arch.hidden_size=32", "arch.intermediate_size=64", "arch.num_hidden_layers=2", "train.val_every=0",
}, config_sft.world_config()))
local world = require("collab_world.world")

T.case("the world's scripted user opens an empty chat; the loop ends at the marker or at max_messages", function()
  local tok = clrt.tokenizer.load(start)
  local samples = paper.world_samples(world, 6, 3, world.system_prompt)
  T.raises(function() scripted.respond({}, { value = "x" }, {}) end, "needs sample.opening")
  local asker = function() return "What is your friend's name? Which city? When?" end
  local answerer = function(c, s) return s.ground_truth end
  local cfg = { max_messages = 5, itr_metric = "asks_question", rollout = {}, seed = 1, temperature = 0.6 }
  local results = paper.run(nil, tok, cfg, samples, scripted, {}, asker)
  for _, r in ipairs(results) do
    local c = r.conversation
    T.eq(c[1], { role = "system", content = world.system_prompt })
    T.eq(c[2].role, "user"); T.eq(c[2].content, r.sample.opening, "the user opens with the world's request")
    T.eq(#c - 1, 5, "a user who never gets an answer stops at max_messages")
    T.eq(c[#c].role, "user"); T.eq(r.ended, "max_assistant_turns")
    T.eq(r.itr, 1); T.eq(r.task_performance, 0)
    T.ok(r.tokens_read_k > 0, "tokens read")
  end
  cfg.max_messages = 14
  results = paper.run(nil, tok, cfg, samples, scripted, {}, answerer)
  for _, r in ipairs(results) do
    T.eq(#r.conversation, 4, "system, request, answer, marker")
    T.ok(conv.has_marker(r.conversation[4].content), "the user ends the chat")
    T.eq(r.ended, "marker"); T.eq(r.task_performance, 1); T.eq(r.itr, 0)
    T.near(r.tokens_read_k, #tok:encode(r.sample.ground_truth, { add_special_tokens = false }) / 1000, 1e-12)
  end
end)

T.case("a chat the user ends before the assistant speaks is dropped and counted, never scored", function()
  local tok = clrt.tokenizer.load(start)
  local samples = paper.world_samples(world, 2, 3, world.system_prompt)
  -- a user whose first message already ends the chat (the marker alone)
  local quitter = { name = "quitter", respond = function() return conv.TERMINATE end }
  local answered = false
  local policy = function() answered = true; return "an answer" end
  local cfg = { max_messages = 14, itr_metric = "asks_question", rollout = {}, seed = 1, temperature = 0.6 }
  local results = paper.run(nil, tok, cfg, samples, quitter, {}, policy)
  for _, r in ipairs(results) do
    T.eq(r.dropped, "no assistant turn", "dropped: " .. tostring(r.dropped))
    T.eq({ r.task_performance, r.itr }, { nil, nil }, "never scored")
  end
  T.eq(answered, false, "the policy was never asked")
  local rep = paper.report(results, cfg)
  T.eq({ rep.conversations, rep.dropped, rep.dropped_by["no assistant turn"] }, { 0, 2, 2 })
end)

T.case("protocol=paper on the built-in world: sampled at 0.6, eval.json and the table", function()
  local sched = require("clrt.sched")
  local real, temps = sched.generate, {}
  sched.generate = function(m, ids, o) temps[#temps + 1] = o.temperature; return real(m, ids, o) end
  T.cleanup(function() sched.generate = real end)
  local ev = require("recipes.collabllm_eval")
  local rep = ev.main(ev.parse_args({ "model=" .. start, "prompts=8", "out=" .. root, "rollout.max_new_tokens=8" }))
  sched.generate = real
  T.ok(#temps > 0, "the policy answered")
  for _, t in ipairs(temps) do T.eq(t, 0.6, "the assistant samples at 0.6") end
  local saved = cjson.decode(T.read(root .. "/eval.json"))
  T.eq(saved.protocol, "paper"); T.eq(saved.max_messages, 14); T.eq(saved.conversations, 8)
  for _, task in ipairs({ "world/specified", "world/underspecified" }) do
    for _, q in ipairs({ "task_performance", "itr", "tokens_read_k" }) do
      T.eq(type(saved.tasks[task][q].mean), "number", task .. " " .. q)
      T.eq(type(saved.tasks[task][q].se), "number", task .. " " .. q .. " standard error")
    end
  end
  T.eq(saved.overall.task_performance.n, 8)
  local details = data.read_jsonl(root .. "/eval_details.jsonl")
  T.eq(#details, 8)
  for _, d in ipairs(details) do
    T.eq(d.conversation[2].role, "user", "the user opens")
    T.ok(#d.conversation - 1 <= 14, "at most 14 messages")
  end
  -- the prompted baseline: the proactive system message replaces the world's (the world's
  -- 256-token model has no room for it: nothing is scored, which is a failure naming why; the
  -- details are written first)
  T.raises(function()
    ev.main(ev.parse_args({ "model=" .. start, "prompts=2", "out=" .. root, "rollout.max_new_tokens=4", "system_prompt=proactive" }))
  end, "no conversation was scored (2 dropped; first: no assistant turn: the system prompt and the user's opening fill the model's context")
  local pro = data.read_jsonl(root .. "/eval_details.jsonl")
  T.eq(pro[1].conversation[1].content, require("clrt.prompt_file").read("proactive_system"))
  T.ok(pro[1].conversation[1].content:find("clarifying question", 1, true), "the proactive prompt")
  ev.main(ev.parse_args({ "model=" .. start, "prompts=2", "out=" .. root, "rollout.max_new_tokens=4", "system_prompt=none" }))
  T.eq(data.read_jsonl(root .. "/eval_details.jsonl")[1].conversation[1].role, "user", "no system message")
  -- the earlier evaluation stays as protocol=prefix
  local pre = ev.main(ev.parse_args({ "model=" .. start, "prompts=4", "out=" .. root, "rollout.max_new_tokens=4", "protocol=prefix" }))
  T.eq(pre.conversations + pre.dropped, 4); T.eq(type(pre.metrics.exact_match), "number")
  T.eq(cjson.decode(T.read(root .. "/eval.json")).protocol, nil, "the prefix report keeps its own shape")
  T.raises(function() ev.main(ev.parse_args({ "model=" .. start, "system_prompt=bossy" })) end, "system_prompt must be")
  T.raises(function() ev.main(ev.parse_args({ "model=" .. start, "temperature=-1" })) end, "temperature must be")
  T.raises(function() ev.main(ev.parse_args({ "model=" .. start, "protocol=papr" })) end, "protocol must be")
end)

T.case("each evaluation writes a folder of its own (runs/collabllm_eval-*), never the model's; a bad value none", function()
  local files = require("clrt.files")
  local work = T.tmpdir() .. "/work"
  files.mkdir_p(work)
  local bin = os.getenv("CLRT_BIN") or arg[-1]
  if bin:sub(1, 1) ~= "/" then bin = os.getenv("PWD") .. "/" .. bin end
  local recipe = T.source_dir() .. "/lua/recipes/collabllm_eval.lua"
  local function eval(extra)
    local f = assert(io.popen(("cd %q && %q %q model=%q prompts=2 rollout.max_new_tokens=4 %s 2>&1; echo \"exit=$?\"")
      :format(work, bin, recipe, start, extra)))
    local out = f:read("*a")
    f:close()
    return out, tonumber(out:match("exit=(%d+)"))
  end
  local before = files.list(start)
  local out, rc = eval("temperature=-1")
  T.eq(rc, 1, out)
  T.eq(files.exists(work .. "/runs"), false, "no folder for a bad value: " .. out)
  local first, rc1 = eval("")
  local second, rc2 = eval("system_prompt=none")
  T.eq({ rc1, rc2 }, { 0, 0 }, first .. second)
  local a, b = first:match("evaluation folder: (%S+)"), second:match("evaluation folder: (%S+)")
  T.ok(a and b and a ~= b and a:match("^runs/collabllm_eval%-"), tostring(a) .. " " .. tostring(b))
  for _, d in ipairs({ a, b }) do
    for _, name in ipairs({ "eval.json", "eval_details.jsonl", "config.json" }) do
      T.ok(files.exists(work .. "/" .. d .. "/" .. name), d .. "/" .. name)
    end
  end
  T.eq(cjson.decode(T.read(work .. "/" .. b .. "/config.json")).system_prompt, "none", "the config it ran with")
  -- an evaluation that scores nothing (the proactive prompt does not fit the world's model)
  -- exits 1 with one line; its folder keeps eval.json and the details that say why
  local none, rc3 = eval("system_prompt=proactive")
  T.eq(rc3, 1, none)
  T.ok(none:find("\nclrt: collabllm_eval: no conversation was scored", 1, true) and not none:find("traceback", 1, true), none)
  local c = none:match("evaluation folder: (%S+)")
  T.eq(cjson.decode(T.read(work .. "/" .. c .. "/eval.json")).conversations, 0)
  T.eq(files.list(start), before, "nothing written into the model folder")
end)

---------------------------------------------------------------- the published schema
if os.execute("command -v curl > /dev/null 2>&1") ~= 0 then
  io.write("skip (published-schema case): curl is not installed\n")
  T.run()
  return
end

T.case("published rows -> eval_test.jsonl -> protocol=paper with an endpoint as user and judges", function()
  local pd = require("recipes.process_dataset")
  local published = require("support.published_rows")
  local all_eval, refs, requests = {}, {}, {}
  for _, kind in ipairs({ "math", "medium" }) do
    local k = published.KINDS[kind]
    local input, krefs, tasks = published.write(root, kind, 10)
    for _, r in ipairs(krefs) do refs[#refs + 1] = r end
    for t in pairs(tasks) do requests[t] = true end
    local out = root .. "/" .. k.file:gsub("%.jsonl$", "")
    local real_print = print
    print = function() end
    local ok, res = pcall(pd.main, config.parse(pd.defaults, { "input=" .. input, "out=" .. out, "test_fraction=0.3" }))
    print = real_print
    assert(ok, res)
    local ev_rows = data.read_jsonl(out .. "/eval_test.jsonl")
    local test_tasks = {}
    for _, r in ipairs(data.read_jsonl(out .. "/rl_test.jsonl")) do test_tasks[r.interaction_kwargs.single_turn_prompt] = true end
    local n = 0
    for _ in pairs(test_tasks) do n = n + 1 end
    T.eq(#ev_rows, n, "one row per distinct single-turn task of the test conversations")
    T.eq(n, 3)
    for _, r in ipairs(ev_rows) do
      T.ok(test_tasks[r.single_turn_prompt], "a test task")
      T.eq(r.prompt, nil, "no multi-turn prompt")
      T.ok(r.ground_truth and r.single_turn_metadata and r.task_desc, "reference and metadata")
      all_eval[#all_eval + 1] = r
    end
    T.eq(ev_rows[1].task_metric, k.file:find("math") and "accuracy" or "bleu_score")
  end
  local eval_file = root .. "/eval_test.jsonl"
  data.write_jsonl(eval_file, all_eval)

  local tiny = require("support.tiny_model")
  -- a context that holds the published system prompt (1,131 tokens of this tiny byte-level
  -- vocabulary) and a few turns
  local policy = tiny(root .. "/policy", { seed = 5, max_position = 4096 })
  local reqlog = root .. "/requests.jsonl"
  local p = assert(io.popen(("/usr/bin/python3 %s/tests/support/fake_collab_endpoint.py %s --lifetime 300"):format(T.source_dir(), reqlog)))
  local port, pid = (p:read("*l") or ""):match("^(%d+) (%d+)$")
  T.cleanup(function() if pid then os.execute("kill " .. pid .. " 2>/dev/null") end p:close() end)
  assert(port, "the fake endpoint did not start")
  local url = ("http://127.0.0.1:%s/v1"):format(port)
  local ev = require("recipes.collabllm_eval")
  local rep = ev.main(ev.parse_args({ "model=" .. policy, "data=" .. eval_file, "sim=llm", "sim_cfg.base_url=" .. url,
    "judge.base_url=" .. url, "sim_cfg.max_chars=64", "judge.max_chars=64", "rollout.max_new_tokens=6", "out=" .. root,
    "max_messages=6" }))
  -- this endpoint's user sometimes ends the chat at its first message: those are dropped
  -- (nothing of the policy's to score), counted by cause, and no other is
  T.eq(rep.conversations + rep.dropped, 6)
  T.eq(rep.dropped, (rep.dropped_by or {})["no assistant turn"] or 0, "only chats the user ended at once")
  for q, n in pairs(rep.failed) do T.eq(n, 0, "failed " .. q) end
  T.eq(rep.tasks["question answering"].task_metric, "accuracy")
  T.eq(rep.tasks["document editing"].task_metric, "bleu_score")
  local kept = {}
  for _, d in ipairs(data.read_jsonl(root .. "/eval_details.jsonl")) do
    if not d.dropped then kept[d.task] = (kept[d.task] or 0) + 1 end
  end
  for _, task in ipairs({ "question answering", "document editing" }) do
    for _, q in ipairs({ "task_performance", "itr", "tokens_read_k" }) do
      T.eq(rep.tasks[task][q].n, kept[task], task .. " " .. q .. " over its conversations")
    end
  end
  T.eq(rep.overall.task_metric, nil, "overall mixes two task metrics")
  -- what the endpoint was sent: every conversation opened by the user from an empty chat; the
  -- user never sees a reference (the accuracy judge is given it, as in the references)
  local opened, user_requests = 0, 0
  for _, body in ipairs(data.read_jsonl(reqlog)) do
    local text = cjson.encode(body.messages)
    if body.response_format.json_schema.schema.properties.response then
      user_requests = user_requests + 1
      for _, ref in ipairs(refs) do T.ok(not text:find(ref, 1, true), "the simulated user never sees a reference") end
      if body.messages[1].content:find("<chat_history>\n\n</chat_history>", 1, true) then opened = opened + 1 end
    end
  end
  T.eq(opened, 6, "each conversation's first user message was asked for from an empty chat")
  for _, body in ipairs(data.read_jsonl(reqlog)) do
    if body.response_format.json_schema.schema.properties.response then T.eq(body.max_tokens, 1024, "the user's cap") end
  end
  local saved = cjson.decode(T.read(root .. "/eval.json"))
  T.eq({ saved.itr, saved.itr_prompt, saved.itr_judge_model, saved.user_max_tokens }, { "verl", "judge_interactivity.txt", "gpt-4o-mini", 1024 })
  T.ok(user_requests > opened, "and later user turns saw the chat so far")
  for _, d in ipairs(data.read_jsonl(root .. "/eval_details.jsonl")) do
    T.eq(d.conversation[1].role, "system"); T.eq(d.conversation[2].role, "user")
    T.ok(#d.conversation - 1 <= 6, "max_messages")
    T.ok(requests[d.conversation[2].content] == nil, "the user's opening is its own message, not the hidden request")
  end
  -- itr=authors: the authors' rubric reaches the judge, with a judge model of one's choice,
  -- and eval.json says so
  os.remove(reqlog)
  rep = ev.main(ev.parse_args({ "model=" .. policy, "data=" .. eval_file, "sim=llm", "sim_cfg.base_url=" .. url,
    "judge.base_url=" .. url, "sim_cfg.max_chars=64", "judge.max_chars=64", "rollout.max_new_tokens=6", "out=" .. root,
    "max_messages=2", "itr=authors", "judge.model=claude-3-5-sonnet-latest" }))
  local judged = 0
  for _, body in ipairs(data.read_jsonl(reqlog)) do
    local props = body.response_format.json_schema.schema.properties
    if props.interactivity then
      judged = judged + 1
      T.ok(body.messages[1].content:find("0.5 = moderately interactive", 1, true), "the authors' anchors")
      T.eq(props.understanding, nil, "one score, no parts")
      T.eq(body.model, "claude-3-5-sonnet-latest")
    end
  end
  saved = cjson.decode(T.read(root .. "/eval.json"))
  T.eq(judged, saved.conversations, "one ITR judgement per conversation scored")
  T.eq(saved.conversations + saved.dropped, 6)
  T.eq({ saved.itr, saved.itr_prompt, saved.itr_judge_model }, { "authors", "judge_interactivity_authors.txt", "claude-3-5-sonnet-latest" })
  T.eq(saved.failed.itr, nil)
  local refused = root .. "/refused_eval"
  T.raises(function()
    ev.main_guarded(ev.parse_args({ "model=" .. policy, "data=" .. root .. "/collabllm-multiturn-medium/rl_test.jsonl",
      "sim=llm", "sim_cfg.base_url=" .. url, "judge.base_url=" .. url, "out=" .. refused }))
  end, "protocol=prefix evaluates RL rows")
  T.eq(require("clrt.files").exists(refused), false, "an evaluation that failed leaves no folder of its own")
  -- a simulated user that refuses every request: no conversation is scored, and that is a
  -- failure naming the first drop (it once wrote an empty table and exited 0)
  local down = dofile(T.source_dir() .. "/tests/support/fake_openai.lua").start({ "--fault", "400" })
  T.cleanup(down.stop)
  local err = T.raises(function()
    ev.main_guarded(ev.parse_args({ "model=" .. policy, "data=" .. eval_file, "sim=llm", "sim_cfg.base_url=" .. down.base_url,
      "sim_cfg.max_retries=0", "judge.base_url=" .. url, "rollout.max_new_tokens=6", "out=" .. root .. "/none_scored",
      "max_messages=2" }))
  end, "collabllm_eval: no conversation was scored (6 dropped; first: ")
  T.ok(not err:find("\n") and err:find("400", 1, true), "one line with the cause: " .. err)
end)

T.run()
