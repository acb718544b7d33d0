-- model= names a model folder, a run folder (its latest complete checkpoint; a finished SFT
-- run's model/) or a checkpoint folder (a full model, or a LoRA adapter over the base its
-- adapter_config.json names), everywhere a model is read (clrt.model_path): the recipes,
-- `clrt chat`, `clrt serve`, `clrt merge`. What it loads equals loading the folders by hand;
-- what it cannot use is one line naming the path.
local T = require("clrt.test")
local files = require("clrt.files")
local json = require("clrt.json")
local model_path = require("clrt.model_path")
local src = T.source_dir()
local fixtures = src .. "/tests/fixtures"
local BASE = fixtures .. "/model/qwen2_tied"
local ADAPTER = fixtures .. "/lora/qwen2_all"
local bin = os.getenv("CLRT_BIN") or arg[-1]

-- a LoRA run's folder as collabllm_rl leaves it: checkpoint-N/ (PEFT files, trainer state)
-- and `latest` naming it; the adapter's base named by path
local function lora_run(steps)
  local run = T.tmpdir() .. "/collabllm_rl-x"
  for _, step in ipairs(steps) do
    local ck = ("%s/checkpoint-%d"):format(run, step)
    files.mkdir_p(ck)
    files.copy(ADAPTER .. "/adapter_model.safetensors", ck .. "/adapter_model.safetensors")
    local cfg = json.decode(files.read(ADAPTER .. "/adapter_config.json"))
    cfg.base_model_name_or_path = BASE
    files.write_atomic(ck .. "/adapter_config.json", json.encode(cfg))
    files.write_atomic(ck .. "/trainer_state.json", json.encode({ step = step }))
  end
  -- the run's own training config, which is no model's config.json
  files.write_atomic(run .. "/config.json", json.encode({ name = "collabllm_rl", steps = 3 }))
  files.write_atomic(run .. "/metrics.jsonl", "")
  files.write_atomic(run .. "/latest", ("checkpoint-%d\n"):format(steps[#steps]))
  return run
end

-- a command's exit status and its output (stdout and stderr)
local function run_cmd(cmd)
  local f = assert(io.popen(cmd .. " 2>&1; echo \"exit=$?\""))
  local text = f:read("*a")
  f:close()
  local rc = tonumber(text:match("exit=(%d+)\n?$"))
  return rc == 0, (text:gsub("exit=%d+\n?$", ""))
end

-- the log-probs of one row of tokens, flattened
local function lp(m, tokens)
  local flat = {}
  local function walk(t)
    if type(t) == "table" then for _, v in ipairs(t) do walk(v) end else flat[#flat + 1] = t end
  end
  walk(m:logprobs({ tokens }, { grad = false }):totable())
  return flat
end

T.case("a model folder is itself; a run folder is its latest checkpoint, over the adapter's base", function()
  T.eq(model_path.resolve(BASE), { model = BASE, tokenizer = BASE })
  local run = lora_run({ 1, 3 })
  files.remove_tree(run .. "/checkpoint-1")   -- as the saver leaves it: only the latest
  local r = model_path.resolve(run, { who = "t" })
  T.eq({ r.model, r.adapter, r.checkpoint }, { BASE, run .. "/checkpoint-3", run .. "/checkpoint-3" })
  local c = model_path.resolve(run .. "/checkpoint-3", { who = "t" })
  T.eq({ c.model, c.adapter }, { BASE, run .. "/checkpoint-3" }, "the checkpoint folder itself")
  -- a config resolved in place records what was loaded
  local cfg = model_path.apply({ model = run }, "t")
  T.eq({ cfg.model, cfg.adapter }, { BASE, run .. "/checkpoint-3" })
  -- a finished SFT run: its merged model/
  local sft = T.tmpdir() .. "/collabllm_sft-x"
  files.mkdir_p(sft .. "/model")
  files.copy(BASE .. "/config.json", sft .. "/model/config.json")
  files.write_atomic(sft .. "/config.json", json.encode({ name = "collabllm_sft" }))
  files.write_atomic(sft .. "/latest", "checkpoint-9\n")
  T.eq(model_path.resolve(sft).model, sft .. "/model")
end)

T.case("what a resolved run folder loads equals the base with the adapter loaded by hand", function()
  local run = lora_run({ 2 })
  local r = model_path.resolve(run)
  local m = clrt.model.load(r.model, { adapter = r.adapter })
  local by_hand = clrt.model.load(BASE, { adapter = ADAPTER })
  local tokens = { 1, 5, 9, 14, 3, 7 }
  local a, b = lp(m, tokens), lp(by_hand, tokens)
  T.ok(#a > 0)
  T.eq(a, b, "bit-identical log-probs")
  local base_only = lp(clrt.model.load(BASE), tokens)
  local differs = false
  for i = 1, #a do differs = differs or a[i] ~= base_only[i] end
  T.ok(differs, "the adapter is applied (not the bare base)")
end)

T.case("clrt merge RUN_DIR OUT folds the run's latest adapter into its base", function()
  local run = lora_run({ 4 })
  local out = T.tmpdir() .. "/merged"
  local ok, text = run_cmd(("%q merge %q %q"):format(bin, run, out))
  T.ok(ok, "clrt merge: " .. text)
  T.ok(text:find(run .. "/checkpoint-4", 1, true), text)
  local merged = clrt.model.load(out)
  local tokens = { 2, 4, 6, 8 }
  local a, b = lp(merged, tokens), lp(clrt.model.load(BASE, { adapter = ADAPTER }), tokens)
  T.eq(#a, #b)
  for i = 1, #a do T.ok(math.abs(a[i] - b[i]) < 2e-5, "merged log-prob " .. i) end
end)

-- runs/collab_world_sft holds the world's warm starts, one finished SFT run per settings and
-- seed: model= of that folder is the one inside, or a line naming them
T.case("a folder of runs is the one run inside it; several are named", function()
  local cache = T.tmpdir() .. "/collab_world_sft"
  local first = cache .. "/world3-abc-seed1"
  files.mkdir_p(first .. "/model")
  for _, n in ipairs({ "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json" }) do
    if files.exists(BASE .. "/" .. n) then files.copy(BASE .. "/" .. n, first .. "/model/" .. n) end
  end
  files.write_atomic(first .. "/metrics.jsonl", "")
  files.write_atomic(first .. "/config.json", json.encode({ name = "collabllm_sft" }))
  T.eq(model_path.resolve(cache, { who = "w" }).model, first .. "/model")
  files.mkdir_p(cache .. "/notes")   -- a folder that is none is passed over
  T.eq(model_path.resolve(cache, { who = "w" }).model, first .. "/model")
  local second = cache .. "/world3-abc-seed2"
  files.mkdir_p(second .. "/model")
  files.copy(first .. "/model/config.json", second .. "/model/config.json")
  T.raises(function() model_path.resolve(cache, { who = "w" }) end,
    ("w: model=%s holds 2 models or runs; name one: %s, %s"):format(cache, first, second))
end)

T.case("a folder model= cannot use is one line naming it, from the library and the commands", function()
  local tmp = T.tmpdir()
  T.raises(function() model_path.resolve(tmp .. "/nope", { who = "collabllm_eval" }) end,
    "collabllm_eval: model=" .. tmp .. "/nope: no such folder")
  local empty_run = tmp .. "/run_without_checkpoint"
  files.mkdir_p(empty_run)
  files.write_atomic(empty_run .. "/metrics.jsonl", "")
  T.raises(function() model_path.resolve(empty_run, { who = "w" }) end, "is a run folder with no complete checkpoint yet")
  files.mkdir_p(tmp .. "/other")
  T.raises(function() model_path.resolve(tmp .. "/other", { who = "w" }) end,
    "is not a model folder (no config.json), a LoRA checkpoint (no adapter_config.json) or a run folder")
  local orphan = tmp .. "/orphan"
  files.mkdir_p(orphan)
  files.write_atomic(orphan .. "/adapter_config.json", json.encode({ base_model_name_or_path = tmp .. "/gone" }))
  T.raises(function() model_path.resolve(orphan, { who = "w" }) end, "is a LoRA adapter over " .. tmp .. "/gone")
  T.raises(function() model_path.resolve(orphan, { who = "w", adapter = ADAPTER }) end, "would be a second one")
  for _, cmd in ipairs({ "chat", "serve" }) do
    local ok, text = run_cmd(("%q %s %q"):format(bin, cmd, tmp .. "/nope"))
    T.eq(ok, false, cmd .. " exits non-zero")
    T.eq(text, ("clrt: clrt %s: model=%s/nope: no such folder\n"):format(cmd, tmp), "one line, no traceback")
  end
  local ok, text = run_cmd(("%q merge %q %q"):format(bin, BASE, tmp .. "/out"))
  T.eq(ok, false)
  T.ok(text:find("holds no LoRA adapter", 1, true) and not text:find("traceback", 1, true), text)
end)

T.case("a busy port is one line naming the address, for clrt serve and clrt view", function()
  package.path = src .. "/tests/?.lua;" .. package.path
  local dir = require("support.tiny_model")(T.tmpdir() .. "/tiny", { seed = 2 })
  -- a process that holds a port: its number in a file, its pid to stop it
  local held = T.tmpdir() .. "/held_port"
  os.execute(([[/usr/bin/python3 -c "
import socket, time
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)
open('%s.tmp', 'w').write(str(s.getsockname()[1])); __import__('os').rename('%s.tmp', '%s')
time.sleep(60)" > /dev/null 2>&1 & echo $! > %s.pid]]):format(held, held, held, held))
  local port
  for _ = 1, 100 do
    port = T.read(held)
    if port then break end
    os.execute("sleep 0.1")
  end
  T.ok(port, "a port is held")
  T.cleanup(function() os.execute("kill $(cat " .. held .. ".pid) 2>/dev/null") end)
  local ok, text = run_cmd(("%q serve %q --port %s"):format(bin, dir, port))
  T.eq(ok, false)
  T.eq(text, ("clrt serve: cannot listen on 127.0.0.1:%s (address in use or not permitted)\n"):format(port))
  local run = lora_run({ 1 })
  ok, text = run_cmd(("%q view %q --port %s"):format(bin, run, port))
  T.eq(ok, false)
  T.eq(text, ("clrt view: cannot listen on 127.0.0.1:%s (address in use or not permitted)\n"):format(port))
end)

T.run()
