-- clrt.train.async — asynchronous RL (train.async.max_off_policy_steps = K > 0): the
-- rollouts of steps t+1 .. t+K are generated, simulated and scored while step t trains.
--
-- A rollout worker (this recipe again, as its own process: its own copy of the weights, its
-- own threads, its own HTTP) makes each step's entries; the trainer publishes weight versions
-- and trains on the entries as they come. Under N data-parallel ranks (mpirun) each rank has
-- its own worker, which rolls out the rank's share of every step's prompts (the share the
-- rank would roll out itself: clrt.train.data_parallel), and its own folder,
-- RUN/async/rank-<r>-of-<N>/; the ranks exchange their entries as a synchronous step does.
-- The schedule, not timing, decides everything:
--   version v       the weights after v optimizer steps (0: the start)
--   step s          samples from version max(0, s - 1 - K), never more than K updates old
-- so step s's entries can exist only once update s - 1 - K is done: the worker is at most K
-- steps ahead, and with the same seed, K and a simulator whose replies depend only on the
-- request two runs give the same entries, the same weights and the same metrics bit for bit
-- (docs/reproducibility.md). Every file is written atomically in RUN/async/ (one rank):
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
-- A version is a whole copy of the weights (an adapter under LoRA) per rank's folder: with N
-- ranks N copies are on disk at a time.
--
--   local A = async.start{ cfg, run_dir, model, start_dir, first, last, script }   -- nil when K = 0
--   entries, timing = A:entries(step, samples)     -- waits for step's entries
--   A:trained(step, model)                         -- publishes version `step` if a step needs it
--   A:checkpointed(step)                           -- the entries up to step may go
--   A:stop(finished, lg, together)                 -- ends the worker (finished: removes async/);
--                                                  -- together: every rank calls it at this point
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

-- This rank's folder: RUN/async alone, RUN/async/rank-<r>-of-<N> under N ranks. The
-- functions below take it (the worker is given it), never the run folder.
local function dir_of(run_dir)
  local dist = require("clrt.dist")
  if dist.world_size() == 1 then return run_dir .. "/async" end
  return ("%s/async/rank-%d-of-%d"):format(run_dir, dist.rank(), dist.world_size())
end
local function version_dir(dir, v) return ("%s/policy-v%d"):format(dir, v) end
local function entries_path(dir, s) return ("%s/entries-%d.json"):format(dir, s) end

-- What RUN/async/ holds for a rank count other than this run's (a resume under another
-- mpirun -np): nil, or the count it was made for.
local function other_layout(run_dir)
  local dist = require("clrt.dist")
  local top = run_dir .. "/async"
  if not files.exists(top) then return nil end
  for _, n in ipairs(files.list(top)) do
    local size = tonumber(n:match("^rank%-%d+%-of%-(%d+)$"))
    if size and size ~= dist.world_size() then return size end
    if not size and dist.world_size() > 1 and (n:match("^entries%-") or n:match("^policy%-v")) then return 1 end
  end
  return nil
