-- clrt.sched — run many plain sequential Lua functions at once, as coroutines on one thread.
--
--   local results, errors = clrt.sched.run(fns, {max_concurrency = 64, timeout = 600, raise = false})
--
-- Each function runs in its own coroutine. Inside one, anything that would wait yields to
-- the scheduler instead: c:chat(...) (clrt.llm) puts its HTTP request in flight and yields;
-- clrt.sched.generate(model, tokens, opts) and m:generate queue generation requests;
-- clrt.sched.sleep(s) waits; p:wait() on a child process (clrt.proc) waits for it to end, the
-- scheduler watching its pidfd beside the HTTP sockets, so decoding and HTTP go on meanwhile.
--
-- This is the task runner only. Generation belongs to clrt.gen.scheduler (one engine per
-- model, shared with m:generate and `clrt serve`; admission, the cache's growth): a task's
-- request joins its model's running batch at the next decode step, whatever its options, and
-- the task resumes as soon as its own rows finish. Between two decode steps the run moves HTTP
-- along and runs the coroutines that can go on, so a conversation's next turn joins the batch
-- while the others still decode. A request's tokens depend on its model, prompt, options, seed
-- and seed_key only, never on which requests share its steps or in which order they came
-- (clrt.gen.engine.row_seed; docs/reproducibility.md).
--
-- results[i] is the first value fns[i] returned, whatever order they finished in; an error
-- in fns[i] is caught and reported as errors[i] (a string) for that one only, or raised
-- after all have finished when opts.raise is set. A third result holds
-- {engine_steps = decode steps of the engines, engine_steps_during_procs = those taken
--  while a task waited on a child process, wait_http_s = seconds the run waited with HTTP
--  requests in flight and no engine work to do, tracebacks = {[i] = traceback of errors[i]}}.
-- opts.timeout bounds the whole run: the functions still unfinished then get
-- errors[i] = "... timed out ..." and their HTTP requests and rows are cancelled.
local http = require("clrt.net.http")
local G = require("clrt.gen.scheduler")

local M = {}
local SUSPEND = setmetatable({}, { __tostring = function() return "clrt.sched.SUSPEND" end })
local run_state        -- the scheduler running now (runs do not nest)
local pack = function(...) return { n = select("#", ...), ... } end
local unpack = unpack or table.unpack

-- The task the calling coroutine belongs to, or nil outside a scheduler.
function M.current()
  if not run_state then return nil end
  local co = coroutine.running()
  return co and run_state.by_co[co] or nil
end

-- Park the current task until someone calls wake(task, ...); returns wake's values.
-- on_cancel runs if the run is abandoned (timeout) while the task waits.
function M.suspend(on_cancel)
  local t = M.current()
  if not t then error("clrt.sched.suspend: not inside a clrt.sched.run function", 2) end
  t.on_cancel = on_cancel
  t.waiting = true
  return coroutine.yield(SUSPEND)
end

function M.wake(t, ...)
  if not t.waiting or t.finished then return end
  t.waiting = false
  t.on_cancel = nil
  t.args = pack(...)
  local st = t.run
  st.ready[#st.ready + 1] = t
end

-- Wait `seconds`: yields inside a task, elsewhere sleeps while pumping HTTP.
function M.sleep(seconds)
  local t = M.current()
  if not t then return http.sleep(seconds) end
  local st = t.run
  st.timers[#st.timers + 1] = { at = http.now() + seconds, task = t }
  M.suspend(function()
    for i, tm in ipairs(st.timers) do
      if tm.task == t then table.remove(st.timers, i) break end
    end
  end)
end

-- Wait, inside a task, until child process p (clrt.proc) has ended ("exited") or http.now()
-- passes deadline (nil: none; "deadline"); p:wait is the way to call this. on_cancel runs if
-- the run is abandoned while the task waits.
function M.wait_proc(p, deadline, on_cancel)
  local t = M.current()
  if not t then error("clrt.sched.wait_proc: not inside a clrt.sched.run function", 2) end
  local st = t.run
  local w = { p = p, task = t, deadline = deadline }
  st.procs[#st.procs + 1] = w
  return M.suspend(function()
    for i, x in ipairs(st.procs) do
      if x == w then table.remove(st.procs, i) break end
    end
    if on_cancel then on_cancel() end
  end)
end

-- Wake the tasks whose child process ended or whose deadline passed.
local function check_procs(st)
  if #st.procs == 0 then return end
  local now, keep = http.now(), {}
  for _, w in ipairs(st.procs) do
    local ok, ended = pcall(w.p.poll, w.p)
    if not ok then M.wake(w.task, "clrt.sched: " .. tostring(ended))
    elseif ended then M.wake(w.task, "exited")
    elseif w.deadline and now >= w.deadline then M.wake(w.task, "deadline")
    else keep[#keep + 1] = w end
  end
  st.procs = keep
end

-- A counting semaphore: acquire() waits (yielding) while n holders are inside. Outside a
-- scheduler nothing else can hold it, so acquire never waits there.
function M.semaphore(n)
  local s = { n = n, count = 0, waiters = {} }
  function s.acquire()
    local t = M.current()
    if s.count < s.n or not t then
      s.count = s.count + 1
      return
    end
    s.waiters[#s.waiters + 1] = t
    M.suspend(function()
      for i, w in ipairs(s.waiters) do
        if w == t then table.remove(s.waiters, i) break end
      end
    end)
    -- release() handed its slot straight to us: count is unchanged
  end
  function s.release()
    local w = table.remove(s.waiters, 1)
    if w then M.wake(w) else s.count = s.count - 1 end
  end
  return s
end

-- A generation request of a task (clrt.gen.scheduler.generate) waits here: its engine is
-- listed in the task's run, which admits and steps it, and the task parks until its rows end.
G.waiter = function(E)
  local t = M.current()
  if not t then return nil end
  local st = t.run
  if not st.engine_set[E] then
    st.engine_set[E] = true
    st.engines[#st.engines + 1] = E
  end
  return { wake = function(ok) M.wake(t, ok) end, wait = M.suspend }
end

-- Let waiting requests join their engines (in order; clrt.gen.scheduler.admit). Returns whether
-- rows run.
local function admit(st)
  local busy = false
  for _, E in ipairs(st.engines) do
    if G.admit(E, st.next_start - 1 - st.done) then busy = true end
  end
  return busy
end

-- One decode step of every engine with rows (a failing one fails its requests).
local function step_engines(st)
  for _, E in ipairs(st.engines) do
    if G.busy(E) then
      st.engine_steps = st.engine_steps + 1
      if #st.procs > 0 then st.engine_steps_during_procs = st.engine_steps_during_procs + 1 end
      G.step(E)
    end
  end
end

-- The n samples of one prompt (a list of token ids): clrt.gen.scheduler.generate's, for the
-- callers that ask one prompt at a time (RL rollouts, evaluation). Inside a task it waits beside
-- the others; outside one it runs alone.
function M.generate(model, prompt_tokens, opts)
  if type(prompt_tokens) ~= "table" then
    error("clrt.sched.generate: prompt_tokens must be a table of token ids, got " .. type(prompt_tokens), 2)
  end
  return G.generate(model, { prompt_tokens }, opts)
end

-- Errors keep their message; the traceback goes beside it (run's third result) so that
-- errors[i] stays one readable line for a run's log.
local function task_error_handler(e)
  return { msg = type(e) == "string" and e or tostring(e), traceback = debug.traceback("", 2) }
end

local function finish(st, t, ok, value)
  t.finished = true
  st.by_co[t.co] = nil
  st.done = st.done + 1
  if ok then st.results[t.index] = value else st.errors[t.index] = value end
  if st.next_start <= st.n then
    local nt = st.tasks[st.next_start]
    st.next_start = st.next_start + 1
    st.ready[#st.ready + 1] = nt
  end
end

local function step(st, t)
  if not t.co then
    t.co = coroutine.create(function()
      return pack(xpcall(t.fn, task_error_handler))
    end)
    st.by_co[t.co] = t
    t.args = pack()
  end
  local args = t.args
  t.args = nil
  local ok, out = coroutine.resume(t.co, unpack(args, 1, args.n))
  if not ok then
    finish(st, t, false, tostring(out))
  elseif coroutine.status(t.co) == "dead" then
    if out[1] then
      finish(st, t, true, out[2])
    else
      st.tracebacks[t.index] = out[2].traceback
      finish(st, t, false, out[2].msg)
    end
  elseif out ~= SUSPEND then
    finish(st, t, false, ("clrt.sched: function %d yielded a value itself; only the clrt.sched/" ..
                          "clrt.llm calls may yield inside clrt.sched.run"):format(t.index))
  end
end

local function run_ready(st)
  while #st.ready > 0 do
    local ready = st.ready
    st.ready = {}
    for _, t in ipairs(ready) do
      if not t.finished then step(st, t) end
    end
  end
end

local function fire_timers(st)
  if #st.timers == 0 then return end
  local now, keep = http.now(), {}
  local due = {}
  for _, tm in ipairs(st.timers) do
    if tm.at <= now then due[#due + 1] = tm else keep[#keep + 1] = tm end
  end
  st.timers = keep
  for _, tm in ipairs(due) do M.wake(tm.task) end
end

-- End every unfinished function with `why`, cancelling what the started ones wait on.
local function abandon(st, why)
  local started = st.next_start
  st.next_start = st.n + 1
  for i = 1, st.n do
    local t = st.tasks[i]
    if not t.finished then
      if i < started and t.on_cancel then pcall(t.on_cancel) end
      t.on_cancel = nil
      if t.co then st.by_co[t.co] = nil end
      t.finished = true
      st.done = st.done + 1
      st.errors[i] = why
    end
  end
  st.ready, st.timers, st.procs = {}, {}, {}
end

function M.run(fns, opts)
  opts = opts or {}
  if run_state then error("clrt.sched.run: runs do not nest (already inside one)", 2) end
  if type(fns) ~= "table" then error("clrt.sched.run: expected a list of functions, got " .. type(fns), 2) end
  for i, f in ipairs(fns) do
    if type(f) ~= "function" then error(("clrt.sched.run: fns[%d] is a %s, not a function"):format(i, type(f)), 2) end
  end
  local n = #fns
  local st = {
    n = n, tasks = {}, by_co = {}, ready = {}, timers = {},
    results = {}, errors = {}, tracebacks = {}, done = 0, next_start = 1,
    engines = {}, engine_set = {}, engine_steps = 0, procs = {}, engine_steps_during_procs = 0, wait_http_s = 0,
  }
  for i, f in ipairs(fns) do st.tasks[i] = { index = i, fn = f, run = st } end
  local limit = opts.max_concurrency or n
  local deadline = opts.timeout and (http.now() + opts.timeout)
  for _ = 1, math.min(limit, n) do
    st.ready[#st.ready + 1] = st.tasks[st.next_start]
    st.next_start = st.next_start + 1
  end

  run_state = st
  -- opts.progress: a label; on a terminal the run's count of finished functions and its ETA
  local bar = opts.progress and require("clrt.progress").new(opts.progress, n, opts.progress_opts) or nil
  local ok, err = pcall(function()
    while st.done < n do
      if bar then bar:set(st.done) end
      run_ready(st)
      if st.done >= n then break end
      if deadline and http.now() >= deadline then
        abandon(st, ("clrt.sched.run: timed out after %g s"):format(opts.timeout))
        break
      end
      if admit(st) then
        -- one decode step, then HTTP and the coroutines that can go on (their requests join
        -- the batch at the next step)
        http.pump(0)
        step_engines(st)
        fire_timers(st)
        check_procs(st)
      elseif #st.ready == 0 then
        local wait = 0.05
        for _, tm in ipairs(st.timers) do wait = math.min(wait, tm.at - http.now()) end
        if deadline then wait = math.min(wait, deadline - http.now()) end
        if http.pending() == 0 and #st.timers == 0 and #st.procs == 0 then
          abandon(st, "clrt.sched.run: deadlock: the function waits on something that can never happen " ..
                      "(no request in flight, no timer, no child process)")
          break
        end
        -- child processes wake the wait through their pidfds (on a short period without one)
        local fds = {}
        for _, w in ipairs(st.procs) do
          local fd = w.p:fd()
          if fd then fds[#fds + 1] = fd else wait = math.min(wait, 0.01) end
          if w.deadline then wait = math.min(wait, w.deadline - http.now()) end
        end
        local http_busy, w0 = http.pending() > 0, http.now()
        http.pump(math.max(0, math.ceil(wait * 1000)), fds)
        if http_busy then st.wait_http_s = st.wait_http_s + (http.now() - w0) end
        fire_timers(st)
        check_procs(st)
      end
    end
  end)
  run_state = nil
  if bar then bar:set(st.done); bar:finish() end
  for _, E in ipairs(st.engines) do G.abandon(E) end
  if not ok then
    -- The scheduler itself failed (a bug or an interrupt): cancel what is in flight.
    for _, t in ipairs(st.tasks) do if t.on_cancel then pcall(t.on_cancel) end end
    error(err, 0)
  end
  if opts.raise then
    for i = 1, n do
      if st.errors[i] then error(("clrt.sched.run: function %d failed: %s"):format(i, st.errors[i]), 2) end
    end
  end
  return st.results, st.errors, { engine_steps = st.engine_steps,
                                  engine_steps_during_procs = st.engine_steps_during_procs, wait_http_s = st.wait_http_s,
                                  tracebacks = st.tracebacks }
end

return M
