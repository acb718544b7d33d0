-- clrt.sched — run many plain sequential Lua functions at once, as coroutines on one thread.
--
--   local results, errors = clrt.sched.run(fns, {max_concurrency = 64, timeout = 600, raise = false})
--
-- Each function runs in its own coroutine. Inside one, anything that would wait yields to
-- the scheduler instead: c:chat(...) (clrt.llm) puts its HTTP request in flight and yields;
-- clrt.sched.generate(model, tokens, opts) queues a generation request; clrt.sched.sleep(s)
-- waits. When no function can run, the scheduler gathers the queued generation requests of
-- all waiting coroutines into one batched model:generate call per (model, opts) and, while
-- it decodes, keeps the HTTP requests moving through the opts.on_step hook (see below).
--
-- results[i] is the first value fns[i] returned, whatever order they finished in; an error
-- in fns[i] is caught and reported as errors[i] (a string) for that one only, or raised
-- after all have finished when opts.raise is set. A third result holds
-- {generate_calls = number of batched calls, tracebacks = {[i] = traceback of errors[i]}}. opts.timeout bounds the whole run: the
-- functions still unfinished then get errors[i] = "... timed out ..." and their HTTP
-- requests are cancelled.
--
-- The contract with model:generate (clrt.model) is
--   outs = model:generate(prompts, opts)
--     prompts: a list of token rows (Lua tables of ints); opts: n, max_new_tokens,
--     temperature, top_p, top_k, stop, seed, and on_step;
--     outs: one entry per (prompt, sample), prompt-major: outs[(p-1)*n + s] =
--           {tokens = {...}, logprobs = {...}, finish_reason = "stop" | "length"}
--   opts.on_step, when present, is a function() the model calls between decode steps (it
--   takes no arguments and its return value is ignored); the scheduler uses it to pump
--   HTTP and resume the coroutines whose replies came in, so network and decode overlap.
--   A model that never calls it is still correct, only less overlapped.
local http = require("clrt.http")

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

local function deep_eq(a, b)
  if a == b then return true end
  if type(a) ~= "table" or type(b) ~= "table" then return false end
  for k, v in pairs(a) do if not deep_eq(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end

-- Generate for one prompt: inside a task the request joins the next batched call; outside,
-- the model is called directly. Returns the n samples for this prompt (a list).
function M.generate(model, prompt_tokens, opts)
  if type(prompt_tokens) ~= "table" then
    error("clrt.sched.generate: prompt_tokens must be a table of token ids, got " .. type(prompt_tokens), 2)
  end
  opts = opts or {}
  local t = M.current()
  if not t then
    local outs = model:generate({ prompt_tokens }, opts)
    local n = opts.n or 1
    local mine = {}
    for s = 1, n do mine[s] = outs[s] end
    return mine
  end
  local q = t.run.gen_queue
  q[#q + 1] = { task = t, model = model, prompt = prompt_tokens, opts = opts }
  local r = M.suspend()
  if not r.ok then error(r.err, 0) end
  return r.outs
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

-- Between decode steps: move HTTP along and let the coroutines whose replies came in go on
-- to their next request; their own generate requests wait for the next batch.
local function on_step(st)
  http.pump(0)
  fire_timers(st)
  run_ready(st)
end

local function dispatch_generate(st)
  local queue = st.gen_queue
  st.gen_queue = {}
  local groups = {}
  for _, req in ipairs(queue) do
    local g
    for _, cand in ipairs(groups) do
      if cand.model == req.model and deep_eq(cand.opts, req.opts) then g = cand break end
    end
    if not g then
      g = { model = req.model, opts = req.opts, reqs = {} }
      groups[#groups + 1] = g
    end
    g.reqs[#g.reqs + 1] = req
  end
  for _, g in ipairs(groups) do
    local prompts = {}
    for i, req in ipairs(g.reqs) do prompts[i] = req.prompt end
    local opts = {}
    for k, v in pairs(g.opts) do opts[k] = v end
    if opts.on_step == nil then opts.on_step = function() on_step(st) end end
    http.pump(0)   -- put queued HTTP requests on the wire before the model takes the CPU
    st.generate_calls = st.generate_calls + 1
    local ok, outs = pcall(g.model.generate, g.model, prompts, opts)
    local n = g.opts.n or 1
    if ok and (type(outs) ~= "table" or #outs ~= #prompts * n) then
      ok, outs = false, ("clrt.sched: model:generate returned %s entries for %d prompts x n=%d"):format(
        type(outs) == "table" and tostring(#outs) or type(outs), #prompts, n)
    end
    for i, req in ipairs(g.reqs) do
      if ok then
        local mine = {}
        for s = 1, n do mine[s] = outs[(i - 1) * n + s] end
        M.wake(req.task, { ok = true, outs = mine })
      else
        M.wake(req.task, { ok = false, err = "model:generate failed: " .. tostring(outs) })
      end
    end
  end
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
  st.ready, st.gen_queue, st.timers = {}, {}, {}
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
    n = n, tasks = {}, by_co = {}, ready = {}, timers = {}, gen_queue = {},
    results = {}, errors = {}, tracebacks = {}, done = 0, next_start = 1, generate_calls = 0,
  }
  for i, f in ipairs(fns) do st.tasks[i] = { index = i, fn = f, run = st } end
  local limit = opts.max_concurrency or n
  local deadline = opts.timeout and (http.now() + opts.timeout)
  for _ = 1, math.min(limit, n) do
    st.ready[#st.ready + 1] = st.tasks[st.next_start]
    st.next_start = st.next_start + 1
  end

  run_state = st
  local ok, err = pcall(function()
    while st.done < n do
      run_ready(st)
      if st.done >= n then break end
      if deadline and http.now() >= deadline then
        abandon(st, ("clrt.sched.run: timed out after %g s"):format(opts.timeout))
        break
      end
      if #st.gen_queue > 0 then
        dispatch_generate(st)
      else
        local wait = 0.05
        for _, tm in ipairs(st.timers) do wait = math.min(wait, tm.at - http.now()) end
        if deadline then wait = math.min(wait, deadline - http.now()) end
        if http.pending() == 0 and #st.timers == 0 and #st.ready == 0 then
          abandon(st, "clrt.sched.run: deadlock: the function waits on something that can never happen " ..
                      "(no request in flight, no timer, no generation queued)")
          break
        end
        http.pump(math.max(0, math.ceil(wait * 1000)))
        fire_timers(st)
      end
    end
  end)
  run_state = nil
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
  return st.results, st.errors, { generate_calls = st.generate_calls, tracebacks = st.tracebacks }
end

return M
