-- Gemma 3 end to end at toy size, over a tiny Gemma3ForCausalLM folder (support.tiny_model,
-- its byte-level tokenizer and ChatML template): SFT (full fine-tuning) on the built-in world
-- lowers the loss and saves a Gemma 3 folder that loads; RL with LoRA adapters runs its steps
-- and trains them; `clrt serve` answers a chat request with what in-process greedy gives.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local data = require("clrt.data")
local config = require("clrt.config")
local files = require("clrt.files")
local json = require("clrt.json")
local sft = require("recipes.collabllm_sft")
local rl = require("recipes.collabllm_rl")

local root = T.tmpdir()
local base = require("support.tiny_model")(root .. "/gemma3", { seed = 6, architecture = "gemma3" })
local tuned   -- the SFT run's model, RL's start

T.case("SFT on a Gemma 3 model: the loss falls, the saved folder is Gemma 3 and loads", function()
  local dir = root .. "/sft"
  local out = sft.main(config.parse(sft.defaults, { "model=" .. base, "run_dir=" .. dir, "train.steps=6",
    "train.batch_size=8", "train.lr=1e-2", "world.conversations=60", "train.val_every=0" }, sft.world_config()))
  local rows = data.read_jsonl(dir .. "/metrics.jsonl")
  T.eq(#rows, 6)
  T.ok(rows[6].loss < rows[1].loss, ("loss %.4f -> %.4f"):format(rows[1].loss, rows[6].loss))
  T.eq(json.decode(files.read(out .. "/config.json")).architectures[1], "Gemma3ForCausalLM")
  local m = clrt.model.load(out)
  tuned = out
  T.ok(m:params()["model.layers.2.post_feedforward_layernorm.weight"], "Gemma 3's names")
end)

T.case("RL with LoRA on a Gemma 3 model: steps log rewards, the adapters train", function()
  if not tuned then T.skip("needs the SFT run's model") end
  local dir = root .. "/rl"
  rl.main(config.parse(rl.defaults, { "config=" .. rl.world_config_path(), "model=" .. tuned, "run_dir=" .. dir,
    "steps=2", "prompts_per_step=4", "rollout.n=4", "rollout.num_repeat_rollouts=2", "rollout.max_new_tokens=12", "seed=3",
    "eval.before=false", "eval.after=false", "save_every=2", "train.lr=1e-2", "train.kl_coef=0.1",
    "train.lora.r=4", "train.lora.alpha=8" }))
  local rows = data.read_jsonl(dir .. "/metrics.jsonl")
  T.eq(#rows, 2)
  T.ok(rows[2].reward ~= nil, "step 2 logs its reward")
  T.ok(rows[1].grad_norm > 0 or rows[2].grad_norm > 0, "the adapters get gradients")
  local trained = clrt.safetensors.load(dir .. "/checkpoint-2/adapter_model.safetensors")
  T.ok(trained["base_model.model.model.layers.2.mlp.down_proj.lora_B.weight"]:abs():max() > 0, "B trained")
end)

T.case("clrt serve on a Gemma 3 folder answers as in-process greedy generation", function()
  if os.execute("command -v curl > /dev/null 2>&1") ~= 0 then T.skip("curl is not installed") end
  local srv = require("support.serve")(base, "--slots 4")
  local msgs = { { role = "user", content = "hello, how are you today?" } }
  local body = root .. "/req.json"
  local f = assert(io.open(body, "w"))
  f:write(json.encode({ messages = msgs, temperature = 0, max_tokens = 20 }))
  f:close()
  local p = io.popen(("curl -s -m 60 --data-binary @%s -H 'Content-Type: application/json' %s/chat/completions"):format(body, srv.url))
  local r = json.decode(p:read("*a"))
  p:close()
  local want = clrt.chat.generate(clrt.model.load(base), clrt.tokenizer.load(base), msgs, { temperature = 0, max_new_tokens = 20 })
  T.eq(r.choices[1].message.content, want)
  T.ok(#want > 0, "a non-empty reply")
end)

T.run()
