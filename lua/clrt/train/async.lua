-- clrt.train.async — asynchronous RL (train.async.max_off_policy_steps = K > 0): the
-- rollouts of steps t+1 .. t+K are generated, simulated and scored while step t trains.
--
-- A rollout worker (this recipe again, as its own process: its own copy of the weights, its
-- own threads, its own HTTP) makes each step's entries; the trainer publishes weight versions
-- and trains on the entries as they come. The schedule, not timing, decides everything:
--   version v       the weights after v optimizer steps (0: the start)
--   step s          samples from version max(0, s - 1 - K), never more than K updates old
-- so step s's entries can exist only once update s - 1 - K is done: the worker is at most K
-- steps ahead, and with the same seed, K and a simulator whose replies depend only on the
-- request two runs give the same entries, the same weights and the same metrics bit for bit
-- (docs/reproducibility.md). Every file is written atomically in RUN/async/:
--   policy-v<N>/        version N (a model folder, or a LoRA adapter over the start), made
--                       by the trainer after update N when a later step samples from it; the
--                       worker removes it after the last step that needs it
--   entries-<s>.json    step s's entries (clrt.train.entry.portable), the version that
--                       sampled them, the worker's request counts and clrt.llm records (the
--                       step's bill); the trainer removes them once a checkpoint covers them
--   worker.json         what the worker runs (the start folder, its steps), beside
--   worker_config.json  the run's resolved config
--   worker.log          the worker's output
--   discarded.json      the step the worker was rolling out when it was stopped, and the API
--                       calls it had made for it: the trainer bills them (money spent) and
--                       removes the file
-- A resumed run (after Ctrl-C, kill -9 or a budget stop) finds the entries and versions the
-- steps after its checkpoint need, and the worker picks up where the files end: nothing is
-- generated twice and nothing is lost.
--
--   local A = async.start{ cfg, run_dir, model, start_dir, first, last, script }   -- nil when K = 0
--   entries, timing = A:entries(step, samples)     -- waits for step's entries
--   A:trained(step, model)                         -- publishes version `step` if a step needs it
--   A:checkpointed(step)                           -- the entries up to step may go
--   A:stop(finished, lg)                           -- ends the worker (finished: removes async/)
local ffi = require("ffi")
local files = require("clrt.files")
local json = require("clrt.json")
local llm = require("clrt.llm")
local entry = require("clrt.train.entry")
local M = {}

pcall(ffi.cdef, "int getppid(void);")
pcall(ffi.cdef, "extern char **environ;")

