-- clrt.gen.scheduler — the one owner of generation. Per model one engine (clrt.gen.engine over
-- the model's KV-cache decoder), its queue of requests, their admission into free slots, the
-- cache's growth and its release. Every caller submits here: clrt.sched's tasks (RL rollouts,
-- evaluation), m:generate (and so clrt.chat and the REPL), `clrt chat` and `clrt serve`.
--
--   local G = require("clrt.gen.scheduler")
--   local outs = G.generate(model, prompts, opts) -- the one generate: checked, queued, waited for
--   local E = G.of(model)                  -- the model's engine state, made on first use
--   local req = G.submit(E, prompt, o, cb) -- o from clrt.gen.options.check; queued in order
--   G.admit(E, alive)                      -- start the queued requests that fit
--   G.step(E)                              -- one decode step of the rows running
--   G.drain(E, reqs, on_step)              -- admit and step until reqs have finished
--   G.drop(model)                          -- free the decoder and the prefix cache now
--   G.times(model)                         -- seconds so far in prefills and decode steps
--
-- cb.on_token(row, id, piece) and cb.on_done(row) are the engine's per-row callbacks;
-- cb.on_start(rows) runs when the request's rows join, cb.on_fail(err) when it cannot run
-- (no decoder could be made, it does not fit, a step failed).
--
-- The decoder grows only while no row runs: to the rows waiting (at least `alive`, the callers
-- that may ask soon, up to 256) and to twice the longest prompt + max_new_tokens waiting,
-- within the model's context and the bounds G.reserve set (`clrt serve --slots --max-len`).
-- The old decoder is freed (Decoder:free) before the new one is allocated. A failed step
-- frees the decoder (its rows belong to no one); G.drop frees the decoder and the model's
-- prefix cache (m:free(), m:to(device), clrt.gen.prefix_cache.configure drops the cache alone).
local gen = require("clrt.gen.engine")
local options = require("clrt.gen.options")
local prefix_cache = require("clrt.gen.prefix_cache")

local M = {}

-- model (or, for a decoder given without a model, the decoder) -> its state. Weak keys: the
-- state holds the model only weakly (and its decoder the model's table weakly), so a model
-- nobody uses goes with its cache.
local states = setmetatable({}, { __mode = "k" })

local function model_of(E) return E.owner[1] end

function M.of(model)
  if type(model) ~= "table" then
    error(("clrt.gen.scheduler: expected a model (or a decoder), got a %s"):format(type(model)), 2)
  end
  local E = states[model]
  if not E then
    E = { owner = setmetatable({ model }, { __mode = "v" }), waiting = {}, live = {},
      times = { prefill_s = 0, decode_s = 0 } }
    states[model] = E
  end
  return E
end

-- The state of an existing engine, or nil (no request has made one).
function M.peek(model) return states[model] end

-- The model's running totals of engine seconds, {prefill_s, decode_s} (zeros before any
-- request): prefills (the prefix cache's lookups and copies included) and decode steps
-- (sampling included). A caller takes differences around its work.
function M.times(model)
  local E = states[model]
  return E and { prefill_s = E.times.prefill_s, decode_s = E.times.decode_s } or { prefill_s = 0, decode_s = 0 }
end

-- Free the engine's decoder now (its rows must have finished or been failed).
local function release(E)
  local d = E.dec
  E.dec, E.eng = nil, nil
  if d and d.free then d:free() end
end

-- Decode with `dec` (a decoder the caller made: a test's fake) under `key`; it never grows.
function M.attach(key, dec)
  local E = M.of(key)
  if E.dec ~= dec then release(E) end
  E.dec, E.eng = dec, gen.engine(dec, { times = E.times })
  E.max_slots, E.max_len = dec.slots, dec.max_len
  return E
end

-- Bound the model's decoder to `slots` rows of `max_len` tokens and make it now (a server
-- sizes its cache once, at start).
function M.reserve(model, slots, max_len)
  for name, v in pairs({ slots = slots, max_len = max_len }) do
    if type(v) ~= "number" or v < 1 or v ~= math.floor(v) then
      error(("clrt.gen.scheduler.reserve(model, slots, max_len): %s must be a positive integer, got %s"):format(name, tostring(v)), 2)
    end
  end
  local E = M.of(model)
  E.max_slots, E.max_len = slots, max_len
  local d = E.dec
  if d and (d.slots ~= slots or d.max_len ~= max_len) and not M.busy(E) then release(E) end
  if not E.dec then
    E.dec = model:decoder(slots, max_len)
    E.eng = gen.engine(E.dec, { times = E.times })
  end
  return E
end

-- The largest request the engine can ever take: rows, tokens (prompt + new).
function M.capacity(E, model)
  local ctx = options.context(model) or math.huge
  return E.max_slots or math.huge, math.min(E.max_len or math.huge, ctx)
end

function M.busy(E) return E.eng ~= nil and E.eng:busy() end

-- A request waits in E.waiting until it fits. prompt: token ids; o: clrt.gen.options.check's;
-- tag, key: the engine's prompt index (in errors) and seed key (clrt.gen.options.seed_keys;
-- nil or false: none).
function M.submit(E, prompt, o, cb, tag, key)
  local usage = "clrt.gen.scheduler.submit(E, prompt, o, cb)"
  if type(E) ~= "table" or type(E.waiting) ~= "table" then error(usage .. ": E must be scheduler.of(model)", 2) end
  if type(prompt) ~= "table" then error(("%s: prompt must be a list of token ids, got a %s"):format(usage, type(prompt)), 2) end
  if type(o) ~= "table" or type(o.stop_ids) ~= "table" then error(usage .. ": o must come from clrt.gen.options.check(opts, V)", 2) end
  if cb ~= nil and type(cb) ~= "table" then error(("%s: cb must be a table of callbacks, got a %s"):format(usage, type(cb)), 2) end
  local req = { E = E, prompt = prompt, o = o, cb = cb or {}, tag = tag, key = key, need = #prompt + o.max_new_tokens }
  E.waiting[#E.waiting + 1] = req
  return req
end

local function fail(req, err)
  req.failed = err
  if req.cb.on_fail then req.cb.on_fail(err) end
end

-- A decoder for every waiting request at once, with a slot for each caller alive (so those
-- asking later join without waiting). Only called when no row runs.
local function grow(E, model, alive)
  local rows, need = 0, 0
  for _, req in ipairs(E.waiting) do rows, need = rows + req.o.n, math.max(need, req.need) end
  local d = E.dec
  if d and d.slots >= rows and d.max_len >= need then return end
  local max_slots, max_len = M.capacity(E, model)
  if d and d.slots >= math.min(rows, max_slots) and d.max_len >= math.min(need, max_len) then return end
  if not model then error("the decoder cannot grow: it was given without a model", 0) end
  local slots = math.min(max_slots, math.max(rows, math.min(alive or 0, 256), d and d.slots or 0))
  local len = math.min(max_len, math.max(need, 2 * need, d and d.max_len or 0))
  release(E)   -- the old cache goes before the new one is allocated
  E.dec = model:decoder(slots, len)
  E.eng = gen.engine(E.dec, { times = E.times })
end

local function start(E, req)
  local cb, rows = req.cb, nil
  local user_done = cb.on_done
  local left = req.o.n
  local wrapped = setmetatable({ on_done = function(row)
    left = left - 1
    if left == 0 then E.live[req] = nil end
    if user_done then user_done(row) end
  end }, { __index = cb })
  E.live[req] = true
  local ok, err = pcall(function() rows = E.eng:add(req.prompt, req.o, wrapped, req.tag, req.key) end)
  if not ok then
    E.live[req] = nil
    return fail(req, err)
  end
  req.rows = rows
  if cb.on_start then cb.on_start(rows) end
end

-- Let waiting requests join, in order: one that does not fit waits (and those behind it) for
-- free slots, or for the engine to empty when it needs a larger decoder. Returns whether rows
-- run.
function M.admit(E, alive)
  local model = model_of(E)
  while #E.waiting > 0 do
    local req = E.waiting[1]
    if not M.busy(E) then
      local ok, err = pcall(grow, E, model, alive)
      if not ok then
        local waiting = E.waiting
        E.waiting = {}
        for _, r in ipairs(waiting) do fail(r, "model:decoder failed: " .. tostring(err)) end
        break
      end
    end
    local max_slots, max_len = M.capacity(E, model)
    if req.o.n > max_slots or req.need > max_len then
      table.remove(E.waiting, 1)
      fail(req, ("generate: %d rows of %d tokens (prompt + max_new_tokens) do not fit this engine's %d slots x %d tokens")
        :format(req.o.n, req.need, max_slots, max_len))
    elseif req.o.n > E.eng:free_slots() or req.need > E.dec.max_len then
      break
    else
      table.remove(E.waiting, 1)
      start(E, req)
    end
  end
  return M.busy(E)
end

-- One decode step. A failing step fails the requests in it and frees the decoder (the next
-- request builds a fresh one). Returns whether it stepped, and the step's error if it failed.
function M.step(E)
  if not M.busy(E) then return false end
  local ok, err = pcall(E.eng.step, E.eng)
  if not ok then
    local live = E.live
    E.live = {}
    release(E)
    for req in pairs(live) do fail(req, "generate failed: " .. tostring(err)) end
    return true, err
  end
  return true
end

-- Drop a request: out of the queue, or its unfinished rows cancelled.
function M.cancel(req)
  local E = req.E
  if req.rows then
    for _, row in ipairs(req.rows) do
      if not row.finish_reason and E.eng then E.eng:cancel(row) end
    end
    E.live[req] = nil
  else
    for i, w in ipairs(E.waiting) do if w == req then table.remove(E.waiting, i) break end end
  end
end

-- Ctrl-C stops the caller (m:generate, `clrt chat`, a server), not only the requests it hit.
function M.is_interrupt(err) return err ~= nil and tostring(err):find("interrupted", 1, true) ~= nil end
local is_interrupt = M.is_interrupt

local function finished(req)
  if req.failed then return true end
  if not req.rows then return false end
  for _, row in ipairs(req.rows) do if not row.finish_reason then return false end end
  return true
end

-- Run the engine (admission and decode steps, on_step() after each) until every request of
-- `reqs` has finished; other requests in the engine go on beside them. An interrupt cancels
-- reqs' rows before it is raised again.
function M.drain(E, reqs, on_step)
  local ok, err = pcall(function()
    if on_step then on_step() end
    while true do
      local done = true
      for _, req in ipairs(reqs) do done = done and finished(req) end
      if done then return end
      M.admit(E, 0)
      local stepped, err = M.step(E)
      if is_interrupt(err) then error(err, 0) end
      if not stepped and #E.waiting > 0 then error("clrt.gen.scheduler: requests wait but nothing runs (a bug)", 0) end
      if on_step then on_step() end
    end
  end)
  if not ok then
    for _, req in ipairs(reqs) do pcall(M.cancel, req) end
    error(err, 0)
  end
end

-- Free the engine's decoder now; the requests still queued or running fail.
function M.drop_engine(E)
  local live, waiting = E.live, E.waiting
  E.live, E.waiting = {}, {}
  release(E)
  for req in pairs(live) do fail(req, "generate: the model's engine was dropped") end
  for _, req in ipairs(waiting) do fail(req, "generate: the model's engine was dropped") end
end

-- Free the model's decoder and prefix cache now (m:free(), m:to(device)).
function M.drop(model)
  local E = states[model]
  if E then
    M.drop_engine(E)
    states[model] = nil
  end
  prefix_cache.release(model)
end

-- How a request waits when its caller is a clrt.sched task: clrt.sched sets this when it loads
-- (it requires this module to step the engines, so this one cannot require it). waiter(E) ->
-- nil outside a task, else {wake = function(ok), wait = function(on_cancel)}: the task's run
-- now admits and steps E, and wait parks the task until wake.
M.waiter = nil

-- The one generate. prompts: a list of token lists; opts: clrt.gen.options' (seed_key: one
-- key per prompt, or one for a lone prompt). Returns one entry per (prompt, sample),
-- prompt-major: {tokens, logprobs, finish_reason, text, model_logprobs}. model: a model
-- (m:decoder, m.config) or the key of a decoder given with M.attach. Inside a clrt.sched task
-- the requests wait beside the other tasks'; outside one the engine runs here until they
-- finish, opts.on_step() between steps. Errors carry no position (callers add theirs).
function M.generate(model, prompts, opts)
  if type(prompts) ~= "table" then error(("generate: prompts must be a list of token lists, got a %s"):format(type(prompts)), 0) end
  local E = M.of(model)
  local cfg = type(model.config) == "table" and model.config or nil
  local V = cfg and cfg.vocab_size or (E.dec and E.dec.vocab_size)
  local o = options.check(opts, V)
  local keys = options.seed_keys(o, #prompts)
  local limit = options.context(model) or (E.dec and E.dec.max_len) or math.huge
  for p, prompt in ipairs(prompts) do options.check_prompt(p, prompt, V, o, limit) end
  local waiter = M.waiter and M.waiter(E)
  local reqs, outs, left, failed = {}, {}, #prompts, nil
  for p, prompt in ipairs(prompts) do
    local got = 0
    local cb = { on_done = function(row)
      outs[(p - 1) * o.n + row.sample] = { tokens = row.tokens, logprobs = row.logprobs,
        finish_reason = row.finish_reason, text = row.text, model_logprobs = row.model_logprobs }
      got = got + 1
      if got == o.n then
        left = left - 1
        if left == 0 and waiter then waiter.wake(true) end
      end
    end, on_fail = function(err)
      failed = failed or err
      if waiter then waiter.wake(false) end
    end }
    reqs[p] = M.submit(E, prompt, o, cb, p, keys and keys[p])
  end
  if waiter then
    waiter.wait(function() for _, req in ipairs(reqs) do M.cancel(req) end end)
  else
    M.drain(E, reqs, opts and opts.on_step)
  end
  if failed then
    for _, req in ipairs(reqs) do M.cancel(req) end
    error(failed, 0)
  end
  return outs
end

-- A run that ends leaves rows nobody waits for (a task failed or timed out): the next run starts
-- with a fresh engine.
function M.abandon(E)
  if M.busy(E) or #E.waiting > 0 then M.drop_engine(E) end
end

return M
