-- The library pieces the recipes share: simulated users found by name (clrt.train.users),
-- the shared defaults each recipe gets a fresh copy of (clrt.train.defaults), errors that name
-- the calling recipe, the rollout entry's one constructor (clrt.train.entry) and the failure
-- policy's stop on a refused key, read from the run's own clients (clrt.train.failure).
local T = require("clrt.test")
local config = require("clrt.config")
local files = require("clrt.files")
local users = require("clrt.train.users")
local context = require("clrt.train.context")
local entry = require("clrt.train.entry")
local failure = require("clrt.train.failure")

T.case("simulated users load by name; an unknown name lists the known ones", function()
  T.eq(users.load("scripted", "collabllm_rl").name, "scripted_user")
  T.eq(users.load("llm").name, "collabllm_user")
  T.eq(users.load("scripted_user").name, "scripted_user", "the file's own name works too")
  local known = users.known()
  T.eq({ known[1], known[2] }, { "llm", "scripted" })
  T.ok(table.concat(known, ","):find("collabllm_user,scripted_user", 1, true), table.concat(known, ","))
  T.raises(function() users.load("nobody", "collabllm_dpo") end,
    "collabllm_dpo: sim: unknown simulated user 'nobody' (no interactions/nobody.lua in ")
  T.raises(function() users.load("../metrics/accuracy", "collabllm_rl") end, "unknown simulated user")
  -- the config check says the same before anything loads
  local rl = require("recipes.collabllm_rl")
  T.raises(function() rl.check_config(config.parse(rl.defaults, { "sim=nobody" })) end, "collabllm_rl: sim: unknown simulated user 'nobody'")
end)

T.case("a new simulated user is a file in an interactions/ folder on the module path", function()
  local dir = T.tmpdir()
  files.mkdir_p(dir .. "/interactions")
  files.write_atomic(dir .. "/interactions/echo_user.lua",
    'return { name = "echo_user", respond = function(conv) return "you said: " .. conv[#conv].content end }\n')
  files.write_atomic(dir .. "/interactions/broken_user.lua", 'return { name = "broken_user" }\n')
  local saved = package.path
  package.path = dir .. "/?.lua;" .. package.path
  local ok, err = pcall(function()
    T.ok(table.concat(users.known(), ","):find("echo_user", 1, true))
    local rl = require("recipes.collabllm_rl")
    local cfg = config.parse(rl.defaults, { "sim=echo_user" })
    rl.check_config(cfg)
    local ctx, user = context{ config = cfg, who = "collabllm_rl" }
    T.eq(user.respond({ { role = "assistant", content = "hi" } }, {}, ctx), "you said: hi")
    T.eq(ctx.user, nil, "a user without uses_llm gets no client")
    T.eq(ctx.who, "collabllm_rl")
    T.raises(function() users.load("broken_user", "collabllm_eval") end,
      "collabllm_eval: sim: interactions.broken_user must return {respond = function(conversation, sample, ctx)}")
  end)
  package.path = saved
  if not ok then error(err, 0) end
end)

T.case("each recipe gets its own copy of the shared defaults", function()
  local defaults = require("clrt.train.defaults")
  local a, b = defaults.shared(), defaults.shared()
  T.ok(a.rollout ~= b.rollout and a.sim_cfg ~= b.sim_cfg)
  local rl, dpo = require("recipes.collabllm_rl"), require("recipes.collabllm_dpo")
  local eval = require("recipes.collabllm_eval")
  local n_dpo, n_eval = dpo.defaults_for("verl", false).rollout.n, eval.defaults.rollout.n
  local saved = rl.defaults.rollout.n
  rl.defaults.rollout.n = 99
  rl.defaults.sim_cfg.model = "changed"
  local ok, err = pcall(function()
    T.eq(dpo.defaults_for("verl", false).rollout.n, n_dpo, "DPO's defaults do not follow the RL recipe's table")
    T.eq(eval.defaults.rollout.n, n_eval, "nor do collabllm_eval's")
    T.eq(dpo.defaults.sim_cfg.model, "gpt-4o-mini"); T.eq(eval.defaults.sim_cfg.model, "gpt-4o-mini")
  end)
  rl.defaults.rollout.n, rl.defaults.sim_cfg.model = saved, "gpt-4o-mini"
  if not ok then error(err, 0) end
  -- nothing in the library loads a recipe (a recipe module is only loaded by name here)
  for name in pairs(package.loaded) do
    if name:match("^recipes%.") then T.ok(name ~= "recipes.process_dataset", "collabllm_eval loaded process_dataset") end
  end
end)

