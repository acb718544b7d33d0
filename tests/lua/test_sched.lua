-- clrt.sched: ordering, error isolation, batching of generate requests, HTTP overlapping
-- generation, bounds and timeouts. The "model" here is a fake whose outputs are a function
-- of its inputs, so every coroutine can check it got its own rows back.
local T = require("clrt.test")
local http = require("clrt.http")
local sched, llm = clrt.sched, clrt.llm
local fake = dofile(T.source_dir() .. "/tests/support/fake_openai.lua")
local function need_python()
  if io.open("/usr/bin/python3") == nil then T.skip("/usr/bin/python3 is needed for the fake server") end
end

-- generate() returns, for prompt row p and sample s, tokens {sum(p) * 10 + s, #p, max_new}.
local function fake_model()
  local m = { calls = {}, steps = 0 }
  function m:generate(prompts, opts)
    local n = opts.n or 1
    self.calls[#self.calls + 1] = { rows = #prompts, n = n, temperature = opts.temperature }
    if self.before then self.before(opts) end
    local outs = {}
    for _, p in ipairs(prompts) do
      local sum = 0
      for _, t in ipairs(p) do sum = sum + t end
      for s = 1, n do
        outs[#outs + 1] = { tokens = { sum * 10 + s, #p, opts.max_new_tokens or 0 }, logprobs = { -0.5, -0.25, -1 },
                            finish_reason = "length" }
      end
    end
    return outs
  end
  return m
end

T.case("results come back in the order given, whatever order they finish in", function()
  local fns = {}
  for i = 1, 6 do fns[i] = function() sched.sleep((7 - i) * 0.02); return i * i end end
  local order = {}
  for i = 1, 6 do
    local f = fns[i]
    fns[i] = function() local v = f(); order[#order + 1] = i; return v end
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

T.case("generate requests of all waiting coroutines become one batched call", function()
  local m = fake_model()
  local fns = {}
  for i = 1, 10 do
    fns[i] = function()
      local outs = sched.generate(m, { i, 100 }, { n = 2, max_new_tokens = 5, temperature = 1 })
      return outs
    end
  end
  local results, errors = sched.run(fns)
  T.eq(errors, {})
  T.eq(#m.calls, 1)
  T.eq(m.calls[1].rows, 10)
  for i = 1, 10 do
    T.eq(#results[i], 2)
    T.eq(results[i][1].tokens, { (i + 100) * 10 + 1, 2, 5 })
    T.eq(results[i][2].tokens, { (i + 100) * 10 + 2, 2, 5 })
  end
end)

T.case("requests with different opts go to separate calls; multi-turn makes one call per turn", function()
  local m = fake_model()
  local fns = {}
  for i = 1, 8 do
    fns[i] = function()
      local temp = (i % 2 == 0) and 0.5 or 1.0
      local toks = { i }
      for _ = 1, 3 do   -- three turns of a conversation
        local o = sched.generate(m, toks, { temperature = temp, max_new_tokens = 1 })
        toks[#toks + 1] = o[1].tokens[1]
      end
      return toks
    end
  end
  local results, errors = sched.run(fns)
  T.eq(errors, {})
  T.eq(#m.calls, 6)   -- 3 turns x 2 temperatures
  for _, c in ipairs(m.calls) do T.eq(c.rows, 4) end
  -- turn 1: i*10+1; turn 2: (i + t1)*10 + 1; ...
  for i = 1, 8 do
    local toks, sum = { i }, i
    for _ = 1, 3 do
      local v = sum * 10 + 1
      toks[#toks + 1] = v
      sum = sum + v
    end
    T.eq(results[i], toks)
  end
end)

T.case("a failing or malformed generate fails only the coroutines in that batch", function()
  local bad = { generate = function() error("out of memory in decode") end }
  local short = { generate = function() return {} end }
  local good = fake_model()
  local results, errors = sched.run({
    function() return sched.generate(bad, { 1 }, {}) end,
    function() return sched.generate(short, { 1 }, {}) end,
    function() return sched.generate(good, { 1 }, {})[1].tokens[1] end,
  })
  T.ok(errors[1]:find("model:generate failed: .*out of memory in decode"), errors[1])
  T.ok(errors[2]:find("returned 0 entries for 1 prompts x n=1", 1, true), errors[2])
  T.eq(results[3], 11)
end)

T.case("outside a scheduler generate calls the model directly", function()
  local m = fake_model()
  local o = sched.generate(m, { 2, 3 }, { n = 3 })
  T.eq(#o, 3)
  T.eq(o[3].tokens[1], 53)
  T.eq(#m.calls, 1)
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
  local srv = fake.start({ "--slow-s", "5", "--lifetime", "30" })
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
  T.ok(http.now() - t0 < 5, "the run did not wait for the slow request")
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
  T.raises(function() sched.generate(fake_model(), "abc") end, "prompt_tokens must be a table")
end)

T.case("HTTP moves while the model decodes: on_step resumes coroutines whose replies came in", function()
  need_python()
  local srv = fake.start({ "--lifetime", "30" })
  local c = llm.client { base_url = srv.base_url, model = "m", timeout = 10 }
  local m = fake_model()
  local chats_done = 0
  -- The fake model "decodes" until both chat coroutines have finished, calling on_step
  -- between steps; without the hook they could only finish after generate returned.
  m.before = function(opts)
    local t_end = http.now() + 10
    while chats_done < 2 and http.now() < t_end do
      m.steps = m.steps + 1
      opts.on_step()
    end
    m.chats_done_in_generate = chats_done
  end
  local results, errors = sched.run({
    function()
      local r1 = c:chat({ { role = "user", content = "first [latency:30]" } })
      local r2 = c:chat({ { role = "user", content = "second [latency:30]" } })   -- sent from on_step
      chats_done = chats_done + 1
      return r1.content .. "|" .. r2.content
    end,
    function() chats_done = chats_done + 1 + (c:chat({ { role = "user", content = "third [latency:30]" } }) and 0) end,
    function() return sched.generate(m, { 1 }, {})[1].tokens[1] end,
  })
  srv.stop()
  T.eq(errors, {})
  T.eq(m.chats_done_in_generate, 2, "both chats finished during the generate call")
  T.eq(#m.calls, 1)
  T.eq(results[1], "echo:first [latency:30]|echo:second [latency:30]")
  T.eq(results[3], 11)
end)

T.run()
