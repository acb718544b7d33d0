-- Runs that never lose work and never succeed silently (issue 19), on the built-in world at
-- toy size: Ctrl-C and kill -9 at seeded random moments, each followed by resume=, end with
-- the same metrics as an uninterrupted run; resume= applies or refuses overrides; a new run
-- never reuses a folder; a full disk, a refused API key, a server that is down, a torn
-- metrics line, bad config values and bad data files each stop the run with one line.
local T = require("clrt.test")
local data = require("clrt.data")
local config = require("clrt.config")
local files = require("clrt.files")
local sft = require("recipes.collabllm_sft")
local rl = require("recipes.collabllm_rl")
local prompts = require("clrt.train.prompts")

local root = T.tmpdir()
local bin = os.getenv("CLRT_BIN") or "clrt"
local start

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Run a shell command; its output (stdout and stderr) and exit status.
local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"__rc=$?\"")
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("__rc=(%d+)%s*$"))
  return out:gsub("__rc=%d+%s*$", ""), rc
end

local function clrt_cmd(script, args)
  local parts = { q(bin), script }
  for _, a in ipairs(args) do parts[#parts + 1] = q(a) end
  return table.concat(parts, " ")
end

local function ensure_start()
  if start then return start end
  local cfg = config.parse(sft.defaults, {
    "run_dir=" .. root .. "/sft", "train.steps=6", "train.batch_size=8", "world.conversations=100",
    "arch.hidden_size=32", "arch.intermediate_size=64", "arch.num_hidden_layers=2", "train.val_every=3",
  }, sft.world_config())
  start = sft.main(cfg)
  return start
end

local function rl_args(run_dir, extra)
  local a = { "config=" .. rl.world_config_path(), "model=" .. ensure_start(), "run_dir=" .. run_dir, "steps=6",
    "prompts_per_step=4", "rollout.n=4", "rollout.num_repeat_rollouts=2", "rollout.max_new_tokens=12", "seed=3",
    "eval.before=false", "eval.after=false", "save_every=2", "sample_every=1" }
  for _, x in ipairs(extra or {}) do a[#a + 1] = x end
  return a
end

-- metrics rows without the wall-clock fields, by step
local function comparable(dir)
  local out, n = {}, 0
  for _, r in ipairs(data.read_jsonl(dir .. "/metrics.jsonl")) do
    local c = {}
    for k, v in pairs(r) do
      if not (k:find("^time") or k == "tokens_per_s" or k == "elapsed") then c[k] = v end
    end
    T.ok(out[r.step] == nil, "metrics.jsonl has step " .. r.step .. " once")
    out[r.step] = c
    n = n + 1
  end
  return out, n
end

-- Long enough that the random interrupts below land inside runs, however fast the machine.
local LOOP_STEPS = 150
local straight
local function straight_run()
  if straight then return straight end
  straight = comparable((rl.main(config.parse(rl.defaults, rl_args(root .. "/straight", { "steps=" .. LOOP_STEPS })))))
  return straight
end

T.case("Ctrl-C and kill -9 at random moments: each run resumes to the uninterrupted run's metrics", function()
  local want = straight_run()
  local dir = root .. "/interrupted"
  local rng = data.rng.new(19)
  local first = clrt_cmd("recipes/collabllm_rl.lua", rl_args(dir, { "steps=" .. LOOP_STEPS }))
  local resume = clrt_cmd("recipes/collabllm_rl.lua", { "resume=" .. dir })
  local interrupts, kills, done = 0, 0, false
  for round = 1, 14 do
    -- stopped before its folder had a config: the first command again (the folder is empty)
    local cmd = files.exists(dir .. "/config.json") and resume or first
    local delay = 0.15 + rng:next32() % 1200 / 1000
    local use_kill = round % 4 == 0
    -- timeout: INT after `delay`; -k 60: KILL if the run is still there a minute later (rc 137,
    -- a run that ignored Ctrl-C). Not a latency bound: a loaded CI machine runs this 25x slower.
    local out, rc = sh(("timeout %s %s %s"):format(use_kill and "-s KILL" or "-s INT -k 60", ("%.3f"):format(delay), cmd))
    if rc == 0 then done = true break end
    if use_kill then
      T.eq(rc, 137, "kill -9 ends the run: " .. out)
      kills = kills + 1
    else
      T.eq(rc, 124, "Ctrl-C stops the run (124, not 137 from the follow-up KILL): " .. out)
      interrupts = interrupts + 1
      -- (a Ctrl-C during start-up, before clrt has set its handler, ends it silently with
      -- the folder untouched: nothing to resume that was not resumable before)
      if files.exists(dir .. "/config.json") and out ~= "" then
        T.ok(out:find("continue this run with:\n  clrt recipes/collabllm_rl.lua resume=" .. dir .. "\n", 1, true),
          "the resume command is printed: " .. out)
      end
    end
    T.ok(not files.exists(dir .. "/checkpoint.tmp") and not files.exists(dir .. "/checkpoint.old"), "no shell-era leftovers")
    local latest = T.read(dir .. "/latest")
    if latest then
      T.ok(T.read(dir .. "/" .. latest:gsub("%s+$", "") .. "/trainer_state.json"), "latest names a complete checkpoint")
    end
  end
  if not done then
    -- (on a loaded machine every round may have stopped during start-up, before the folder)
    local out, rc = sh(files.exists(dir .. "/config.json") and resume or first)
    T.eq(rc, 0, out)
  end
  T.ok(interrupts >= 3, "several Ctrl-C rounds happened (" .. interrupts .. ")")
  local got, n = comparable(dir)
  T.eq(n, LOOP_STEPS, "one metrics row per step")
  for step = 1, LOOP_STEPS do T.eq(got[step], want[step], "step " .. step) end
  local seen = {}
  for _, r in ipairs(data.read_jsonl(dir .. "/samples.jsonl")) do
    local key = r.step .. "/" .. tostring(r.id) .. "/" .. tostring(r.reward)
    seen[key] = (seen[key] or 0) + 1
  end
  local per_step = {}
  for _, r in ipairs(data.read_jsonl(dir .. "/samples.jsonl")) do per_step[r.step] = (per_step[r.step] or 0) + 1 end
  for step = 1, 6 do T.eq(per_step[step], 4, "samples of step " .. step .. " written once") end
end)

T.case("resume= applies overrides that may change and refuses the ones that may not", function()
  local dir = root .. "/stopped"
  rl.main(config.parse(rl.defaults, rl_args(dir, { "stop_after=2", "steps=4" })))
  T.eq(#data.read_jsonl(dir .. "/metrics.jsonl"), 2)
  for _, bad in ipairs({ { "seed=4", "seed" }, { "rollout.n=2", "rollout.n" }, { "prompts_per_step=8", "prompts_per_step" },
    { "model=" .. root .. "/elsewhere", "model" }, { "data=x.jsonl", "data" } }) do
    T.raises(function() rl.parse_args({ "resume=" .. dir, bad[1] }) end, "resume: " .. bad[2] .. " cannot change", bad[1])
  end
  -- a new run never writes into an existing folder
  local err = T.raises(function() rl.main(config.parse(rl.defaults, rl_args(dir))) end, "already exists")
  T.ok(err:find(dir, 1, true), "the error names the folder")
  T.eq(#data.read_jsonl(dir .. "/metrics.jsonl"), 2, "the old run is untouched")
  -- a torn last line (a kill mid-write) is dropped with a warning
  files.append(dir .. "/metrics.jsonl", '{"step": 3, "rew')
  local out, rc = sh(clrt_cmd("recipes/collabllm_rl.lua", { "resume=" .. dir, "steps=5", "sample_every=2" }))
  T.eq(rc, 0, out)
  T.ok(out:find("the last line is cut off; dropped", 1, true), "the torn line is reported: " .. out)
  T.ok(out:find("steps: 4 -> 5", 1, true), "the applied override is printed: " .. out)
  local rows = data.read_jsonl(dir .. "/metrics.jsonl")
  T.eq(#rows, 5, "steps=5 applied on resume")
  local saved = config.load(dir .. "/config.json")
  T.eq(saved.steps, 5)
  T.eq(saved.sample_every, 2)
end)

T.case("a run killed while it wrote its first config.json starts again with the same command", function()
  -- kill -9 between open() and rename() of the atomic write leaves only NAME.tmp.PID
  local dir = root .. "/torn_start"
  files.mkdir_p(dir)
  files.append(dir .. "/config.json.tmp.4242", '{"steps": ')
  local out, rc = sh(clrt_cmd("recipes/collabllm_rl.lua", rl_args(dir, { "steps=2" })))
  T.eq(rc, 0, out)
  T.eq(#data.read_jsonl(dir .. "/metrics.jsonl"), 2)
  T.ok(not files.exists(dir .. "/config.json.tmp.4242"), "the leftover is removed")
  -- anything else in the folder is a run's content: refused, and left as it was
  for _, name in ipairs({ "notes.txt", "checkpoint.tmp.7" }) do
    local other = root .. "/not_empty_" .. name
    files.mkdir_p(other)
    if name == "notes.txt" then files.append(other .. "/" .. name, "mine\n") else files.mkdir_p(other .. "/" .. name) end
    files.append(other .. "/config.json.tmp.4242", "{")
    T.raises(function() rl.main(config.parse(rl.defaults, rl_args(other))) end, "already exists")
    T.ok(files.exists(other .. "/" .. name) and files.exists(other .. "/config.json.tmp.4242"), "nothing removed in " .. other)
  end
end)

T.case("summary.json keeps `before` across a resume", function()
  local dir = root .. "/summary"
  rl.main(config.parse(rl.defaults, rl_args(dir, { "steps=3", "stop_after=1", "eval.before=true", "eval.after=true",
    "eval.prompts=4" })))
  local before = require("cjson").decode(T.read(dir .. "/summary.json")).before
  T.eq(type(before), "table", "before is written at once")
  rl.main(rl.parse_args({ "resume=" .. dir }))
  local s = require("cjson").decode(T.read(dir .. "/summary.json"))
  T.eq(s.before, before)
  T.eq(type(s.after), "table")
end)

T.case("a full disk stops the run naming the file and keeps the previous checkpoint", function()
  local mnt = root .. "/tiny"
  files.mkdir_p(mnt)
  local _, rc = sh("mount -t tmpfs -o size=600k tmpfs " .. q(mnt))
  if rc ~= 0 then T.skip("cannot mount a tmpfs here") end
  T.cleanup(function() os.execute("umount " .. q(mnt) .. " 2>/dev/null") end)
  local dir = mnt .. "/run"
  local out, rc2 = sh(clrt_cmd("recipes/collabllm_rl.lua", rl_args(dir, { "steps=40", "save_every=1", "sample_every=1" })))
  local latest = T.read(dir .. "/latest")
  local complete = latest and T.read(dir .. "/" .. latest:gsub("%s+$", "") .. "/trainer_state.json")
  os.execute("umount " .. q(mnt))
  T.ok(rc2 ~= 0, "the run fails: " .. out)
  T.ok(complete, "the previous checkpoint is still complete and named by latest: " .. tostring(latest))
  T.ok(out:find("No space left on device", 1, true), "says why: " .. out)
  T.ok(out:find(dir, 1, true), "names the file: " .. out)
  T.ok(not out:find("stack traceback", 1, true), "one line, no traceback: " .. out)
end)

T.case("a failed write to a run file is an error naming it", function()
  local dir = root .. "/log"
  local lg = clrt.log.run({ dir = dir, quiet = true, tensorboard = false })
  lg:log(1, { loss = 1 })
  for _, name in ipairs({ "metrics.jsonl", "samples.jsonl" }) do
    os.remove(dir .. "/" .. name)
    assert(os.execute("ln -s /dev/full " .. q(dir .. "/" .. name)) == 0)
  end
  T.raises(function() lg:log(2, { loss = 1 }) end, dir .. "/metrics.jsonl: No space left on device")
  T.raises(function() lg:samples(2, { { id = "a", conversation = {} } }) end, dir .. "/samples.jsonl: No space left on device")
  T.raises(function() files.write_atomic(dir .. "/nope/x.json", "{}") end, dir .. "/nope/x.json")
end)

-- A run against tests/support/fake_openai.py as the simulated user.
local function llm_run(dir, server_args, extra)
  local fake = dofile(T.source_dir() .. "/tests/support/fake_openai.lua")
  local srv = fake.start(server_args)
  T.cleanup(srv.stop)
  local args = rl_args(dir, { "sim=llm", "sim_cfg.base_url=" .. srv.base_url, "sim_cfg.api_key_env=CLRT_TEST_KEY",
    "sim_cfg.max_retries=0", "sim_cfg.timeout=5" })
  for _, x in ipairs(extra or {}) do args[#args + 1] = x end
  local out, rc = sh("CLRT_TEST_KEY=wrong-key " .. clrt_cmd("recipes/collabllm_rl.lua", args))
  srv.stop()
  return out, rc
end

T.case("an HTTP 401 from the simulator stops the run at once with one line", function()
  local dir = root .. "/auth"
  local out, rc = llm_run(dir, { "--key", "right-key" })
  T.eq(rc, 1, out)
  T.ok(out:find("clrt: collabllm_rl: gpt%-4o%-mini at http://127%.0%.0%.1:%d+/v1/chat/completions refused the request: HTTP 401"), out)
  T.ok(not out:find("wrong-key", 1, true), "the key never shows")
  T.ok(not out:find("stack traceback", 1, true), out)
  -- a step whose first replies all ended at the length limit calls no simulator and may be
  -- logged; no step that called it (and met the 401) is. A run stopped before it logged a
  -- step leaves no folder: the same command runs again once the key is fixed.
  if files.exists(dir) then
    for _, r in ipairs(data.read_jsonl(dir .. "/metrics.jsonl")) do
      T.eq(r.http_calls or 0, 0, "step " .. tostring(r.step) .. " met the 401 yet was logged as if it had worked")
    end
    T.ok(#data.read_jsonl(dir .. "/metrics.jsonl") > 0, "a folder kept holds a logged step")
  end
  T.ok(not out:find("continue this run", 1, true) or files.exists(dir), "no resume command for a removed folder: " .. out)
end)

-- Before the first step (clrt.train.endpoints): each endpoint answers GET /models and serves
-- its model; what does not is one line naming the setting, and no folder is left behind.
T.case("endpoints and model names are checked before the first step: one line each, no folder", function()
  local down = root .. "/ep_down"
  local out, rc = sh(clrt_cmd("recipes/collabllm_rl.lua", rl_args(down, { "sim=llm", "sim_cfg.base_url=http://127.0.0.1:1/v1",
    "sim_cfg.max_retries=0" })))
  T.eq(rc, 1, out)
  T.ok(out:find("clrt: collabllm_rl: sim_cfg.base_url=http://127.0.0.1:1/v1: cannot reach the endpoint", 1, true), out)
  T.ok(not out:find("step 1", 1, true) and not out:find("traceback", 1, true), out)
  T.eq(files.exists(down), false, "no folder for a run that never started")
  local wrong = root .. "/ep_model"
  out, rc = llm_run(wrong, { "--models", "qwen-a,qwen-b" })
  T.eq(rc, 1, out)
  T.ok(out:find("sim_cfg.model=gpt%-4o%-mini is not served at http://127.0.0.1:%d+/v1 %(it serves: qwen%-a, qwen%-b%)"), out)
  T.eq(files.exists(wrong), false)
  out, rc = llm_run(root .. "/ep_key", { "--models", "gpt-4o-mini", "--key", "right-key" })
  T.eq(rc, 1, out)
  T.ok(out:find("sim_cfg.base_url=http://127.0.0.1:%d+/v1 refused the key: HTTP 401 Incorrect API key provided %(sim_cfg.api_key_env%)"), out)
  T.ok(not out:find("wrong-key", 1, true), "the key never shows")
  -- the planted fault's other side: served, the run goes on (one GET /models, then rollouts)
  local fake = dofile(T.source_dir() .. "/tests/support/fake_openai.lua")
  local srv = fake.start({ "--models", "x,gpt-4o-mini" })
  T.cleanup(srv.stop)
  local ok_dir = root .. "/ep_ok"
  out, rc = sh("CLRT_TEST_KEY=k " .. clrt_cmd("recipes/collabllm_rl.lua", rl_args(ok_dir, { "sim=llm", "sim_cfg.base_url=" .. srv.base_url,
    "sim_cfg.api_key_env=CLRT_TEST_KEY", "steps=1", "save_every=1", "rollout.max_new_tokens=8" })))
  local stats = sh(("curl -s http://127.0.0.1:%d/stats"):format(srv.port))
  srv.stop()
  -- past the check, the rollouts ran (this fake's echo is no simulated user: the step fails)
  T.ok(out:find("no step succeeded (1 of 1 failed)", 1, true) and out:find("simulator failed", 1, true), out)
  T.ok(stats:find('"models_calls": 1', 1, true), stats)
  -- check_endpoints=false: nothing asked
  local endpoints = require("clrt.train.endpoints")
  local asked = 0
  local client = { base_url = "http://x/v1", model = "m", list_models = function() asked = asked + 1; return { error = "down" } end }
  T.eq(endpoints.check({ user = client }, {}, { check_endpoints = false }, "w"), {})
  T.eq(asked, 0)
  T.raises(function() endpoints.check({ user = client, judge = client }, {}, {}, "w") end, "w: sim_cfg.base_url=http://x/v1: cannot reach the endpoint (down)")
  T.eq(asked, 1, "the judge is not asked when no metric uses it, and one endpoint is asked once")
end)

T.case("a simulator that is down: failed steps are logged by cause and the run stops", function()
  local dir = root .. "/down"
  local out, rc = llm_run(dir, { "--fault", "500" }, { "max_failed_steps=2", "rollout.max_new_tokens=40" })
  T.eq(rc, 1, out)
  T.ok(out:find("stopped after 2 failed steps", 1, true), out)
  T.ok(out:find("HTTP 500", 1, true), "the first message is printed: " .. out)
  local rows = data.read_jsonl(dir .. "/metrics.jsonl")
  local failed = {}
  for _, r in ipairs(rows) do
    if r.failed_step == 1 then
      failed[#failed + 1] = r
      T.ok((r["dropped/simulator failed"] or 0) > 0, "the cause is counted in metrics.jsonl")
    end
  end
  T.eq(#failed, 2, "two failed steps")
  T.eq(failed[2].step, rows[#rows].step, "the run stops at the second")
end)

-- fewer steps than max_failed_steps, all failed: the run trained on nothing and says so
T.case("a run in which no step succeeded exits non-zero, though under max_failed_steps", function()
  local dir = root .. "/none"
  local out, rc = llm_run(dir, { "--fault", "500" }, { "steps=2", "max_failed_steps=5", "rollout.max_new_tokens=40" })
  T.eq(rc, 1, out)
  T.ok(out:find("collabllm_rl: no step succeeded (2 of 2 failed)", 1, true), out)
  T.ok(out:find("HTTP 500", 1, true), "why: " .. out)
  T.ok(not out:find("stopped after step", 1, true) and files.exists(dir .. "/latest"), "a failed run, its steps kept: " .. out)
  T.ok(not out:find("stack traceback", 1, true), out)
end)

T.case("a run that fails after its folder is made but before its first step leaves no folder", function()
  local run = require("clrt.run")
  local dir = root .. "/startup"
  -- what a recipe has written by then: config.json, an empty metrics.jsonl
  local err = T.raises(function()
    run.guard("collabllm_rl", "recipes/collabllm_rl.lua", dir, function()
      files.mkdir_p(dir)
      files.write_atomic(dir .. "/config.json", "{}")
      files.write_atomic(dir .. "/metrics.jsonl", "")
      error("collabllm_rl: the endpoint check failed", 0)
    end)
  end, "the endpoint check failed")
  T.ok(not err:find("resume=", 1, true), err)
  T.eq(files.exists(dir), false, "no orphan folder")
  -- once a step is logged the folder is the run's, kept to resume
  local kept = root .. "/started"
  T.raises(function()
    run.guard("collabllm_rl", "recipes/collabllm_rl.lua", kept, function()
      files.mkdir_p(kept)
      files.write_atomic(kept .. "/config.json", "{}")
      files.write_atomic(kept .. "/metrics.jsonl", '{"step":1}\n')
      error("collabllm_rl: step 2 failed", 0)
    end)
  end, "step 2 failed")
  T.eq(files.exists(kept .. "/config.json"), true, "a started run's folder stays")
  -- and a resumed run's folder is never removed, whatever it holds
  local resumed = root .. "/resumed"
  files.mkdir_p(resumed)
  files.write_atomic(resumed .. "/config.json", "{}")
  T.raises(function() run.guard("collabllm_rl", "recipes/collabllm_rl.lua", resumed, function() error("x", 0) end) end, "x")
  T.eq(files.exists(resumed .. "/config.json"), true)
end)

T.case("bad config values: one line each naming key and value, before anything runs", function()
  local cases = {
    { "rollout.n=0", "rollout.n must be an integer >= 1, got 0" },
    { "train.lr=-1", "train.lr must be a finite number > 0, got -1" },
    { "train.lr=1e999", "train.lr must be a finite number > 0, got inf" },
    { "steps=0", "steps must be an integer >= 1, got 0" },
    { "steps=1.5", "steps must be an integer >= 1, got 1.5" },
    { "prompts_per_step=0", "prompts_per_step must be an integer >= 1, got 0" },
    { "rollout.num_repeat_rollouts=0", "rollout.num_repeat_rollouts must be an integer >= 1, got 0" },
    { "train.kl_coef=-1", "train.kl_coef must be a finite number >= 0, got -1" },
    { "reward.mode=sum", "reward.mode must be one of verl, mean, got 'sum'" },
    { "train.decay=exp", "train.decay must be one of constant, cosine, linear, got 'exp'" },
    { "reward.metric_weights={bad json", "reward.metric_weights={bad json is not valid JSON" },
    { "reward.metric_weights={}", "reward.metric_weights must name at least one metric" },
    { 'reward.metric_weights={"exact_match":"x"}', "reward.metric_weights.exact_match must be a finite number, got \"x\"" },
    { 'reward.metric_weights={"nope":1}', "unknown metric 'nope'" },
  }
  for _, c in ipairs(cases) do
    local err = T.raises(function() rl.main(config.parse(rl.defaults, rl_args(root .. "/never", { c[1] }))) end, c[2], c[1])
    T.ok(not err:find("\n"), "one line: " .. err)
  end
  T.ok(not files.exists(root .. "/never"), "no run folder for a bad config")
  T.raises(function() sft.main(config.parse(sft.defaults, { "train.batch_size=0", "run_dir=" .. root .. "/never" })) end,
    "train.batch_size must be an integer >= 1, got 0")
  -- the command line: one line, exit 1, no traceback unless CLRT_TRACEBACK=1
  local out, rc = sh(clrt_cmd("recipes/collabllm_rl.lua", { "rollout.n=0" }))
  T.eq(rc, 1)
  T.eq(out, "clrt: collabllm_rl: rollout.n must be an integer >= 1, got 0\n")
  out = sh("CLRT_TRACEBACK=1 " .. clrt_cmd("recipes/collabllm_rl.lua", { "rollout.n=0" }))
  T.ok(out:find("stack traceback", 1, true), out)
end)

T.case("data files are checked up front: line numbers, empty files, BOM, invalid UTF-8", function()
  local function write(name, text)
    local p = root .. "/" .. name
    files.write_atomic(p, text)
    return p
  end
  local good = '{"prompt":[{"role":"user","content":"hi"}],"ground_truth":"x"}\n'
  local bad = write("bad.jsonl", good .. "\n\n" .. good .. '{"prompt":"not a list"}\n')
  T.raises(function() prompts.dataset_samples(bad) end, bad .. ":5: no \"prompt\" list")
  local badmsg = write("badmsg.jsonl", good .. '{"prompt":[{"role":"user"}]}\n')
  T.raises(function() prompts.dataset_samples(badmsg) end, badmsg .. ":2: prompt message 1 needs")
  local notjson = write("notjson.jsonl", good .. "\n{oops\n")
  T.raises(function() prompts.dataset_samples(notjson) end, notjson .. ":3: not a JSON line")
  local empty = write("empty.jsonl", "\n\n")
  T.raises(function() prompts.dataset_samples(empty) end, empty .. ": the data file has no rows")
  T.raises(function() sft.read_conversations(empty) end, "the data file has no rows")
  local bom = write("bom.jsonl", "\239\187\191" .. good)
  T.eq(#prompts.dataset_samples(bom), 1, "a BOM is skipped")
  local utf = write("utf.jsonl", '{"prompt":[{"role":"user","content":"caf\233 \255"}]}\n')
  local warned
  local rows = data.read_dataset(utf, function(m) warned = m end)
  T.eq(rows[1].prompt[1].content, "caf\239\191\189 \239\191\189")
  T.ok(warned and warned:find("1 lines held invalid UTF-8", 1, true), tostring(warned))
  local sftbad = write("sftbad.jsonl", '{"messages":[{"role":"user","content":"a"}]}\n\n{"messages":[]}\n')
  T.raises(function() sft.read_conversations(sftbad) end, sftbad .. ":3: a row needs a \"messages\" list")
end)

T.case("a missing data file is one line naming it, from the command line too", function()
  local gone = root .. "/no_such_rows.jsonl"
  local out, rc = sh(clrt_cmd("recipes/collabllm_sft.lua", { "data=" .. gone, "run_dir=" .. root .. "/missing_data",
    "world.conversations=10" }))
  T.eq(rc, 1, out)
  T.ok(out:find("clrt: data: cannot open " .. gone .. ": No such file or directory\n", 1, true), out)
  T.ok(not out:find("traceback", 1, true) and not out:find("%.lua:%d+:"), "no Lua position or traceback: " .. out)
  T.eq(files.exists(root .. "/missing_data"), false, "no folder left")
end)

T.case("process_dataset: empty input is an error, line numbers count blank lines", function()
  local pd = require("recipes.process_dataset")
  local empty = root .. "/pd_empty.jsonl"
  files.write_atomic(empty, "\n")
  T.raises(function() pd.main(config.parse(pd.defaults, { "input=" .. empty, "out=" .. root .. "/pd_out" })) end,
    "the data file has no rows")
  local gaps = root .. "/pd_gaps.jsonl"
  files.write_atomic(gaps, "\n\n\n\n\n\n" .. '{"nothing": 1}\n')
  T.raises(function() pd.main(config.parse(pd.defaults, { "input=" .. gaps, "out=" .. root .. "/pd_out" })) end,
    gaps .. " line 7")
end)

T.case("SFT checkpoints and resume= give the uninterrupted run's losses", function()
  local base = { "train.steps=6", "train.batch_size=8", "world.conversations=100", "arch.hidden_size=32",
    "arch.intermediate_size=64", "arch.num_hidden_layers=2", "train.val_every=3", "save_every=2" }
  local function args(dir, extra)
    local a = { "run_dir=" .. dir }
    for _, x in ipairs(base) do a[#a + 1] = x end
    for _, x in ipairs(extra or {}) do a[#a + 1] = x end
    return a
  end
  sft.main(config.parse(sft.defaults, args(root .. "/sft_a"), sft.world_config()))
  sft.main(config.parse(sft.defaults, args(root .. "/sft_b", { "stop_after=3" }), sft.world_config()))
  T.eq(T.read(root .. "/sft_b/latest"), "checkpoint-3\n")
  T.ok(not files.exists(root .. "/sft_b/model/model.safetensors"), "no final model before the end")
  sft.main(sft.parse_args({ "resume=" .. root .. "/sft_b" }))
  local a, b = data.read_jsonl(root .. "/sft_a/metrics.jsonl"), data.read_jsonl(root .. "/sft_b/metrics.jsonl")
  T.eq(#b, 6)
  for i = 1, 6 do
    T.eq(b[i].loss, a[i].loss, "loss at step " .. i)
    T.eq(b[i].val_loss, a[i].val_loss, "val_loss at step " .. i)
  end
  T.ok(files.exists(root .. "/sft_b/model/model.safetensors"), "the final model is written")
end)

T.case("T.tmpdir folders are removed, also when the test file fails", function()
  local script = root .. "/leaky.lua"
  files.write_atomic(script, 'local T = require("clrt.test")\nlocal d = T.tmpdir()\nprint("DIR " .. d)\n' ..
    'T.case("fails", function() T.ok(false) end)\nif arg[1] == "die" then error("dies before run") end\nT.run()\n')
  for _, mode in ipairs({ "fail", "die" }) do
    local out = sh(q(bin) .. " " .. q(script) .. " " .. mode)
    local d = out:match("DIR (%S+)")
    T.ok(d, out)
    T.ok(not files.exists(d), mode .. ": " .. tostring(d) .. " was removed")
  end
end)

T.run()
