-- The built-in world, its scripted user, the LLM user's failure path, rollouts, and the
-- reward signal the world gives scripted policies (ask / guess / direct).
local T = require("clrt.test")
local json = require("clrt.json")
local reward = require("clrt.train.reward")
local rollout = require("clrt.train.rollout")
local rng = require("clrt.rng")
local conv = require("clrt.conversation")
local world = dofile(T.source_dir() .. "/examples/collab_world/world.lua")
local user = require("interactions.scripted_user")

local function last_user(sample) return sample.prompt[#sample.prompt].content end

T.case("samples: deterministic, half under-specified, templates filled", function()
  local a, b = world.rl_prompts(200, 1), world.rl_prompts(200, 1)
  T.eq(a, b)
  T.ok(not T.deep_eq(a, world.rl_prompts(200, 2)))
  local under = 0
  for _, s in ipairs(a) do
    if s.underspecified then
      under = under + 1
      T.ok(not last_user(s):find(s.value, 1, true), "under-specified prompt leaks the value: " .. s.id)
    else
      T.ok(last_user(s):find(s.value, 1, true), "specified prompt lacks the value: " .. s.id)
    end
    T.ok(s.ground_truth:find(s.value, 1, true))
    T.ok(s.single_turn_prompt:find(s.value, 1, true))
    T.eq(s.prompt[1].role, "system"); T.eq(s.split, "train")
    T.eq(world.classify(s.ask), "ask"); T.eq(world.classify(s.ground_truth), "answer")
  end
  T.eq(under, 100)
  T.eq(#world.rl_prompts(4, 1, { system = false })[1].prompt, 1)
end)

T.case("eval prompts are held out from training", function()
  local train = {}
  for _, s in ipairs(world.rl_prompts(2000, 3)) do
    if not s.underspecified then train[last_user(s)] = true end
  end
  local ev = world.eval_prompts(400, 4)
  local under, values = 0, {}
  for _, s in ipairs(ev) do
    T.eq(s.split, "eval")
    if s.underspecified then under = under + 1
    else T.ok(not train[last_user(s)], "eval prompt seen in training: " .. last_user(s)) end
    values[s.value] = true
  end
  T.eq(under, 200)
  -- every value still appears in training text (copying a new word is not the test)
  local corpus = world.corpus()
  for v in pairs(values) do T.ok(corpus:find(v, 1, true)) end
end)

T.case("sft conversations mix asking and guessing", function()
  local convs = world.sft_conversations(2000, 5)
  local n = { under = 0, under_ask = 0, spec = 0, spec_ask = 0, guess_right = 0, guess = 0 }
  for _, c in ipairs(convs) do
    local s, m = c.sample, c.messages
    T.eq(m[#m].role, "assistant")
    local first = conv.first_reply(m, s)
    if s.underspecified then
      n.under = n.under + 1
      if world.classify(first) == "ask" then
        n.under_ask = n.under_ask + 1
        T.eq(m[#m - 1].content, s.value .. "."); T.eq(m[#m].content, s.ground_truth)
      else
        n.guess = n.guess + 1
        if first == s.ground_truth then n.guess_right = n.guess_right + 1 end
      end
    else
      n.spec = n.spec + 1
      if world.classify(first) == "ask" then n.spec_ask = n.spec_ask + 1 end
      T.eq(m[#m].content, s.ground_truth)
    end
  end
  T.near(n.under / 2000, 0.5, 0.05)
  T.near(n.under_ask / n.under, 0.5, 0.05)
  T.near(n.spec_ask / n.spec, 0.3, 0.05)
  T.ok(n.guess_right / n.guess < 0.2, "guesses are mostly wrong")
  T.ok(n.guess_right > 0, "a guess is sometimes right")
end)

T.case("scripted user: relevant, irrelevant, answers, errors", function()
  local s = world.rl_prompts(1, 7)[1]
  s = world.sample(rng.new(1), { underspecified = true, task = "trip" })
  local c = conv.copy(s.prompt)
  c[#c + 1] = { role = "assistant", content = "Which city do you want to visit?" }
  T.eq(user.respond(c, s, {}), s.value .. ".")
  c[#c].content = "Where would you like to go?"
  T.eq(user.respond(c, s, {}), s.value .. ".")
  c[#c].content = "What is your friend's name?"
  T.eq(user.respond(c, s, {}), "That is not relevant.")
  c[#c].content = "Trip plan: fly to Nowhere."
  T.eq(user.respond(c, s, {}), "[[TERMINATE CHAT]]")
  -- asked for a fact the request already gave: no new information
  local full = world.sample(rng.new(1), { underspecified = false, task = "trip" })
  local c2 = conv.copy(full.prompt)
  c2[#c2 + 1] = { role = "assistant", content = "Which city do you want to visit?" }
  T.eq(user.respond(c2, full, {}), "I already told you.")
  c[#c] = nil
  T.raises(function() user.respond(c, s, {}) end, "must end with an assistant message")
end)

-- Scripted policies: "ask" always asks its own task's question first; "guess" answers
-- with a random value; "direct" answers with the prompt's value when it has one.
local function policy_for(kind, r)
  return function(c, s)
    local t = world.task_by_id[s.task]
    local last = c[#c].content
    if c[#c - 1] and c[#c - 1].role == "assistant" and world.classify(c[#c - 1].content) == "ask" then
      -- the user gave the fact now, or points back at the request that had it
      if last == user.ALREADY_SAID then return s.ground_truth end
      return (t.answer:gsub("{v}", (last:gsub("%.$", ""))))
    end
    if kind == "ask" then return t.ask end
    if kind == "direct" and not s.underspecified then return s.ground_truth end
    return (t.answer:gsub("{v}", t.values[r:int(#t.values)]))
  end
end

T.case("rollout: turns, marker, keep/discard last, drops", function()
  local s = world.sample(rng.new(2), { underspecified = true, task = "birthday" })
  local pol = policy_for("ask", rng.new(1))
  local start = conv.copy(s.prompt); start[#start + 1] = { role = "assistant", content = pol(start, s) }
  local c, info = rollout.conversation(start, pol, user, s, {}, { max_user_turns = 2 })
  T.eq(info.ended, "marker"); T.eq(info.user_turns, 2); T.eq(info.assistant_turns, 1)
  T.eq(c[#c].content, "[[TERMINATE CHAT]]"); T.eq(c[#c - 1].content, s.ground_truth)
  T.eq(#start, 3)
  -- a user that never ends: verl mode discards the last assistant turn (A1 U1 A2 U2)
  local chatty = { respond = function() return "Tell me more." end }
  local calls = 0
  local counting = function(cc, ss) calls = calls + 1; return "Sure.", 4 end
  local c2, i2 = rollout.conversation(start, counting, chatty, s, {}, { max_user_turns = 2, keep_last_assistant = false })
  T.eq(#c2, #start + 3); T.eq(c2[#c2].role, "user"); T.eq(calls, 1); T.eq(i2.ended, "max_user_turns")
  calls = 0
  local c3 = rollout.conversation(start, counting, chatty, s, {}, { max_user_turns = 2 })
  T.eq(#c3, #start + 4); T.eq(c3[#c3].role, "assistant"); T.eq(calls, 2)
  -- verl's budget: A1 + user turns + later assistant turns; the crossing turn is discarded
  local words = function(t) local n = 0 for _ in t:gmatch("%S+") do n = n + 1 end return n end
  local c4, i4 = rollout.conversation(start, counting, chatty, s, {}, { max_user_turns = 5, max_assistant_turns = 5,
    token_budget = 12, first_tokens = 2, count_tokens = words })
  -- 2 (A1) + 3 (U1) + 4 (A2) = 9; U2 (3 more) = 12 fits; A3 (4 more) would cross: dropped
  T.eq(i4.ended, "token_budget"); T.eq(i4.tokens, 12); T.eq(c4[#c4].role, "user"); T.eq(#c4, #start + 3)
  local c4b, i4b = rollout.conversation(start, counting, chatty, s, {}, { max_user_turns = 5, token_budget = 8,
    first_tokens = 2, count_tokens = words })
  T.eq(i4b.ended, "token_budget"); T.eq(i4b.tokens, 5); T.eq(#c4b, #start + 1)
  -- a full context ends the conversation without an empty assistant turn
  local c7, i7 = rollout.conversation(start, function() return nil, 0 end, chatty, s, {}, { max_user_turns = 3 })
  T.eq(i7.ended, "context_full"); T.eq(c7[#c7].role, "user"); T.eq(#c7, #start + 1)
  local c5, i5 = rollout.conversation(start, counting, { respond = function() error("HTTP 429") end }, s, {}, {})
  T.eq(c5, nil); T.eq(i5.dropped, "simulator failed"); T.ok(i5.error:find("429", 1, true))
  local _, i6 = rollout.conversation(start, counting, { respond = function() return "  " end }, s, {}, {})
  T.eq(i6.dropped, "simulator failed")
end)

-- The multiturn-aware reward a policy's first response earns (mean over K futures).
local function mr(sample, first, pol, k, weights, futures)
  local metrics = reward.load_metrics(weights)
  local scores = {}
  for i = 1, k do
    local c = conv.copy(sample.prompt)
    c[#c + 1] = { role = "assistant", content = first }
    if futures then c = rollout.conversation(c, pol, user, sample, {}, { max_user_turns = 2 }) end
    scores[i] = reward.score_conversation(c, sample, metrics, {})
  end
  return reward.reward(scores, weights, "verl")
end

T.case("world rewards: asking pays only when needed, and only with futures", function()
  local w = world.default_weights
  local r = rng.new(9)
  local totals = { under = {}, spec = {} }
  for _, s in ipairs(world.rl_prompts(100, 11)) do
    local k = s.underspecified and "under" or "spec"
    local t = world.task_by_id[s.task]
    local guess = t.answer:gsub("{v}", t.values[r:int(#t.values)])
    local answer = s.underspecified and guess or s.ground_truth
    local pol = policy_for("ask", r)
    local entry = {
      ask_mt = mr(s, t.ask, pol, 3, w, true), answer_mt = mr(s, answer, pol, 3, w, true),
      ask_st = mr(s, t.ask, pol, 1, w, false), answer_st = mr(s, answer, pol, 1, w, false),
    }
    for key, v in pairs(entry) do totals[k][key] = (totals[k][key] or 0) + v / 50 end
  end
  local U, S = totals.under, totals.spec
  -- multiturn-aware reward: under-specified -> ask wins by a lot; specified -> answer wins
  T.ok(U.ask_mt > U.answer_mt + 0.5, ("under: ask %.3f vs guess %.3f"):format(U.ask_mt, U.answer_mt))
  T.ok(S.answer_mt > S.ask_mt + 0.05, ("spec: answer %.3f vs ask %.3f"):format(S.answer_mt, S.ask_mt))
  -- single-turn reward: asking never beats guessing (the paper's ablation)
  T.ok(U.ask_st < U.answer_st, ("single-turn under: ask %.3f vs guess %.3f"):format(U.ask_st, U.answer_st))
  -- exact values of one case: ask on "birthday" = 1 - 0.02 * (5 + 1 + 3 + 2) words
  local s = world.sample(rng.new(2), { underspecified = true, task = "birthday" })
  T.near(mr(s, "What is your friend's name?", policy_for("ask", r), 3, w, true), 1 - 0.02 * 11, 1e-12)
end)

T.case("summarize: the before/after numbers", function()
  local r = rng.new(4)
  local results = {}
  for _, kind in ipairs({ "ask", "direct" }) do
    for _, s in ipairs(world.eval_prompts(40, 5)) do
      local pol = policy_for(kind, r)
      local c = conv.copy(s.prompt)
      c[#c + 1] = { role = "assistant", content = pol(c, s) }
      c = rollout.conversation(c, pol, user, s, {}, { max_user_turns = 2 })
      results[#results + 1] = { sample = s, conversation = c, kind = kind }
    end
  end
  local ask_only, direct_only = {}, {}
  for _, x in ipairs(results) do table.insert(x.kind == "ask" and ask_only or direct_only, x) end
  local a, d = world.summarize(ask_only), world.summarize(direct_only)
  T.eq(a.ask_rate_underspecified, 1); T.eq(a.ask_rate_specified, 1)
  T.eq(a.accuracy_underspecified, 1); T.eq(a.accuracy_specified, 1)
  T.eq(d.ask_rate_underspecified, 0); T.eq(d.ask_rate_specified, 0); T.eq(d.accuracy_specified, 1)
  T.ok(d.accuracy_underspecified < 0.35)
  T.eq(a.n_underspecified, 20)
  T.ok(a.tokens_per_conversation > d.tokens_per_conversation)
  -- a custom counter (bytes here) replaces whitespace words
  local bytes, nconv = 0, 0
  for _, x in ipairs(ask_only) do
    nconv = nconv + 1
    for _, m in ipairs(conv.after_prompt(x.conversation, x.sample)) do bytes = bytes + #m.content end
  end
  T.near(world.summarize(ask_only, { count = function(t) return #t end }).tokens_per_conversation, bytes / nconv, 1e-12)
  T.ok(json.encode(a):find("tokens_per_conversation", 1, true))
end)

T.case("collabllm_user: per-conversation goal, JSON, retries, failure", function()
  local cu = require("interactions.collabllm_user")
  local function extract_json(text)
    return json.decode(text:match("^[^{]*(%b{})"))
  end
  local function client(replies)
    local c = { calls = {} }
    function c:chat(msgs, opts) self.calls[#self.calls + 1] = { msgs = msgs, opts = opts }; return { content = table.remove(replies, 1) } end
    return c
  end
  local s1 = { single_turn_prompt = "Write a poem about cats.", task_desc = "document editing", ground_truth = "SECRET" }
  local c = { { role = "system", content = "sys" }, { role = "user", content = "poem pls" }, { role = "assistant", content = "About what?" } }
  local cl = client({ 'ok {"current_answer": "none yet", "thought": "tell it", "response": "Cats. "}' })
  local slept = {}
  local text, obj = cu.respond(c, s1, { user = cl, extract_json = extract_json, sleep = function(s) slept[#slept + 1] = s end })
  T.eq(text, "Cats."); T.eq(obj.thought, "tell it")
  local p = cl.calls[1].msgs[1].content
  T.ok(p:find("Write a poem about cats.", 1, true)); T.ok(p:find("document editing", 1, true))
  T.ok(not p:find("SECRET", 1, true)); T.ok(not p:find("sys", 1, true)); T.ok(p:find("[[TERMINATE CHAT]]", 1, true))
  T.eq(cl.calls[1].opts.temperature, 1.0)
  -- two conversations with different goals through one client: no shared state
  local s2 = { single_turn_prompt = "Fix my SQL query.", task_desc = "code generation" }
  local cl2 = client({ '{"response": "a"}', '{"response": "b"}' })
  cu.respond(c, s1, { user = cl2, extract_json = extract_json })
  cu.respond(c, s2, { user = cl2, extract_json = extract_json })
  T.ok(cl2.calls[1].msgs[1].content:find("cats", 1, true)); T.ok(cl2.calls[2].msgs[1].content:find("SQL", 1, true))
  T.ok(not cl2.calls[2].msgs[1].content:find("cats", 1, true))
  -- empty response, then not JSON -> asked once more (parse_retries = 1), then an error;
  -- no back-off of its own (transport waits are the HTTP client's)
  local cl3 = client({ '{"response": "  "}', "sure thing", '{"thought": "x"}' })
  local counters = {}
  T.raises(function() cu.respond(c, s1, { user = cl3, extract_json = extract_json, counters = counters,
    sleep = function(s) slept[#slept + 1] = s end }) end, "no usable reply after 2 attempts")
  T.eq(#cl3.calls, 2); T.eq(slept, {})
  T.eq(counters, { user_calls = 1, user_attempts = 2, user_failures = 1 })
  local cl3b = client({ '{"thought": "x"}', '{"response": "fine"}' })
  T.raises(function() cu.respond(c, s1, { user = cl3b, extract_json = extract_json, user_options = { parse_retries = 0 } }) end,
    "after 1 attempts")
  T.eq(#cl3b.calls, 1)
  -- through a rollout the failure drops the sample instead of continuing with an empty turn
  local cl4 = client({ '{"response": ""}', '{"response": ""}', '{"response": ""}' })
  local out, info = rollout.conversation(c, function() return "x" end, cu, s1, { user = cl4, extract_json = extract_json }, {})
  T.eq(out, nil); T.eq(info.dropped, "simulator failed")
end)

T.case("collabllm_user: a non-string response is its text; the marker comes from ctx", function()
  local cu = require("interactions.collabllm_user")
  local llm_reply = require("clrt.llm_reply")
  local function client(replies)
    local c = { calls = {} }
    function c:chat(msgs, opts) self.calls[#self.calls + 1] = { msgs = msgs, opts = opts }; return { content = table.remove(replies, 1) } end
    return c
  end
  local s1 = { single_turn_prompt = "What is 2 + 3?", task_desc = "question answering" }
  local c = { { role = "user", content = "math q" }, { role = "assistant", content = "Which numbers?" } }
  -- the real lenient parser reads "5" as the number 5
  local lenient = clrt.llm.extract_json
  T.eq(lenient('{"response": "5"}').response, 5)
  local replies = { '{"current_answer": "none", "thought": "t", "response": "5"}', '{"response": 5}', '{"response": 2.5}',
    '{"response": "0.1"}', '{"response": true}', '{"response": -12}' }
  local want = { "5", "5", "2.5", "0.1", "true", "-12" }
  for i, r in ipairs(replies) do
    local cl = client({ r })
    T.eq(cu.respond(c, s1, { user = cl, extract_json = lenient }), want[i], r)
    T.eq(#cl.calls, 1, "accepted at once: " .. r)
  end
  -- a table or null is still no response
  T.raises(function() cu.respond(c, s1, { user = client({ '{"response": {"a": 1}}', '{"response": null}' }), extract_json = lenient }) end,
    "no \"response\" text")
  T.eq(llm_reply.text(1e20), "1e+20"); T.eq(llm_reply.text(3.0), "3"); T.eq(llm_reply.text(1 / 3), "0.3333333333333333")
  T.eq(llm_reply.text(false), "false"); T.eq(llm_reply.text({}), nil)
  -- the termination marker: ctx.terminate_marker in the prompt; a sample's own wins
  local cl = client({ '{"response": "thanks DONE!"}', '{"response": "x"}' })
  cu.respond(c, s1, { user = cl, extract_json = lenient, terminate_marker = "DONE!" })
  local p = cl.calls[1].msgs[1].content
  T.ok(p:find("exactly DONE!", 1, true)); T.ok(not p:find("[[TERMINATE CHAT]]", 1, true))
  cu.respond(c, { single_turn_prompt = "q", terminate_marker = "<<END>>" }, { user = cl, extract_json = lenient, terminate_marker = "DONE!" })
  T.ok(cl.calls[2].msgs[1].content:find("exactly <<END>>", 1, true))
  T.ok(conv.has_marker("ok DONE!", conv.marker({ terminate_marker = "DONE!" }, {})))
  T.ok(not conv.has_marker("ok [[TERMINATE CHAT]]", conv.marker({ terminate_marker = "DONE!" }, {})))
  T.ok(conv.has_marker("ok [[TERMINATE CHAT]]")); T.eq(conv.marker(nil, nil), "[[TERMINATE CHAT]]")
  -- the scripted user ends with the run's marker too
  local su = require("interactions.scripted_user")
  T.eq(su.respond({ { role = "assistant", content = "Done." } }, { value = "x" }, { terminate_marker = "DONE!" }), "DONE!")
end)

T.case("the warm start's cache folder is named by its sft settings, so other settings never reuse it", function()
  local config = require("clrt.config")
  local recipe = require("recipes.collabllm_rl")
  local warm_start = require("clrt.train.warm_start")
  local function dir(args) return warm_start.dir(config.parse(recipe.defaults, args, config.read_file(recipe.world_config_path())), world) end
  local base = dir({})
  T.eq(dir({}), base, "the same settings, the same folder")
  T.ok(base:find("^runs/collab_world_sft/world" .. world.version .. "%-%x%x%x%x%x%x%x%x%-seed1$"), base)
  T.ok(dir({ "sft.train.steps=999" }) ~= base, "another step count, another folder")
  T.ok(dir({ "sft.arch.hidden_size=64" }) ~= base, "another architecture, another folder")
  T.eq(dir({ "seed=2" }):match("seed(%d+)$"), "2")
  T.eq(dir({ "seed=2" }):gsub("seed2$", "seed1"), base, "the seed is its own part of the name")
end)

T.run()
