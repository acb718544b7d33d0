-- Asynchronous RL (train.async.max_off_policy_steps, clrt.train.async): with K = 1 the
-- rollouts of step s sample from the weights after update s - 2 in a worker process while the
-- steps before train, and the run still repeats bit for bit. collabllm_rl with the simulated
-- user and both judges on a local endpoint whose replies depend only on each request and
-- come after random delays (tests/support/fake_collab_endpoint.py, as test_reproducible_rl):
--   two runs with one seed: identical metrics, samples and final parameters; each step's
--   policy version as the schedule says, its mismatch logged, no async/ folder left;
--   kill -9 at random moments, then resume=: the uninterrupted run's metrics, samples and
--   final parameters, bit for bit;
--   a worker killed under the run: the run fails with one line naming it;
--   train.algorithm=ppo (the value head trains on the update's weights) and LoRA (each
--   version an adapter over the start) under K = 1: two runs the same bit for bit;
--   a budget stop (budget.max_usd) under K = 1: one line says what was made ahead and what was
--   discarded, and resume= with a higher budget ends as the uninterrupted run, bit for bit,
--   every request the endpoint answered billed.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local data = require("clrt.data")
local files = require("clrt.files")
local config = require("clrt.config")
local rl = require("recipes.collabllm_rl")

local root = T.tmpdir()
-- 3 steps: step 3 samples from version 1, so the schedule moves past the start
-- (no embedding rows past the tokenizer: the sampler leaves those out and renormalises, so
-- with them the rollout's log-probabilities differ from the trained policy's by their mass
-- even at age 0, and the mismatch could not show the age)
local R = require("support.rl_repeat").new(T, root, { steps = 3, extra = { "train.async.max_off_policy_steps=1" },
  extra_rows = 0 })
local q = require("support.rl_repeat").quote

local first
T.case("K = 1: two runs with the same seed and an HTTP user that answers in random order: the same run", function()
  first = R.run_twice(function(args) rl.main(config.parse(rl.defaults, args)) end, function(dir)
    -- the schedule: step s sampled from the weights after update max(0, s - 2), one update old
    -- from step 2 on, and the mismatch it left is logged
    local rows = {}
    for _, r in ipairs(data.read_jsonl(dir .. "/metrics.jsonl")) do rows[r.step] = r end
    for step = 1, R.steps do
      T.eq(rows[step]["async/policy_version"], math.max(0, step - 2), "step " .. step .. "'s policy version")
      T.eq(rows[step]["async/age_max"], step == 1 and 0 or 1, "step " .. step .. "'s age")
      T.ok(rows[step]["tis/mismatch_kl"] ~= nil and rows[step]["tis/weight_mean"] ~= nil, "step " .. step .. "'s mismatch")
    end
    -- step 1 trains the weights that sampled it (age 0): only rounding between the worker's
    -- engine and the update's forward; step 3 trains weights one update past its rollouts'
    T.ok(rows[1]["tis/logp_mismatch"] < 1e-5, "step 1's rollouts from the trained weights: " .. tostring(rows[1]["tis/logp_mismatch"]))
    -- (measured: 1.5e-7 at step 1, 2.7e-5 and 8.7e-5 at steps 2 and 3)
    for step = 2, 3 do
      T.ok(rows[step]["tis/logp_mismatch"] > 1e-5 and rows[step]["tis/logp_mismatch"] > 50 * rows[1]["tis/logp_mismatch"],
        "step " .. step .. " trains weights one update past its rollouts': " .. tostring(rows[step]["tis/logp_mismatch"]))
    end
    T.ok(not files.exists(dir .. "/async"), "a finished run leaves no async/ folder")
  end)
end)

T.case("K = 1: kill -9 at random moments, then resume=: the uninterrupted run bit for bit", function()
  if not first then T.skip("the uninterrupted run failed") end
  R.kill_and_resume(first)
end)

