-- Checkpoints that survive what a crash or a bad file does to them (issue 46), on the built-in
-- world at toy size: stop, resume, stop, resume keeps the tokenizer files in every checkpoint
-- and in model/, and RL starts from the result; save_keep keeps the previous checkpoint, so a
-- damaged newest one is skipped (named, with the reason) and the run resumes from the one
-- before; an unreadable trainer_state.json is an error, never a silent restart; temporary
-- files a kill left behind are removed; a resume with no step left prints no "loss nan".
local T = require("clrt.test")
local config = require("clrt.config")
local files = require("clrt.files")
local data = require("clrt.data")
local sft = require("recipes.collabllm_sft")
local rl = require("recipes.collabllm_rl")
local checkpoint = require("clrt.train.checkpoint")

local root = T.tmpdir()
local bin = os.getenv("CLRT_BIN") or "clrt"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"__rc=$?\"")
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("__rc=(%d+)%s*$"))
  return out:gsub("__rc=%d+%s*$", ""), rc
end
local function sft_cmd(args)
  local parts = { q(bin), "recipes/collabllm_sft.lua" }
  for _, a in ipairs(args) do parts[#parts + 1] = q(a) end
  return table.concat(parts, " ")
end

local BASE = { "train.steps=6", "train.batch_size=8", "world.conversations=60", "arch.hidden_size=32",
  "arch.intermediate_size=64", "arch.num_hidden_layers=2", "train.val_every=3", "save_every=1" }
local function sft_args(dir, extra)
  local a = { "run_dir=" .. dir }
  for _, x in ipairs(BASE) do a[#a + 1] = x end
  for _, x in ipairs(extra or {}) do a[#a + 1] = x end
  return a
end
local function run_sft(args) return sft.main(config.parse(sft.defaults, args, sft.world_config())) end
local function resume(dir, extra)
  local a = { "resume=" .. dir }
  for _, x in ipairs(extra or {}) do a[#a + 1] = x end
  return sft.main(sft.parse_args(a))
end

local function checkpoint_names(dir)
  local out = {}
  for _, n in ipairs(files.list(dir)) do if n:match("^checkpoint%-%d+$") then out[#out + 1] = n end end
  return out
end

local function has_tokenizer(dir)
  return files.exists(dir .. "/tokenizer.json") and files.exists(dir .. "/tokenizer_config.json")
end

T.case("stop, resume, stop, resume: every checkpoint and model/ carry the tokenizer; RL starts from it", function()
  local dir = root .. "/twice"
  run_sft(sft_args(dir, { "stop_after=2" }))
  resume(dir, { "stop_after=4" })
  for _, n in ipairs(checkpoint_names(dir)) do T.ok(has_tokenizer(dir .. "/" .. n), n .. " has the tokenizer files") end
  resume(dir)
  for _, n in ipairs(checkpoint_names(dir)) do T.ok(has_tokenizer(dir .. "/" .. n), n .. " has the tokenizer files") end
  T.eq(#checkpoint_names(dir), 2, "save_keep=2: two checkpoints kept")
  T.ok(has_tokenizer(dir .. "/model"), "model/ has the tokenizer files")
  T.eq(#data.read_jsonl(dir .. "/metrics.jsonl"), 6, "six steps, each once")
  local out = rl.main(config.parse(rl.defaults, { "config=" .. rl.world_config_path(), "model=" .. dir .. "/model",
    "run_dir=" .. root .. "/rl_from_twice", "steps=1", "prompts_per_step=2", "rollout.n=2", "rollout.num_repeat_rollouts=1",
    "rollout.max_new_tokens=6", "eval.before=false", "eval.after=false", "save_every=1", "sample_every=0" }))
  T.ok(files.exists(root .. "/rl_from_twice/checkpoint-1/tokenizer.json"), "RL's checkpoint has the tokenizer too: " .. tostring(out))
end)

T.case("save_keep: a damaged newest checkpoint is skipped, named with its reason; the run resumes from the one before", function()
  local dir = root .. "/damaged"
  run_sft(sft_args(dir, { "stop_after=3" }))
  T.eq(checkpoint_names(dir), { "checkpoint-2", "checkpoint-3" }, "the previous checkpoint is kept")
  T.ok(checkpoint.verify(dir .. "/checkpoint-2"), "checkpoint-2 verifies")
  -- a truncated model file in the newest one
  local path = dir .. "/checkpoint-3/model.safetensors"
  local bytes = T.read(path)
  files.write_atomic(path, bytes:sub(1, #bytes - 100))
  local st, why = checkpoint.verify(dir .. "/checkpoint-3")
  T.ok(not st and why:find("model.safetensors", 1, true), "checkpoint-3 does not verify: " .. tostring(why))
  local lines = {}
  local found, state = checkpoint._find(dir, { warn = function(l) lines[#lines + 1] = l end })
  T.eq(found, dir .. "/checkpoint-2")
  T.eq(state.step, 2)
  T.ok(lines[1] and lines[1]:find("skipped " .. dir .. "/checkpoint-3", 1, true) and lines[1]:find("model.safetensors", 1, true),
    "says which it skipped and why: " .. tostring(lines[1]))
  -- the resumed run redoes step 3 over the damaged folder and finishes
  resume(dir)
  T.eq(checkpoint_names(dir), { "checkpoint-5", "checkpoint-6" })
  T.ok(checkpoint.verify(dir .. "/checkpoint-6"), "the new ones verify")
  local steps = {}
  for _, r in ipairs(data.read_jsonl(dir .. "/metrics.jsonl")) do steps[#steps + 1] = r.step end
  T.eq(steps, { 1, 2, 3, 4, 5, 6 }, "metrics.jsonl: step 3 redone once, not twice")
end)

T.case("a save that did not reach its manifest is incomplete; a file missing from the manifest's list is named", function()
  local dir = root .. "/partial"
  run_sft(sft_args(dir, { "stop_after=2" }))
  files.remove_tree(dir .. "/checkpoint-2/manifest.json")
  local st, why = checkpoint.verify(dir .. "/checkpoint-2")
  T.ok(not st and why:find("manifest.json is missing", 1, true), tostring(why))
  run_sft(sft_args(root .. "/partial2", { "stop_after=2" }))
  files.remove_tree(root .. "/partial2/checkpoint-2/optimizer.safetensors")
  st, why = checkpoint.verify(root .. "/partial2/checkpoint-2")
  T.ok(not st and why:find("optimizer.safetensors is missing", 1, true), tostring(why))
end)

T.case("an unreadable trainer_state.json in the only checkpoint is an error naming it, not a restart", function()
  local dir = root .. "/empty_state"
  run_sft(sft_args(dir, { "stop_after=1", "save_keep=1" }))
  T.eq(checkpoint_names(dir), { "checkpoint-1" })
  files.write_atomic(dir .. "/checkpoint-1/trainer_state.json", "")
  local metrics_before = T.read(dir .. "/metrics.jsonl")
  local out, rc = sh(sft_cmd({ "resume=" .. dir }))
  T.ok(rc ~= 0, "the resume fails: " .. out)
  T.ok(out:find("trainer_state.json", 1, true) and out:find("checkpoint-1", 1, true), "names the file: " .. out)
  T.ok(not out:find("stack traceback", 1, true), "one line: " .. out)
  T.eq(T.read(dir .. "/metrics.jsonl"), metrics_before, "metrics.jsonl untouched")
  T.ok(files.is_dir(dir .. "/checkpoint-1"), "the checkpoint is not deleted")
end)

T.case("RL: an empty trainer_state.json in the only checkpoint is an error, not a redone step 1", function()
  local dir = root .. "/rl_empty"
  local model = root .. "/twice/model"
  if not files.exists(model .. "/model.safetensors") then run_sft(sft_args(root .. "/twice", {})) end
  rl.main(config.parse(rl.defaults, { "config=" .. rl.world_config_path(), "model=" .. model, "run_dir=" .. dir,
    "steps=2", "stop_after=1", "prompts_per_step=2", "rollout.n=2", "rollout.num_repeat_rollouts=1",
    "rollout.max_new_tokens=6", "eval.before=false", "eval.after=false", "save_every=1", "sample_every=0" }))
  T.eq(checkpoint_names(dir), { "checkpoint-1" })
  files.write_atomic(dir .. "/checkpoint-1/trainer_state.json", "")
  local parts = { q(bin), "recipes/collabllm_rl.lua", q("resume=" .. dir) }
  local out, rc = sh(table.concat(parts, " "))
  T.ok(rc ~= 0, "the resume fails: " .. out)
  T.ok(out:find("checkpoint-1: trainer_state.json is not JSON (empty)", 1, true), "says which file and why: " .. out)
  T.ok(not out:find("is the latest checkpoint; it is not overwritten", 1, true), out)
  T.eq(#data.read_jsonl(dir .. "/metrics.jsonl"), 1, "step 1 not redone")
end)

T.case("temporary files a kill left are removed on resume; a resume with nothing left to run prints no nan", function()
  local dir = root .. "/finished"
  run_sft(sft_args(dir, { "train.steps=2" }))
  files.remove_tree(dir .. "/model")   -- as if killed after the last checkpoint, before model/
  files.write_atomic(dir .. "/latest.tmp.999999", "checkpoint-9\n")
  files.write_atomic(dir .. "/checkpoint-2/trainer_state.json.tmp.999999", "{")
  local out, rc = sh(sft_cmd({ "resume=" .. dir }))
  T.eq(rc, 0, out)
  T.ok(not out:lower():find("nan", 1, true), "no nan in: " .. out)
  T.ok(out:find("loss %d"), "reports the recorded loss: " .. out)
  T.ok(not files.exists(dir .. "/latest.tmp.999999") and not files.exists(dir .. "/checkpoint-2/trainer_state.json.tmp.999999"),
    "stale temporaries removed")
  T.ok(has_tokenizer(dir .. "/model"), "model/ written with the tokenizer")
end)

T.run()
