-- Asynchronous RL (train.async.max_off_policy_steps, clrt.train.async): with K = 1 the
-- rollouts of step s sample from the weights after update s - 2 in a worker process while the
-- steps before train, and the run still repeats bit for bit. collabllm_rl with the simulated
-- user and both judges on a local endpoint whose replies depend only on each request and
-- come after random delays (tests/support/fake_collab_endpoint.py, as test_reproducible_rl):
--   two runs with one seed: identical metrics, samples and final parameters; each step's
--   policy version as the schedule says, its mismatch logged, no async/ folder left;
--   kill -9 at random moments, then resume=: the uninterrupted run's metrics, samples and
--   final parameters, bit for bit;
--   a worker killed under the run: the run fails with one line naming it.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local data = require("clrt.data")
local files = require("clrt.files")
local config = require("clrt.config")
local rl = require("recipes.collabllm_rl")

local root = T.tmpdir()
local bin = os.getenv("CLRT_BIN") or arg[-1]
local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- The policy: a tiny random model (with embedding rows its tokenizer lacks, as Qwen2.5 has),
-- taught in a few steps to answer briefly and end its turn, so first responses go on to futures.
local policy_dir = require("support.tiny_model")(root .. "/policy", { seed = 5, extra_rows = 40 })
do
  local sft = require("clrt.sft")
  local m, tok = clrt.model.load(policy_dir), clrt.tokenizer.load(policy_dir)
  local convs = {}
  for i = 1, 16 do
    convs[i] = { { role = "user", content = "Write a card for my friend " .. i .. "." }, { role = "assistant", content = "ok" } }
  end
  sft.train(m, sft.encode(tok, convs, 256), nil, { steps = 30, batch_size = 16, lr = 1e-2, seed = 1 })
  m:save(policy_dir)
end

