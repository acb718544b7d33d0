-- LoRA in the CollabLLM recipes on the built-in world at toy size: SFT and RL with
-- train.lora.r > 0 train adapters over a frozen base (the base folder and weights untouched),
-- checkpoint the adapter in PEFT's format with the optimizer state, and a run stopped and
-- resumed logs the same metrics, bit for bit, as one that never stopped (dropout on, so the
-- masks' counter must resume too). In RL the reference is the policy with its adapters off.
-- The RL runs also put adapters beside the output layer and the embedding (lm_head,
-- embed_tokens: off by default), so resume and the reference cover those too.
local T = require("clrt.test")
local data = require("clrt.data")
local config = require("clrt.config")
local files = require("clrt.files")
local sft = require("recipes.collabllm_sft")
local rl = require("recipes.collabllm_rl")

local root = T.tmpdir()
local base

local function comparable(dir)
  local out = {}
  for _, r in ipairs(data.read_jsonl(dir .. "/metrics.jsonl")) do
    local c = {}
    for k, v in pairs(r) do
      if not (k:find("^time") or k == "tokens_per_s" or k == "elapsed" or k == "cpu_seconds") then c[k] = v end
    end
    out[r.step] = c
  end
  return out
end

local LORA = { "train.lora.r=4", "train.lora.alpha=8", "train.lora.dropout=0.1" }

T.case("a base for the LoRA runs (SFT from scratch, full fine-tuning)", function()
  local cfg = config.parse(sft.defaults, {
    "run_dir=" .. root .. "/base", "train.steps=4", "train.batch_size=8", "world.conversations=100",
    "arch.hidden_size=32", "arch.intermediate_size=64", "arch.num_hidden_layers=2", "train.val_every=0",
  }, sft.world_config())
  base = sft.main(cfg)
  T.ok(files.exists(base .. "/model.safetensors"))
end)

local function sft_args(run_dir, extra)
  local a = { "model=" .. base, "run_dir=" .. run_dir, "train.steps=6", "train.batch_size=8", "train.lr=1e-2",
    "world.conversations=100", "train.val_every=3", "save_every=2" }
  for _, x in ipairs(LORA) do a[#a + 1] = x end
  for _, x in ipairs(extra or {}) do a[#a + 1] = x end
  return a
end

T.case("LoRA SFT: adapters train, the base stays, PEFT checkpoints, bit-identical resume", function()
  if not base then T.skip("needs the base") end
  local before = T.read(base .. "/model.safetensors")
  sft.main(config.parse(sft.defaults, sft_args(root .. "/sft_straight"), sft.world_config()))
  local a = comparable(root .. "/sft_straight")
  T.ok(a[6].grad_norm > 0, "the adapters get gradients")
  local ck = root .. "/sft_straight/checkpoint-6"
  local trained = clrt.safetensors.load(ck .. "/adapter_model.safetensors")
  T.ok(trained["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"]:abs():max() > 0, "B left zero: nothing trained")
  T.ok(files.exists(ck .. "/adapter_config.json") and files.exists(ck .. "/adapter_model.safetensors"), "PEFT adapter saved")
  T.ok(not files.exists(ck .. "/model.safetensors"), "no full model in a LoRA checkpoint")
  T.ok(files.exists(ck .. "/optimizer.safetensors"), "with the optimizer state")
  local acfg = require("clrt.json").decode(T.read(ck .. "/adapter_config.json"))
  T.eq(acfg.r, 4); T.eq(acfg.lora_alpha, 8); T.eq(acfg.base_model_name_or_path, base)
  T.ok(T.read(base .. "/model.safetensors") == before, "the base folder is untouched")
  -- the run's model/ is the merged model: equal to base + the adapter it saved
  local merged = clrt.model.load(root .. "/sft_straight/model")
  local adapted = clrt.model.load(base, { adapter = root .. "/sft_straight/adapter" })
  local toks = { { 1, 2, 3, 4, 5, 6, 7, 8 } }
  local d = (merged:logprobs(toks, { grad = false }) - adapted:logprobs(toks, { grad = false })):abs():max()
  T.ok(d < 1e-4, "merged model/ = base + adapter: " .. d)
  sft.main(config.parse(sft.defaults, sft_args(root .. "/sft_stopped", { "stop_after=3" }), sft.world_config()))
  T.eq(#data.read_jsonl(root .. "/sft_stopped/metrics.jsonl"), 3)
  sft.main(sft.parse_args({ "resume=" .. root .. "/sft_stopped" }))
  local b = comparable(root .. "/sft_stopped")
  for step = 1, 6 do T.eq(b[step], a[step], "step " .. step) end
end)

local function rl_args(run_dir, extra)
  local a = { "config=" .. rl.world_config_path(), "model=" .. base, "run_dir=" .. run_dir, "steps=4", "prompts_per_step=4",
    "rollout.n=4", "rollout.num_repeat_rollouts=2", "rollout.max_new_tokens=24", "seed=3", "eval.before=false",
    "eval.after=false", "save_every=2", "sample_every=2", "train.lr=1e-2", "train.kl_coef=0.1",
    "train.lora.targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head,embed_tokens" }
  for _, x in ipairs(LORA) do a[#a + 1] = x end
  for _, x in ipairs(extra or {}) do a[#a + 1] = x end
  return a
end

T.case("LoRA RL: the reference is the base (adapters off), PEFT checkpoints, bit-identical resume", function()
  if not base then T.skip("needs the base") end
  rl.main(config.parse(rl.defaults, rl_args(root .. "/rl_straight")))
  local a = comparable(root .. "/rl_straight")
  T.ok(a[4] and a[4].reward ~= nil, "every step logs its reward")
  T.ok(a[3].grad_norm > 0, "the adapters get gradients")
  T.ok(a[4].kl > 0, "the trained policy moved away from the reference")
  local ck = root .. "/rl_straight/checkpoint-4"
  T.ok(files.exists(ck .. "/adapter_model.safetensors") and not files.exists(ck .. "/model.safetensors"))
  T.ok(files.exists(ck .. "/optimizer.safetensors"))
  local trained = clrt.safetensors.load(ck .. "/adapter_model.safetensors")
  T.ok(trained["base_model.model.lm_head.lora_B.weight"]:abs():max() > 0, "lm_head's B trained")
  T.ok(trained["base_model.model.model.embed_tokens.lora_embedding_A"]:abs():max() > 0, "embed_tokens' A trained")
  rl.main(config.parse(rl.defaults, rl_args(root .. "/rl_stopped", { "stop_after=2" })))
  rl.main(rl.parse_args({ "resume=" .. root .. "/rl_stopped" }))
  local b = comparable(root .. "/rl_stopped")
  for step = 1, 4 do T.eq(b[step], a[step], "step " .. step) end
end)

T.case("RL from model=BASE adapter=DIR (a PEFT folder) continues that adapter; the reference is BASE", function()
  if not base then T.skip("needs the base") end
  local dir = root .. "/rl_adapter"
  rl.main(config.parse(rl.defaults, { "config=" .. rl.world_config_path(), "model=" .. base, "adapter=" .. root .. "/sft_straight/adapter",
    "run_dir=" .. dir, "steps=1", "prompts_per_step=2", "rollout.n=2", "rollout.num_repeat_rollouts=1",
    "rollout.max_new_tokens=8", "eval.before=false", "eval.after=false", "save_every=1", "train.kl_coef=0.1" }))
  local a = comparable(dir)
  T.ok(a[1].kl > 1e-6, "the SFT adapter makes the policy differ from the base at step 1: kl " .. tostring(a[1].kl))
  local cfg = require("clrt.json").decode(T.read(dir .. "/checkpoint-1/adapter_config.json"))
  T.eq(cfg.r, 4, "the adapter's own settings")
end)

T.case("the RL reference of a LoRA policy is the same weights with the adapters off", function()
  if not base then T.skip("needs the base") end
  local lora = require("clrt.train.lora")
  local m = lora.policy(base, root .. "/rl_straight/checkpoint-4", { r = 4 }, 1)
  local ref = lora.reference(m, base)
  T.eq(getmetatable(ref), nil, "not a second model")
  local toks = { { 1, 2, 3, 4, 5, 6, 7, 8 } }
  local want = clrt.model.load(base):logprobs(toks, { grad = false })
  local got = ref:logprobs(toks, { grad = false })
  T.eq((got - want):abs():max(), 0, "reference = base")
  T.ok((m:logprobs(toks, { grad = false }) - want):abs():max() > 0, "the policy itself keeps its adapters")
  T.eq(m:adapters_enabled(), true)
end)

T.run()
