-- The CollabLLM recipes end to end on the built-in world at toy size: SFT from scratch
-- (tokenizer + model) writes a loadable model folder; RL runs steps with the multiturn-aware
-- reward and writes metrics and checkpoints; a run stopped and resumed from its checkpoint
-- logs the same metrics, bit for bit, as a run that never stopped; the single-turn ablation
-- and the before/after evaluation run.
local T = require("clrt.test")
local data = require("clrt.data")
local config = require("clrt.config")
local sft = require("recipes.collabllm_sft")
local rl = require("recipes.collabllm_rl")

local root = T.tmpdir()
local start

T.case("SFT from scratch writes a model folder that loads and chats", function()
  local cfg = config.parse(sft.defaults, {
    "run_dir=" .. root .. "/sft", "train.steps=12", "train.batch_size=8", "world.conversations=200",
    "arch.hidden_size=32", "arch.intermediate_size=64", "arch.num_hidden_layers=2", "train.val_every=6",
  }, sft.world_config())
  local dir, last = sft.main(cfg)
  start = dir
  local rows = data.read_jsonl(root .. "/sft/metrics.jsonl")
  T.eq(#rows, 12)
  T.ok(rows[12].loss < rows[1].loss, ("the loss should fall: %.3f -> %.3f"):format(rows[1].loss, rows[12].loss))
  T.ok(last.val_loss == last.val_loss, "validation loss is a number")
  local m, tok = clrt.model.load(dir), clrt.tokenizer.load(dir)
  T.eq(m.config.vocab_size, tok:vocab_size())
  local text = clrt.chat.generate(m, tok, { { role = "user", content = "Plan a trip for me." } }, { max_new_tokens = 5 })
  T.eq(type(text), "string")
  -- the data summary SFT prints: counts, tokens and the trained share from the items
  local line = sft.data_summary({ { ids = { 1, 2, 3, 4 }, mask = { 0, 0, 1, 1 } }, { ids = { 1, 2 }, mask = { 0, 1 } } }, { {} })
  T.eq(line, "collabllm_sft: 2 training conversations, 6 tokens (3 trained on, the assistant's: 50%), longest 4; 1 validation")
end)

local function rl_args(run_dir, extra)
  local a = { "config=" .. rl.world_config_path(), "model=" .. start, "run_dir=" .. run_dir, "steps=5", "prompts_per_step=4", "rollout.n=4",
    "rollout.num_repeat_rollouts=2", "rollout.max_new_tokens=12", "seed=3", "eval.before=false", "eval.after=false",
    "save_every=2", "sample_every=2" }
  for _, x in ipairs(extra or {}) do a[#a + 1] = x end
  return a
end

-- metrics rows without the wall-clock fields
local function comparable(dir)
  local out = {}
  for _, r in ipairs(data.read_jsonl(dir .. "/metrics.jsonl")) do
    local c = {}
    for k, v in pairs(r) do
      if not (k:find("^time") or k == "tokens_per_s" or k == "elapsed") then c[k] = v end
    end
    out[r.step] = c
  end
  return out
end

T.case("RL steps, checkpoints, and a resumed run equal to an uninterrupted one", function()
  if not start then T.skip("needs the SFT case") end
  rl.main(config.parse(rl.defaults, rl_args(root .. "/straight")))
  local a = comparable(root .. "/straight")
  T.ok(a[5] and a[5].reward ~= nil, "every step logs its reward")
  -- the share of prompt tokens the prefix cache served (at this size most first responses are
  -- cut and get no futures, so it may be 0; test_prefix_cache checks the hits themselves)
  if require("clrt.core.ffi").C.clrt_model_kv_reusable(clrt.model.load(start).ptr) == 1 then
    for step = 1, 5 do
      local h = a[step].prefix_cache_hit_rate
      T.ok(type(h) == "number" and h >= 0 and h < 1, ("step %d: prefix_cache_hit_rate %s"):format(step, tostring(h)))
    end
  end
  -- the rollouts' split: the engine's prefill and decode seconds within the step's generation
  -- and futures (the world's user is scripted: no HTTP to wait on)
  for _, r in ipairs(data.read_jsonl(root .. "/straight/metrics.jsonl")) do
    if r.time_rollout_s then
      local roll = r.time_generate_first_s + r.time_rollout_s
      T.ok(r.time_prefill_s > 0 and r.time_decode_s > 0 and r.time_prefill_s + r.time_decode_s <= roll,
        ("step %d: prefill %s s + decode %s s within the rollouts' %.3f s"):format(r.step, tostring(r.time_prefill_s), tostring(r.time_decode_s), roll))
      T.eq(r.time_wait_http_s, 0, "no HTTP in the built-in world")
    end
  end
  -- the steps before the stop must change the model and the optimizer, or resuming proves nothing
  T.ok(a[3].grad_norm > 0 and (a[2].grad_norm > 0 or a[1].grad_norm > 0), "updates happen before step 3")
  T.ok(T.read(root .. "/straight/checkpoint-5/trainer_state.json"), "a checkpoint is written")
  T.eq(T.read(root .. "/straight/latest"), "checkpoint-5\n", "latest names it")
  local kept = {}
  for _, n in ipairs(require("clrt.files").list(root .. "/straight")) do if n:match("^checkpoint%-%d+$") then kept[#kept + 1] = n end end
  T.eq(kept, { "checkpoint-4", "checkpoint-5" }, "save_keep=2: the previous checkpoint is kept, older ones removed")
  T.ok(T.read(root .. "/straight/checkpoint-5/optimizer.safetensors"), "with the optimizer state")
  T.ok(T.read(root .. "/straight/samples.jsonl"), "sample conversations are written")
  rl.main(config.parse(rl.defaults, rl_args(root .. "/stopped", { "stop_after=3" })))
  T.eq(#data.read_jsonl(root .. "/stopped/metrics.jsonl"), 3)
  rl.main(rl.parse_args({ "resume=" .. root .. "/stopped" }))
  local b = comparable(root .. "/stopped")
  for step = 1, 5 do T.eq(b[step], a[step], "step " .. step) end
end)

T.case("the single-turn ablation and the before/after evaluation", function()
  if not start then T.skip("needs the SFT case") end
  local dir = root .. "/ablation"
  rl.main(config.parse(rl.defaults, rl_args(dir, { "single_turn=true", "steps=2", "eval.before=true",
    "eval.after=true", "eval.prompts=8" })))
  local s = require("cjson").decode(T.read(dir .. "/summary.json"))
  for _, k in ipairs({ "accuracy_underspecified", "accuracy_specified", "ask_rate_underspecified",
    "ask_rate_specified", "tokens_per_conversation" }) do
    T.eq(type(s.before[k]), "number", "before." .. k)
    T.eq(type(s.after[k]), "number", "after." .. k)
  end
  T.eq(s.config.single_turn, true)
  T.raises(function() config.parse(rl.defaults, { "rollout.num_repeats=3" }) end, "rollout.num_repeat_rollouts")
end)

T.case("a cut-off first response earns rollout.cutoff_reward (verl's -1 by default, the world's 0)", function()
  if not start then T.skip("needs the SFT case") end
  T.eq(rl.defaults.rollout.cutoff_reward, -1)
  T.eq(config.parse(rl.defaults, {}, config.read_file(rl.world_config_path())).rollout.cutoff_reward, 0)
  -- one token per first response: every one is cut, none gets futures (unless the one
  -- token sampled ends the turn: at seed 3 one of the 16 does, at seeds 1, 2 and 4-8 none)
  local dir = root .. "/cutoff"
  rl.main(config.parse(rl.defaults, rl_args(dir, { "steps=1", "rollout.max_new_tokens=1", "rollout.cutoff_reward=-0.25",
    "seed=4",
    "save_every=0" })))
  local row = data.read_jsonl(dir .. "/metrics.jsonl")[1]
  T.eq(row.truncated, 16, "4 prompts x 4 responses, all cut")
  T.near(row.reward, -0.25, 1e-12)
  T.raises(function() rl.check_config(config.parse(rl.defaults, { "rollout.cutoff_reward=inf" })) end, "rollout.cutoff_reward")
end)

-- rollout.quant=int8: rollouts sample from int8 copies of the policy, the update weights each
-- token by truncated importance sampling, and each step logs the mismatch and the weight.
T.case("rollout.quant=int8 logs the rollout/train mismatch and the TIS weight per step", function()
  if not start then T.skip("needs the SFT case") end
  local dir = root .. "/int8"
  rl.main(config.parse(rl.defaults, rl_args(dir, { "steps=2", "rollout.quant=int8", "save_every=0" })))
  for _, row in ipairs(data.read_jsonl(dir .. "/metrics.jsonl")) do
    local mis, w = row["tis/logp_mismatch"], row["tis/weight_mean"]
    T.ok(type(mis) == "number" and mis > 0 and mis < 0.5, "step " .. row.step .. ": mismatch " .. tostring(mis))
    T.ok(type(w) == "number" and math.abs(w - 1) < 0.5, "step " .. row.step .. ": TIS weight " .. tostring(w))
  end
  T.raises(function() rl.check_config(config.parse(rl.defaults, { "rollout.quant=int4" })) end, "rollout.quant")
end)

T.run()
