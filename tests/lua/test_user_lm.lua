-- sim=user_lm (lua/interactions/user_lm.lua) and the user model's recipe
-- (recipes/collabllm_user_sft.lua), against the real thing where it can run: a tiny model
-- folder whose chat template flips the roles as UserLM-8b's does (the simulator's own turns,
-- "assistant" in the OpenAI request, rendered under the user header, and the generation
-- prompt the user header too), taught a few SFT steps to answer a question with "Alice." and
-- anything else with <|endconversation|>, served by `clrt serve --deterministic`. The
-- request shapes and the bad replies are checked with a client that records what it is
-- sent and answers what the case needs.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local cjson = require("cjson")
local data = require("clrt.data")
local config = require("clrt.config")
local files = require("clrt.files")
local conv = require("clrt.conversation")
local user_lm = require("interactions.user_lm")
local user_sft = require("recipes.collabllm_user_sft")

-- A client that records each request and replies with the next of `replies`
-- ({content =, finish_reason =} or a string; an error string raises as a refused request).
local function recorder(replies)
  local c = { sent = {} }
  function c:chat(messages, opts)
    self.sent[#self.sent + 1] = { messages = messages, opts = opts }
    local r = table.remove(replies, 1)
    if type(r) == "table" and r.raise then error(r.raise, 0) end
    if type(r) == "string" then r = { content = r, finish_reason = "stop" } end
    return r
  end
  return c
end
local function ctx_of(client, o)
  return { user = client, user_options = o or { max_chars = 100, max_tokens = 24 }, counters = {}, seed = 7 }
end
local SAMPLE = { single_turn_prompt = "Write a birthday card for my friend Alice.", task_desc = "writing",
  prompt = { { role = "system", content = "You are a helpful assistant." }, { role = "user", content = "Write a birthday card for my friend." } } }

T.case("the intent is the system message, the roles are flipped, the policy's system prompt is not sent", function()
  local c = recorder({ "Alice." })
  local chat = { SAMPLE.prompt[1], SAMPLE.prompt[2], { role = "assistant", content = "What is your friend's name?" } }
  local text = user_lm.respond(chat, SAMPLE, ctx_of(c), { seed_key = "rl/step 1/prompt 1/user 1" })
  T.eq(text, "Alice.")
  T.eq(c.sent[1].messages, {
    { role = "system", content = SAMPLE.single_turn_prompt },
    { role = "assistant", content = "Write a birthday card for my friend." },   -- the simulator's own turn
    { role = "user", content = "What is your friend's name?" },                 -- the policy's: the other party
  })
  T.eq(c.sent[1].opts.temperature, 1.0, "sampled as the LLM user is")
  T.ok(c.sent[1].opts.response_format == nil, "plain text: no JSON schema asked")
  -- another field holds the intent; flip_roles=false sends the roles as they are
  local c2 = recorder({ "Alice." })
  user_lm.respond(chat, { goal = "the intent", single_turn_prompt = "x" }, ctx_of(c2, { intent_field = "goal", flip_roles = false }))
  T.eq(c2.sent[1].messages[1].content, "the intent")
  T.eq(c2.sent[1].messages[2].role, "user")
  local c3 = recorder({ "Alice." })
  user_lm.respond(chat, { meta = { goal = "nested" } }, ctx_of(c3, { intent_field = "meta.goal" }))
  T.eq(c3.sent[1].messages[1].content, "nested")
  T.raises(function() user_lm.respond(chat, { task_desc = "x" }, ctx_of(recorder({ "a" }))) end, "no intent text")
end)

T.case("the end marker ends the chat as [[TERMINATE CHAT]] does; a custom marker too", function()
  local chat = { SAMPLE.prompt[2], { role = "assistant", content = "Happy birthday, Alice!" } }
  local ctx = ctx_of(recorder({ "<|endconversation|>", "Thanks! <|endconversation|> more", "bye [[END]]" }))
  T.eq(user_lm.respond(chat, SAMPLE, ctx), conv.TERMINATE)
  T.eq(user_lm.respond(chat, SAMPLE, ctx), "Thanks! " .. conv.TERMINATE, "the text before the marker is kept, what follows it dropped")
  T.eq(ctx.counters["user_lm/ended"], 2)
  ctx.user_options.end_marker = "[[END]]"
  ctx.terminate_marker = "<<done>>"
  T.eq(user_lm.respond(chat, SAMPLE, ctx), "bye <<done>>", "the run's own terminate marker")
  -- the rollout ends there
  local rollout = require("clrt.train.rollout")
  local c, info = rollout.conversation(chat, function() return "unused" end, user_lm, SAMPLE,
    ctx_of(recorder({ "ok <|endconversation|>" })), { max_user_turns = 3 })
  T.eq(info.ended, "marker")
  T.eq(c[#c].content, "ok " .. conv.TERMINATE)
end)

T.case("bad replies: counted outcomes, the sample dropped, never a crash", function()
  local rollout = require("clrt.train.rollout")
  local function run(replies, chat, o)
    local ctx = ctx_of(recorder(replies), o)
    local c, info = rollout.conversation(chat, function() return "an answer" end, user_lm, SAMPLE, ctx, { max_user_turns = 2 })
    return c, info, ctx.counters
  end
  local asked = { SAMPLE.prompt[2], { role = "assistant", content = "What is your friend's name?" } }
  -- empty twice (parse_retries 1): dropped, counted
  local c, info, n = run({ "", "   " }, asked)
  T.eq(c, nil); T.eq(info.dropped, "simulator failed"); T.ok(info.error:find("empty reply", 1, true), info.error)
  T.eq(n["user_lm/empty"], 2); T.eq(n.user_failures, 1); T.eq(n.user_attempts, 2)
  -- an empty reply, then a good one: the retry draws its own seed and the chat goes on
  local cr = recorder({ "", "Alice." })
  local ctx = ctx_of(cr)
  T.eq(user_lm.respond(asked, SAMPLE, ctx, { seed_key = "k" }), "Alice.")
  T.ok(cr.sent[1].opts.seed ~= cr.sent[2].opts.seed, "the retry is another sample")
  -- longer than the cap, or cut at max_tokens
  c, info, n = run({ ("x"):rep(101), { content = "short", finish_reason = "length" } }, asked)
  T.eq(c, nil); T.ok(info.error:find("longer than the cap", 1, true), info.error); T.eq(n["user_lm/too_long"], 2)
  -- only the marker where the user opens an empty chat: no conversation to score
  c, info, n = run({ "<|endconversation|>" }, { SAMPLE.prompt[1] })
  T.eq(c, nil); T.ok(info.error:find("before it began", 1, true), info.error); T.eq(n["user_lm/ended_at_open"], 1)
  -- ... but after the assistant's answer it is the user being done
  c, info = run({ "<|endconversation|>" }, { SAMPLE.prompt[2], { role = "assistant", content = "Happy birthday, Alice!" } })
  T.eq(info.ended, "marker")
  -- a refused request (the endpoint has no such model): dropped at once with its message
  c, info, n = run({ { raise = "HTTP 404: model_not_found: The model 'nope' does not exist" } }, asked)
  T.eq(c, nil); T.ok(info.error:find("model_not_found", 1, true), info.error); T.eq(n.user_failures, 1); T.eq(n.user_attempts, 1)
end)

T.case("a seed per turn from the run's seed and the turn's key", function()
  T.eq(user_lm.seed_of(1, "a"), user_lm.seed_of(1, "a"))
  T.ok(user_lm.seed_of(1, "a") ~= user_lm.seed_of(2, "a"))
  T.ok(user_lm.seed_of(1, "rl/step 1/user 1") ~= user_lm.seed_of(1, "rl/step 1/user 2"))
  local s = user_lm.seed_of(123456, ("x"):rep(500))
  T.ok(s >= 0 and s < 2 ^ 31 and s == math.floor(s))
end)

T.case("a local simulator is priced at 0 unless a price is set", function()
  local prices = require("clrt.api.prices")
  for _, u in ipairs({ "http://127.0.0.1:8000/v1", "http://localhost/v1", "http://[::1]:9/v1", "https://127.4.5.6/v1" }) do
    T.ok(prices.is_local(u), u)
  end
  for _, u in ipairs({ "https://api.openai.com/v1", "http://127.0.0.1.evil.com/v1", "http://10.0.0.1/v1", "localhost" }) do
    T.ok(not prices.is_local(u), u)
  end
  local lp = require("clrt.train.context").local_priced
  T.eq(lp({ base_url = "http://127.0.0.1:1/v1", model = "world-user" }).price, { input = 0, cached_input = 0, output = 0 })
  T.eq(lp({ base_url = "http://127.0.0.1:1/v1", model = "gpt-4o-mini" }).price, nil, "a stand-in for a listed model keeps its list price")
  T.eq(lp({ base_url = "http://127.0.0.1:1/v1", price = { input = 1, output = 2 } }).price, { input = 1, output = 2 })
  T.eq(lp({ base_url = "https://api.openai.com/v1", model = "gpt-4o-mini" }).price, nil)
end)

T.case("collabllm_user_sft: roles flipped, intent first, the marker closes, the loss on the user's turns only", function()
  local msgs = { { role = "system", content = "sys" }, { role = "user", content = "Write a card." },
    { role = "assistant", content = "For whom?" }, { role = "user", content = "Alice." }, { role = "assistant", content = "Happy birthday, Alice!" } }
  local f = user_sft.flip(msgs, "Write a card for Alice.", "<|endconversation|>")
  T.eq(f, { { role = "system", content = "Write a card for Alice." }, { role = "assistant", content = "Write a card." },
    { role = "user", content = "For whom?" }, { role = "assistant", content = "Alice." }, { role = "user", content = "Happy birthday, Alice!" },
    { role = "assistant", content = "<|endconversation|>" } })
  local f2 = user_sft.flip({ msgs[2], msgs[3], msgs[4] }, "i", "<E>")
  T.eq(f2[#f2], { role = "assistant", content = "Alice.<E>" }, "a chat ending on a user turn: the marker appended to it")
  T.eq(user_sft.flip({ msgs[1], msgs[3] }, "i", "<E>"), nil, "no user turn: nothing to learn")
  T.ok(user_sft.reveals(msgs, "write  A card."), "word for word, whitespace and case aside")
  T.ok(not user_sft.reveals(msgs, "Write a card for Alice."))
  -- what the trainer sees: only the user's text (and the marker) is trained on
  local dir = require("support.tiny_model")(T.tmpdir(), { seed = 2 })
  local tok = clrt.tokenizer.load(dir)
  local items = require("clrt.sft").encode(tok, { f }, 512)
  local trained = {}
  for i, id in ipairs(items[1].ids) do if items[1].mask[i] == 1 then trained[#trained + 1] = id end end
  local text = tok:decode(trained)
  T.ok(text:find("Write a card.", 1, true) and text:find("Alice.", 1, true) and text:find("<|endconversation|>", 1, true), text)
  T.ok(not text:find("For whom", 1, true) and not text:find("Happy birthday", 1, true), "the assistant's turns are context only: " .. text)
end)

T.case("collabllm_user_sft reads CollabLLM rows and messages rows, filters revealed intents and counts them", function()
  local root = T.tmpdir()
  local rows = {
    -- conversation 1: two turns; the later turn's best row is used
    { conv_id = 1, turn_id = 0, score = 0.1, single_turn_prompt = "Plan a trip to Rome.", completion = "Where to?",
      prompt = { { role = "user", content = "Plan a trip." } } },
    { conv_id = 1, turn_id = 1, score = 0.5, single_turn_prompt = "Plan a trip to Rome.", completion = "Trip plan: Rome.",
      prompt = { { role = "user", content = "Plan a trip." }, { role = "assistant", content = "Where to?" }, { role = "user", content = "Rome." } } },
    { conv_id = 1, turn_id = 1, score = 0.2, single_turn_prompt = "Plan a trip to Rome.", completion = "worse",
      prompt = { { role = "user", content = "Plan a trip." }, { role = "assistant", content = "Where to?" }, { role = "user", content = "Rome." } } },
    -- conversation 2 pastes its whole intent in the first turn
    { conv_id = 2, turn_id = 0, score = 1, single_turn_prompt = "Order sushi.", completion = "Order placed: sushi.",
      prompt = { { role = "user", content = "Please: order sushi. Thanks" } } },
  }
  data.write_jsonl(root .. "/rows.jsonl", rows)
  local items = user_sft.read_source(root .. "/rows.jsonl", "single_turn_prompt")
  T.eq(#items, 2)
  local cfg = { data = root .. "/rows.jsonl", intent_field = "single_turn_prompt", end_marker = "<|endconversation|>", drop_revealed = true }
  local out = user_sft.conversations(cfg)
  T.eq(#out, 1, "conversation 2 reveals its intent word for word")
  T.eq(out[1].messages[#out[1].messages].content, "<|endconversation|>")
  T.eq(out[1].messages[#out[1].messages - 1], { role = "user", content = "Trip plan: Rome." }, "the best row's completion")
  cfg.drop_revealed = false
  T.eq(#user_sft.conversations(cfg), 2)
  -- messages rows (WildChat-style) with their intent in a named field; one without is counted
  data.write_jsonl(root .. "/chats.jsonl", { { intent = "a goal", messages = { { role = "user", content = "hi" }, { role = "assistant", content = "hello" } } },
    { messages = { { role = "user", content = "x" } } } })
  local it, missing = user_sft.read_source(root .. "/chats.jsonl", "intent")
  T.eq(#it, 1); T.eq(missing, 1)
  -- a whole run: the same trainer and options as collabllm_sft.lua (here 3 steps), a model folder out
  local base = require("support.tiny_model")(root .. "/base", { seed = 3 })
  local model = user_sft.main(config.parse(user_sft.defaults, { "model=" .. base, "data=" .. root .. "/chats.jsonl", "intent_field=intent",
    "run_dir=" .. root .. "/run", "train.steps=3", "train.batch_size=1", "train.lr=1e-3", "train.val_every=0", "val_fraction=0", "save_every=0" }))
  T.ok(files.exists(model .. "/model.safetensors") and files.exists(model .. "/tokenizer.json"), model)
  T.raises(function() user_sft.main(config.parse(user_sft.defaults, { "model=" .. base, "data=" .. root .. "/chats.jsonl",
    "run_dir=" .. root .. "/run2" })) end, "no conversation left")
end)

if os.execute("command -v curl > /dev/null 2>&1") ~= 0 then
  T.run(...)
  return
end

-- The UserLM-style folder: a template that flips the roles (generation under the user header).
local FLIP = "{% for m in messages %}{% if m['role'] == 'system' %}{{ '<|im_start|>system\\n' + m['content'] + '<|im_end|>\\n' }}"
  .. "{% elif m['role'] == 'assistant' %}{{ '<|im_start|>user\\n' + m['content'] + '<|im_end|>\\n' }}"
  .. "{% else %}{{ '<|im_start|>assistant\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
  .. "{% if add_generation_prompt %}{{ '<|im_start|>user\\n' }}{% endif %}"
local root = T.tmpdir()
local user_dir = require("support.tiny_model")(root .. "/user", { seed = 11, max_position = 1024 })
do
  local p = user_dir .. "/tokenizer_config.json"
  local tc = cjson.decode(files.read(p))
  tc.chat_template = FLIP
  files.write_atomic(p, cjson.encode(tc))
  local m, tok = clrt.model.load(user_dir), clrt.tokenizer.load(user_dir)
  -- the template's own rendering: the simulator's turn under the user header
  local text = require("clrt.chat").spans(tok, { { role = "system", content = "i" }, { role = "user", content = "q?" },
    { role = "assistant", content = "a" } })
  T.ok(text:find("<|im_start|>assistant\nq?", 1, true) and text:find("<|im_start|>user\na<|im_end|>", 1, true), text)
  -- the shape sim=user_lm sends: intent, the user's own opening (as "assistant"), the
  -- policy's reply (as "user"); a question gets "Alice.", anything else the end marker
  local convs = {}
  local world = require("collab_world.world")
  -- the policy's turns: random words (a tiny policy's), a question when they end in "?"
  local words = { "hello", "there", "how", "are", "you", "what", "is", "your", "name", "city", "ok", "a", "card", "fine" }
  local r = require("clrt.rng").new(4)
  local function babble()
    if r:int(3) == 1 then return r:int(2) == 1 and "ok" or "what is the name" end   -- what the policy below says
    local t = {}
    for k = 1, r:int(6) do t[k] = words[r:int(#words)] end
    return table.concat(t, " ")
  end
  for i, s in ipairs(world.rl_prompts(64, 9)) do
    local head = { { role = "system", content = s.single_turn_prompt }, { role = "assistant", content = s.prompt[#s.prompt].content } }
    local q, o = { head[1], head[2] }, { head[1], head[2] }
    q[3] = { role = "user", content = babble() .. "?" }; q[4] = { role = "assistant", content = "Alice." }
    o[3] = { role = "user", content = babble() }; o[4] = { role = "assistant", content = "<|endconversation|>" }
    convs[#convs + 1], convs[#convs + 2] = q, o
  end
  local sft = require("clrt.sft")
  sft.train(m, sft.encode(tok, convs, 512), nil, { steps = 150, batch_size = 16, lr = 1e-2, seed = 1 })
  m:save(user_dir)
end
local srv = require("support.serve")(user_dir, "--deterministic --slots 32 --served-model-name userlm")
local policy_dir = require("support.tiny_model")(root .. "/policy", { seed = 5 })
do   -- a policy that ends its turns: a few steps on short replies
  local sft = require("clrt.sft")
  local m, tok = clrt.model.load(policy_dir), clrt.tokenizer.load(policy_dir)
  local convs = {}
  for i = 1, 16 do
    convs[i] = { { role = "user", content = "Write a card for my friend " .. i .. "." }, { role = "assistant", content = i % 2 == 0 and "ok" or "what is the name?" } }
  end
  sft.train(m, sft.encode(tok, convs, 256), nil, { steps = 40, batch_size = 16, lr = 1e-2, seed = 1 })
  m:save(policy_dir)
end
local rl = require("recipes.collabllm_rl")
local function rl_run(dir, extra)
  local argv = { "model=" .. policy_dir, "run_dir=" .. dir, "steps=2", "prompts_per_step=4", "rollout.n=2", "seed=3",
    "rollout.num_repeat_rollouts=2", "rollout.max_user_turns=2", "rollout.max_new_tokens=8", "sim=user_lm",
    "rollout.future_temperature=0.3",
    "sim_cfg.base_url=" .. srv.url, "sim_cfg.model=userlm", "sim_cfg.max_tokens=48", "sim_cfg.max_chars=200",
    'reward.metric_weights={"exact_match":1,"token_amount":-0.02}', "eval.before=false", "eval.after=false", "save_every=0" }
  for _, a in ipairs(extra or {}) do argv[#argv + 1] = a end
  rl.main(config.parse(rl.defaults, argv, config.read_file(rl.world_config_path())))
  return data.read_jsonl(dir .. "/metrics.jsonl")
end

T.case("clrt serve of a role-flipping user model drives collabllm_rl.lua sim=user_lm; its API bill is $0, its tokens counted", function()
  local rows = rl_run(root .. "/run1")
  T.eq(#rows, 2)
  local ended, calls = 0, 0
  for _, r in ipairs(rows) do
    ended = ended + (r["user_lm/ended"] or 0)
    calls = calls + (r["api/user/calls"] or 0)
    T.eq(r["api/user/usd"] or 0, 0, "a local simulator costs nothing")
    T.ok(r["api/unpriced_calls"] == nil, "and is not an unpriced model")
  end
  T.ok(calls > 0 and rows[1]["api/user/prompt_tokens"] > 0, "its calls and tokens are counted")
  T.ok(ended > 0, "the served model's <|endconversation|> ended chats")
  -- the replies it learned: "Alice." after a question, in the rollouts the run kept
  local answered = false
  for _, p in ipairs(data.read_jsonl(root .. "/run1/rollouts.jsonl")) do
    for _, resp in ipairs(p.type == "prompt" and p.responses or {}) do
      for _, fut in ipairs(resp.futures or {}) do
        for _, m in ipairs(fut.messages or {}) do
          if m.role == "user" and m.content == "Alice." then answered = true end
        end
      end
    end
  end
  T.ok(answered, "the user model answered a question through the flipped template")
end)

T.case("clrt serve --deterministic as the simulator: the same seed gives the same metrics", function()
  local a = rl_run(root .. "/run_a")
  local b = rl_run(root .. "/run_b")
  local c = rl_run(root .. "/run_c", { "seed=4" })
  local function figures(rows)
    local out = {}
    for i, r in ipairs(rows) do
      out[i] = {}
      for k, v in pairs(r) do
        if not k:find("time") and not k:find("latency") and not k:find("tokens_per_s") and not k:find("cache")
          and not k:find("^api/") and k ~= "prefix_cache_hit_rate" then out[i][k] = v end
      end
    end
    return out
  end
  T.eq(figures(a), figures(b))
  T.ok(cjson.encode(figures(a)) ~= cjson.encode(figures(c)), "another seed samples other conversations")
end)

T.case("an endpoint without the model: the run refuses it in one line; mid-run, the sample dropped and counted", function()
  -- the recipe asks /v1/models first: one line, before any training
  local ok, err = pcall(rl_run, root .. "/run_missing", { "sim_cfg.model=nope" })
  T.ok(not ok)
  T.ok(tostring(err):find("sim_cfg.model=nope is not served at", 1, true) and not tostring(err):find("\n"), tostring(err))
  -- a model that goes away mid-run: the server's 404 drops the sample, counted
  local cfg = config.parse(rl.defaults, { "sim=user_lm", "sim_cfg.base_url=" .. srv.url, "sim_cfg.model=nope", "seed=1" })
  local ctx, user = require("clrt.train.context"){ config = cfg, who = "test" }
  local c, info = require("clrt.train.rollout").conversation({ SAMPLE.prompt[2], { role = "assistant", content = "What is the name?" } },
    function() return "x" end, user, SAMPLE, ctx, { max_user_turns = 1 })
  T.eq(c, nil); T.eq(info.dropped, "simulator failed")
  T.ok(info.error:find("nope", 1, true), info.error)
  T.eq(ctx.counters.user_failures, 1)
end)

T.case("collabllm_eval eval_sim=: one model against two simulators, both in eval.json", function()
  local ev = require("recipes.collabllm_eval")
  local out = root .. "/eval"
  ev.opened = nil
  local rep = ev.main(ev.parse_args({ "model=" .. policy_dir, "protocol=prefix", "out=" .. out, "prompts=6", "rollout.max_new_tokens=8",
    "sim=scripted", "eval_sim=user_lm", "eval_sim_cfg.base_url=" .. srv.url, "eval_sim_cfg.model=userlm", "eval_sim_cfg.max_tokens=48" }))
  local saved = cjson.decode(files.read(out .. "/eval.json"))
  T.eq(saved.simulators, { "scripted", "user_lm (userlm)" })
  for _, name in ipairs(saved.simulators) do
    local r = saved.by_simulator[name]
    T.ok(r.world ~= nil and r.conversations + r.dropped == 6, name .. ": every prompt evaluated or counted as dropped")
  end
  T.eq(saved.world, saved.by_simulator.scripted.world, "the first simulator's figures at the top level")
  T.ok(saved.by_simulator["user_lm (userlm)"].api.all.calls > 0, "the second one talked to the served model")
  T.ok(files.exists(out .. "/eval_details_eval_sim.jsonl") or rep.protocol ~= "paper")
end)

T.run(...)
