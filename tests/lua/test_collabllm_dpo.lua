-- The DPO recipe and MR-selected SFT end to end on the built-in world at toy size: offline
-- DPO on pairs the start samples and the multiturn-aware reward ranks, online DPO on the
-- policy's own samples (the RL recipe's rollouts and reward), offline DPO on
-- process_dataset.lua's pairs, each stopped and resumed equal bit for bit to a run that never
-- stopped; the pair selection rule; SFT on the best conversation of each scored group.
local T = require("clrt.test")
local data = require("clrt.data")
local config = require("clrt.config")
local sft = require("recipes.collabllm_sft")
local dpo_recipe = require("recipes.collabllm_dpo")
local dpo = require("clrt.train.dpo")
local scored = require("clrt.train.scored")
local files = require("clrt.files")

local root = T.tmpdir()
local start

local function start_model()
  if start then return start end
  local cfg = config.parse(sft.defaults, { "run_dir=" .. root .. "/sft", "train.steps=12", "train.batch_size=8",
    "world.conversations=200", "arch.hidden_size=32", "arch.intermediate_size=64", "arch.num_hidden_layers=2",
    "train.val_every=6" }, sft.world_config())
  start = sft.main(cfg)
  return start
end

local function args(run_dir, extra)
  local a = { "model=" .. start_model(), "run_dir=" .. run_dir, "steps=5", "prompts_per_step=4", "rollout.n=4",
    "rollout.num_repeat_rollouts=2", "rollout.max_new_tokens=12", "seed=3", "eval.before=false", "eval.after=false",
    "save_every=2", "sample_every=2", "pairs_prompts=8", "min_gap=0", "train.batch_size=4", "train.micro_batch_size=2",
    "train.lr=3e-3" }
  for _, x in ipairs(extra or {}) do a[#a + 1] = x end
  return a
end
-- the world runs on its preset (config_dpo.lua: verl), as parse_args would give it
local WORLD_DEFAULTS = dpo_recipe.defaults_for("verl", false)
local function run(dir, extra) return dpo_recipe.main(config.parse(WORLD_DEFAULTS, args(dir, extra), dpo_recipe.world_config())) end

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

-- a straight run, then the same stopped after step 3 and resumed: the same rows
local function straight_and_resumed(name, extra)
  run(root .. "/" .. name, extra)
  local a = comparable(root .. "/" .. name)
  T.ok(a[5] and a[5].loss ~= nil, "every step logs its loss")
  T.ok(a[2].grad_norm > 0 and a[3].grad_norm > 0, "updates happen before the stop")
  T.ok(a[5].loss < a[1].loss, ("the DPO loss falls on its pairs: %.4f -> %.4f"):format(a[1].loss, a[5].loss))
  T.eq(T.read(root .. "/" .. name .. "/latest"), "checkpoint-5\n")
  local extra2 = { "stop_after=3" }
  for _, x in ipairs(extra or {}) do extra2[#extra2 + 1] = x end
  run(root .. "/" .. name .. "_stopped", extra2)
  T.eq(#data.read_jsonl(root .. "/" .. name .. "_stopped/metrics.jsonl"), 3)
  dpo_recipe.main(dpo_recipe.parse_args({ "resume=" .. root .. "/" .. name .. "_stopped" }))
  local b = comparable(root .. "/" .. name .. "_stopped")
  for step = 1, 5 do T.eq(b[step], a[step], name .. " step " .. step) end
  return a
end

T.case("pair selection: best and worst of each group above the gap", function()
  local e = {}
  for i = 1, 7 do e[i] = { group = i <= 4 and 1 or 2, id = i } end
  local sel = dpo.select(e, { 0.5, 0.9, nil, 0.1, 0.3, 0.35, 0.3 }, 0.1)
  T.eq(#sel, 1, "group 2's gap 0.05 is below min_gap")
  T.eq(sel[1].chosen.id, 2); T.eq(sel[1].rejected.id, 4)
  T.near(sel[1].score_chosen - sel[1].score_rejected, 0.8, 1e-12)
  local sel2 = dpo.select(e, { 0.5, 0.9, nil, 0.1, 0.3, 0.35, 0.3 }, 0.04)
  T.eq(#sel2, 2); T.eq(sel2[2].chosen.id, 6); T.eq(sel2[2].rejected.id, 7, "the last worst on a tie")
  T.eq(#dpo.select({ { group = 1 } }, { 1 }, 0), 0, "one response makes no pair")
end)

T.case("offline DPO on pairs sampled and MR-scored in the world; resume is bit-identical", function()
  straight_and_resumed("offline")
  local pairs = data.read_jsonl(root .. "/offline/pairs.jsonl")
  T.ok(#pairs > 0, "pairs.jsonl has pairs")
  for _, p in ipairs(pairs) do
    T.ok(p.score_chosen >= p.score_rejected, "chosen scores at least the rejected")
    T.eq(type(p.chosen), "string"); T.eq(p.prompt[1].role, "system")
  end
  local sc = data.read_jsonl(root .. "/offline/scored.jsonl")
  T.eq(#sc, 8 * 4, "every scored candidate of 8 prompts x 4")
  T.eq(type(sc[1].score), "number"); T.eq(type(sc[1].group), "string")
end)

T.case("offline DPO with LoRA: the reference is the start with its adapters off; checkpoints hold the adapter; resume is bit-identical", function()
  local a = straight_and_resumed("offline_lora", { "train.lora.r=4", "train.lora.dropout=0.1" })
  T.near(a[1].loss, math.log(2), 1e-5, "step 1: adapters start at zero (B = 0), so the policy is its reference")
  T.ok(files.exists(root .. "/offline_lora/checkpoint-5/adapter_config.json"), "the checkpoint holds the PEFT adapter")
  T.ok(not files.exists(root .. "/offline_lora/checkpoint-5/model.safetensors"), "and not a full model")
end)

T.case("online DPO on the policy's samples ranked by the MR; resume is bit-identical", function()
  local a = straight_and_resumed("online", { "online=true" })
  T.ok(a[1].reward ~= nil and a[1].pairs ~= nil and a[1].first_reply_ask_rate ~= nil, "the RL step's reward fields are logged")
  local with_pairs = 0
  for step = 1, 5 do
    if (a[step].pairs or 0) > 0 then
      with_pairs = with_pairs + 1
      T.ok(a[step].pair_score_gap >= 0, ("step %d: the chosen responses score at least the rejected (gap %s)"):format(step, a[step].pair_score_gap))
    end
  end
  T.ok(with_pairs > 0, "some step trained on pairs")
end)

T.case("offline DPO from process_dataset.lua's dpo_train.jsonl", function()
  local pd = require("recipes.process_dataset")
  -- rows in the published multiturn schema: two turns of 6 conversations, two candidates each
  local rows = {}
  for c = 1, 6 do
    local u1 = { role = "user", content = "Plan a trip for me." }
    rows[#rows + 1] = { prompt = { u1 }, completion = "Which city do you want to visit?", conv_id = c, turn_id = 0, score = 0.8 }
    rows[#rows + 1] = { prompt = { u1 }, completion = "Trip plan: fly to Rome.", conv_id = c, turn_id = 0, score = 0.1 }
    local p2 = { u1, { role = "assistant", content = "Which city do you want to visit?" }, { role = "user", content = "Oslo." } }
    rows[#rows + 1] = { prompt = p2, completion = "Trip plan: fly to Oslo.", conv_id = c, turn_id = 1, score = 1.0 }
    rows[#rows + 1] = { prompt = p2, completion = "Trip plan: fly to Rome.", conv_id = c, turn_id = 1, score = 0.0 }
  end
  local path = root .. "/dpo_train.jsonl"
  -- the world's model has a 256-token context, shorter than the published system prompt
  -- (lua/prompts/collabllm_system.txt): a short one of its own stands in for it
  local pairs_rows = pd.dpo_rows(rows, 0.1)
  for _, r in ipairs(pairs_rows) do
    T.eq(r.prompt[1], { role = "system", content = pd.SYSTEM_PROMPT })
    r.prompt[1] = { role = "system", content = "Ask when a request is unclear." }
  end
  data.write_jsonl(path, pairs_rows)
  local kept, below = dpo_recipe.read_pairs(path, 0.8)
  T.eq(#kept, 6, "turn 1's pairs (gap 1.0) stay"); T.eq(below, 6, "turn 0's (gap 0.7) are below min_gap 0.8")
  T.eq(kept[1].chosen, "Trip plan: fly to Oslo."); T.eq(kept[1].rejected, "Trip plan: fly to Rome.")
  local dir = root .. "/fromfile"
  dpo_recipe.main(config.parse(WORLD_DEFAULTS, args(dir, { "data=" .. path, "steps=3", "min_gap=0.3" }), dpo_recipe.world_config()))
  local m = data.read_jsonl(dir .. "/metrics.jsonl")
  T.eq(#m, 3)
  T.eq(m[1].pairs, 4, "batch_size pairs per step")
  T.ok(T.read(dir .. "/checkpoint-3/trainer_state.json"), "a checkpoint")
  -- a bad row names file and line
  local bad = root .. "/bad.jsonl"
  require("clrt.files").write_atomic(bad, '{"prompt": [{"role": "user", "content": "x"}], "chosen": "a"}\n')
  T.raises(function()
    dpo_recipe.main(config.parse(WORLD_DEFAULTS, args(root .. "/bad", { "data=" .. bad }), dpo_recipe.world_config()))
  end, "bad.jsonl:1: \"chosen\" and \"rejected\" must be strings")
end)

T.case("the world's settings load without model= or with world=true; a real model's defaults otherwise", function()
  local w = dpo_recipe.parse_args({ "model=/some/start", "world=true" })
  T.eq(w.sim, "scripted"); T.eq(w.train.beta, 0.1); T.eq(w.steps, 60)
  local r = dpo_recipe.parse_args({ "model=/some/start" })
  T.eq(r.sim, "llm"); T.eq(r.train.lr, 5e-6, "preset=authors"); T.eq(r.steps, nil); T.eq(r.online, false)
  T.raises(function() dpo_recipe.check_config(dpo_recipe.parse_args({ "model=/x", "train.label_smoothing=0.5" })) end,
    "label_smoothing")
  T.raises(function() dpo_recipe.parse_args({ "model=/x", "train.betta=0.2" }) end, "train.beta")
end)

T.case("MR-selected SFT: the best conversation of each group", function()
  local path = root .. "/scored.jsonl"
  local function conv(text) return { { role = "user", content = "Plan a trip for me." }, { role = "assistant", content = text } } end
  data.write_jsonl(path, {
    { messages = conv("guess"), score = 0.1, group = "a" }, { messages = conv("ask"), score = 0.9, group = "a" },
    { messages = conv("ask too"), score = 0.9, group = "a" }, { messages = conv("low"), score = -0.5, group = "b" },
    { messages = conv("alone"), score = 0.4 },
  })
  local out, info = scored.select(path)
  T.eq(#out, 3); T.eq(out[1].messages[2].content, "ask", "the first best on a tie"); T.eq(out[2].messages[2].content, "low")
  T.eq(info.groups, 3)
  local top2 = scored.select(path, { top = 2, min_score = 0 })
  T.eq(#top2, 3, "top 2 of a, none of b above 0, the lone row")
  T.eq(top2[2].messages[2].content, "ask too")
  local dir = root .. "/mrsft"
  local cfg = config.parse(sft.defaults, { "model=" .. start_model(), "run_dir=" .. dir, "scored=" .. path, "train.steps=2",
    "train.lr=1e-3", "val_fraction=0" }, nil)
  sft.main(cfg)
  T.eq(#data.read_jsonl(dir .. "/metrics.jsonl"), 2)
  require("clrt.files").write_atomic(root .. "/bad_scored.jsonl", '{"messages": [{"role": "user", "content": "x"}]}\n')
  T.raises(function() scored.select(root .. "/bad_scored.jsonl") end, "bad_scored.jsonl:1: a row needs a numeric \"score\"")
end)

T.case("presets: authors (default) and verl, offline and online; the world keeps its settings", function()
  local function parse(extra)
    local argv = { "model=/nonexistent/model" }
    for _, x in ipairs(extra) do argv[#argv + 1] = x end
    local cfg = dpo_recipe.parse_args(argv)
    dpo_recipe.check_config(cfg)
    return cfg
  end
  -- authors, offline: scripts/train/offline_dpo.py
  local a = parse({})
  T.eq({ a.preset, a.online, a.min_gap, a.epochs, a.train.lr, a.train.decay, a.train.min_lr_ratio, a.train.warmup_steps,
    a.train.weight_decay, a.train.batch_size, a.train.lora.r, a.train.lora.alpha, a.train.lora.dropout, a.train.beta, a.train.grad_clip },
    { "authors", false, 0.02, 8, 5e-6, "cosine", 0, 0, 0, 64, 32, 16, 0, 0.1, 1.0 })
  T.eq(a.train.lora.targets, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
  -- authors, online: scripts/train/online_dpo.py
  local o = parse({ "online=true" })
  T.eq({ o.preset, o.online, o.min_gap, o.epochs, o.prompts_per_step, o.rollout.n, o.rollout.temperature, o.rollout.top_p,
    o.train.lr, o.train.decay, o.train.lora.r, o.train.lora.alpha, o.reward.mode, o.rollout.num_repeat_rollouts,
    o.rollout.max_user_turns, o.rollout.max_assistant_turns },
    { "authors", true, 0, 1, 32, 2, 0.6, 1.0, 5e-6, "cosine", 32, 16, "mean", 3, 2, 2 })
  T.eq(o.reward.metric_weights, { accuracy = 1, interactivity = 1, tokens_read = -0.5 })
  -- verl-style, both ways: the RL recipe's settings
  for _, extra in ipairs({ { "preset=verl" }, { "preset=verl", "online=true" } }) do
    local v = parse(extra)
    T.eq({ v.preset, v.min_gap, v.epochs, v.prompts_per_step, v.rollout.n, v.rollout.temperature, v.train.lr, v.train.decay,
      v.train.batch_size, v.train.lora.r, v.train.weight_decay, v.reward.mode },
      { "verl", 0.1, 3, 16, 8, 1.0, 1e-6, "constant", 16, 0, 0.01, "verl" })
    T.eq(v.reward.metric_weights, { accuracy = 1, interactivity = 1, token_amount = -0.0001 })
  end
  -- the command line wins over the preset; a preset from a config= file counts too
  T.eq(parse({ "online=true", "rollout.n=4", "train.lr=1e-5" }).rollout.n, 4)
  local dir = T.tmpdir()
  local f = assert(io.open(dir .. "/c.json", "wb")); f:write('{"preset": "verl", "online": true}'); f:close()
  local fc = dpo_recipe.parse_args({ "model=/nonexistent/model", "config=" .. dir .. "/c.json" })
  T.eq({ fc.preset, fc.online, fc.rollout.n, fc.min_gap }, { "verl", true, 8, 0.1 })
  T.raises(function() parse({ "preset=paper" }) end, "preset must be 'authors' or 'verl'")
  -- the built-in world runs as it was measured (full fine-tuning, its own settings)
  for _, extra in ipairs({ {}, { "online=true" } }) do
    local w = dpo_recipe.parse_args(extra)
    T.eq({ w.preset, w.train.lora.r, w.train.lora.alpha, w.min_gap, w.epochs, w.rollout.n, w.rollout.temperature, w.train.lr,
      w.prompts_per_step, w.reward.mode }, { "verl", 0, nil, 0.1, 3, 8, 1.0, 2e-4, 16, "verl" })
    T.eq(w.reward.metric_weights, { exact_match = 1, token_amount = -0.02 })
  end
end)

T.run()
