-- lua/metrics/*: rule-based metrics on fixed conversations, BLEU against hand-computed
-- values, pass_rate in its sandbox, the LLM judges with a scripted fake judge.
local T = require("clrt.test")
local json = require("clrt.json")
local rl = require("clrt.rl")

-- A fake judge: returns queued replies in order and records every request.
local function fake_judge(replies)
  local j = { calls = {}, replies = replies }
  function j:chat(messages, opts)
    self.calls[#self.calls + 1] = { messages = messages, opts = opts }
    local r = table.remove(self.replies, 1)
    if r == nil then error("fake judge: no more replies") end
    if type(r) == "function" then return r() end
    return { content = r }
  end
  return j
end

-- Simple extract_json stub: the outermost {...} decoded strictly.
local function extract_json(text)
  local a, b = text:find("{", 1, true), nil
  for i = #text, 1, -1 do if text:sub(i, i) == "}" then b = i break end end
  if not a or not b then error("no JSON object") end
  return json.decode(text:sub(a, b))
end

local system = { role = "system", content = "Be helpful." }
local prompt = { system, { role = "user", content = "Write a birthday card for my friend." } }
local function conversation(...)
  local c = { prompt[1], prompt[2] }
  for _, m in ipairs({ ... }) do c[#c + 1] = m end
  return c
end
local A = function(t) return { role = "assistant", content = t } end
local U = function(t) return { role = "user", content = t } end
local sample = { prompt = prompt, ground_truth = "Happy birthday, Alice!",
                 single_turn_prompt = "Write a birthday card for my friend Alice." }

T.case("token_amount counts whitespace words after the prompt", function()
  local m = require("metrics.token_amount")
  T.eq(m.name, "token_amount")
  local c = conversation(A("What is your friend's name?"), U("Alice."), A("Happy  birthday,\nAlice!"), U("[[TERMINATE CHAT]]"))
  T.eq(m.compute(c, sample, {}), 5 + 1 + 3 + 2)
  T.eq(m.compute(conversation(), sample, {}), 0)
  -- without sample.prompt the prompt ends before the first assistant message
  T.eq(m.compute(c, {}, {}), 11)
end)

T.case("exact_match compares the final answer after trimming", function()
  local m = require("metrics.exact_match")
  T.eq(m.compute(conversation(A("What is your friend's name?"), U("Alice."), A(" Happy birthday, Alice!\n"), U("[[TERMINATE CHAT]]")), sample, {}), 1)
  T.eq(m.compute(conversation(A("Happy birthday, Bob!")), sample, {}), 0)
  T.eq(m.compute(conversation(A("What is your friend's name?")), sample, {}), 0)
  T.eq(m.compute(conversation(), sample, {}), 0)
  T.raises(function() m.compute(conversation(), { prompt = prompt }, {}) end, "no ground_truth")
end)

T.case("asks_question looks at the first reply only", function()
  local m = require("metrics.asks_question")
  T.eq(m.compute(conversation(A("What is your friend's name?"), U("Alice."), A("Happy birthday, Alice!")), sample, {}), 1)
  T.eq(m.compute(conversation(A("Happy birthday, Bob!"), U("Who?"), A("Sorry?")), sample, {}), 0)
  T.eq(m.compute(conversation(A("```\nx = a ? b : c\n```\nDone.")), sample, {}), 0)
end)

T.case("bleu: hand-computed word and char values, brevity, smoothing", function()
  local m = require("metrics.bleu_score")
  -- p1 5/6, p2 3/5, p3 1/4, p4 0 matches -> 0.1/3; BP 1
  local want = math.exp(0.25 * (math.log(5 / 6) + math.log(3 / 5) + math.log(1 / 4) + math.log(0.1 / 3)))
  T.near(m.bleu("the cat sat on the mat", "the cat is on the mat"), want, 1e-12)
  T.near(want, 0.254066, 1e-6)
  -- characters: p 3/4, 2/3, 1/2, 0.1/1
  T.near(m.bleu("abcd", "abce", "char"), math.exp(0.25 * (math.log(3 / 4) + math.log(2 / 3) + math.log(1 / 2) + math.log(0.1))), 1e-12)
  -- spaces are characters at char level
  T.near(m.bleu("a b", "a b", "char"), math.exp(0.25 * math.log(0.1)), 1e-12)
  -- brevity: c = 2, r = 6 -> exp(1 - 3); p3, p4 have no hypothesis n-grams -> 0.1
  T.near(m.bleu("the cat", "the cat sat on the mat"), math.exp(-2) * math.sqrt(0.1), 1e-12)
  T.near(m.bleu("x y z w", "x y z w"), 1, 1e-12)
  -- clipped counts: "the the the the" vs "the cat": p1 = 1/4
  T.near(m.bleu("the the the the", "the cat"),
    math.exp(0.25 * (math.log(1 / 4) + math.log(0.1 / 3) + math.log(0.1 / 2) + math.log(0.1 / 1))), 1e-12)
  T.eq(m.bleu("", "the cat"), 0)
end)

T.case("bleu metric extracts the document through the judge", function()
  local m = require("metrics.bleu_score")
  local j = fake_judge({ 'Sure: {"thought": "last reply", "final_completion": "the cat sat on the mat"}' })
  local s = { prompt = prompt, ground_truth = "the cat is on the mat", single_turn_prompt = "Write about a cat." }
  local v = m.compute(conversation(A("Draft: the cat sat on the mat")), s, { judge = j, extract_json = extract_json })
  T.near(v, 0.254066, 1e-6)
  T.eq(j.calls[1].opts.temperature, 0)
  T.ok(j.calls[1].messages[1].content:find("Draft: the cat sat on the mat", 1, true))
  -- without a judge: the last assistant message; char level by option
  local v2 = m.compute(conversation(A("abcd")), { prompt = prompt, ground_truth = "abce" },
    { metric_options = { bleu_score = { level = "char" } } })
  T.near(v2, math.exp(0.25 * (math.log(3 / 4) + math.log(2 / 3) + math.log(1 / 2) + math.log(0.1))), 1e-12)
end)

T.case("pass_rate runs the tests in a limited sandbox", function()
  local r = os.execute("python3 -c 'pass' >/dev/null 2>&1")
  if not (r == 0 or r == true) then T.skip("no python3 on PATH") end
  local m = require("metrics.pass_rate")
  local code = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nEnjoy."
  local s = { prompt = prompt, tests = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n" }
  T.eq(m.compute(conversation(A(code)), s, {}), 1)
  T.eq(m.compute(conversation(A("```python\ndef add(a, b):\n    return a - b\n```")), s, {}), 0)
  T.eq(m.compute(conversation(A("I cannot do that.")), s, {}), 0)
  -- BigCodeBench-style unittest tests from the metadata
  local ut = "import unittest\nclass TestCases(unittest.TestCase):\n    def test_a(self):\n        self.assertEqual(add(1, 1), 2)\n"
  T.eq(m.compute(conversation(A(code)), { prompt = prompt, single_turn_metadata = { test = ut } }, {}), 1)
  local ut_bad = ut:gsub("2%)", "3)")
  T.eq(m.compute(conversation(A(code)), { prompt = prompt, single_turn_metadata = { test = ut_bad } }, {}), 0)
  T.raises(function() m.compute(conversation(A(code)), { prompt = prompt }, {}) end, "no tests")
  -- limits: CPU time (a loop forever is a timeout = fail), memory, file size
  local ok = m.run_tests("while True:\n    pass\n", "", { cpu_s = 1 })
  T.eq(ok, false)
  local okm, detail = m.run_tests("x = bytearray(600 * 1024 * 1024)\n", "", { mem_mb = 256 })
  T.eq(okm, false); T.ok(detail:find("MemoryError", 1, true), detail)
  T.eq(m.run_tests("open('big', 'wb').write(b'x' * (4 * 1024 * 1024))\n", "", { file_mb = 1 }), false)
  T.eq(m.run_tests("open('small', 'wb').write(b'x' * 1024)\n", "", { file_mb = 1 }), true)
  -- network: only the loopback interface exists inside the sandbox
  if m.sandbox() ~= "none" then
    T.eq(m.run_tests("import socket\nassert [n for _, n in socket.if_nameindex()] == ['lo']\n", ""), true)
  end
end)

T.case("accuracy judge: prompt, parsing, retries, failure", function()
  local m = require("metrics.accuracy")
  local c = conversation(A("What is your friend's name?"), U("Alice."), A("Happy birthday, Alice!"))
  local j = fake_judge({ '{"thought": "matches", "accuracy": 1}' })
  T.eq(m.compute(c, sample, { judge = j, extract_json = extract_json }), 1)
  local p = j.calls[1].messages[1].content
  T.ok(p:find(sample.single_turn_prompt, 1, true)); T.ok(p:find(sample.ground_truth, 1, true))
  T.ok(p:find("Assistant: What is your friend's name?", 1, true)); T.ok(not p:find("Be helpful.", 1, true))
  T.eq(j.calls[1].opts.temperature, 0)
  -- a reply without the key, then one that is not JSON, then a good one: 3 attempts
  local j2 = fake_judge({ '{"thought": "hmm"}', "I think it is right", '{"thought": "no", "accuracy": false}' })
  T.eq(m.compute(c, sample, { judge = j2, extract_json = extract_json }), 0)
  T.eq(#j2.calls, 3)
  -- out of attempts: raise, and score_conversation records a failure
  local j3 = fake_judge({ '{"accuracy": 2}', '{"thought": "x"}', '{"thought": "x"}' })
  T.raises(function() m.compute(c, sample, { judge = j3, extract_json = extract_json }) end, "after 3 attempts")
  local j4 = fake_judge({ function() error("HTTP 500") end, '{"thought": "x"}' })
  local s = rl.score_conversation(c, sample, { { name = "accuracy", compute = m.compute } },
    { judge = j4, extract_json = extract_json, judge_retries = 2 })
  T.ok(rl.is_failed(s.accuracy)); T.ok(tostring(s.accuracy.error):find("lacks key 'accuracy'", 1, true))
  T.eq(m.compute(c, sample, { judge = fake_judge({ '{"accuracy": "1"}' }), extract_json = extract_json }), 1)
  T.raises(function() m.compute(c, sample, {}) end, "no judge")
end)

T.case("interactivity judge: parts mean, fallback, bad values", function()
  local m = require("metrics.interactivity")
  local c = conversation(A("What is your friend's name?"), U("Alice."), A("Happy birthday, Alice!"))
  local ctx = { judge = fake_judge({ '{"thought": "good", "understanding": 1.0, "clarification": 0.7, "suggestions": 0.3, "interactivity": 0.9}' }),
                extract_json = extract_json }
  T.near(m.compute(c, sample, ctx), (1 + 0.7 + 0.3) / 3, 1e-12)
  T.ok(ctx.judge.calls[1].messages[1].content:find("User: Write a birthday card for my friend.", 1, true))
  ctx.judge = fake_judge({ '{"thought": "ok", "interactivity": 0.55}' })
  T.near(m.compute(c, sample, ctx), 0.55, 1e-12)
  ctx.judge = fake_judge({ '{"interactivity": 7}', '{"interactivity": "x"}', '{"thought": "?"}' })
  T.raises(function() m.compute(c, sample, ctx) end, "interactivity")
end)

T.case("load_metrics finds plug-ins by name", function()
  local ms = rl.load_metrics({ exact_match = 1, token_amount = -0.02 })
  T.eq(#ms, 2); T.eq(ms[1].name, "exact_match"); T.eq(ms[2].name, "token_amount")
  T.raises(function() rl.load_metrics({ no_such_metric = 1 }) end, "cannot load metric 'no_such_metric'")
end)

T.run()
