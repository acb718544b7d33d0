-- Mistral and Phi-3 models (a sliding window far shorter than the conversations) through what a
-- user runs at toy size on the built-in world: SFT (full fine-tuning), RL with LoRA (Phi-3's
-- fused qkv_proj / gate_up_proj adapters from the recipes' default target list) and
-- `clrt serve`. Smoke tests: the runs finish, train (loss falls, adapters move), save what
-- transformers reads (architecture, window, fused names) and serve what the model generates in
-- process. Parity of the math itself is test_model / test_decode / test_lora's.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local data = require("clrt.data")
local config = require("clrt.config")
local files = require("clrt.files")
local json = require("clrt.json")
local sft = require("recipes.collabllm_sft")
local rl = require("recipes.collabllm_rl")

local root = T.tmpdir()
local WINDOW = 24

-- the world's tokenizer, from a one-step SFT run from scratch
local world = root .. "/world"
sft.main(config.parse(sft.defaults, { "run_dir=" .. world, "train.steps=1", "train.batch_size=4",
  "world.conversations=40", "arch.hidden_size=32", "arch.intermediate_size=64", "arch.num_hidden_layers=2",
  "train.val_every=0" }, sft.world_config()))

local ARCHS = {
  mistral = { architectures = { "MistralForCausalLM" }, model_type = "mistral", sliding_window = WINDOW },
  phi3 = { architectures = { "Phi3ForCausalLM" }, model_type = "phi3", sliding_window = WINDOW,
    original_max_position_embeddings = 1024, rope_scaling = json.null },
}

-- a model folder: the world's tokenizer files and a random model of the architecture
local function base_for(name)
  local dir = root .. "/" .. name .. "_base"
  files.mkdir_p(dir)
  for _, f in ipairs({ "tokenizer.json", "tokenizer_config.json" }) do
    files.write_atomic(dir .. "/" .. f, T.read(world .. "/model/" .. f))
  end
  local tok = clrt.tokenizer.load(dir)
  local cfg = { vocab_size = tok:vocab_size(), hidden_size = 32, intermediate_size = 48, num_hidden_layers = 2,
    num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 1024, rms_norm_eps = 1e-5,
    rope_theta = 10000.0, tie_word_embeddings = false, hidden_act = "silu" }
  for k, v in pairs(ARCHS[name]) do cfg[k] = v end
  clrt.model.new(cfg, { seed = 5 }):save(dir)
  return dir
end

local function metrics(dir) return data.read_jsonl(dir .. "/metrics.jsonl") end

for _, name in ipairs({ "mistral", "phi3" }) do
  local base = base_for(name)

  T.case(name .. ": SFT (full fine-tuning) trains over conversations longer than the window and saves HF's layout", function()
    local run = root .. "/" .. name .. "_sft"
    sft.main(config.parse(sft.defaults, { "model=" .. base, "run_dir=" .. run, "train.steps=4", "train.batch_size=4",
      "train.lr=1e-2", "world.conversations=40", "train.val_every=0" }, sft.world_config()))
    local rows = metrics(run)
    T.eq(#rows, 4)
    T.ok(rows[4].loss < rows[1].loss, ("loss falls: %g -> %g"):format(rows[1].loss, rows[4].loss))
    local cfg = json.decode(T.read(run .. "/model/config.json"))
    T.eq(cfg.architectures[1], ARCHS[name].architectures[1])
    T.eq(cfg.sliding_window, WINDOW)
    local info = clrt.safetensors.info(run .. "/model/model.safetensors")
    if name == "phi3" then
      T.ok(info["model.layers.0.self_attn.qkv_proj.weight"] and info["model.layers.1.mlp.gate_up_proj.weight"], "fused names")
      T.ok(not info["model.layers.0.self_attn.q_proj.weight"], "no split names")
    else
      T.ok(info["model.layers.0.self_attn.q_proj.weight"], "Llama's names")
    end
    -- the world's conversations (what the run trained on) are longer than the window
    local tok = clrt.tokenizer.load(base)
    local conv = sft.world().sft_conversations(40, sft.defaults.seed, {})
    local shortest = math.huge
    for _, c in ipairs(conv) do shortest = math.min(shortest, #clrt.chat.render(tok, c.messages)) end
    T.ok(shortest > WINDOW, "every conversation outgrows the window: the shortest has " .. shortest .. " tokens")
  end)

  T.case(name .. ": RL with LoRA (the default targets) runs steps, moves the adapters, checkpoints PEFT's names", function()
    local run = root .. "/" .. name .. "_rl"
    rl.main(config.parse(rl.defaults, { "config=" .. rl.world_config_path(), "model=" .. base, "run_dir=" .. run,
      "steps=2", "prompts_per_step=2", "rollout.n=2", "rollout.num_repeat_rollouts=1", "rollout.max_new_tokens=40",
      "seed=3", "eval.before=false", "eval.after=false", "save_every=2", "train.lr=1e-2", "train.kl_coef=0.1",
      "train.lora.r=4", "train.lora.alpha=8" }))
    local rows = metrics(run)
    T.eq(#rows, 2)
    T.ok(rows[2].reward ~= nil, "rewards logged")
    T.ok(rows[2].grad_norm > 0, "the adapters get gradients")
    local ck = run .. "/checkpoint-2"
    local acfg = json.decode(T.read(ck .. "/adapter_config.json"))
    local want = name == "phi3" and "qkv_proj,o_proj,gate_up_proj,down_proj"
      or "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    T.eq(table.concat(acfg.target_modules, ","), want)
    local w = clrt.safetensors.load(ck .. "/adapter_model.safetensors")
    local b = name == "phi3" and "base_model.model.model.layers.1.self_attn.qkv_proj.lora_B.weight"
      or "base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"
    T.ok(w[b] and w[b]:abs():max() > 0, b .. " trained")
  end)

  T.case(name .. ": clrt serve answers with the model's own greedy reply", function()
    if os.execute("command -v curl > /dev/null 2>&1") ~= 0 then T.skip("curl is not installed") end
    local srv = require("support.serve")(base, "--slots 4")
    local messages = { { role = "user", content = "hello there, how are you today? write a card for my friend" } }
    local body = root .. "/" .. name .. "_req.json"
    files.write_atomic(body, require("cjson").encode({ messages = messages, temperature = 0, max_tokens = 40 }))
    local f = assert(io.popen(("curl -s -m 60 --data-binary @%s -H 'Content-Type: application/json' %s/chat/completions")
      :format(body, srv.url)))
    local reply = require("cjson").decode(f:read("*a"))
    f:close()
    local m, tok = clrt.model.load(base), clrt.tokenizer.load(base)
    local want, raw = clrt.chat.generate(m, tok, messages, { temperature = 0, max_new_tokens = 40 })
    T.eq(reply.choices[1].message.content, want)
    T.eq(reply.usage.completion_tokens, #raw.tokens)
    T.ok(reply.usage.prompt_tokens + reply.usage.completion_tokens > WINDOW, "the reply runs past the window")
  end)
end

T.run()