-- train.async's settings and their rules, one copy for every recipe that rolls out
-- (collabllm_rl, collabllm_dpo online=true).
function M.config()
  return { max_off_policy_steps = 0,   -- K; 0: every step's rollouts from the current weights (verl, TRL sync)
    correction = "tis",                -- "tis": token weights min(pi_old / pi_rollout, tis_cap) (verl's TIS);
                                       -- "sequence_mask": TRL's default mode; "none" (DPO trains no ratio: unused)
    seq_cap = 3,                       -- sequence_mask: rows above it left out (TRL vllm_importance_sampling_cap 3.0)
    rollout_threads = 0 }              -- the worker's threads (0: all cores, idle threads passive: suits 2 cores)
end
M.rules = { { "train.async.max_off_policy_steps", "count0" },
  { "train.async.correction", "one_of", { "tis", "sequence_mask", "none" } },
  { "train.async.seq_cap", "rate" }, { "train.async.rollout_threads", "count0" } }

-- The version step s samples from.
function M.version_for(s, K) return math.max(0, s - 1 - K) end

local function dir_of(run_dir) return run_dir .. "/async" end
local function version_dir(run_dir, v) return ("%s/policy-v%d"):format(dir_of(run_dir), v) end
local function entries_path(run_dir, s) return ("%s/entries-%d.json"):format(dir_of(run_dir), s) end

local function sleep(s) require("clrt.net.http").sleep(s) end

-- This process's environment, for the worker (clrt.proc passes nothing by itself): API keys,
-- CLRT_* settings and the rest, with the worker's thread setting over them.
local function environment(threads)
  local env, i = {}, 0
  while ffi.C.environ[i] ~= nil do
    local kv = ffi.string(ffi.C.environ[i])
    if not kv:match("^OMP_NUM_THREADS=") and not kv:match("^OMP_WAIT_POLICY=") then env[#env + 1] = kv end
    i = i + 1
  end
  if threads > 0 then env[#env + 1] = "OMP_NUM_THREADS=" .. threads end
  -- idle worker threads give their cores back to the update (and the update's to the worker)
  env[#env + 1] = "OMP_WAIT_POLICY=passive"
  return env
end

-- Version v of the policy into RUN/async/policy-v<v>/, whole or not at all.
local function publish(run_dir, v, m, start_dir)
  local dir = version_dir(run_dir, v)
  if files.exists(dir) then return end
  local tmp = dir .. ".tmp"
  if files.exists(tmp) then files.remove_tree(tmp) end
  files.mkdir_p(tmp)
  if m.lora then m:save_adapter(tmp, { base = start_dir }) else m:save(tmp) end
  files.rename(tmp, dir)
end

local Async = {}
Async.__index = Async

-- o: cfg, run_dir, model, start_dir, first (the first step this invocation trains), last,
-- script (the recipe's path: the worker runs it with async_worker=RUN), ctx (the run's: its
-- spend ledger bills what the worker spent on a step it did not finish).
function M.start(o)
  local A = o.cfg.train.async
  local K = A and A.max_off_policy_steps or 0
  if K == 0 or o.first > o.last then return nil end
  if require("clrt.dist").world_size() > 1 then
    error(o.who .. ": train.async.max_off_policy_steps > 0 runs on one rank for now; run without mpirun, or with max_off_policy_steps=0", 0)
  end
  local dir = dir_of(o.run_dir)
  files.mkdir_p(dir)
  for _, n in ipairs(files.list(dir)) do   -- what a kill left half-written
    if n:match("%.tmp$") or n:match("%.tmp%.%d+$") then files.remove_tree(dir .. "/" .. n) end
  end
  local self = setmetatable({ K = K, run_dir = o.run_dir, start_dir = o.start_dir, first = o.first, last = o.last,
    who = o.who, cfg = o.cfg, ctx = o.ctx }, Async)
  -- the current weights are version first - 1; the first steps' older versions are on disk
  -- from before (a resume), or it is version 0
  self:trained(o.first - 1, o.model)
  for s = o.first, o.last do
    local v = M.version_for(s, K)   -- versions before the current weights are published no more
    if v < o.first - 1 and not files.exists(entries_path(o.run_dir, s)) and not files.exists(version_dir(o.run_dir, v)) then
      error(("%s: train.async: step %d needs policy version %d, which %s no longer holds (and its entries were not " ..
        "kept); resume with the same train.async.max_off_policy_steps"):format(o.who, s, v, dir), 0)
    end
  end
  files.write_atomic(dir .. "/worker_config.json", require("clrt.config").dump(o.cfg))
  files.write_atomic(dir .. "/worker.json", json.encode({ start_dir = o.start_dir, first = o.first, last = o.last }))
  local bin = arg and arg[-1] or "clrt"
  self.proc = require("clrt.proc").spawn{ argv = { bin, o.script, "async_worker=" .. o.run_dir },
    env = environment(A.rollout_threads or 0), fds = { [1] = { path = dir .. "/worker.log", write = true }, [2] = 1 } }
  return self
end

-- After update `step` (or at the start, step = first - 1): version `step` for the steps that
-- sample from it.
function Async:trained(step, m)
  self.done = step
  local needed = false
  for s = math.max(self.first, step + 1), self.last do
    if M.version_for(s, self.K) == step and not files.exists(entries_path(self.run_dir, s)) then needed = true end
  end
  if needed then publish(self.run_dir, step, m, self.start_dir) end
end

-- Step s's entries, once the worker wrote them: from the portable form, with the step's
-- samples; the worker's request counts and records join this process's (the step's row and
-- the bill). timing: the worker's, and wait_s (how long the trainer waited for them).
function Async:entries(step, samples, ctx)
  local path, t0 = entries_path(self.run_dir, step), require("clrt.log").now()
  while not files.exists(path) do
    require("clrt.core.interrupt").check()
    if self.proc:poll() then
      local log = files.read(dir_of(self.run_dir) .. "/worker.log") or ""
      local last = log:match("([^\n]+)\n*$") or "no output"
      error(("%s: train.async: the rollout worker stopped before step %d's rollouts: %s (its log: %s/worker.log)")
        :format(self.who, step, last, dir_of(self.run_dir)), 0)
    end
    sleep(0.01)
  end
  local got = json.decode(files.read(path), path)
  local out = {}
  for i, p in ipairs(got.entries) do
    local e = entry.from_portable(M.strip_nulls(p), samples[p.group])
    e.policy_version = got.version
    out[i] = e
  end
  if ctx and ctx.counters then
    for k, n in pairs(got.counters or {}) do ctx.counters[k] = (ctx.counters[k] or 0) + n end
  end
  llm.add_records(M.strip_nulls(got.calls or {}))
  local timing = M.strip_nulls(got.timing or {})
  timing.async_wait_s = require("clrt.log").now() - t0
  return out, timing, got.version
end

-- A checkpoint of `step` is complete: the entries of steps up to the oldest checkpoint kept
-- (save_keep) are trained and saved; a resume that finds the newest one damaged starts from
-- an older one and needs the entries after it.
function Async:checkpointed(step)
  local oldest = step
  for _, n in ipairs(files.list(self.run_dir)) do
    local c = tonumber(n:match("^checkpoint%-(%d+)$"))
    if c and c < oldest then oldest = c end
  end
  for s = 1, oldest do
    local p = entries_path(self.run_dir, s)
    if files.exists(p) then os.remove(p) end
  end
end

-- The worker ends; a finished run (every step trained) needs nothing in async/ any more.
-- A run that stops early (a budget stop, Ctrl-C, a failure) keeps what was made ahead for its
-- resume: the worker is asked to stop (SIGTERM; killed after 10 s), the API calls of the step
-- it had in progress are billed to the run (they were paid; the resume makes that step again),
-- and lg says both. Once only: a second call does nothing.
function Async:stop(finished, lg)
  if self.stopped then return end
  self.stopped = true
  if self.proc and not self.proc:poll() then
    if finished then self.proc:kill()
    else
      self.proc:signal(15)
      local t0 = require("clrt.log").now()
      while not self.proc:poll() and require("clrt.log").now() - t0 < 10 do sleep(0.02) end
      if not self.proc:poll() then self.proc:kill() end
    end
  end
  if finished then files.remove_tree(dir_of(self.run_dir)) return end
  local dpath = dir_of(self.run_dir) .. "/discarded.json"
  local discarded = files.exists(dpath) and json.decode(files.read(dpath), dpath)
  local calls, usd = 0, 0
  if discarded then
    local records = M.strip_nulls(discarded.calls or {})
    calls = #records
    local spend = self.ctx and self.ctx.spend
    if spend then
      local sum = spend:add(records, true)
      usd = sum and sum.all and sum.all.usd or 0
    else
      llm.add_records(records)
    end
    os.remove(dpath)
  end
  if lg then
    local ahead = 0
    for _, n in ipairs(files.list(dir_of(self.run_dir))) do
      local s = tonumber(n:match("^entries%-(%d+)%.json$"))
      if s and s > self.done then ahead = ahead + 1 end
    end
    local line = ("train.async: the rollouts of %d step%s made ahead are kept for the resume"):format(ahead, ahead == 1 and "" or "s")
    if discarded then
      line = line .. ("; step %d's, in progress, are discarded (the resume makes them again): its %d API call%s ($%.4f) "
        .. "are billed to this run"):format(discarded.step, calls, calls == 1 and "" or "s", usd)
    end
    lg:print(line)
  end
end

-- JSON null where a value was absent: back to nil, recursively.
function M.strip_nulls(v)
  if type(v) ~= "table" then return v end
  for k, x in pairs(v) do
    if x == json.null then v[k] = nil else M.strip_nulls(x) end
  end
  return v
end

-- The step's figures of the schedule: how old the trained entries' policy was (in updates
-- behind the weights being trained), which version sampled them, the wait.
function M.row(row, entries, step, timing)
  local age_sum, age_max, n = 0, 0, 0
  for _, e in ipairs(entries) do
    if e.policy_version then
      local age = (step - 1) - e.policy_version
      age_sum, age_max, n = age_sum + age, math.max(age_max, age), n + 1
    end
  end
  if n > 0 then row["async/age_mean"], row["async/age_max"] = age_sum / n, age_max end
  row["async/policy_version"] = entries[1] and entries[1].policy_version or nil
  row["async/wait_s"] = timing.async_wait_s
  return row
end

-- ---- the worker ---------------------------------------------------------------------------------

-- A recipe's worker (its async_worker=RUN entry): each version's policy and what the rollouts
-- read besides it, made as the recipe's run makes them. who: the recipe's name; world(): the
-- built-in world module.
function M.recipe_worker(run_dir, who, world)
  local train = require("clrt.train")
  local reward, prompts = train.reward, train.prompts
  local function load_policy(cfg, start_dir, version_dir)
    local m = train.lora.policy(start_dir, version_dir, cfg.train.lora, cfg.seed, cfg.adapter, cfg.train.base_dtype)
    if cfg.device ~= "cpu" then m:to(cfg.device) end
    m:set_batch_invariant(cfg.rollout.batch_invariant)
    require("clrt.gen.prefix_cache").configure(m, { mb = cfg.rollout.prefix_cache_mb })
    train.lora.set_precision(m, cfg.train.precision, who)
    if cfg.rollout.quant == "int8" then m:set_quant("int8") end
    return m
  end
  local function setup(cfg, m, start_dir)
    local tok = require("clrt.tokenizer").load(start_dir)
    local dataset = prompts.load_sets(m, tok, cfg, who)
    local metrics = reward.load_metrics(cfg.reward.metric_weights, cfg.reward.metric_options)
    if dataset then dataset = reward.check_samples(metrics, dataset, cfg.reward.metric_options, function() end) end
    local ctx, user = train.context{ config = cfg, tokenizer = tok, who = who }
    return { world = world(), tok = tok, dataset = dataset, metrics = metrics, ctx = ctx, user = user }
  end
  M.worker(run_dir, load_policy, setup, prompts.step_prompts)
end

-- The worker's loop (the recipe calls it for async_worker=RUN): for each step, wait for the
-- version it samples from, load it when it differs from the one held, roll out, write the
-- entries. setup(cfg, m, start_dir) gives what the rollouts read besides the policy: {tok, world,
-- dataset, metrics, ctx, user}. It ends when its parent (the trainer) is gone.
function M.worker(run_dir, load_policy, setup, step_prompts)
  local dir = dir_of(run_dir)
  local job = json.decode(files.read(dir .. "/worker.json"), dir .. "/worker.json")
  local cfg = require("clrt.config").load(dir .. "/worker_config.json")
  local K = cfg.train.async.max_off_policy_steps
  local parent = ffi.C.getppid()
  cfg.rollout.keep_logprobs = true
  local rollout = require("clrt.train.rollout")
  local m, held, env
  for s = job.first, job.last do
    if not files.exists(entries_path(run_dir, s)) then
      local v = M.version_for(s, K)
      local vdir = version_dir(run_dir, v)
      while not files.exists(vdir) do
        if ffi.C.getppid() ~= parent or require("clrt.core.interrupt").pressed() then return end   -- the trainer is gone or stops
        sleep(0.01)
      end
      if held ~= v then
        if m then m:free() end
        m = load_policy(cfg, job.start_dir, vdir)
        held = v
        env = env or setup(cfg, m, job.start_dir)
      end
      local samples = step_prompts(cfg, env.world, env.dataset, s)
      local ok, entries, timing = pcall(rollout.step, m, env.tok, cfg, samples, env.ctx, env.user, env.metrics, s)
      if not ok then
        -- stopped (SIGTERM, Ctrl-C) or failed mid-step: what this step's calls cost, for the bill
        files.write_atomic(dir .. "/discarded.json", json.encode({ step = s, calls = json.array(llm.drain_records()) }))
        error(entries, 0)
      end
      local portable = {}
      for i, e in ipairs(entries) do portable[i] = entry.portable(e, 0) end
      local counters = {}
      for k, n in pairs(env.ctx.counters or {}) do counters[k] = n; env.ctx.counters[k] = nil end
      files.write_atomic(entries_path(run_dir, s), json.encode({ step = s, version = v, entries = json.array(portable),
        counters = counters, calls = json.array(llm.drain_records()), timing = timing }))
    end
    -- the version no later step samples from goes
    local v = M.version_for(s, K)
    if s == job.last or M.version_for(s + 1, K) ~= v then
      local vdir = version_dir(run_dir, v)
      if files.exists(vdir) then files.remove_tree(vdir) end
    end
  end
end

return M