T.case("errors name the recipe that called the library", function()
  local dpo, rl = require("recipes.collabllm_dpo"), require("recipes.collabllm_rl")
  T.raises(function() dpo.check_config(config.parse(dpo.defaults, { "rollout.n=0" })) end, "collabllm_dpo: rollout.n must be")
  T.raises(function() rl.check_config(config.parse(rl.defaults, { "rollout.n=0" })) end, "collabllm_rl: rollout.n must be")
  T.raises(function() dpo.check_config(config.parse(dpo.defaults, { "reward.metric_weights.nope=1" })) end,
    "collabllm_dpo: reward.metric_weights: unknown metric 'nope'")
  local dir = T.tmpdir()
  files.write_atomic(dir .. "/bad.jsonl", '{"prompt": "not a list"}\n')
  local prompts = require("clrt.train.prompts")
  T.raises(function() prompts.dataset_samples(dir .. "/bad.jsonl", "collabllm_eval") end,
    "collabllm_eval: " .. dir .. "/bad.jsonl:1: no \"prompt\" list")
  T.raises(function() require("clrt.train.paper_eval").samples(dir .. "/bad.jsonl", nil, nil, "collabllm_dpo") end, "collabllm_dpo: ")
end)

T.case("a rollout entry is made by one constructor and survives the trip between ranks", function()
  T.raises(function() entry.new{ group = 1, sample = {}, prompt_ids = {}, tokens = {}, text = "x" } end,
    "clrt.train.entry.new: message must be a table, got nil")
  T.raises(function() entry.new{ group = "1", sample = {}, prompt_ids = {}, tokens = {}, text = "x", message = {} } end,
    "group must be a number")
  local s = { id = "a", prompt = { { role = "user", content = "hi" } } }
  local e = entry.new{ group = 2, sample = s, prompt_ids = { 1, 2 }, tokens = { 3 }, text = "ok",
    message = { role = "assistant", content = "ok" }, truncated = false, logprobs_sampled = { -0.5 } }
  T.eq(e.convs, {}); T.eq(e.scores, {}); T.eq(e.truncated, false); T.eq(e.reward, nil)
  entry.add_future(e, { { role = "user", content = "hi" } }, { m = 1 })
  entry.drop(e, "simulator failed", "HTTP 500")
  entry.drop(e, "error: boom", "second")
  T.eq(e.dropped, "error: boom"); T.eq(e.drop_error, "HTTP 500", "the first error is kept")
  local json = require("clrt.json")
  local back = entry.from_portable(json.decode(json.encode(entry.portable(e, 3))), s)
  T.eq(back.group, 5); T.eq(back.sample, s); T.eq(back.tokens, { 3 }); T.eq(back.scores, { { m = 1 } })
  T.eq(back.dropped, "error: boom"); T.eq(back.drop_error, "HTTP 500"); T.eq(back.message.content, "ok")
end)

T.case("a refused key stops the run through the run's own clients, naming the recipe", function()
  -- clrt.llm keeps a 401/403 on the client that got it (its take_auth_error clears it)
  local Client = getmetatable(require("clrt.llm").client{ base_url = "http://127.0.0.1:9/v1", model = "m" })
  local function client(err) return setmetatable({ auth_error = err }, Client) end
  local judge = client("m at http://x/v1/chat/completions refused the request: HTTP 401: bad key")
  local ctx = { who = "collabllm_dpo", user = client(nil), judge = judge }
  T.raises(function() failure.check_stop(ctx) end,
    "collabllm_dpo: m at http://x/v1/chat/completions refused the request: HTTP 401: bad key; fix the key")
  T.eq(judge.auth_error, nil, "taken once")
  failure.check_stop(ctx)   -- nothing more to say
  failure.check_stop({ who = "x" })   -- a run without clients (the scripted user, no judge)
  -- another run's client does not stop this one
  local other = client("refused")
  failure.check_stop(ctx)
  T.eq(other.auth_error, "refused")
end)

T.case("the failure policy reports; the recipe counts and stops", function()
  local reward = require("clrt.train.reward")
  local function e(dropped) return { dropped = dropped, drop_error = dropped and "HTTP 500" or nil, scores = {} } end
  local entries = { e("simulator failed"), e("simulator failed"), e(nil) }
  local R = { dropped = 2, truncated = 0, failed = {}, metrics = {} }
  local f = failure.assess({ max_drop_fraction = 0.5 }, entries, R)
  T.eq(f.failed, true); T.eq(f.why, "2 of 3 samples dropped"); T.eq(f.causes, { ["simulator failed"] = 2 })
  T.eq(f.first, "simulator failed: HTTP 500")
  local row = failure.mark({}, f)
  T.eq(row, { ["dropped/simulator failed"] = 2, failed_step = 1 })
  T.eq(failure.line(4, f, 1, 3), "step 4 failed (1 of 3 allowed): 2 of 3 samples dropped; first: simulator failed: HTTP 500")
  T.eq(failure.stop_message("collabllm_dpo", 4, f, 3),
    "collabllm_dpo: stopped after 3 failed steps (max_failed_steps); step 4: 2 of 3 samples dropped; first: simulator failed: HTTP 500")
  T.eq(failure.assess({ max_drop_fraction = 0.7 }, entries, R).failed, false)
  local scored = { { scores = { { m = reward.failed("judge down") } } } }
  local f2 = failure.assess({ max_drop_fraction = 0.5 }, scored, { dropped = 0, truncated = 0, failed = { m = 1 }, metrics = {} })
  T.eq(f2.why, "metric m failed on every conversation (1 scored)"); T.eq(f2.first, "metric m: judge down")
end)

T.run()
