-- pass_rate — 1 when the code the conversation produced passes the task's tests, else 0.
-- The code: extracted by the judge (JSON final_completion, like bleu_score), told the
-- task's entry point and extraction requirement (single_turn_metadata.entry_point /
-- .extraction_requirement, as the published bigcodebench rows have them); or, with
-- options.extract = false / no judge, the last fenced block of the last assistant message.
-- The tests: sample.tests, else sample.single_turn_metadata.test (BigCodeBench's
-- unittest source); a sample without tests is an error (a failed metric, not a 0).
--
-- The program runs in a bubblewrap sandbox (clrt.sandbox; docs/sandbox.md): an empty
-- environment but the harness's variables, the system read-only, a private /tmp, no
-- network, its own PID namespace, an unprivileged uid, limits and a wall-clock timeout
-- that kills every process it started. It is an asynchronous child: inside a clrt.sched
-- task the scheduler decodes and moves HTTP while it runs, up to `parallel` at once.
-- The verdict is the test framework's own, read by lua/metrics/lib/pass_rate_harness.py
-- and reported on a descriptor with a nonce (the exit status means nothing): by default
-- BigCodeBench 0.2.5's rule (no failure and no error; skips the tests declare pass), with
-- a forged pass (a skip or stop raised from the solution, patched test machinery,
-- introspection of the harness) a 0 counted as tampering; docs/sandbox.md. Where
-- bubblewrap is missing or cannot create its namespaces, pass_rate refuses with one line
-- saying what to allow; a module the code rows need that the sandbox lacks stops the run
-- before its first step (check; missing_modules=skip leaves those rows out).
-- Options (ctx.metric_options.pass_rate, so `reward.metric_options.pass_rate.timeout=300`
-- on the command line); the defaults are BigCodeBench's evaluation's where it sets them:
--   timeout   wall-clock seconds (default 241: untrusted_check's max(min_time_limit 240, gt_time_limit 60) + 1)
--   semantics bigcodebench (default: BigCodeBench 0.2.5's verdict, skips the tests declare pass)
--             or strict (skips, unexpected successes and missing expected tests fail)
--   cpu_s     CPU seconds of each process (default: timeout)
--   mem_mb    writable memory, RLIMIT_DATA (default 30720: BigCodeBench's max_data_limit)
--   as_mb     address space, RLIMIT_AS (default 30720: BigCodeBench's max_as_limit);
--             numpy on 16 BLAS threads reserves 2.6 GB for 79 MB resident (measured)
--   stack_mb  stack, RLIMIT_STACK (default 10: BigCodeBench's max_stack_limit)
--   file_mb   size of any file written, the output log included (default 16)
--   program_mb the whole program's memory, all its processes together (default: 30720, or
--             3/4 of the host's MemTotal over `parallel` where that is less): a memory
--             cgroup where this user may make one, else its process tree's RSS polled
--   memory_bound auto (default: a cgroup where possible) or poll (always poll the RSS)
--   procs     processes and threads at once, RLIMIT_NPROC in the sandbox's own user
--             namespace (default 64): a fork bomb stops there
--   tmp_mb    size of the private /tmp and of /dev/shm, memory-backed (default 512 each)
--   threads   OMP/OpenBLAS/MKL threads (default 1, as BigCodeBench sets OMP_NUM_THREADS)
--   python    the interpreter inside the sandbox (default /usr/bin/python3, Debian's, with
--             python3-numpy/-pandas for BigCodeBench's tasks); an absolute path outside
--             /usr has its prefix (two levels up: /opt/conda for /opt/conda/bin/python3)
--             bound read-only
--   bind      more host paths visible read-only (a list, e.g. ["/opt/conda"])
--   loopback  true: a loopback of the sandbox's own (reaching nothing outside it) for
--             tasks that talk to a server they start; default false: no network at all
--   parallel  programs at once in this process (default: the processor count)
--   bwrap     the bubblewrap program (default "bwrap" on PATH)
--   uid       the uid programs run as when the trainer is root (default 2000000000)
--   extract   false: no judge call, the last fenced block is the code
--   unsafe_no_sandbox  true: no bubblewrap (limits, clean environment and the harness
--             only); a warning goes to stderr once. Never chosen silently.
--   missing_modules refuse (default: a module the code rows need that the sandbox lacks
--             stops the run before its first step) or skip (those rows are left out)
--   disable_defenses tests only: a comma list of the harness's defenses to turn off, to
--             show each red-team attack passing without them
-- Per step (ctx.counters, logged by clrt.train.report): pass_rate_programs run and
-- pass_rate_seconds spent in them (summed; they overlap), pass_rate_tampered and
-- pass_rate_env_errors (logged as pass_rate/tampered, pass_rate/env_errors).
local judge = require("metrics.lib.judge")
local files = require("clrt.files")
local proc = require("clrt.proc")
local sandbox = require("clrt.sandbox")

local M = { name = "pass_rate", uses_judge = true }   -- uses_judge: the run checks the judge's endpoint before its first step

M.DEFAULTS = { timeout = 241, mem_mb = 30720, as_mb = 30720, stack_mb = 10, file_mb = 16, procs = 64,
  tmp_mb = 512, threads = 1, python = "/usr/bin/python3", bwrap = "bwrap", uid = sandbox.DEFAULT_UID }

local NUMBERS = { "timeout", "cpu_s", "program_mb", "mem_mb", "as_mb", "stack_mb", "file_mb", "procs", "tmp_mb", "threads", "parallel", "uid" }

-- The whole program's memory bound by default: BigCodeBench's 30 GiB, or less where the
-- host's memory, shared by `parallel` programs at once, is smaller (3/4 of MemTotal).
function M.default_program_mb(parallel)
  local total = tonumber(((require("clrt.files").read("/proc/meminfo") or ""):match("MemTotal:%s+(%d+) kB")))
  if not total then return 30720 end
  return math.max(256, math.min(30720, math.floor(total / 1024 * 0.75 / math.max(1, parallel))))
end

-- The limits for one run: options over the defaults, each checked.
function M.limits(opts)
  opts = opts or {}
  local l = {}
  for k, v in pairs(M.DEFAULTS) do l[k] = opts[k] == nil and v or opts[k] end
  l.cpu_s = opts.cpu_s == nil and l.timeout or opts.cpu_s
  l.parallel = opts.parallel == nil and proc.cpu_count() or opts.parallel
  l.program_mb = opts.program_mb == nil and M.default_program_mb(l.parallel) or opts.program_mb
  for _, k in ipairs(NUMBERS) do
    if type(l[k]) ~= "number" or l[k] <= 0 or l[k] ~= l[k] or l[k] == math.huge then
      error(("pass_rate: option %s must be a positive number, got %s"):format(k, tostring(l[k])), 0)
    end
  end
  for _, k in ipairs({ "python", "bwrap" }) do
    if type(l[k]) ~= "string" or l[k] == "" then error(("pass_rate: option %s must be a command"):format(k), 0) end
  end
  l.bind = opts.bind == nil and {} or opts.bind
  if type(l.bind) ~= "table" then error("pass_rate: option bind must be a list of paths", 0) end
  for i, b in ipairs(l.bind) do
    if type(b) ~= "string" or b:sub(1, 1) ~= "/" then
      error(("pass_rate: option bind[%d] must be an absolute path, got %s"):format(i, tostring(b)), 0)
    end
  end
  l.semantics = opts.semantics == nil and "bigcodebench" or opts.semantics
  if l.semantics ~= "bigcodebench" and l.semantics ~= "strict" then
    error(("pass_rate: option semantics must be bigcodebench or strict, got %s"):format(tostring(l.semantics)), 0)
  end
  -- tests only: harness defenses turned off, to show each red-team attack passing without its defense
  l.disable_defenses = opts.disable_defenses or ""
  if type(l.disable_defenses) ~= "string" or not l.disable_defenses:match("^[%a,]*$") then
    error("pass_rate: option disable_defenses must be a comma list of names", 0)
  end
  l.memory_bound = opts.memory_bound == nil and "auto" or opts.memory_bound
  if l.memory_bound ~= "auto" and l.memory_bound ~= "poll" then
    error(("pass_rate: option memory_bound must be auto or poll, got %s"):format(tostring(l.memory_bound)), 0)
  end
  l.missing_modules = opts.missing_modules == nil and "refuse" or opts.missing_modules
  if l.missing_modules ~= "refuse" and l.missing_modules ~= "skip" then
    error(("pass_rate: option missing_modules must be refuse or skip, got %s"):format(tostring(l.missing_modules)), 0)
  end
  for _, k in ipairs({ "unsafe_no_sandbox", "loopback" }) do
    if opts[k] ~= nil and type(opts[k]) ~= "boolean" then error(("pass_rate: option %s must be true or false"):format(k), 0) end
    l[k] = opts[k] == true
  end
  return l
end

local warned_unsafe = false

-- Refuse, with one line, where the sandbox cannot be made (checked once per bwrap and
-- uid); a bad option is an error here too. Called when the metric is loaded and by compute.
function M.prepare(opts)
  local l = M.limits(opts)
  if l.unsafe_no_sandbox then
    if not warned_unsafe then
      warned_unsafe = true
      io.stderr:write("pass_rate: WARNING: unsafe_no_sandbox=true: the policy's code runs WITHOUT a sandbox " ..
        "(it can read this process's files, use the network and outlive the test)\n")
    end
    return l
  end
  local ok, why = sandbox.check({ bwrap = l.bwrap, uid = l.uid, loopback = l.loopback })
  if not ok then
    error("pass_rate: refusing to run the policy's code without a sandbox: " .. why ..
      "; or set reward.metric_options.pass_rate.unsafe_no_sandbox=true to run it unisolated", 0)
  end
  return l
end

M.HARNESS = "metrics/lib/pass_rate_harness.py"

local function harness_path()
  if M.HARNESS_PATH then return M.HARNESS_PATH end   -- tests only: another harness (the old one, to compare)
  local p = require("clrt").lua_dir .. "/" .. M.HARNESS
  if not files.exists(p) then error("pass_rate: the harness " .. p .. " is missing from this installation", 0) end
  return p
end

-- The sandbox's whole environment: what BigCodeBench's evaluation sets, and a PATH and HOME.
function M.environment(l)
  local t = math.floor(l.threads)
  return { "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "TMPDIR=/tmp", "LANG=C.UTF-8", "TZ=UTC",
    "MPLBACKEND=Agg", "OMP_NUM_THREADS=" .. t, "OPENBLAS_NUM_THREADS=" .. t, "MKL_NUM_THREADS=" .. t,
    "TF_CPP_MIN_LOG_LEVEL=3", "TF_ENABLE_ONEDNN_OPTS=0" }
end

local function nonce()
  local f = assert(io.open("/dev/urandom", "rb"))
  local b = f:read(16)
  f:close()
  return (b:gsub(".", function(c) return ("%02x"):format(c:byte()) end))
end

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

local SYSTEM_PREFIXES = { "/usr/", "/bin/", "/sbin/", "/lib/", "/lib64/", "/etc/" }

-- The host paths the sandbox binds read-only: option bind, and the interpreter's prefix
-- when it lives outside the system folders.
function M.python_binds(l)
  local binds = {}
  for _, b in ipairs(l.bind) do binds[#binds + 1] = { b } end
  if l.python:sub(1, 1) == "/" then
    local system = false
    for _, p in ipairs(SYSTEM_PREFIXES) do if l.python:sub(1, #p) == p then system = true end end
    local prefix = l.python:match("^(/.+)/[^/]+/[^/]+$")
    if not system and prefix then binds[#binds + 1] = { prefix } end
  end
  return binds
end

-- argv under one memory bound for all its processes (metrics/lib/pass_rate_membound.py:
-- a cgroup where the machine allows one, else the process tree's resident memory polled).
function M.bounded(l, argv)
  local out = { l.python, "-I", require("clrt").lua_dir .. "/metrics/lib/pass_rate_membound.py",
    tostring(math.floor(l.program_mb * 1048576)), l.memory_bound, "--" }
  for _, a in ipairs(argv) do out[#out + 1] = a end
  return out
end

-- The command and descriptors of one program: run_dir holds its files (private to this user).
function M.command(l, dir)
  local limits = { cpu_s = l.cpu_s, as_mb = l.as_mb, data_mb = l.mem_mb, stack_mb = l.stack_mb,
    file_mb = l.file_mb, procs = math.floor(l.procs), files = 1024 }
  local fds = { [0] = { path = dir .. "/nonce" }, [1] = { path = dir .. "/log", write = true }, [2] = 1,
    [3] = { path = dir .. "/report", write = true } }
  if l.unsafe_no_sandbox then
    files.mkdir_p(dir .. "/work")
    local argv = { "prlimit", "--core=0", "--cpu=" .. math.ceil(l.cpu_s), "--as=" .. math.floor(l.as_mb * 1048576),
      "--data=" .. math.floor(l.mem_mb * 1048576), "--stack=" .. math.floor(l.stack_mb * 1048576),
      "--fsize=" .. math.floor(l.file_mb * 1048576), "--", l.python, "-I", harness_path(),
      dir .. "/solution.py", dir .. "/tests.py", l.semantics, l.disable_defenses }
    return M.bounded(l, argv), fds, dir .. "/work"
  end
  fds[4] = { path = dir .. "/solution.py" }
  fds[5] = { path = dir .. "/tests.py" }
  fds[6] = { path = harness_path() }
  local binds = M.python_binds(l)
  local argv = sandbox.command({ bwrap = l.bwrap, uid = math.floor(l.uid), loopback = l.loopback, binds = binds, tmp_mb = l.tmp_mb,
    data = { { 4, "/task/solution.py" }, { 5, "/task/tests.py" }, { 6, "/task/harness.py" } },
    limits = limits, chdir = "/tmp",
    argv = { l.python, "-I", "/task/harness.py", "/task/solution.py", "/task/tests.py", l.semantics, l.disable_defenses } })
  return M.bounded(l, argv), fds, nil
end

local slots = {}   -- parallel -> the semaphore every program of this process takes

-- The verdict from the report: exactly one line, with this run's nonce.
function M.verdict(report, key)
  if type(report) ~= "string" then return nil end
  local got, v, counts = report:match("^CLRT%-PASS%-RATE (%x+) (%u+) ([%w=/ ,._-]*)\n$")
  if got ~= key then return nil end
  return v, counts
end

-- What kind of outcome a run was: pass, wrong, tamper (the harness saw a forgery, or the
-- report was forged), env (a module missing: an environment error, never a wrong answer),
-- timeout; and the missing modules.
function M.kind(v, counts, timed_out, report)
  if timed_out then return "timeout" end
  if not v then return (report and report ~= "") and "tamper" or "wrong" end
  local k = counts:match("kind=(%a+)") or (v == "PASS" and "pass" or "wrong")
  return k, counts:match("missing=([%w,._-]+)")
end

-- Run code + tests; returns passed (bool), detail (the end of the program's output, and
-- the harness's verdict line or why there is none), kind (M.kind). ctx (optional):
-- counters: pass_rate_tampered and pass_rate_env_errors count those kinds.
function M.run_tests(code, tests, opts, ctx)
  local l = M.prepare(opts)
  local sem = slots[l.parallel]
  if not sem then
    sem = require("clrt.sched").semaphore(math.floor(l.parallel))
    slots[l.parallel] = sem
  end
  sem.acquire()
  local dir
  local function cleanup()
    if dir then pcall(files.remove_tree, dir) end
    dir = nil
  end
  local released = false
  local function release()
    if not released then released = true sem.release() end
  end
  local ok, passed, detail, kind, missing = pcall(function()
    dir = files.temp_dir("clrt-pass-rate")
    local key = nonce()
    write(dir .. "/nonce", key .. "\n")
    write(dir .. "/solution.py", code)
    write(dir .. "/tests.py", tests)
    local argv, fds, cwd = M.command(l, dir)
    local p = proc.spawn({ argv = argv, env = M.environment(l), cwd = cwd, fds = fds })
    local r = p:wait({ timeout = l.timeout, on_cancel = function() cleanup() release() end })
    if ctx and ctx.counters then
      local c = ctx.counters
      c.pass_rate_programs = (c.pass_rate_programs or 0) + 1
      c.pass_rate_seconds = (c.pass_rate_seconds or 0) + r.seconds
    end
    local out = (files.read(dir .. "/log") or ""):sub(-2000)
    local report = files.read(dir .. "/report")
    local v, counts = M.verdict(report, key)
    local kind, missing = M.kind(v, counts, r.timed_out, report)
    if ctx and ctx.counters then
      local c = ctx.counters
      if kind == "tamper" then c.pass_rate_tampered = (c.pass_rate_tampered or 0) + 1 end
      if kind == "env" then
        c.pass_rate_env_errors = (c.pass_rate_env_errors or 0) + 1
        io.stderr:write(("pass_rate: environment error: modules missing in the sandbox: %s\n"):format(missing or "?"))
      end
    end
    local why
    if r.timed_out then why = ("timed out after %g s"):format(l.timeout)
    elseif not v then why = report and report ~= "" and "the report was tampered with" or
      ("no report (exit %s)"):format(tostring(r.code or ("signal " .. tostring(r.signal))))
    else why = v .. " " .. counts end
    return v == "PASS" and not r.timed_out, out .. "\n[pass_rate: " .. why .. "]", kind, missing
  end)
  cleanup()
  release()
  if not ok then error(passed, 0) end
  return passed, detail, kind, missing
end

-- single_turn_metadata as a table (some exports keep it as a JSON string).
function M.metadata_of(sample)
  local md = sample.single_turn_metadata
  if type(md) == "string" then
    local ok, t = pcall(require("clrt.json").decode, md)
    if ok and type(t) == "table" then return t end
  end
  return type(md) == "table" and md or {}
end

-- What the extractor is told besides its prompt: the entry point the tests call and the
-- dataset's extraction requirement; nil when the metadata has neither.
function M.extraction_instructions(sample)
  local md = M.metadata_of(sample)
  local parts = {}
  if type(md.entry_point) == "string" and md.entry_point ~= "" then
    parts[#parts + 1] = ("The tests call `%s`: keep its definition with that exact name and signature, "
      .. "together with every import and helper it uses, as one self-contained program."):format(md.entry_point)
  end
  if type(md.extraction_requirement) == "string" and md.extraction_requirement ~= "" then
    parts[#parts + 1] = md.extraction_requirement
  end
  if #parts == 0 then return nil end
  return table.concat(parts, "\n")
end

function M.tests_of(sample)
  if type(sample.tests) == "string" then return sample.tests end
  local md = M.metadata_of(sample)
  if type(md.test) == "string" then return md.test end
  return nil
end

-- A row without tests (math, documents in a mixed data file) has no pass rate: the metric
-- is left out for it rather than failed (clrt.train.reward.score_conversation).
function M.applies(sample) return M.tests_of(sample) ~= nil end

-- Before the first step (clrt.train.reward.check_samples): every module the code rows
-- need must be importable in the sandbox (metrics/lib/pass_rate_env.lua). Returns the
-- samples to run and the number left out (missing_modules=skip), or stops with one line.
function M.check_samples(samples, opts)
  local l = M.prepare(opts)
  local kept, left_out, names = require("metrics.lib.pass_rate_env").check(samples, l, M)
  if left_out > 0 then
    io.stderr:write(("pass_rate: %d code rows left out: the sandbox's python lacks %s (missing_modules=skip)\n")
      :format(left_out, table.concat(names, ", ")))
  end
  return kept, left_out
end

function M.compute(conversation, sample, ctx)
  local tests = M.tests_of(sample)
  if not tests then error("pass_rate: sample has no tests (sample.tests or single_turn_metadata.test)", 0) end
  local opts = judge.options(ctx, "pass_rate")
  M.prepare(opts) -- a bad option or a missing sandbox is an error before any judge call
  local code = judge.final_completion(conversation, sample, ctx, "pass_rate", "code",
    { instructions = M.extraction_instructions(sample) })
  if code:find("^%s*$") then return 0 end
  local passed, _, kind, missing = M.run_tests(code, tests, opts, ctx)
  if kind == "env" then
    -- a module the task needs is missing: the environment's fault, a failed metric and not
    -- a 0; a module only the solution wants (one it made up) is the solution's fault
    local needs = {}
    for _, m in ipairs(require("metrics.lib.pass_rate_env").task_modules({ sample }, M.limits(opts).python, M)[1]) do
      needs[m] = true
    end
    local all = missing ~= nil
    for m in (missing or ""):gmatch("[^,]+") do all = all and needs[m:match("^[^.]+")] == true end
    if all then error(("pass_rate: environment error: modules missing in the sandbox: %s (task %s)")
      :format(missing, tostring(M.metadata_of(sample).task_id or "?")), 0) end
  end
  return passed and 1 or 0
end

return M
