-- clrt.json, clrt.config, clrt.rng and clrt.data.
local T = require("clrt.test")
local json = require("clrt.json")
local config = require("clrt.config")
local rng = require("clrt.rng")
local data = require("clrt.data")

---------------------------------------------------------------- json
T.case("json decodes objects, arrays, escapes, numbers", function()
  local v = json.decode('{"a": [1, 2.5, -3e2, true, false, null], "s": "x\\n\\u00e9\\ud83d\\ude00\\"", "o": {}}')
  T.eq(v.a[1], 1); T.eq(v.a[2], 2.5); T.eq(v.a[3], -300); T.eq(v.a[4], true); T.eq(v.a[5], false)
  T.ok(v.a[6] == json.null); T.eq(#v.a, 6)
  T.eq(v.s, "x\n\195\169\240\159\152\128\"")
  T.ok(json.is_array(v.a)); T.ok(not json.is_array(v.o))
end)

T.case("json errors name line and column", function()
  T.raises(function() json.decode('{"a": 1,\n "b": }') end, "line 2 col 7")
  T.raises(function() json.decode('{"a": 1} x') end, "trailing")
  T.raises(function() json.decode('[01]') end, "malformed number")
  T.raises(function() json.decode('"abc') end, "unterminated")
  T.raises(function() json.decode('') end, "end of input")
end)

T.case("json encodes sorted, round-trips doubles and empty arrays", function()
  T.eq(json.encode({ b = 1, a = { 1, 2 }, c = "q\"\n" }), '{"a":[1,2],"b":1,"c":"q\\"\\n"}')
  for _, x in ipairs({ 0.1, 1 / 3, 1e-300, 123456789.123, -2.5e17, 2 ^ 60 }) do
    T.eq(json.decode(json.encode(x)), x)
  end
  T.eq(json.encode(0.1), "0.1")
  T.eq(json.encode(json.decode('{"x":[],"y":{}}')), '{"x":[],"y":{}}')
  T.raises(function() json.encode(0 / 0) end, "NaN")
  local cyc = {}; cyc.self = cyc
  T.raises(function() json.encode(cyc) end, "cycle")
  T.eq(json.encode({ a = { b = { 1, 2 } } }, { pretty = true }), '{\n  "a": {\n    "b": [1, 2]\n  }\n}')
end)

---------------------------------------------------------------- config
local defaults = {
  lr = 1e-6, steps = 10, name = "run", verbose = false,
  reward = { mode = "verl", metric_weights = { accuracy = 1, token_amount = -0.0001 } },
  stop = { "a", "b" }, resume = config.optional("string"),
}

T.case("config overrides by type", function()
  local c = config.parse(defaults, { "lr=3e-4", "steps=20", "name=123", "verbose=true",
    "reward.metric_weights.accuracy=0.5", 'stop=["x"]', "resume=runs/a" })
  T.eq(c.lr, 3e-4); T.eq(c.steps, 20); T.eq(c.name, "123"); T.eq(c.verbose, true)
  T.eq(c.reward.metric_weights.accuracy, 0.5); T.eq(c.reward.metric_weights.token_amount, -0.0001)
  T.eq(c.stop[1], "x"); T.eq(#c.stop, 1); T.eq(c.resume, "runs/a")
  -- defaults untouched, optional unset resolves to nil
  T.eq(defaults.lr, 1e-6); T.eq(defaults.reward.metric_weights.accuracy, 1)
  T.eq(config.parse(defaults, {}).resume, nil)
end)

T.case("config + adds keys; nil clears; quoted strings", function()
  local c = config.parse(defaults, { "+reward.metric_weights.bleu_score=2", "+extra.deep.k='7'", "name=nil" })
  T.eq(c.reward.metric_weights.bleu_score, 2); T.eq(c.extra.deep.k, "7"); T.eq(c.name, nil)
  T.raises(function() config.parse(defaults, { "+lr=1" }) end, "already exists")
end)

T.case("config unknown key names the closest", function()
  T.raises(function() config.parse(defaults, { "reward.metric_weight.accuracy=1" }) end,
    "did you mean 'reward.metric_weights.accuracy'")
  T.raises(function() config.parse(defaults, { "setps=3" }) end, "did you mean 'steps'")
  -- a key cut short means the key it starts; a leaf without its table, the key ending so
  local rl = require("recipes.collabllm_rl").defaults
  T.raises(function() config.parse(rl, { "rollout.num_repeat=2" }) end, "did you mean 'rollout.num_repeat_rollouts'")
  T.raises(function() config.parse(rl, { "max_new_tokens=2" }) end, "did you mean 'rollout.max_new_tokens'")
  T.raises(function() config.parse(defaults, { "reward.metric_weights.bleu=1" }) end, "+reward.metric_weights.bleu=")
end)

T.case("config type mismatch and malformed items", function()
  T.raises(function() config.parse(defaults, { "lr=fast" }) end, "lr expects a number")
  T.raises(function() config.parse(defaults, { "verbose=1" }) end, "verbose expects a boolean")
  T.raises(function() config.parse(defaults, { "reward=3" }) end, "reward expects a table")
  T.raises(function() config.parse(defaults, { "lr" }) end, "not key.path=value")
  T.raises(function() config.parse(defaults, { "lr.x=1" }) end, "not a table")
  T.raises(function() config.parse(defaults, { "stop=[1," }) end, "json")
end)

T.case("config files merge under the command line; maps are data", function()
  local d = {
    model = config.optional("string"), steps = 10,
    train = { lr = 1e-6, decay = "constant" },
    reward = { metric_weights = config.map({ accuracy = 1, interactivity = 1 }), metric_options = config.map({}) },
  }
  local dir = T.tmpdir()
  local lua_file, json_file, bad = dir .. "/world.lua", dir .. "/w.json", dir .. "/bad.lua"
  data.write_atomic(lua_file, 'return { steps = 120, train = { lr = 5e-4 }, reward = { metric_weights = { exact_match = 1 } } }')
  data.write_atomic(json_file, '{"train": {"decay": "cosine"}}')
  data.write_atomic(bad, 'return { train = { lrr = 1 } }')
  local c = config.parse(d, { "config=" .. lua_file, "steps=7" })
  T.eq(c.steps, 7, "the command line wins over the file, wherever config= stands")
  T.eq(c.train.lr, 5e-4); T.eq(c.train.decay, "constant", "settings tables merge key by key")
  T.eq(c.reward.metric_weights.exact_match, 1)
  T.eq(c.reward.metric_weights.accuracy, nil, "a map in a file replaces the default whole")
  T.eq(config.parse(d, { "config=" .. json_file }).train.decay, "cosine")
  -- a base table (the recipes' built-in world) sits under the files and the command line
  local b = config.parse(d, { "config=" .. json_file, "train.lr=3" }, { train = { lr = 2, decay = "linear" } })
  T.eq(b.train.lr, 3); T.eq(b.train.decay, "cosine")
  T.raises(function() config.parse(d, { "config=" .. bad }) end, "bad.lua: unknown key 'train.lrr'; did you mean 'train.lr'")
  T.raises(function() config.parse(d, { "config=" .. dir .. "/none.lua" }) end, "none.lua")
  -- map entries are set without '+', nested ones too; settings keys still need to exist
  local m = config.parse(d, { "reward.metric_weights.bleu_score=2", "reward.metric_options.pass_rate.timeout=60",
    "reward.metric_options.bleu_score.level=char" })
  T.eq(m.reward.metric_weights.bleu_score, 2); T.eq(m.reward.metric_weights.accuracy, 1)
  T.eq(m.reward.metric_options.pass_rate.timeout, 60); T.eq(m.reward.metric_options.bleu_score.level, "char")
  local j = config.parse(d, { 'reward.metric_weights={"accuracy":2}', "reward.metric_weights.token_amount=-1" })
  T.eq(j.reward.metric_weights.accuracy, 2); T.eq(j.reward.metric_weights.token_amount, -1)
  T.eq(j.reward.metric_weights.interactivity, nil)
  T.raises(function() config.parse(d, { "train.lrr=1" }) end, "did you mean 'train.lr'")
  T.eq(config.arg_value({ "a=1", "model=x/y" }, "model"), "x/y"); T.eq(config.arg_value({ "a=1" }, "model"), nil)
end)

T.case("config dump is stable and loads back", function()
  local c = config.parse(defaults, { "lr=0.001" })
  local s = config.dump(c)
  T.eq(s, config.dump(config.parse(defaults, { "lr=0.001" })))
  T.ok(s:find('"lr": 0.001', 1, true))
  local dir = T.tmpdir()
  data.write_atomic(dir .. "/config.json", s)
  local back = config.load(dir .. "/config.json")
  T.eq(back.reward.metric_weights.token_amount, -0.0001)
  T.eq(config.edit_distance("kitten", "sitting"), 3)
end)

---------------------------------------------------------------- rng
T.case("resume: keys newer than the run keep their defaults; unset optional keys stay unset", function()
  local defaults = { steps = 10, warmup = config.optional("number"),
    train = { lr = 0.1, lora = { r = 0, alpha = config.optional("number") } }, dist = { check_every = 50 } }
  -- a run saved by a version without train.lora and dist, with warmup unset
  local saved = { steps = 20, train = { lr = 0.5 } }
  local cfg = config.resume(defaults, saved, { "steps=30" }, { "train.lora.r", "dist.check_every" }, "t")
  T.eq(cfg.steps, 30); T.eq(cfg.train.lr, 0.5)
  T.eq(cfg.train.lora.r, 0, "a newer key takes its default")
  T.eq(cfg.dist.check_every, 50)
  T.eq(cfg.warmup, nil, "an unset optional stays unset"); T.eq(cfg.train.lora.alpha, nil)
  -- a fixed key the command line changes is still refused
  local ok, err = pcall(config.resume, defaults, saved, { "train.lora.r=4" }, { "train.lora.r" }, "t")
  T.ok(not ok and err:find("train.lora.r cannot change", 1, true), tostring(err))
end)

T.case("xoshiro128** matches the C reference", function()
  -- reference: the published next() in C from state {0x12345678,0x9abcdef0,0xdeadbeef,0x0badf00d}
  local r = rng.from_state({ 0x12345678, 0x9abcdef0, 0xdeadbeef, 0x0badf00d })
  local want = { 2576881682, 1162350735, 808537200, 2062165408, 3804998253, 141604735, 2037853177, 2208554992 }
  for i = 1, #want do T.eq(r:next32(), want[i], "output " .. i) end
end)

T.case("rng is seeded, serialisable and roughly uniform", function()
  local a, b = rng.new(7), rng.new(7)
  for _ = 1, 10 do T.eq(a:random(), b:random()) end
  T.ok(rng.new(7):random() ~= rng.new(8):random())
  local s = a:state()
  local x1, x2 = a:random(), a:int(100)
  local c = rng.from_state(json.decode(json.encode(s)))
  T.eq(c:random(), x1); T.eq(c:int(100), x2)
  local counts, n = { 0, 0, 0, 0 }, 40000
  local sum = 0
  for _ = 1, n do local k = a:int(4); counts[k] = counts[k] + 1; sum = sum + a:random() end
  for k = 1, 4 do T.near(counts[k] / n, 0.25, 0.01) end
  T.near(sum / n, 0.5, 0.01)
  for _ = 1, 1000 do local v = a:int(3, 5); T.ok(v >= 3 and v <= 5) end
end)

---------------------------------------------------------------- data
T.case("jsonl round trip, atomic write, bad line names file:line", function()
  local dir = T.tmpdir()
  local rows = { { a = 1, m = { { role = "user", content = "hi\nthere" } } }, { a = 2 } }
  data.write_jsonl(dir .. "/x.jsonl", rows)
  T.eq(data.read_jsonl(dir .. "/x.jsonl")[1].m[1].content, "hi\nthere")
  T.eq(#data.read_jsonl(dir .. "/x.jsonl"), 2)
  local leftovers = io.popen("ls " .. dir):read("*a")
  T.eq(leftovers, "x.jsonl\n")
  local f = io.open(dir .. "/bad.jsonl", "w"); f:write('{"a":1}\n\n{"a":\n'); f:close()
  T.raises(function() data.read_jsonl(dir .. "/bad.jsonl") end, dir .. "/bad.jsonl:3:")
  T.raises(function() data.read_jsonl(dir .. "/missing.jsonl") end, "cannot open")
end)

T.case("shuffle and split are seeded permutations", function()
  local rows = {}
  for i = 1, 100 do rows[i] = i end
  local s1, s2 = data.shuffle(rows, 42), data.shuffle(rows, 42)
  T.eq(s1, s2); T.ok(not T.deep_eq(s1, rows)); T.eq(rows[1], 1)
  table.sort(s1); T.eq(s1, rows)
  local tr, va = data.split(rows, 0.9, 42)
  T.eq(#tr, 90); T.eq(#va, 10)
  local seen = {}
  for _, v in ipairs(tr) do seen[v] = true end
  for _, v in ipairs(va) do T.ok(not seen[v]); seen[v] = true end
  for i = 1, 100 do T.ok(seen[i]) end
end)

T.case("a generation option of the wrong type says so and names the value", function()
  local options = require("clrt.gen.options")
  local check = options.check
  T.raises(function() check({ temperature = "hot" }) end, 'generate: option temperature must be a number (>= 0), got "hot"')
  T.raises(function() check({ temperature = -1 }) end, "generate: option temperature must be >= 0, got -1")
  T.raises(function() check({ top_p = 2 }) end, "option top_p must be in (0, 1], got 2")
end)

T.case("collabllm_rl's progress line and plot name the metrics in one order", function()
  local rl = require("recipes.collabllm_rl")
  -- many keys: a hash table's order would differ between runs; the names never do
  local w = {}
  for _, n in ipairs({ "token_amount", "exact_match", "accuracy", "bleu_score", "pass_rate", "interactivity" }) do w[n] = 1 end
  T.eq(rl.metric_names(w), { "accuracy", "bleu_score", "exact_match", "interactivity", "pass_rate", "token_amount" })
end)

T.run()
