-- support/rl_repeat.lua — what the repeat tests of collabllm_rl share (test_reproducible_rl,
-- test_async_rl): a tiny policy that ends its turns, the simulated user and both judges on a
-- local endpoint whose replies depend only on each request and come after random delays
-- (tests/support/fake_collab_endpoint.py), the run's command line, its metrics without what
-- the clock decides, and the comparison of a run with another bit for bit, killed and
-- resumed included.
--   local R = require("support.rl_repeat").new(T, root, { steps = 2, extra = {...} })
--   (spread_key: the row's figure that shows rewards differing, advantage_std by default)
--   (extra_rows: embedding rows past the tokenizer, 40 by default; the sampler never draws them)
--   local first = R.run_twice(function(args) ... end, check); R.kill_and_resume(first)
local data = require("clrt.data")
local files = require("clrt.files")
local M = {}

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
M.quote = q

-- metrics rows without what the clock decides (durations, rates) and what the run folder's
-- reply cache saved (api/*: calls answered from the cache cost no tokens; a killed run has
-- cached some of the replies its resumed run asks again), by step; prefix_cache_hit_rate
-- too: which turns find their prefix cached follows the HTTP timing (and a resumed run starts
-- with an empty cache), while the tokens served are the same bits (test_prefix_cache)
local CLOCK = { tokens_per_s = true, elapsed = true, http_attempts = true, prefix_cache_hit_rate = true }

function M.new(T, root, o)
  local R = { steps = o.steps, bin = os.getenv("CLRT_BIN") or arg[-1] }
  -- The policy: a tiny random model (with embedding rows its tokenizer lacks, as Qwen2.5
  -- has), taught in a few steps to answer briefly and end its turn, so first responses go on
  -- to futures.
  local policy_dir = require("support.tiny_model")(root .. "/policy", { seed = 5, extra_rows = o.extra_rows or 40 })
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
  -- (its stderr to a file: the killed runs' dropped connections print tracebacks there)
  local p = assert(io.popen(("/usr/bin/python3 %s/tests/support/fake_collab_endpoint.py %s --lifetime 600 --delay-ms 20 2> %s")
    :format(T.source_dir(), root .. "/requests.jsonl", root .. "/endpoint.err")))
  local port, pid = (p:read("*l") or ""):match("^(%d+) (%d+)$")
  T.cleanup(function() if pid then os.execute("kill " .. pid .. " 2>/dev/null") end p:close() end)
  assert(port, "the fake endpoint did not start")
  local url = ("http://127.0.0.1:%s/v1"):format(port)

  function R.args(dir)
    local a = { "model=" .. policy_dir, "run_dir=" .. dir, "steps=" .. R.steps, "seed=7", "prompts_per_step=2", "rollout.n=4",
      "rollout.num_repeat_rollouts=2", "rollout.max_user_turns=2", "rollout.max_new_tokens=8", "rollout.temperature=1",
      "sim=llm", "sim_cfg.base_url=" .. url, "sim_cfg.model=fake", "sim_cfg.max_tokens=160",
      "judge.base_url=" .. url, "judge.model=fake", "sim_cfg.max_concurrency=16", "judge.max_concurrency=16",
      'reward.metric_weights={"accuracy":1,"interactivity":1,"token_amount":-0.0001}',
      "eval.before=false", "eval.after=false", "save_every=1", "sample_every=1" }
    for _, x in ipairs(o.extra or {}) do a[#a + 1] = x end
    return a
  end

  function R.metrics(dir)
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

  function R.final_params(dir)
    local latest = (T.read(dir .. "/latest") or ""):gsub("%s+$", "")
    T.eq(latest, "checkpoint-" .. R.steps, dir .. ": the last step's checkpoint")
    -- (a LoRA run's checkpoint holds its adapter)
    local bytes = T.read(dir .. "/" .. latest .. "/model.safetensors") or T.read(dir .. "/" .. latest .. "/adapter_model.safetensors")
    T.ok(bytes and #bytes > 1000, "a model file")
    return bytes
  end

  -- A finished run's record, for same_run.
  function R.record(dir, wall)
    return { metrics = R.metrics(dir), samples = data.read_jsonl(dir .. "/samples.jsonl"), params = R.final_params(dir),
      wall = wall }
  end

  function R.same_run(dir, want, what)
    local got = R.metrics(dir)
    for step = 1, R.steps do
      local differ = {}
      for k, v in pairs(want.metrics[step]) do if not T.deep_eq(got[step] and got[step][k], v) then differ[#differ + 1] = k end end
      table.sort(differ)
      T.eq(got[step], want.metrics[step], what .. ": metrics of step " .. step .. " (differ: " .. table.concat(differ, ", ") .. ")")
    end
    T.eq(data.read_jsonl(dir .. "/samples.jsonl"), want.samples, what .. ": samples")
    T.ok(R.final_params(dir) == want.params, what .. ": final parameters bit for bit")
  end

  -- Two runs with the same seed through run(cfg_args): the first did what the claim is about
  -- (futures over HTTP, rewards that differ within groups), check(dir, record) looks at it
  -- further, the second is the same bit for bit. Returns the first's record.
  function R.run_twice(run, check)
    local dir1, dir2 = root .. "/run1", root .. "/run2"
    local t0 = clrt.log.now()
    run(R.args(dir1))
    local first = R.record(dir1, clrt.log.now() - t0)
    local spread = 0
    for step = 1, R.steps do
      local r = first.metrics[step]
      T.ok(r.http_calls and r.http_calls > 0, "step " .. step .. " called the user and judges over HTTP")
      T.eq(r.dropped, 0, "step " .. step .. ": no sample dropped")
      spread = math.max(spread, r[o.spread_key or "advantage_std"] or 0)
    end
    T.ok(spread > 0, "rewards differ within groups")
    if check then check(dir1, first) end
    run(R.args(dir2))
    R.same_run(dir2, first, "second run")
    return first
  end

  -- Run `cmd` in the background and kill -9 it `delay` seconds after `after` (a file) exists,
  -- or after it started when `after` is nil; true when it finished before the kill.
  local function run_and_kill(cmd, delay, after)
    local wait = after and ("while [ ! -e %s ] && kill -0 $pid 2>/dev/null; do sleep 0.02; done; "):format(q(after)) or ""
    local rc = os.execute(("%s > %s/out.log 2>&1 & pid=$!; %ssleep %.3f; kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null")
      :format(cmd, root, wait, delay))
    return rc == 0 or rc == true
  end

  -- Kill anywhere in the run (start-up, a step, a checkpoint being written), then somewhere
  -- in the step after the first checkpoint, so that resume= starts from a checkpoint. A
  -- loaded machine may finish that step before the kill: then again in a new folder, sooner.
  -- The last resume must end as `want`, the uninterrupted run.
  function R.kill_and_resume(want)
    math.randomseed(os.time())
    local per_step = want.wall / R.steps
    local dir
    for attempt = 1, 6 do
      dir = ("%s/killed%d"):format(root, attempt)
      local start = { q(R.bin), "recipes/collabllm_rl.lua" }
      for _, a in ipairs(R.args(dir)) do start[#start + 1] = q(a) end
      start = table.concat(start, " ")
      local resume = table.concat({ q(R.bin), "recipes/collabllm_rl.lua", q("resume=" .. dir) }, " ")
      local function next_cmd() return files.exists(dir .. "/config.json") and resume or start end
      local done = run_and_kill(next_cmd(), 0.2 + math.random() * want.wall)
      if not done then
        done = run_and_kill(next_cmd(), math.random() * per_step / 2 ^ attempt, dir .. "/checkpoint-1/trainer_state.json")
      end
      -- a kill after the last checkpoint (the run was closing) left nothing to resume either
      if not done and not files.exists(dir .. "/checkpoint-" .. R.steps) then break end
      io.write(("  attempt %d: the run finished before the kill; again, sooner\n"):format(attempt))
    end
    T.ok(files.exists(dir .. "/latest") and not files.exists(dir .. "/checkpoint-" .. R.steps),
      "the last kill came after a checkpoint and before the end: resume= starts from it; the killed run's output: "
        .. tostring(T.read(root .. "/out.log")))
    local rc = os.execute(("%s > %s/out.log 2>&1"):format(table.concat({ q(R.bin), "recipes/collabllm_rl.lua",
      q("resume=" .. dir) }, " "), root))
    T.ok(rc == 0 or rc == true, "the last resume finishes: " .. tostring(T.read(root .. "/out.log")))
    R.same_run(dir, want, "killed and resumed")
  end

  return R
end

return M
