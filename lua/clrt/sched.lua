-- clrt.sched — run many plain sequential Lua functions at once, as coroutines on one thread.
--
--   local results, errors = clrt.sched.run(fns, {max_concurrency = 64, timeout = 600, raise = false})
--
-- Each function runs in its own coroutine. Inside one, anything that would wait yields to
-- the scheduler instead: c:chat(...) (clrt.llm) puts its HTTP request in flight and yields;
-- clrt.sched.generate(model, tokens, opts) queues a generation request; clrt.sched.sleep(s)
-- waits; p:wait() on a child process (clrt.proc) waits for it to end, the scheduler
-- watching its pidfd beside the HTTP sockets, so decoding and HTTP go on meanwhile.
--
-- Generation goes through the continuous-batching engine (clrt.gen.engine) that `clrt serve`
-- uses, one engine per model: a request joins the running batch at the next decode step,
-- whatever its options (temperature, top_p, top_k, max_new_tokens, stop, seed, json, ...
-- are per row), and its coroutine resumes as soon as its own rows finish. Between two
-- decode steps the scheduler moves HTTP along and runs the coroutines that can go on, so a
-- conversation's next turn joins the batch while the others still decode. A request's
-- tokens depend on its model, prompt, options, seed and seed_key only, never on which
-- requests share its steps or in which order they came: sample s draws from the stream of
-- (seed, seed_key, s) (clrt.gen.engine.row_seed). seed_key says who asks -- the RL rollouts
-- pass "rl/step 3/prompt 2/response 1/future 2/turn 1" -- so two identical requests of
-- different futures still differ, and a rerun draws alike whatever the HTTP timing. Without
-- a seed_key (serve, the REPL) the prompt's tokens name the stream: identical requests with
-- the same seed then sample alike.
-- The engine and its decoder belong to clrt.gen.scheduler (one per model, shared with
-- m:generate and `clrt serve`); the decoder grows when idle to the rows waiting and to twice
-- the longest prompt + max_new_tokens seen (capped by the model's context), freeing the old
-- one; a request that needs more waits until the running rows finish.
--
-- results[i] is the first value fns[i] returned, whatever order they finished in; an error
-- in fns[i] is caught and reported as errors[i] (a string) for that one only, or raised
-- after all have finished when opts.raise is set. A third result holds
-- {generate_calls = batched model:generate calls (models without a decoder),
--  engine_steps = decode steps of the engines, engine_steps_during_procs = those taken
--  while a task waited on a child process, wait_http_s = seconds the run waited with HTTP
--  requests in flight and no engine work to do, tracebacks = {[i] = traceback of errors[i]}}.
-- opts.timeout bounds the whole run: the functions still unfinished then get
-- errors[i] = "... timed out ..." and their HTTP requests and rows are cancelled.
--
-- A model is anything with m:decoder(slots, max_len) (clrt.model; see clrt.gen.engine for the
-- decoder's contract) and m.config.vocab_size. A model without a decoder (a fake or a
-- remote one) is called as model:generate instead, the requests with equal options that
-- wait together in one call:
--   outs = model:generate(prompts, opts)
--     prompts: a list of token rows (Lua tables of ints); opts: n, max_new_tokens,
--     temperature, top_p, top_k, stop, seed, seed_key (when any request gave one: a list,
--     prompts[i]'s key or false), and on_step;
--     outs: one entry per (prompt, sample), prompt-major: outs[(p-1)*n + s] =
--           {tokens = {...}, logprobs = {...}, finish_reason = "stop" | "length"}
--   opts.on_step, when present, is a function() the model calls between decode steps; the
--   scheduler uses it to pump HTTP and resume the coroutines whose replies came in.
local http = require("clrt.net.http")
local gen = require("clrt.gen.engine")
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

local function deep_eq(a, b)
  if a == b then return true end
  if type(a) ~= "table" or type(b) ~= "table" then return false end
  for k, v in pairs(a) do if not deep_eq(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end

-- The engine state of `model` (clrt.gen.scheduler's: one per model, whoever asks), listed in
-- this run so that its loop admits and steps it.
local function engine_of(st, model)
  local E = G.of(model)
  if not st.engine_set[E] then
    st.engine_set[E] = true
    st.engines[#st.engines + 1] = E
  end
  return E
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

-- prompts (token lists), each with o (clrt.gen.engine.options) and keys[p] (its seed key; nil
-- or false: none) into the model's engine; the n samples of every prompt, prompt-major. Inside
-- a task it waits beside the others, outside one the engine runs until they finish (on_step()
-- between steps).
function M.generate_all(model, prompts, o, keys, on_step)
  if type(prompts) ~= "table" or type(o) ~= "table" or type(o.n) ~= "number" then
    error("clrt.sched.generate_all(model, prompts, o, keys): prompts must be a list of token lists and o come from clrt.gen.engine.options", 2)
  end
  local t = M.current()
  local E = t and engine_of(t.run, model) or G.of(model)
  local reqs, outs, left, failed = {}, {}, #prompts, nil
  for p, prompt in ipairs(prompts) do
    local got = 0
    local cb = { on_done = function(row)
      outs[(p - 1) * o.n + row.sample] = { tokens = row.tokens, logprobs = row.logprobs,
        finish_reason = row.finish_reason, text = row.text, model_logprobs = row.model_logprobs }
      got = got + 1
      if got == o.n then
        left = left - 1
        if left == 0 and t then M.wake(t, true) end
      end
    end, on_fail = function(err)
      failed = failed or err
      if t then M.wake(t, false) end
    end }
    reqs[p] = G.submit(E, prompt, o, cb, p, keys and keys[p])
  end
  if t then
    M.suspend(function() for _, req in ipairs(reqs) do G.cancel(req) end end)
  else
    G.drain(E, reqs, on_step)
  end
  if failed then
    for _, req in ipairs(reqs) do G.cancel(req) end
    error(failed, 0)
  end
  return outs
end

-- Generate for one prompt: inside a task the request joins its model's engine (or, for a
-- model without a decoder, the next batched model:generate call); outside, it runs alone.
-- Returns the n samples for this prompt (a list).
function M.generate(model, prompt_tokens, opts)
  if type(prompt_tokens) ~= "table" then
    error("clrt.sched.generate: prompt_tokens must be a table of token ids, got " .. type(prompt_tokens), 2)
  end
  opts = opts or {}
  local t = M.current()
  local engine = type(model) == "table" and type(model.decoder) == "function"
  if not t then
    if engine and not run_state then
      local res, errs = M.run({ function() return M.generate(model, prompt_tokens, opts) end })
      if errs[1] then error(errs[1], 2) end
      return res[1]
    end
    if opts.seed_key ~= nil and type(opts.seed_key) ~= "table" then
      local o = {}
      for k, v in pairs(opts) do o[k] = v end
      o.seed_key = { opts.seed_key }   -- model:generate takes one key per prompt
      opts = o
    end
    local outs = model:generate({ prompt_tokens }, opts)
    local n = opts.n or 1
    local mine = {}
    for s = 1, n do mine[s] = outs[s] end
    return mine
  end
  if not engine then
    local q = t.run.gen_queue
    q[#q + 1] = { task = t, model = model, prompt = prompt_tokens, opts = opts }
    local r = M.suspend()
    if not r.ok then error(r.err, 0) end
    return r.outs
  end
  local ok, o = pcall(gen.options, opts, model.config.vocab_size)
  if not ok then error(o, 2) end
  local need = #prompt_tokens + o.max_new_tokens
  local limit = model.config.max_position_embeddings
  if limit and need > limit then
    error(("generate: a prompt of %d tokens + max_new_tokens %d exceeds the model's context of %d")
      :format(#prompt_tokens, o.max_new_tokens, limit), 2)
  end
  if type(o.seed_key) == "table" then error("clrt.sched.generate: seed_key names one request: a string or number, not a list", 2) end
  return M.generate_all(model, { prompt_tokens }, o)
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
  check_procs(st)
  run_ready(st)
end

local function dispatch_generate(st)
  local queue = st.gen_queue
  st.gen_queue = {}
  local groups = {}
  -- requests that differ only in seed_key share a call: opts.seed_key then lists each
  -- prompt's key (false: none)
  local function bare(o)
    if o.seed_key == nil then return o end
    local c = {}
    for k, v in pairs(o) do if k ~= "seed_key" then c[k] = v end end
    return c
  end
  for _, req in ipairs(queue) do
    local g
    local o = bare(req.opts)
    for _, cand in ipairs(groups) do
      if cand.model == req.model and deep_eq(cand.opts, o) then g = cand break end
    end
    if not g then
      g = { model = req.model, opts = o, reqs = {} }
      groups[#groups + 1] = g
    end
    g.reqs[#g.reqs + 1] = req
  end
  for _, g in ipairs(groups) do
    local prompts = {}
    for i, req in ipairs(g.reqs) do prompts[i] = req.prompt end
    local opts, keys = {}, {}
    for k, v in pairs(g.opts) do opts[k] = v end
    for i, req in ipairs(g.reqs) do
      local k = req.opts.seed_key
      if k == nil then k = false else opts.seed_key = keys end
      keys[i] = k
    end
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
  st.ready, st.gen_queue, st.timers, st.procs = {}, {}, {}, {}
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
  local ok, err = pcall(function()
    while st.done < n do
      run_ready(st)
      if st.done >= n then break end
      if deadline and http.now() >= deadline then
        abandon(st, ("clrt.sched.run: timed out after %g s"):format(opts.timeout))
        break
      end
      if #st.gen_queue > 0 then dispatch_generate(st) end
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
        if http.pending() == 0 and #st.timers == 0 and #st.gen_queue == 0 and #st.procs == 0 then
          abandon(st, "clrt.sched.run: deadlock: the function waits on something that can never happen " ..
                      "(no request in flight, no timer, no generation queued, no child process)")
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
  for _, E in ipairs(st.engines) do
    -- rows left by a failure belong to no one now: the next run starts with a fresh engine
    if G.busy(E) or #E.waiting > 0 then G.drop_engine(E) end
  end
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
  return st.results, st.errors, { generate_calls = st.generate_calls, engine_steps = st.engine_steps,
                                  engine_steps_during_procs = st.engine_steps_during_procs, wait_http_s = st.wait_http_s,
                                  tracebacks = st.tracebacks }
end

return M