local reqlog = root .. "/requests.jsonl"
-- (its stderr to a file: the killed runs' dropped connections print tracebacks there)
local p = assert(io.popen(("/usr/bin/python3 %s/tests/support/fake_collab_endpoint.py %s --lifetime 600 --delay-ms 20 2> %s")
  :format(T.source_dir(), reqlog, root .. "/endpoint.err")))
local port, pid = (p:read("*l") or ""):match("^(%d+) (%d+)$")
T.cleanup(function() if pid then os.execute("kill " .. pid .. " 2>/dev/null") end p:close() end)
assert(port, "the fake endpoint did not start")
local url = ("http://127.0.0.1:%s/v1"):format(port)

local STEPS = 3   -- step 3 samples from version 1: the schedule moves past the start
local function args(dir)
  return { "model=" .. policy_dir, "run_dir=" .. dir, "steps=" .. STEPS, "seed=7", "prompts_per_step=2", "rollout.n=4",
    "rollout.num_repeat_rollouts=2", "rollout.max_user_turns=2", "rollout.max_new_tokens=8", "rollout.temperature=1",
    "sim=llm", "sim_cfg.base_url=" .. url, "sim_cfg.model=fake", "sim_cfg.max_tokens=160",
    "judge.base_url=" .. url, "judge.model=fake", "sim_cfg.max_concurrency=16", "judge.max_concurrency=16",
    'reward.metric_weights={"accuracy":1,"interactivity":1,"token_amount":-0.0001}',
    "eval.before=false", "eval.after=false", "save_every=1", "sample_every=1",
    "train.async.max_off_policy_steps=1" }
end

-- metrics rows without what the clock decides (durations, rates) and what the run folder's
-- reply cache saved (api/*: calls answered from the cache cost no tokens; a killed run has
-- cached some of the replies its resumed run asks again), by step; prefix_cache_hit_rate
-- too: which turns find their prefix cached follows the HTTP timing (and a resumed run starts
-- with an empty cache), while the tokens served are the same bits (test_prefix_cache)
local CLOCK = { tokens_per_s = true, elapsed = true, http_attempts = true, prefix_cache_hit_rate = true }
local function metrics(dir)
  local out = {}
  for _, r in ipairs(data.read_jsonl(dir .. "/metrics.jsonl")) do
    local c = {}
    for k, v in pairs(r) do
      if not (CLOCK[k] or k:find("^time") or k:find("_s$") or k:find("^api/")) then c[k] = v end
    end
    T.ok(out[r.step] == nil, "metrics.jsonl has step " .. r.step .. " once")
    out[r.step] = c
  end
  return out
end

local function final_params(dir)
  local latest = (T.read(dir .. "/latest") or ""):gsub("%s+$", "")
  T.eq(latest, "checkpoint-" .. STEPS, dir .. ": the last step's checkpoint")
  local bytes = T.read(dir .. "/" .. latest .. "/model.safetensors")
  T.ok(bytes and #bytes > 1000, "a model file")
  return bytes
end

local function same_run(dir, want, what)
  local got = metrics(dir)
  for step = 1, STEPS do
    local differ = {}
    for k, v in pairs(want.metrics[step]) do if not T.deep_eq(got[step] and got[step][k], v) then differ[#differ + 1] = k end end
    table.sort(differ)
    T.eq(got[step], want.metrics[step], what .. ": metrics of step " .. step .. " (differ: " .. table.concat(differ, ", ") .. ")")
  end
  T.eq(data.read_jsonl(dir .. "/samples.jsonl"), want.samples, what .. ": samples")
  T.ok(final_params(dir) == want.params, what .. ": final parameters bit for bit")
end

local first
T.case("K = 1: two runs with the same seed and an HTTP user that answers in random order: the same run", function()
  local dir1, dir2 = root .. "/run1", root .. "/run2"
  local t0 = clrt.log.now()
  rl.main(config.parse(rl.defaults, args(dir1)))
  first = { metrics = metrics(dir1), samples = data.read_jsonl(dir1 .. "/samples.jsonl"), params = final_params(dir1),
    wall = clrt.log.now() - t0 }
  -- the run did what the claim is about: futures over HTTP, rewards that differ
  local spread = 0
  for step = 1, STEPS do
    local r = first.metrics[step]
    T.ok(r.http_calls and r.http_calls > 0, "step " .. step .. " called the user and judges over HTTP")
    T.eq(r.dropped, 0, "step " .. step .. ": no sample dropped")
    spread = math.max(spread, r.advantage_std or 0)
  end
  T.ok(spread > 0, "rewards differ within groups")
  -- the schedule: step s sampled from the weights after update max(0, s - 2), one update old
  -- from step 2 on, and the mismatch it left is logged
  local rows = {}
  for _, r in ipairs(data.read_jsonl(dir1 .. "/metrics.jsonl")) do rows[r.step] = r end
  for step = 1, STEPS do
    T.eq(rows[step]["async/policy_version"], math.max(0, step - 2), "step " .. step .. "'s policy version")
    T.eq(rows[step]["async/age_max"], step == 1 and 0 or 1, "step " .. step .. "'s age")
    T.ok(rows[step]["tis/mismatch_kl"] ~= nil and rows[step]["tis/weight_mean"] ~= nil, "step " .. step .. "'s mismatch")
  end
  T.ok(math.abs(rows[3]["tis/logp_mismatch"]) > 1e-4, "step 3 trains weights one update past its rollouts': "
    .. tostring(rows[3]["tis/logp_mismatch"]))
  T.ok(not files.exists(dir1 .. "/async"), "a finished run leaves no async/ folder")
  rl.main(config.parse(rl.defaults, args(dir2)))
  same_run(dir2, first, "second run")
end)

-- Run `cmd` in the background and kill -9 it `delay` seconds after `after` (a file) exists,
-- or after it started when `after` is nil; true when it finished before the kill.
local function run_and_kill(cmd, delay, after)
  local wait = after and ("while [ ! -e %s ] && kill -0 $pid 2>/dev/null; do sleep 0.02; done; "):format(q(after)) or ""
  local rc = os.execute(("%s > %s/out.log 2>&1 & pid=$!; %ssleep %.3f; kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null")
    :format(cmd, root, wait, delay))
  return rc == 0 or rc == true
end

T.case("K = 1: kill -9 at random moments, then resume=: the uninterrupted run bit for bit", function()
  if not first then T.skip("the uninterrupted run failed") end
  math.randomseed(os.time())
  local per_step = first.wall / STEPS
  -- Kill anywhere in the run (start-up, a step, a checkpoint being written), then somewhere
  -- in the step after the first checkpoint, so that resume= starts from a checkpoint. A
  -- loaded machine may finish that step before the kill: then again in a new folder, sooner.
  local dir
  for attempt = 1, 6 do
    dir = ("%s/killed%d"):format(root, attempt)
    local start = { q(bin), "recipes/collabllm_rl.lua" }
    for _, a in ipairs(args(dir)) do start[#start + 1] = q(a) end
    start = table.concat(start, " ")
    local resume = table.concat({ q(bin), "recipes/collabllm_rl.lua", q("resume=" .. dir) }, " ")
    local function next_cmd() return files.exists(dir .. "/config.json") and resume or start end
    local done = run_and_kill(next_cmd(), 0.2 + math.random() * first.wall)
    if not done then
      done = run_and_kill(next_cmd(), math.random() * per_step / 2 ^ attempt, dir .. "/checkpoint-1/trainer_state.json")
    end
    -- a kill after the last checkpoint (the run was closing) left nothing to resume either
    if not done and not files.exists(dir .. "/checkpoint-" .. STEPS) then break end
    io.write(("  attempt %d: the run finished before the kill; again, sooner\n"):format(attempt))
  end
  T.ok(files.exists(dir .. "/latest") and not files.exists(dir .. "/checkpoint-" .. STEPS),
    "the last kill came after a checkpoint and before the end: resume= starts from it; the killed run's output: "
      .. tostring(T.read(root .. "/out.log")))
  local rc = os.execute(("%s > %s/out.log 2>&1"):format(table.concat({ q(bin), "recipes/collabllm_rl.lua", q("resume=" .. dir) }, " "), root))
  T.ok(rc == 0 or rc == true, "the last resume finishes: " .. tostring(T.read(root .. "/out.log")))
  same_run(dir, first, "killed and resumed")
end)

T.case("a rollout worker that dies is one line naming it, and the run fails", function()
  local dir = root .. "/worker_dies"
  local cmd = { q(bin), "recipes/collabllm_rl.lua" }
  for _, a in ipairs(args(dir)) do cmd[#cmd + 1] = q(a) end
  -- the worker is killed as soon as it has started
  local rc = os.execute(("(%s > %s/dies.log 2>&1; echo $? > %s/dies.rc) & while [ ! -e %s ]; do sleep 0.02; done; "
    .. "sleep 0.3; pkill -9 -f %s; wait"):format(table.concat(cmd, " "), root, root, q(dir .. "/async/worker.log"),
    q("[a]sync_worker=" .. dir)))   -- [a]: the pattern does not match this shell's own command line
  T.ok(rc == 0 or rc == true, "the shell ran")
  local out = T.read(root .. "/dies.log") or ""
  T.ok(tonumber((T.read(root .. "/dies.rc") or ""):match("%d+")) ~= 0, "the run exits non-zero: " .. out)
  T.ok(out:find("the rollout worker stopped before step", 1, true), "the error names the worker: " .. out)
  T.ok(not out:find("stack traceback", 1, true), "no traceback: " .. out)
end)

T.run()