end

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
  -- under mpirun the worker inherits the launcher's variables but is no rank (clrt.dist)
  env[#env + 1] = "CLRT_DIST_CHILD=1"
  -- the trainer's SIGTERM stops it as Ctrl-C does: the step in progress is written off in
  -- discarded.json with the API calls it made (billed by the trainer)
  env[#env + 1] = "CLRT_SIGTERM=interrupt"
  if threads > 0 then env[#env + 1] = "OMP_NUM_THREADS=" .. threads end
  -- idle worker threads give their cores back to the update (and the update's to the worker)
  env[#env + 1] = "OMP_WAIT_POLICY=passive"
  return env
end

-- Version v of the policy into RUN/async/policy-v<v>/, whole or not at all.
local function publish(adir, v, m, start_dir)
  local dir = version_dir(adir, v)
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
  local dist = require("clrt.dist")
  local made_for = other_layout(o.run_dir)
  if made_for then
    error(("%s: train.async: %s/async holds the rollouts made ahead for %d rank%s; resume with as many ranks (%s)")
      :format(o.who, o.run_dir, made_for, made_for == 1 and "" or "s",
        made_for == 1 and "without mpirun" or "mpirun -np " .. made_for), 0)
  end
  local dir = dir_of(o.run_dir)
  files.mkdir_p(dir)
  for _, n in ipairs(files.list(dir)) do   -- what a kill left half-written
    if n:match("%.tmp$") or n:match("%.tmp%.%d+$") then files.remove_tree(dir .. "/" .. n) end
  end
  local self = setmetatable({ K = K, run_dir = o.run_dir, dir = dir, start_dir = o.start_dir, first = o.first,
    last = o.last, who = o.who, cfg = o.cfg, ctx = o.ctx }, Async)
  -- the current weights are version first - 1; the first steps' older versions are on disk
  -- from before (a resume), or it is version 0
  self:trained(o.first - 1, o.model)
  for s = o.first, o.last do
    local v = M.version_for(s, K)   -- versions before the current weights are published no more
    if v < o.first - 1 and not files.exists(entries_path(dir, s)) and not files.exists(version_dir(dir, v)) then
      error(("%s: train.async: step %d needs policy version %d, which %s no longer holds (and its entries were not " ..
        "kept); resume with the same train.async.max_off_policy_steps"):format(o.who, s, v, dir), 0)
    end
  end
  files.write_atomic(dir .. "/worker_config.json", require("clrt.config").dump(o.cfg))
  files.write_atomic(dir .. "/worker.json", json.encode({ start_dir = o.start_dir, first = o.first, last = o.last,
    steps = o.cfg.steps, rank = dist.rank(), size = dist.world_size() }))
  local bin = arg and arg[-1] or "clrt"
  self.proc = require("clrt.proc").spawn{ argv = { bin, o.script, "async_worker=" .. dir },
    env = environment(A.rollout_threads or 0), fds = { [1] = { path = dir .. "/worker.log", write = true }, [2] = 1 } }
  return self
end

-- After update `step` (or at the start, step = first - 1): version `step` for the steps that
-- sample from it, this invocation's or a later one's (stop_after=: the resume needs it).
-- Under N ranks every rank calls it at the same point: the ranks' parameters are compared
-- there when a synchronous step would compare them (dist.check_every).
function Async:trained(step, m)
  self.done = step
  require("clrt.train.data_parallel").check_params(m, step, self.cfg.dist and self.cfg.dist.check_every)
  local needed = false
  for s = math.max(self.first, step + 1), self.cfg.steps or self.last do   -- the run's last step, not this invocation's
    if M.version_for(s, self.K) == step and not files.exists(entries_path(self.dir, s)) then needed = true end
  end
  if needed then publish(self.dir, step, m, self.start_dir) end
end

-- Step s's entries, once the worker wrote them: from the portable form, with the step's
-- samples; the worker's request counts and records join this process's (the step's row and
-- the bill). Under N ranks this rank's worker made its share, and the ranks exchange theirs
-- (clrt.train.data_parallel.gather_entries, as after a synchronous step): every rank gets the
-- whole step. timing: the worker's, and wait_s (how long the trainer waited for them).
function Async:entries(step, samples, ctx)
  local path, t0 = entries_path(self.dir, step), require("clrt.log").now()
  while not files.exists(path) do
    require("clrt.core.interrupt").check()
    if self.proc:poll() then
      local log = files.read(self.dir .. "/worker.log") or ""
      local last = log:match("([^\n]+)\n*$") or "no output"
      error(("%s: train.async: the rollout worker stopped before step %d's rollouts: %s (its log: %s/worker.log)")
        :format(self.who, step, last, self.dir), 0)
    end
    sleep(0.01)
  end
  local got = json.decode(files.read(path), path)
  local dp = require("clrt.train.data_parallel")
  local mine, first = dp.my_prompts(samples)
  local out = {}
  for i, p in ipairs(got.entries) do out[i] = entry.from_portable(M.strip_nulls(p), mine[p.group]) end
  if ctx and ctx.counters then
    for k, n in pairs(got.counters or {}) do ctx.counters[k] = (ctx.counters[k] or 0) + n end
  end
  llm.add_records(M.strip_nulls(got.calls or {}))
  out = dp.gather_entries(out, samples, first, ctx)
  for _, e in ipairs(out) do e.policy_version = got.version end
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
    local p = entries_path(self.dir, s)
    if files.exists(p) then os.remove(p) end
  end
end

-- The worker ends; a finished run (every step trained) needs nothing in async/ any more.
-- A run that stops early (a budget stop, Ctrl-C, a failure) keeps what was made ahead for its
-- resume: the worker is asked to stop (SIGTERM; killed after 10 s), the API calls of the step
-- it had in progress are billed to the run (they were paid; the resume makes that step again),
-- and lg says both, with what the steps made ahead cost (paid already; billed when they train).
-- together: every rank stops here (a finished run, stop_after, a budget stop), so under N
-- ranks the discarded calls of every rank's worker are billed on every rank, as a step's are;
-- after a failure each rank bills its own. Once only: a second call does nothing.
function Async:stop(finished, lg, together)
  if self.stopped then return end
  self.stopped = true
  local dist = require("clrt.dist")
  if self.proc and not self.proc:poll() then
    if finished then self.proc:kill()
    else
      self.proc:signal(15)
      local t0 = require("clrt.log").now()
      while not self.proc:poll() and require("clrt.log").now() - t0 < 10 do sleep(0.02) end
      if not self.proc:poll() then self.proc:kill() end
    end
  end
  if finished then
    files.remove_tree(self.dir)
    if dist.world_size() > 1 then   -- the ranks' folders gone: their parent too
      dist.barrier()
      local top = self.run_dir .. "/async"
      if dist.is_main() and files.exists(top) and #files.list(top) == 0 then files.remove_tree(top) end
    end
    return
  end
  local dpath = self.dir .. "/discarded.json"
  local discarded = files.exists(dpath) and json.decode(files.read(dpath), dpath) or nil
  local records = discarded and M.strip_nulls(discarded.calls or {}) or {}
  if discarded then os.remove(dpath) end
  local ahead, ahead_usd = 0, 0
  for _, n in ipairs(files.list(self.dir)) do
    local s = tonumber(n:match("^entries%-(%d+)%.json$"))
    if s and s > self.done then
      ahead = ahead + 1
      local got = json.decode(files.read(self.dir .. "/" .. n), self.dir .. "/" .. n)
      ahead_usd = ahead_usd + require("clrt.api.usage").summarize(M.strip_nulls(got.calls or {})).all.usd
    end
  end
  local steps = discarded and { [discarded.step] = true } or {}
  if together and dist.world_size() > 1 then
    local all = {}
    for r = 0, dist.world_size() - 1 do
      local part = json.decode(dist.broadcast_string(json.encode({ calls = json.array(records),
        step = discarded and discarded.step or json.null }), r), "rank " .. r .. "'s discarded calls")
      for _, c in ipairs(M.strip_nulls(part.calls or {})) do all[#all + 1] = c end
      if part.step ~= json.null and part.step then steps[part.step] = true end
    end
    records = all
    ahead_usd = dist.all_reduce_numbers({ ahead_usd }, "sum")[1]
  end
  local calls, usd = #records, 0
  if calls > 0 then
    local spend = self.ctx and self.ctx.spend
    if spend then
      local sum = spend:add(records, true)
      usd = sum and sum.all and sum.all.usd or 0
    else
      llm.add_records(records)
    end
  end
  if lg then
    local line = ahead == 0 and "train.async: no step's rollouts were made ahead"
      or ("train.async: the rollouts of %d step%s made ahead are kept for the resume ($%.4f paid for them, "
        .. "billed when they train)"):format(ahead, ahead == 1 and "" or "s", ahead_usd)
    local which = {}
    for st in pairs(steps) do which[#which + 1] = st end
    table.sort(which)
    if #which > 0 then
      line = line .. ("; step %s's, in progress, are discarded (the resume makes them again): %d API call%s ($%.4f) "
        .. "billed to this run"):format(table.concat(which, " and "), calls, calls == 1 and "" or "s", usd)
    end
    lg:print(line)
  end
end

-- JSON null where a value was absent: back to nil, recursively (clrt.train.data_parallel's).
M.strip_nulls = require("clrt.train.data_parallel").strip_nulls

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

-- A recipe's worker (its async_worker=DIR entry, DIR the rank's folder under RUN/async): each
-- version's policy and what the rollouts read besides it, made as the recipe's run makes them.
-- who: the recipe's name; world(): the built-in world module.
function M.recipe_worker(dir, who, world)
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
  M.worker(dir, load_policy, setup, prompts.step_prompts)
end

-- The worker's loop (the recipe calls it for async_worker=DIR): for each step, wait for the
-- version it samples from, load it when it differs from the one held, roll out its rank's
-- share of the step's prompts (all of them on one rank; the sampling streams are named by the
-- prompt's index in the whole step, so the share does not change a sample), write the
-- entries. setup(cfg, m, start_dir) gives what the rollouts read besides the policy: {tok, world,
-- dataset, metrics, ctx, user}. It ends when its parent (the trainer) is gone.
function M.worker(dir, load_policy, setup, step_prompts)
  local job = json.decode(files.read(dir .. "/worker.json"), dir .. "/worker.json")
  local cfg = require("clrt.config").load(dir .. "/worker_config.json")
  local K = cfg.train.async.max_off_policy_steps
  local parent = ffi.C.getppid()
  cfg.rollout.keep_logprobs = true
  local rollout = require("clrt.train.rollout")
  local m, held, env
  for s = job.first, job.last do
    if not files.exists(entries_path(dir, s)) then
      local v = M.version_for(s, K)
      local vdir = version_dir(dir, v)
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
      local mine, first = require("clrt.train.data_parallel").my_prompts(samples, job.rank or 0, job.size or 1)
      -- the rollouts and their file in one protected call: a stop (SIGTERM, Ctrl-C) or a failure
      -- anywhere before the file is whole writes the step off in discarded.json with every API
      -- call it made, for the bill (a stop lands wherever Lua runs, a scheduler task may catch
      -- its error: the flag decides)
      local interrupt = require("clrt.core.interrupt")
      local calls
      local ok, err = pcall(function()
        local entries, timing = rollout.step_local(m, env.tok, cfg, mine, env.ctx, env.user, env.metrics, s, first)
        interrupt.check()
        local portable = {}
        for i, e in ipairs(entries) do portable[i] = entry.portable(e, 0) end
        local counters = {}
        for k, n in pairs(env.ctx.counters or {}) do counters[k] = n; env.ctx.counters[k] = nil end
        calls = llm.drain_records()
        files.write_atomic(entries_path(dir, s), json.encode({ step = s, version = v, entries = json.array(portable),
          counters = counters, calls = json.array(calls), timing = timing }))
      end)
      if not ok or (interrupt.pressed() and not files.exists(entries_path(dir, s))) then
        local all = calls or {}
        for _, c in ipairs(llm.drain_records()) do all[#all + 1] = c end
        files.write_atomic(dir .. "/discarded.json", json.encode({ step = s, calls = json.array(all) }))
        error(ok and "interrupted" or err, 0)
      end
    end
    -- the version no later step of the run samples from goes (one that a step after this
    -- invocation's last needs stays for the resume)
    local v = M.version_for(s, K)
    if s >= (job.steps or job.last) or M.version_for(s + 1, K) ~= v then
      local vdir = version_dir(dir, v)
      if files.exists(vdir) then files.remove_tree(vdir) end
    end
  end
end

return M