-- stop_after=2: step 3 samples from version 1, made in the first invocation; it is kept for
-- the resume (and the version before it until no step needs it)
T.case("K = 1: stop_after=, then resume=: the uninterrupted run bit for bit", function()
  if not first then T.skip("the uninterrupted run failed") end
  local dir = root .. "/stop_after"
  local args = R.args(dir)
  args[#args + 1] = "stop_after=2"
  rl.main(config.parse(rl.defaults, args))
  T.ok(files.exists(dir .. "/async/policy-v1"), "the version step 3 samples from is kept")
  rl.main(rl.parse_args({ "resume=" .. dir }))
  R.same_run(dir, first, "stopped after step 2 and resumed")
end)

T.case("a rollout worker that dies is one line naming it, and the run fails", function()
  local dir = root .. "/worker_dies"
  local cmd = { q(R.bin), "recipes/collabllm_rl.lua" }
  for _, a in ipairs(R.args(dir)) do cmd[#cmd + 1] = q(a) end
  -- the worker is killed as soon as it has started ([a]: the pattern does not match this
  -- shell's own command line)
  local rc = os.execute(("(%s > %s/dies.log 2>&1; echo $? > %s/dies.rc) & while [ ! -e %s ]; do sleep 0.02; done; "
    .. "sleep 0.3; pkill -9 -f %s; wait"):format(table.concat(cmd, " "), root, root, q(dir .. "/async/worker.log"),
    q("[a]sync_worker=" .. dir)))
  T.ok(rc == 0 or rc == true, "the shell ran")
  local out = T.read(root .. "/dies.log") or ""
  T.ok(tonumber((T.read(root .. "/dies.rc") or ""):match("%d+")) ~= 0, "the run exits non-zero: " .. out)
  T.ok(out:find("the rollout worker stopped before step", 1, true), "the error names the worker: " .. out)
  T.ok(not out:find("stack traceback", 1, true), "no traceback: " .. out)
end)

-- train.algorithm=ppo and LoRA: the same schedule; each its own world (policy, endpoint)
for _, c in ipairs({ { name = "ppo", extra = { "train.algorithm=ppo" }, spread_key = "returns/var" },
                     { name = "lora", extra = { "train.lora.r=4", "train.lr=1e-2" } } }) do
  T.case(c.name .. ", K = 1: two runs with the same seed: the same run, each step from the version the schedule says", function()
    local extra = { "train.async.max_off_policy_steps=1" }
    for _, x in ipairs(c.extra) do extra[#extra + 1] = x end
    local R2 = require("support.rl_repeat").new(T, root .. "/" .. c.name, { steps = 3, extra = extra, spread_key = c.spread_key })
    R2.run_twice(function(args) rl.main(config.parse(rl.defaults, args)) end, function(dir)
      local rows = {}
      for _, r in ipairs(data.read_jsonl(dir .. "/metrics.jsonl")) do rows[r.step] = r end
      for step = 1, R2.steps do T.eq(rows[step]["async/policy_version"], math.max(0, step - 2), "step " .. step .. "'s version") end
      T.ok(rows[3]["tis/logp_mismatch"] > 0, "the mismatch is logged: " .. tostring(rows[3]["tis/logp_mismatch"]))
      if c.name == "ppo" then T.ok(type(rows[3]["value/loss"]) == "number", "the value head trains") end
      if c.name == "lora" then
        T.ok(files.exists(dir .. "/checkpoint-3/adapter_model.safetensors"), "a LoRA run's checkpoint is an adapter")
      end
    end)
  end)
end

-- A budget stop under K = 1 after step 1, with the worker ahead (step 2 made or in progress,
-- perhaps step 3 begun: the timing decides which, and the line says which), then resume=.
T.case("a budget stop under K = 1 says what was made ahead and discarded; resume= ends as the uninterrupted run", function()
  local price = { 'sim_cfg.price={"input":1,"output":2}', 'judge.price={"input":1,"output":2}' }
  local extra = { "train.async.max_off_policy_steps=1" }
  for _, x in ipairs(price) do extra[#extra + 1] = x end
  local broot = root .. "/budget"
  local R3 = require("support.rl_repeat").new(T, broot, { steps = 3, extra = extra })
  local function cli(dir, more)
    local cmd = { q(R3.bin), "recipes/collabllm_rl.lua" }
    for _, a in ipairs(more or R3.args(dir)) do cmd[#cmd + 1] = q(a) end
    local rc = os.execute(("%s > %s/cli.log 2>&1"):format(table.concat(cmd, " "), broot))
    return rc == 0 or rc == true, T.read(broot .. "/cli.log") or ""
  end
  local function sent() return #data.read_jsonl(broot .. "/requests.jsonl") end
  local dir = broot .. "/stopped"
  local args = R3.args(dir)
  args[#args + 1] = "budget.max_usd=0.000000001"
  local ok, out = cli(dir, args)
  local stop_out = out
  T.ok(not ok, "the run stops with a non-zero exit: " .. out)
  T.ok(out:find("budget.max_usd=1e-09 reached", 1, true), out)
  T.eq(T.read(dir .. "/latest"), "checkpoint-1\n", "a checkpoint of the step it stopped after")
  local n, usd = out:match("train%.async: the rollouts of (%d+) steps? made ahead are kept for the resume %(%$([%d.]+) paid")
  T.ok(n or out:find("train.async: no step's rollouts were made ahead", 1, true), "the stop says what was made ahead: " .. out)
  io.write("  ", out:match("train%.async: [^\n]*"), "\n")
  if n then
    T.ok(tonumber(n) >= 1 and tonumber(n) <= 2, "at most steps 2 and 3 were made ahead: " .. out)
    T.ok(tonumber(usd) > 0, "what they cost: " .. out)
  end
  if out:find("in progress, are discarded", 1, true) then
    T.ok(out:find("step [23]'s, in progress, are discarded %(the resume makes them again%): %d+ API calls? %(%$[%d.]+%) billed to this run"),
      "the step in progress and its calls: " .. out)
  end
  T.ok(files.exists(dir .. "/async"), "what was made ahead is kept in RUN/async")
  ok, out = cli(dir, { "resume=" .. dir, "budget.max_usd=1000" })
  T.ok(ok, "resume= with a higher budget finishes: " .. out)
  T.ok(not files.exists(dir .. "/async"), "a finished run leaves no async/ folder")
  -- every request the endpoint answered for the run is billed once (a request the stop cut
  -- short in flight reached the endpoint but never came back: it cannot be more)
  local summary = require("clrt.json").decode(T.read(dir .. "/summary.json"))
  local billed = summary.api.all.calls - summary.api.all.cache_hits
  local answered = sent()
  T.ok(billed <= answered, ("billed %d of the %d requests sent"):format(billed, answered))
  T.ok(summary.api.all.usd > 0, "priced")
  -- the uninterrupted run (its requests come after these) trained on the same entries
  local udir = broot .. "/uninterrupted"
  ok, out = cli(udir)
  T.ok(ok, out)
  local want = R3.record(udir, 0)
  R3.same_run(dir, want, "stopped by the budget and resumed")
  local u = require("clrt.json").decode(T.read(udir .. "/summary.json"))
  local function roles(x)
    local parts = {}
    for r, t in pairs(x.api.roles) do parts[#parts + 1] = ("%s %d-%d"):format(r, t.calls, t.cache_hits) end
    table.sort(parts)
    return table.concat(parts, ", ")
  end
  T.ok(billed >= u.api.all.calls - u.api.all.cache_hits, ("the stopped run billed %d requests, the uninterrupted one %d")
    :format(billed, u.api.all.calls - u.api.all.cache_hits) .. " (calls - cache hits per role: " .. roles(summary) .. "; "
      .. roles(u) .. "); the stop: " .. stop_out)
end)

T.run()
