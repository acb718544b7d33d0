-- lua/metrics/*: rule-based metrics on fixed conversations, BLEU against hand-computed
-- values, pass_rate in its sandbox, the LLM judges with a scripted fake judge.
local T = require("clrt.test")

-- The simulated user and ctx a recipe's config gives (clrt.train.context).
local function simulator(cfg, tok)
  local ctx, user = require("clrt.train.context"){ config = cfg, tokenizer = tok, who = "collabllm_rl" }
  return user, ctx
end
local json = require("clrt.json")
local reward = require("clrt.train.reward")

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

T.case("tokens_read: the authors' efficiency, assistant tokens of the whole conversation / 1000", function()
  local m = require("metrics.tokens_read")
  -- a byte-level tokenizer with no merges: one token per byte, an independent count
  local tok = clrt.tokenizer.from_json((clrt.tokenizer.train({ "abc abc" }, { vocab_size = 256 })))
  T.eq(#tok:encode("héllo", { add_special_tokens = false }), 6)
  local c = { system, U("Write a card."), A("Which friend?"), U("Alice, please. [[TERMINATE CHAT]]"), A("Happy birthday, Alice!") }
  -- prompt turns count too (the authors score the whole session); messages joined by one space
  local want = #("Which friend?" .. " " .. "Happy birthday, Alice!") / 1000
  T.near(m.compute(c, { prompt = { system, U("Write a card.") } }, { tokenizer = tok }), want, 1e-15)
  T.eq(m.compute({ system, U("hi") }, {}, { tokenizer = tok }), 0)
  T.raises(function() m.compute(c, {}, {}) end, "no tokenizer")
  -- not verl's token_amount, which counts words of every message after the prompt
  T.eq(require("metrics.token_amount").compute(c, { prompt = { system, U("Write a card.") } }, {}), 2 + 4 + 3)
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

T.case("bleu: hand-computed char (default) and word values, brevity, smoothing", function()
  local m = require("metrics.bleu_score")
  local W = { level = "word", smoothing = "method1" }   -- clrt's old default, now an option
  -- p1 5/6, p2 3/5, p3 1/4, p4 0 matches -> 0.1/3; BP 1
  local want = math.exp(0.25 * (math.log(5 / 6) + math.log(3 / 5) + math.log(1 / 4) + math.log(0.1 / 3)))
  T.near(m.bleu("the cat sat on the mat", "the cat is on the mat", W), want, 1e-12)
  T.near(want, 0.254066, 1e-6)
  -- characters (the default, unsmoothed): p 3/4, 2/3, 1/2, and no 4-gram match -> DBL_MIN
  T.near(m.bleu("abcd", "abce"), math.exp(0.25 * (math.log(3 / 4) + math.log(2 / 3) + math.log(1 / 2) + math.log(m.DBL_MIN))), 1e-90)
  T.ok(m.bleu("abcd", "abce") < 1e-70, "no smoothing: a missing order makes the score tiny")
  T.near(m.bleu("abcd", "abce", { smoothing = "method1" }),
    math.exp(0.25 * (math.log(3 / 4) + math.log(2 / 3) + math.log(1 / 2) + math.log(0.1))), 1e-12)
  -- spaces are characters; a multi-byte character is one token (Python iterates code points)
  T.eq(m.bleu("a bc", "a bc"), 1)
  T.eq(m.bleu("éèàç", "éèàç"), 1)
  T.near(m.bleu("éèàx", "éèày", { smoothing = "method1" }),
    math.exp(0.25 * (math.log(3 / 4) + math.log(2 / 3) + math.log(1 / 2) + math.log(0.1))), 1e-12)
  -- brevity at word level: c = 2, r = 6 -> exp(1 - 3); p3, p4 have no hypothesis n-grams -> 0.1
  T.near(m.bleu("the cat", "the cat sat on the mat", W), math.exp(-2) * math.sqrt(0.1), 1e-12)
  -- brevity at char level: "abcde" vs "abcdefghij" -> exp(1 - 10/5), precisions 1
  T.near(m.bleu("abcde", "abcdefghij"), math.exp(-1), 1e-12)
  T.near(m.bleu("x y z w", "x y z w", W), 1, 1e-12)
  -- clipped counts: "the the the the" vs "the cat": p1 = 1/4
  T.near(m.bleu("the the the the", "the cat", W),
    math.exp(0.25 * (math.log(1 / 4) + math.log(0.1 / 3) + math.log(0.1 / 2) + math.log(0.1 / 1))), 1e-12)
  T.eq(m.bleu("", "the cat"), 0); T.eq(m.bleu("", "the cat", W), 0); T.eq(m.bleu("xyz", "abc"), 0)
  T.raises(function() m.bleu("a", "a", { level = "byte" }) end, "level must be")
  T.raises(function() m.bleu("a", "a", { smoothing = "method7" }) end, "smoothing must be")
end)

T.case("bleu metric extracts the document through the judge", function()
  local m = require("metrics.bleu_score")
  local j = fake_judge({ 'Sure: {"thought": "last reply", "final_completion": "the cat sat on the mat"}' })
  local s = { prompt = prompt, ground_truth = "the cat is on the mat", single_turn_prompt = "Write about a cat." }
  local v = m.compute(conversation(A("Draft: the cat sat on the mat")), s, { judge = j, extract_json = extract_json,
    metric_options = { bleu_score = { level = "word", smoothing = "method1" } } })
  T.near(v, 0.254066, 1e-6)
  T.eq(j.calls[1].opts.temperature, 0)
  T.ok(j.calls[1].messages[1].content:find("Draft: the cat sat on the mat", 1, true))
  -- without a judge: the last assistant message; the default is characters, unsmoothed
  local v2 = m.compute(conversation(A("abcde")), { prompt = prompt, ground_truth = "abcdefghij" }, {})
  T.near(v2, math.exp(-1), 1e-12)
end)

T.case("pass_rate runs the tests in its sandbox (tests/lua/test_pass_rate_sandbox.lua attacks it)", function()
  if io.open("/usr/bin/python3") == nil then T.skip("no /usr/bin/python3") end
  local m = require("metrics.pass_rate")
  local ok, why = require("clrt.sandbox").check({})
  if not ok then T.skip("no sandbox here: " .. why) end
  local code = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nEnjoy."
  local s = { prompt = prompt, tests = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n" }
  -- plain asserts are one test under semantics=strict; BigCodeBench's rule wants TestCases
  local strict = { metric_options = { pass_rate = { semantics = "strict" } } }
  T.eq(m.compute(conversation(A(code)), s, strict), 1)
  T.eq(m.compute(conversation(A(code)), s, {}), 0)
  T.eq(m.compute(conversation(A("```python\ndef add(a, b):\n    return a - b\n```")), s, strict), 0)
  T.eq(m.compute(conversation(A("I cannot do that.")), s, strict), 0)
  -- BigCodeBench-style unittest tests from the metadata
  local ut = "import unittest\nclass TestCases(unittest.TestCase):\n    def test_a(self):\n        self.assertEqual(add(1, 1), 2)\n"
  T.eq(m.compute(conversation(A(code)), { prompt = prompt, single_turn_metadata = { test = ut } }, {}), 1)
  local ut_bad = ut:gsub("2%)", "3)")
  T.eq(m.compute(conversation(A(code)), { prompt = prompt, single_turn_metadata = { test = ut_bad } }, {}), 0)
  T.raises(function() m.compute(conversation(A(code)), { prompt = prompt }, {}) end, "no tests")
  -- a loop forever is killed at its CPU limit: a failure
  T.eq(m.run_tests("while True:\n    pass\n", "", { cpu_s = 1 }), false)
end)

T.case("accuracy judge: prompt, parsing, retries, failure", function()
  local m = require("metrics.accuracy")
  local c = conversation(A("What is your friend's name?"), U("Alice."), A("Happy birthday, Alice!"))
  local j = fake_judge({ '{"thought": "matches", "accuracy": 1}' })
  T.eq(m.compute(c, sample, { judge = j, extract_json = extract_json }), 1)
  local p = j.calls[1].messages[1].content
  T.ok(p:find(sample.single_turn_prompt, 1, true)); T.ok(p:find(sample.ground_truth, 1, true))
  T.ok(p:find("**Assistant**: What is your friend's name?", 1, true)); T.ok(not p:find("Be helpful.", 1, true))
  T.eq(j.calls[1].opts.temperature, 0)
  -- a reply without the key, then a good one: the one parse retry (default) is used
  local j2 = fake_judge({ '{"thought": "hmm"}', '{"thought": "no", "accuracy": false}' })
  T.eq(m.compute(c, sample, { judge = j2, extract_json = extract_json }), 0)
  T.eq(#j2.calls, 2)
  -- out of attempts: raise, and score_conversation records a failure
  local j3 = fake_judge({ '{"accuracy": 2}', "I think it is right", '{"thought": "x", "accuracy": 1}' })
  T.raises(function() m.compute(c, sample, { judge = j3, extract_json = extract_json }) end, "after 2 attempts")
  T.eq(#j3.calls, 2)
  -- a client that raises (the HTTP client gave up) is not asked again
  local j4 = fake_judge({ function() error("HTTP 500") end, '{"thought": "x", "accuracy": 1}' })
  local s = reward.score_conversation(c, sample, { { name = "accuracy", compute = m.compute } },
    { judge = j4, extract_json = extract_json })
  T.ok(reward.is_failed(s.accuracy)); T.ok(tostring(s.accuracy.error):find("HTTP 500", 1, true)); T.eq(#j4.calls, 1)
  T.eq(m.compute(c, sample, { judge = fake_judge({ '{"accuracy": "1"}' }), extract_json = extract_json }), 1)
  T.raises(function() m.compute(c, sample, {}) end, "no judge")
end)

T.case("interactivity judge: parts mean, fallback, bad values", function()
  local m = require("metrics.interactivity")
  local c = conversation(A("What is your friend's name?"), U("Alice."), A("Happy birthday, Alice!"))
  local ctx = { judge = fake_judge({ '{"thought": "good", "understanding": 1.0, "clarification": 0.7, "suggestions": 0.3, "interactivity": 0.9}' }),
                extract_json = extract_json }
  T.near(m.compute(c, sample, ctx), (1 + 0.7 + 0.3) / 3, 1e-12)
  T.ok(ctx.judge.calls[1].messages[1].content:find("**User**: Write a birthday card for my friend.", 1, true))
  -- parts off the scale: the judge's own mean is used
  ctx.judge = fake_judge({ '{"thought": "ok", "understanding": 0.5, "clarification": 0.5, "suggestions": 0.6, "interactivity": 0.55}' })
  T.near(m.compute(c, sample, ctx), 0.55, 1e-12)
  -- a reply without the parts lacks keys the prompt and schema require
  ctx.judge = fake_judge({ '{"thought": "ok", "interactivity": 0.55}', '{"interactivity": 7}' })
  T.raises(function() m.compute(c, sample, ctx) end, "lacks key 'understanding'")
  ctx.judge = fake_judge({ '{"thought": "?", "understanding": 0.5, "clarification": 0.5, "suggestions": 0.5, "interactivity": 7}',
    '{"thought": "?", "understanding": 0.5, "clarification": 0.5, "suggestions": 0.5, "interactivity": "x"}' })
  T.raises(function() m.compute(c, sample, ctx) end, "interactivity is not a number")
end)

-- Does `text` fit the schema as clrt serve's constrained decoding reads it (one byte per
-- token through the JSON automaton)? Returns true, or false and where it stopped.
local function schema_accepts(schema, text)
  local JC = require("clrt.gen.json_constraint")
  local bytes = {}
  for b = 0, 255 do bytes[b + 1] = string.char(b) end
  local c = JC.new({ vocab = { trie = JC.vocab_from_bytes(bytes), bytes = bytes }, schema = schema })
  local st = c:state()
  for i = 1, #text do
    local ok, err = pcall(c.advance, c, st, text:byte(i))
    if not ok then return false, ("byte %d of %s: %s"):format(i, text:sub(1, 200), err) end
  end
  return c:complete(st), "incomplete: " .. text:sub(1, 200)
end

-- The keys of the JSON reply a prompt asks for, in order (its last {...} template).
local function template_keys(prompt_text)
  local tpl = prompt_text:match(".*(%b{})")
  local keys = {}
  for k in tpl:gmatch('"([%w_]+)"%s*:') do keys[#keys + 1] = k end
  return keys
end

T.case("each judge's JSON schema accepts the reply its prompt asks for", function()
  local judge = require("metrics.lib.judge")
  local cases = {
    { m = require("metrics.interactivity"), values = { understanding = "1.0", clarification = "0.7", suggestions = "0.3", interactivity = "0.6667" } },
    { m = require("metrics.accuracy"), values = { accuracy = "1" } },
    { prompt = require("clrt.prompt_file").fill(require("clrt.prompt_file").read(judge.EXTRACT_FILE),
      judge.extract_vars({}, sample, "document")), name = "extract", values = { final_completion = '"def f():\\n    return 1\\n"' } },
  }
  for _, case in ipairs(cases) do
    local name = case.m and case.m.name or case.name
    local ctx = { judge = fake_judge({}), extract_json = extract_json, judge_options = { response_format = true, max_chars = 64 } }
    local want = template_keys(case.m and case.m.PROMPT:gsub("{{", "{"):gsub("}}", "}") or case.prompt)
    -- the schema the metric actually sends
    local keys
    if case.m then
      pcall(case.m.compute, conversation(A("Hi?")), sample, ctx)
      keys = {}
      for i = 2, #want do keys[#keys + 1] = want[i] end
    else
      pcall(judge.final_completion, conversation(A("x")), sample, ctx, "bleu_score", "document")
    end
    T.ok(#ctx.judge.calls >= 1, name .. ": the judge was asked")
    local schema = ctx.judge.calls[1].opts.response_format.json_schema.schema
    T.eq(schema.propertyOrdering, want, name .. ": schema keys = prompt keys, same order")
    T.eq(schema.required, want, name .. ": every key the prompt asks for is required")
    local parts = {}
    for _, k in ipairs(want) do
      parts[#parts + 1] = ('"%s": %s'):format(k, k == "thought" and '"short reason"' or case.values[k])
    end
    local reply = "{" .. table.concat(parts, ", ") .. "}"
    local ok, why = schema_accepts(schema, reply)
    T.ok(ok, name .. ": " .. tostring(why))
    -- and the metric scores that reply
    if case.m then
      T.ok(type(case.m.compute(conversation(A("Hi?")), sample,
        { judge = fake_judge({ reply }), extract_json = extract_json })) == "number", name .. " scores the reply")
    end
  end
end)

T.case("extraction: whole conversation in, a long document out uncut", function()
  local judge = require("metrics.lib.judge")
  local long = {}
  for i = 1, 500 do long[i] = ("line %04d"):format(i) end
  local doc = table.concat(long, "\n")        -- 500 * 10 - 1 = 4999 chars
  doc = doc .. "!"
  T.eq(#doc, 5000)
  local reply = json.encode({ thought = "merged turns 1 and 3", final_completion = doc })
  local j = fake_judge({ reply })
  local ctx = { judge = j, extract_json = extract_json, judge_options = { response_format = true, max_chars = 16 } }
  local c = conversation(A("Draft one: Dear Alice"), U("Add a poem."), A("Poem: roses"), U("[[TERMINATE CHAT]]"))
  local got = judge.final_completion(c, sample, ctx, "bleu_score", "document")
  T.eq(#got, 5000); T.eq(got, doc)
  local req = j.calls[1]
  local schema = req.opts.response_format.json_schema.schema
  T.eq(schema.properties.final_completion.maxLength, nil, "final_completion is never capped")
  T.eq(schema.properties.thought.maxLength, 16, "the thought is bounded by max_chars")
  T.ok(schema_accepts(schema, ('{"thought": "turns 1 and 3", "final_completion": %s}'):format(json.encode(doc))))
  T.eq(req.opts.max_tokens, 4096, "the extraction reply may be long")
  -- the extractor sees the prompt's user turn and every later turn, never the system message
  local p = req.messages[1].content
  T.ok(p:find("**User**: Write a birthday card for my friend.", 1, true), "first user turn")
  T.ok(p:find("**Assistant**: Draft one: Dear Alice", 1, true)); T.ok(p:find("**User**: Add a poem.", 1, true))
  T.ok(p:find("**Assistant**: Poem: roses", 1, true)); T.ok(not p:find("Be helpful.", 1, true))
  T.ok(p:find("Merge the revisions", 1, true), "asks for the merged final version")
  -- instructions for the extractor (e.g. the entry point) reach the prompt
  local j2 = fake_judge({ json.encode({ thought = "t", final_completion = "```python\ndef task_func():\n    pass\n```" }) })
  local code = judge.final_completion(c, sample, { judge = j2, extract_json = extract_json }, "pass_rate", "code",
    { instructions = "Keep the function named task_func." })
  T.eq(code, "```python\ndef task_func():\n    pass\n```", "the whole final_completion, as the references run it")
  T.ok(j2.calls[1].messages[1].content:find("Keep the function named task_func.", 1, true))
  -- code_block=true: the last fenced block of it (clrt's option); without the extractor the
  -- last message's last fenced block is the default
  local j2b = fake_judge({ json.encode({ thought = "t", final_completion = "Here:\n```python\ndef task_func():\n    pass\n```" }) })
  T.eq(judge.final_completion(c, sample, { judge = j2b, extract_json = extract_json,
    metric_options = { pass_rate = { code_block = true } } }, "pass_rate", "code"), "def task_func():\n    pass\n")
  local fenced = conversation(A("Sure:\n```python\ndef g():\n    return 2\n```\nDone."))
  T.eq(judge.final_completion(fenced, sample, { metric_options = { pass_rate = { extract = false } } }, "pass_rate", "code"),
    "def g():\n    return 2\n")
  T.eq(judge.final_completion(fenced, sample, { metric_options = { pass_rate = { extract = false, code_block = false } } },
    "pass_rate", "code"), "Sure:\n```python\ndef g():\n    return 2\n```\nDone.")
  -- extract_max_tokens from the judge options, and per metric
  local j3 = fake_judge({ reply, reply })
  judge.final_completion(c, sample, { judge = j3, extract_json = extract_json, judge_options = { extract_max_tokens = 9000 } },
    "bleu_score", "document")
  judge.final_completion(c, sample, { judge = j3, extract_json = extract_json, judge_options = { extract_max_tokens = 9000 },
    metric_options = { bleu_score = { extract_max_tokens = 12000 } } }, "bleu_score", "document")
  T.eq(j3.calls[1].opts.max_tokens, 9000); T.eq(j3.calls[2].opts.max_tokens, 12000)
  -- a document the lenient parser read as a number comes back as its text
  T.eq(judge.final_completion(c, sample, { judge = fake_judge({ '{"thought": "t", "final_completion": "42"}' }),
    extract_json = require("clrt.llm").extract_json }, "bleu_score", "document"), "42")
end)

T.case("judge: one parse retry, then failure; attempts counted", function()
  local m = require("metrics.accuracy")
  local c = conversation(A("Happy birthday, Alice!"))
  local bad = '{"thought": "no key"}'
  local ctx = { judge = fake_judge({ bad, bad, bad, bad }), extract_json = extract_json, counters = {} }
  T.raises(function() m.compute(c, sample, ctx) end, "no usable reply after 2 attempts")
  T.eq(#ctx.judge.calls, 2, "parse_retries = 1 (default): exactly 2 requests")
  T.eq(ctx.counters, { judge_calls = 1, judge_attempts = 2, judge_failures = 1 })
  ctx.judge = fake_judge({ bad, bad, bad, bad })
  ctx.judge_options = { parse_retries = 0 }
  T.raises(function() m.compute(c, sample, ctx) end, "after 1 attempts")
  T.eq(#ctx.judge.calls, 1)
  ctx.judge = fake_judge({ bad, bad, '{"thought": "ok", "accuracy": 1}' })
  ctx.judge_options = { parse_retries = 2 }
  T.eq(m.compute(c, sample, ctx), 1)
  T.eq(#ctx.judge.calls, 3)
  T.eq(ctx.counters, { judge_calls = 3, judge_attempts = 6, judge_failures = 2 })
  T.raises(function() m.compute(c, sample, { judge = fake_judge({}), extract_json = extract_json,
    judge_options = { parse_retries = -1 } }) end, "parse_retries must be")
end)

T.case("judge options reach the request; recipe config reaches ctx", function()
  local m = require("metrics.accuracy")
  local c = conversation(A("Happy birthday, Alice!"))
  local ok_reply = '{"thought": "ok", "accuracy": 1}'
  local j = fake_judge({ ok_reply })
  m.compute(c, sample, { judge = j, extract_json = extract_json })
  T.eq(j.calls[1].opts.temperature, 0); T.eq(j.calls[1].opts.max_tokens, 2048, "verl's judge max_tokens"); T.eq(j.calls[1].opts.top_p, nil)
  T.eq(j.calls[1].opts.response_format, nil)
  -- from the command line through the recipe's ctx
  local config = require("clrt.config")
  local recipe = require("recipes.collabllm_rl")
  local cfg = config.parse(recipe.defaults, { "judge.base_url=http://127.0.0.1:9/v1", "judge.temperature=0.25",
    "judge.max_tokens=300", "judge.top_p=0.9", "judge.parse_retries=0", "judge.extract_max_tokens=5000",
    "judge.max_retries=7", "judge.backoff=2", "judge.max_backoff=9",
    "sim_cfg.terminate_marker=<<BYE>>", "sim_cfg.parse_retries=3",
    "+reward.metric_options.bleu_score.level=word", "+reward.metric_options.pass_rate.timeout=60" })
  -- metric_options is a map: its entries are set with or without the "+"
  T.eq(config.parse(recipe.defaults, { "reward.metric_options.bleu_score.level=word" }).reward.metric_options,
    { bleu_score = { level = "word" } })
  -- a settings table still refuses a new nested key, with the hint
  T.raises(function() config.parse(recipe.defaults, { "rollout.sampling.top_k=3" }) end, "rollout.sampling")
  local _, ctx = simulator(cfg, nil)
  T.eq(ctx.judge_options.temperature, 0.25); T.eq(ctx.judge_options.max_tokens, 300)
  T.eq(ctx.judge_options.top_p, 0.9); T.eq(ctx.judge_options.parse_retries, 0)
  T.eq(ctx.judge_options.extract_max_tokens, 5000)
  T.eq(ctx.metric_options, { bleu_score = { level = "word" }, pass_rate = { timeout = 60 } })
  T.eq(ctx.terminate_marker, "<<BYE>>"); T.eq(ctx.counters, {})
  T.eq(ctx.judge.max_retries, 7); T.eq(ctx.judge.backoff, 2); T.eq(ctx.judge.max_backoff, 9)
  ctx.judge = fake_judge({ ok_reply })
  m.compute(c, sample, ctx)
  local o = ctx.judge.calls[1].opts
  T.eq(o.temperature, 0.25); T.eq(o.max_tokens, 300); T.eq(o.top_p, 0.9)
  T.ok(o.response_format and o.response_format.json_schema.schema.properties.thought.maxLength == 1500)
  T.eq(ctx.counters.judge_attempts, 1)
  -- the bleu level from the command line is used (word here: char is the default)
  local b = require("metrics.bleu_score")
  ctx.judge = nil
  T.near(b.compute(conversation(A("a b c d e")), { prompt = prompt, ground_truth = "a b c d f" }, ctx),
    b.bleu("a b c d e", "a b c d f", { level = "word" }), 1e-12)
  -- the JSON form; sim=llm gives the user its options
  local cfg2 = config.parse(recipe.defaults, { 'reward.metric_options={"pass_rate":{"timeout":60}}', "sim=llm",
    "sim_cfg.parse_retries=3", "sim_cfg.top_p=0.8", "judge.top_p=null" })
  local user, ctx2 = simulator(cfg2, nil)
  T.eq(user.name, "collabllm_user")
  T.eq(ctx2.metric_options, { pass_rate = { timeout = 60 } })
  T.eq(ctx2.user_options.parse_retries, 3); T.eq(ctx2.user_options.top_p, 0.8)
  T.eq(ctx2.user.backoff, 0.5); T.eq(ctx2.user.max_retries, 5)
  T.eq(ctx2.terminate_marker, "[[TERMINATE CHAT]]")
  T.eq(ctx2.judge.model, "gpt-4o-mini", "the judge defaults to the verl recipe's")
  local j2 = fake_judge({ ok_reply })
  ctx2.judge = j2
  m.compute(c, sample, ctx2)
  T.eq(j2.calls[1].opts.top_p, nil, "judge.top_p=null leaves top_p out")
end)

T.case("load_metrics finds plug-ins by name", function()
  local ms = reward.load_metrics({ exact_match = 1, token_amount = -0.02 })
  T.eq(#ms, 2); T.eq(ms[1].name, "exact_match"); T.eq(ms[2].name, "token_amount")
  T.raises(function() reward.load_metrics({ no_such_metric = 1 }) end, "cannot load metric 'no_such_metric'")
end)

T.run()
