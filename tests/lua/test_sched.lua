-- clrt.sched: ordering, error isolation, generate requests of many tasks sharing the model's
-- engine, HTTP overlapping generation, bounds and timeouts. The models here have a fake decoder
-- whose logits are a function of its inputs, so every coroutine can check it got its own rows
-- back, and every request goes through the one owner of generation (clrt.gen.scheduler).
local T = require("clrt.test")
local http = require("clrt.net.http")
local sched, llm = clrt.sched, clrt.llm
local fake = dofile(T.source_dir() .. "/tests/support/fake_openai.lua")
local function need_python()
  if io.open("/usr/bin/python3") == nil then T.skip("/usr/bin/python3 is needed for the fake server") end
end

-- A model with a decoder (the fake of tests/lua/support/fake_model.lua): sched feeds its
-- continuous-batching engine. decs lists the decoders it made; slow_ms makes each decode step
-- take that long, as a real model's would.
package.path = T.source_dir() .. "/tests/lua/?.lua;" .. package.path
local fakedec = require("support.fake_model")
local function engine_model(slow_ms)
  local m = { config = { vocab_size = fakedec.V, max_position_embeddings = 128 }, decs = {} }
  function m:decoder(slots, max_len)
    local d = fakedec.decoder(slots, max_len)
    if slow_ms then
      local decode = d.decode
      function d:decode(...)
        local t_end = http.now() + slow_ms / 1000
        while http.now() < t_end do end
        return decode(self, ...)
      end
    end
    self.decs[#self.decs + 1] = d
    return d
  end
  function m:steps() local n = 0 for _, d in ipairs(self.decs) do n = n + d.steps end return n end
  return m
end

T.case("results come back in the order given, whatever order they finish in", function()
  -- function i finishes only after function i + 1 has: the reverse order, by construction
  -- rather than by sleep lengths, which a loaded machine reorders
  local fns, order, finished = {}, {}, {}
  for i = 1, 6 do
    fns[i] = function()
      local polls = 0
      while i < 6 and not finished[i + 1] do
        polls = polls + 1
        if polls > 10000 then error(("function %d waited 10 s for %d: not run concurrently"):format(i, i + 1)) end
        sched.sleep(0.001)
      end
      finished[i] = true
      order[#order + 1] = i
      return i * i
    end
  end
  local results, errors = sched.run(fns)
  T.eq(results, { 1, 4, 9, 16, 25, 36 })
  T.eq(errors, {})
  T.eq(order, { 6, 5, 4, 3, 2, 1 })
end)

T.case("an error is reported for its own function only", function()
  local results, errors, info = sched.run({
    function() return "a" end,
    function() sched.sleep(0.01); error("boom in two") end,
    function() sched.sleep(0.02); return "c" end,
    function() local x = nil; return x.field end,
  })
  T.eq(results[1], "a")
  T.eq(results[3], "c")
  T.eq({ results[2], results[4] }, { nil, nil })
  T.ok(errors[2]:find("boom in two", 1, true), errors[2])
  T.ok(errors[4]:find("attempt to index", 1, true), errors[4])
  T.ok(not errors[2]:find("\n"), "the message is one line; the traceback is apart")
  T.ok(info.tracebacks[2]:find("stack traceback", 1, true), tostring(info.tracebacks[2]))
  T.eq({ errors[1], errors[3] }, { nil, nil })
end)

T.case("raise = true raises the failed function's error after the others finish", function()
  local finished = false
  T.raises(function()
    sched.run({ function() error("bad one") end, function() sched.sleep(0.01); finished = true end }, { raise = true })
  end, "function 1 failed")
  T.ok(finished)
end)

T.case("generate requests of all waiting coroutines decode together, each getting its own rows", function()
  local m = engine_model()
  local opts = { n = 2, max_new_tokens = 5, temperature = 1 }
  local fns, alone = {}, {}
  for i = 1, 10 do
    alone[i] = sched.generate(engine_model(), { i, 10 }, opts)
    fns[i] = function() return sched.generate(m, { i, 10 }, opts) end
  end
  local results, errors = sched.run(fns)
  T.eq(errors, {})
  T.eq(#m.decs, 1, "one decoder")
  T.eq(m.decs[1].max_batch, 20, "the 10 requests' 20 rows in one decode batch")
  for i = 1, 10 do
    T.eq(#results[i], 2)
    T.eq({ results[i][1].tokens, results[i][2].tokens }, { alone[i][1].tokens, alone[i][2].tokens })
  end
end)

T.case("requests with different options share the steps; each turn of a conversation joins the batch", function()
  local function conversation(m, i)
    local temp = (i % 2 == 0) and 0.5 or 1.0
    local toks = { i }
    for _ = 1, 3 do   -- three turns of a conversation
      local o = sched.generate(m, toks, { temperature = temp, max_new_tokens = 2, seed = i })
      for _, t in ipairs(o[1].tokens) do toks[#toks + 1] = t end
    end
    return toks
  end
  local m = engine_model()
  local fns = {}
  for i = 1, 8 do fns[i] = function() return conversation(m, i) end end
  local results, errors = sched.run(fns)
  T.eq(errors, {})
  T.eq(m.decs[1].max_batch, 8, "both temperatures in one batch")
  T.eq(m:steps(), 3, "one decode step per turn for all 8 conversations")
  for i = 1, 8 do T.eq(results[i], conversation(engine_model(), i), "conversation " .. i .. " as alone") end
end)

T.case("a failing decoder fails only the requests of its model", function()
  local bad = engine_model()
  local decoder = bad.decoder
  function bad:decoder(slots, max_len)
    local d = decoder(self, slots, max_len)
    function d:decode() error("out of memory in decode") end
    return d
  end
  local none = engine_model()
  function none:decoder() error("cannot allocate the cache") end
  local good = engine_model()
  local o = { temperature = 0, max_new_tokens = 4 }
  local results, errors = sched.run({
    function() return sched.generate(bad, { 1 }, o) end,
    function() return sched.generate(none, { 1 }, o) end,
    function() return sched.generate(good, { 1 }, o)[1].tokens end,
  })
  T.ok(errors[1]:find("generate failed: .*out of memory in decode"), errors[1])
  T.ok(errors[2]:find("model:decoder failed: .*cannot allocate the cache"), errors[2])
  T.eq(results[3], fakedec.greedy_reference({ 1 }, 4))
end)

T.case("outside a scheduler generate runs the model's engine alone, on_step between steps", function()
  local m = engine_model()
  local o = sched.generate(m, { 2, 3 }, { n = 3, temperature = 0, max_new_tokens = 5 })
  T.eq(#o, 3)
  for s = 1, 3 do T.eq(o[s].tokens, fakedec.greedy_reference({ 2, 3 }, 5)) end
  T.eq(#m.decs, 1)
  local calls = 0
  require("clrt.gen.scheduler").generate(m, { { 4 } }, { temperature = 0, max_new_tokens = 5, on_step = function() calls = calls + 1 end })
  T.eq(calls, 1 + 5, "once before the first step and after each of the 5")
end)

T.case("max_concurrency bounds the coroutines alive at once", function()
  local alive, peak = 0, 0
  local fns = {}
  for i = 1, 12 do
    fns[i] = function()
      alive = alive + 1
      peak = math.max(peak, alive)
      sched.sleep(0.01)
      alive = alive - 1
      return i
    end
  end
  local results = sched.run(fns, { max_concurrency = 3 })
  T.eq(peak, 3)
  T.eq(#results, 12)
end)

T.case("the run timeout ends unfinished functions and cancels their requests", function()
  need_python()
  local srv = fake.start({ "--slow-s", "60", "--lifetime", "120" })
  local c = llm.client { base_url = srv.base_url, model = "m", timeout = 10 }
  local t0 = http.now()
  local results, errors = sched.run({
    function() return "quick" end,
    function() sched.sleep(30) end,
    function() return c:chat({ { role = "user", content = "[fault:slow]" } }) end,
    function() return "late start" end,
  }, { timeout = 0.3, max_concurrency = 3 })
  srv.stop()
  T.eq(results[1], "quick")
  T.eq(results[4], "late start")
  T.ok(errors[2]:find("timed out after 0.3 s", 1, true), tostring(errors[2]))
  T.ok(errors[3]:find("timed out after 0.3 s", 1, true), tostring(errors[3]))
  T.eq(http.pending(), 0, "the request was cancelled")
  T.ok(http.now() - t0 < 30, "the run did not wait for the slow request (60 s)")
end)

T.case("a coroutine waiting on nothing is reported as a deadlock, not a hang", function()
  local _, errors = sched.run({ function() sched.suspend() end, function() return 1 end })
  T.ok(errors[1]:find("deadlock", 1, true), tostring(errors[1]))
end)

T.case("bad input and misuse are clear errors", function()
  T.raises(function() sched.run({ 1 }) end, "fns[1] is a number, not a function")
  T.raises(function() sched.run("x") end, "expected a list of functions")
  local _, errors = sched.run({ function() sched.run({}) end })
  T.ok(errors[1]:find("runs do not nest", 1, true), tostring(errors[1]))
  _, errors = sched.run({ function() coroutine.yield(5) end })
  T.ok(errors[1]:find("yielded a value itself", 1, true), tostring(errors[1]))
  T.raises(function() sched.generate(engine_model(), "abc") end, "prompt_tokens must be a table")
end)

T.case("engine: a conversation's next turn joins the running batch between decode steps", function()
  local m = engine_model()
  local events = {}
  local greedy = { temperature = 0 }
  local results, errors, info = sched.run({
    function()
      local out = sched.generate(m, { 1, 2 }, { temperature = 0, max_new_tokens = 20 })
      events[#events + 1] = "long done"
      return out[1].tokens
    end,
    function()
      local turn = { 3 }
      for i = 1, 3 do
        greedy.max_new_tokens = 3
        local out = sched.generate(m, turn, greedy)
        events[#events + 1] = "turn " .. i .. " done"
        for _, tok in ipairs(out[1].tokens) do turn[#turn + 1] = tok end
      end
      return turn
    end,
  })
  T.eq(errors, {})
  T.eq(events, { "turn 1 done", "turn 2 done", "turn 3 done", "long done" })
  T.eq(results[1], fakedec.greedy_reference({ 1, 2 }, 20))
  -- every turn decodes like a fresh greedy continuation of the conversation so far
  local ref = { 3 }
  for _ = 1, 3 do for _, tok in ipairs(fakedec.greedy_reference(ref, 3)) do ref[#ref + 1] = tok end end
  T.eq(results[2], ref)
  -- the turns decoded beside the long row: 19 decode steps in all, not 19 + the turns' own
  T.eq(m:steps(), 19)
  T.eq(info.engine_steps, 20)
  T.eq(#m.decs, 1, "one decoder, made once")
  T.eq(m.decs[1].max_batch, 2)
end)

T.case("engine: requests with different options share the batch and keep their own options", function()
  local m = engine_model()
  local V = fakedec.V
  local reqs = {
    { { 1, 2, 3 }, { temperature = 0, max_new_tokens = 9 } },
    { { 4 }, { temperature = 1, max_new_tokens = 7, seed = 5, n = 2 } },
    { { 5, 5 }, { temperature = 0.7, top_k = 3, max_new_tokens = 4, seed = 9 } },
    { { 1, 2, 3 }, { temperature = 0, max_new_tokens = 9, stop = { fakedec.greedy_reference({ 1, 2, 3 }, 9)[4] } } },
  }
  local fns = {}
  for i, r in ipairs(reqs) do fns[i] = function() return sched.generate(m, r[1], r[2]) end end
  local results, errors = sched.run(fns)
  T.eq(errors, {})
  T.eq(m.decs[1].max_batch, 5, "all five rows decode in one batch")
  T.eq(results[1][1].tokens, fakedec.greedy_reference({ 1, 2, 3 }, 9))
  T.eq(#results[2], 2)
  T.eq(#results[2][1].tokens, 7)
  T.ok(not T.deep_eq(results[2][1].tokens, results[2][2].tokens), "the two samples differ")
  T.eq(#results[3][1].tokens, 4)
  local ref, upto = fakedec.greedy_reference({ 1, 2, 3 }, 9), {}
  for _, tok in ipairs(ref) do upto[#upto + 1] = tok if tok == ref[4] then break end end
  T.eq(results[4][1].tokens, upto)
  T.eq(results[4][1].finish_reason, "stop")
  for _, r in ipairs(results) do for _, o in ipairs(r) do for _, t in ipairs(o.tokens) do T.ok(t >= 0 and t < V) end end end
end)

T.case("engine: a request's tokens depend on its seed and prompt, not on the batch it joins", function()
  local sampled = { temperature = 1, top_p = 0.9, max_new_tokens = 10, seed = 4, n = 2 }
  local greedy = { temperature = 0, max_new_tokens = 10 }
  local alone_s = sched.generate(engine_model(), { 2, 7 }, sampled)
  local alone_g = sched.generate(engine_model(), { 2, 7 }, greedy)
  local m = engine_model()
  local fns = {}
  for i = 1, 5 do   -- others, with options of their own, already decoding when ours join
    fns[#fns + 1] = function() return sched.generate(m, { i, 1 }, { temperature = 1, max_new_tokens = 8 + i, seed = 4 }) end
  end
  local function after(k, opts)   -- the request, made once k tokens of another have decoded
    return function()
      sched.generate(m, { 9 }, { temperature = 0, max_new_tokens = k })
      return sched.generate(m, { 2, 7 }, opts)
    end
  end
  fns[#fns + 1] = after(2, sampled)
  fns[#fns + 1] = after(3, greedy)
  fns[#fns + 1] = after(4, sampled)   -- the same request again, later: no key, the same stream
  local keyed = {}
  for k, v in pairs(sampled) do keyed[k] = v end
  keyed.seed_key = "another asker"
  fns[#fns + 1] = after(5, keyed)     -- the same prompt from someone else: a stream of its own
  local results, errors = sched.run(fns)
  T.eq(errors, {})
  T.eq({ results[6][1].tokens, results[6][2].tokens }, { alone_s[1].tokens, alone_s[2].tokens })
  T.eq(results[7][1].tokens, alone_g[1].tokens)
  T.eq(results[7][1].tokens, fakedec.greedy_reference({ 2, 7 }, 10))
  T.eq(results[8][1].tokens, results[6][1].tokens, "without a seed_key the prompt names the stream")
  T.ok(not T.deep_eq(results[9][1].tokens, results[6][1].tokens), "another seed_key samples anew")
  T.eq(#m.decs, 1)
  T.eq(m.decs[1].max_batch, 9, "they did share steps")
end)

-- The RL rollouts' futures: identical requests (same context, same seed) from different
-- futures. Each must draw from the stream its seed_key names, whichever reaches the engine
-- first; the arrival order here is set by how long each task sleeps, as HTTP replies set it.
T.case("engine: who asks (seed_key) decides a request's stream, never its arrival order", function()
  local opts = { temperature = 1, max_new_tokens = 12, seed = 3 }
  local function run_in(order)
    local m = engine_model()
    local fns = {}
    for rank, who in ipairs(order) do
      fns[who] = function()
        sched.sleep(0.002 * rank)   -- who asks `rank`-th
        local o = { seed_key = ("future %d"):format(who) }
        for k, v in pairs(opts) do o[k] = v end
        return sched.generate(m, { 4, 2 }, o)[1].tokens
      end
    end
    local results, errors = sched.run(fns)
    T.eq(errors, {})
    return results
  end
  local forward, backward = run_in({ 1, 2, 3, 4 }), run_in({ 4, 3, 2, 1 })
  T.eq(backward, forward, "each future's tokens, asked in the opposite order")
  local distinct = {}
  for _, toks in ipairs(forward) do distinct[table.concat(toks, ",")] = true end
  local n = 0
  for _ in pairs(distinct) do n = n + 1 end
  T.eq(n, 4, "four futures, four streams")
  -- the same through m:generate's list of keys, one per prompt, in one call outside a run
  local outs = require("clrt.gen.scheduler").generate(engine_model(), { { 4, 2 }, { 4, 2 } },
    { temperature = 1, max_new_tokens = 12, seed = 3, seed_key = { "future 2", "future 4" } })
  T.eq({ outs[1].tokens, outs[2].tokens }, { forward[2], forward[4] })
end)

T.case("engine on a real model: a request alone and among others gives the same tokens and logprobs", function()
  local m = clrt.model.load(T.source_dir() .. "/tests/fixtures/model/qwen2_tied")
  local V = m.config.vocab_size
  local p = { 5 % V, 17 % V, 33 % V, 2, 9 % V, 41 % V, 7 }
  local sampled = { temperature = 1, top_p = 0.9, max_new_tokens = 12, seed = 11, n = 2 }
  local greedy = { temperature = 0, max_new_tokens = 12 }
  local alone_s, alone_g = sched.generate(m, p, sampled), sched.generate(m, p, greedy)
  local fns = {}
  for i = 1, 6 do
    fns[i] = function() return sched.generate(m, { i % V, (i + 3) % V, 4 }, { temperature = 0.8, max_new_tokens = 14, seed = i }) end
  end
  fns[7] = function() sched.generate(m, { 9 % V }, { temperature = 0, max_new_tokens = 3 }); return sched.generate(m, p, sampled) end
  fns[8] = function() sched.generate(m, { 9 % V }, { temperature = 0, max_new_tokens = 5 }); return sched.generate(m, p, greedy) end
  local r, errors = sched.run(fns)
  T.eq(errors, {})
  for s = 1, 2 do
    T.eq(r[7][s].tokens, alone_s[s].tokens)
    T.eq(r[7][s].logprobs, alone_s[s].logprobs)
  end
  T.eq(r[8][1].tokens, alone_g[1].tokens)
end)

T.case("engine: HTTP moves and coroutines go on while rows decode", function()
  need_python()
  local srv = fake.start({ "--lifetime", "30" })
  local c = llm.client { base_url = srv.base_url, model = "m", timeout = 10 }
  local m = engine_model(20)
  local events = {}
  local results, errors = sched.run({
    function()
      local out = sched.generate(m, { 1 }, { temperature = 0, max_new_tokens = 100 })   -- ~2 s of decode
      events[#events + 1] = "long done"
      return #out[1].tokens
    end,
    function()
      local r1 = c:chat({ { role = "user", content = "first [latency:30]" } })
      local r2 = c:chat({ { role = "user", content = "second [latency:30]" } })
      events[#events + 1] = "chats done"
      T.ok(m:steps() < 90, ("the chats finished at decode step %d"):format(m:steps()))
      local out = sched.generate(m, { 4 }, { temperature = 0, max_new_tokens = 2 })
      events[#events + 1] = "reply done"
      return r1.content .. "|" .. r2.content .. "|" .. #out[1].tokens
    end,
  })
  srv.stop()
  T.eq(errors, {})
  T.eq(events, { "chats done", "reply done", "long done" })
  T.eq(results, { 100, "echo:first [latency:30]|echo:second [latency:30]|2" })
end)

T.case("time split: waiting on HTTP with no engine work, and the engine's prefill and decode seconds", function()
  need_python()
  local G = require("clrt.gen.scheduler")
  local srv = fake.start({ "--lifetime", "30" })
  local c = llm.client { base_url = srv.base_url, model = "m", timeout = 10 }
  -- two answers of 300 ms one after the other, nothing else to do: the run waits on HTTP
  local t0 = http.now()
  local _, errors, info = sched.run({ function()
    c:chat({ { role = "user", content = "a [latency:300]" } })
    c:chat({ { role = "user", content = "b [latency:300]" } })
  end })
  local wall = http.now() - t0
  T.eq(errors, {})
  T.ok(info.wait_http_s >= 0.55 and info.wait_http_s <= wall, ("waited %.3f s on HTTP in a %.3f s run"):format(info.wait_http_s, wall))
  -- a timer is not HTTP
  _, errors, info = sched.run({ function() sched.sleep(0.3) end })
  T.eq(errors, {})
  T.ok(info.wait_http_s < 0.05, ("a sleep is no HTTP wait: %.3f s"):format(info.wait_http_s))
  -- an answer that comes while the engine decodes (~1 s of 20 ms steps) is no wait; the
  -- engine's seconds go to prefill (100 ms, slowed here) and decode (the steps)
  local m = engine_model(20)
  local decoder = m.decoder
  function m:decoder(slots, max_len)
    local d = decoder(self, slots, max_len)
    local prefill, prefill_many = d.prefill, d.prefill_many
    local function slow() local t_end = http.now() + 0.1 while http.now() < t_end do end end
    function d:prefill(...) slow() return prefill(self, ...) end
    function d:prefill_many(n, ...) slow() return prefill_many(self, n, ...) end
    return d
  end
  local e0 = G.times(m)
  T.eq(e0, { prefill_s = 0, decode_s = 0 }, "no engine yet: zeros")
  _, errors, info = sched.run({
    function() return sched.generate(m, { 1, 2 }, { temperature = 0, max_new_tokens = 50 }) end,
    function() return c:chat({ { role = "user", content = "c [latency:200]" } }) end,
  })
  srv.stop()
  T.eq(errors, {})
  T.ok(info.wait_http_s < 0.1, ("no HTTP wait while the engine decodes: %.3f s"):format(info.wait_http_s))
  local e1 = G.times(m)
  T.ok(e1.prefill_s >= 0.1 and e1.prefill_s < 0.5, ("prefill %.3f s (one slowed prefill of 0.1 s)"):format(e1.prefill_s))
  T.ok(e1.decode_s >= 0.9 and e1.decode_s < 5, ("decode %.3f s (49 decode steps of 20 ms)"):format(e1.decode_s))
end)

T.case("child processes: decoding and HTTP go on while a task waits on one; a deadline kills its whole group", function()
  need_python()
  local proc = require("clrt.proc")
  local srv = fake.start({ "--lifetime", "30" })
  local c = llm.client { base_url = srv.base_url, model = "m", timeout = 10 }
  local m = engine_model()
  local dir = T.tmpdir()
  local flag, marker = dir .. "/go", "clrt-sched-test-" .. tostring(os.time()) .. "-" .. tostring(math.random(1e6))
  local env = { "PATH=/usr/bin:/bin" }
  local events = {}
  local results, errors, info = sched.run({
    function()
      -- ends only once the other task has decoded and had its reply: a scheduler that waited
      -- on this process would never get there (the deadline would end it, out of order)
      local p = proc.spawn({ argv = { "sh", "-c", 'while [ ! -e "$1" ]; do sleep 0.01; done', "sh", flag }, env = env })
      local r = p:wait({ timeout = 30 })
      events[#events + 1] = "child done"
      return r.code
    end,
    function()
      local out = sched.generate(m, { 1 }, { temperature = 0, max_new_tokens = 30 })
      local r = c:chat({ { role = "user", content = "hello" } })
      events[#events + 1] = "decode+http done"
      assert(io.open(flag, "w")):close()
      return #out[1].tokens .. "|" .. r.content
    end,
    function()
      local p = proc.spawn({ argv = { "sh", "-c", 'sh -c "sleep 300; :" "$1" & sleep 300; :', "sh", marker }, env = env })
      local r = p:wait({ timeout = 0.5 })
      return { r.timed_out, r.signal, r.code }
    end,
  })
  srv.stop()
  T.eq(errors, {})
  T.eq(events, { "decode+http done", "child done" })
  T.eq(results, { 0, "30|echo:hello", { true, 9 } })
  T.ok(info.engine_steps_during_procs >= 29, ("decode steps while a child ran: %d"):format(info.engine_steps_during_procs))
  -- the grandchild went with its group
  local left
  for _ = 1, 50 do
    left = {}
    for _, pid in ipairs(require("clrt.files").list("/proc")) do
      local cmd = pid:match("^%d+$") and T.read("/proc/" .. pid .. "/cmdline")
      if cmd and cmd:find(marker, 1, true) then left[#left + 1] = pid end
    end
    if #left == 0 then break end
    http.sleep(0.05)
  end
  for _, pid in ipairs(left) do os.execute("kill -9 " .. pid) end
  T.eq(left, {}, "processes of the killed group")
  -- outside a scheduler the same wait blocks, with the same deadline
  local r = proc.spawn({ argv = { "sleep", "5" }, env = env }):wait({ timeout = 0.2 })
  T.eq({ r.timed_out, r.signal }, { true, 9 })
  T.raises(function() proc.spawn({ argv = { "/nonexistent/program" } }) end, "cannot start /nonexistent/program")
end)

T.run()
