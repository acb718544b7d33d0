-- bench/train_step.lua — tokens per second of one training step (forward + backward + AdamW)
-- at B=8, T=256, for a ~5M and a ~50M parameter model (and sizes=0.5B: Qwen2.5-0.5B's
-- shape, with B=2 for memory), clrt against the same model in
-- PyTorch (tests/reference/model_ref.py, float32, 2 threads) run in this invocation; also the
-- peak resident memory of each (each side runs in its own process). Prints the ratios and
-- clrt's per-kernel time breakdown. Speeds are from the median step (and the fastest, which
-- is what a busy machine disturbs least).
-- device=cuda runs both on the GPU (fp32, TF32 off on both sides) and adds achieved TFLOP/s
-- and MFU against the GPU's dense bf16 peak (clrt.cuda_peak_tflops(), CLRT_PEAK_TFLOPS).
-- precision=bf16 (or matmul=bf16; full fine-tune and LoRA-over-f32-base rows): clrt's
-- train.precision=bf16 (m:set_matmul("bf16"): bf16 products on the CPU's matrix unit, AMX or
-- AVX512-BF16, f32 master weights, AdamW, loss and norms) against PyTorch's step under
-- autocast(bfloat16). CLRT_PYTHON names the peer's Python (default /usr/bin/python3, Debian's).
-- On the CPU the bench first measures the peaks it compares with, over its threads, operands
-- in registers: the f32 FMA peak of the kernel level in use (AVX-512 or AVX2) and the bf16 unit's (clrt.model.unit_peak_gflops),
-- and prints each row's GFLOP/s as a share of them. It also prints, per step, the time
-- outside the products (the optimizer and everything not a kernel). Timings need a quiet
-- machine: a loaded one measures the load.
-- baseline=1 also runs clrt with set_decode_pack(false) (OpenBLAS sgemm for every product, the
-- path before the AVX-512 training kernels) and prints the ratio of the two in this run.
-- deterministic=1 also runs clrt with m:set_batch_invariant(true) (the RL policy's default:
-- the training forward's attention query by query, as decode runs it) and prints its cost;
-- that run keeps a packed copy of the weights at any size, as a policy that decodes has one.
-- sizes=0.9M is the built-in world's model at its SFT batch (B=32, T=256).
-- rows=full,lora,lora_bf16 picks the steps measured per size: the full fine-tune, and LoRA of
-- rank lora=R (default 16, alpha 2R) on the seven projections of every layer over an f32 base
-- or a bf16 one (train.base_dtype=bf16); `lora=R` alone means rows=lora, with base_dtype=bf16
-- rows=lora_bf16. A LoRA row's PyTorch peer is a LoRA of its own (train_step_torch.py), its
-- FLOPs those it needs: no weight gradients of the frozen base, the adapters' products added.
-- On the CPU each row also prints GFLOP/s against peak_gflops= (default 443: the two cores'
-- measured FMA peak on the Zen 5 the README's figures come from).
--   clrt bench/train_step.lua [sizes=5M,50M] [rows=full] [lora=16] [base_dtype=f32|bf16] [steps=3] [B=8 (0.9M: 32, 0.5B/1.5B: 2)] [T=256]
--                             [threads=2] [device=cpu|cuda] [baseline=1] [deterministic=1] [peak_gflops=measured] [precision=f32|bf16]
local cjson = require("cjson")

local args = {}
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^([%w_]+)=(.*)$")
  if k then args[k] = v end
end

local SIZES = dofile((debug.getinfo(1, "S").source:sub(2):match("^(.*)/") or ".") .. "/shapes.lua")

local function peak_rss_mb()
  local f = io.open("/proc/self/status")
  local s = f:read("*a")
  f:close()
  return tonumber(s:match("VmHWM:%s+(%d+)")) / 1024
end

local now = require("clrt.log").now   -- the monotonic clock

-- The clrt side, in a child process: `clrt bench/train_step.lua worker=5M ...`.
if args.worker then
  clrt.set_num_threads(tonumber(args.threads or 2))
  local cfg = SIZES[args.worker]
  local B, T, steps = tonumber(args.B), tonumber(args.T), tonumber(args.steps)
  local m = clrt.model.new(cfg, { seed = 0, max_batch = B, max_seq = T, keep_logits_mb = tonumber(args.keep_logits_mb),
    device = args.device })
  if args.pack == "0" then m:set_decode_pack(false) end   -- sgemm throughout: the old path
  if args.invariant == "1" then m:set_batch_invariant(true) end
  local flops = m:train_flops(B, T)
  local r = tonumber(args.lora or 0)
  if r > 0 then
    m:add_lora({ r = r, alpha = 2 * r, seed = 0 })
    if args.base_dtype == "bf16" then m:set_base_dtype("bf16") end
    flops = m:train_flops(B, T)   -- with adapters: no weight gradients of the frozen base
  end
  if args.matmul == "bf16" then m:set_matmul("bf16") end
  print("clrt matrix_unit=" .. (args.matmul == "bf16" and clrt.model.matrix_unit() or "f32"))
  local opt = clrt.optim.adamw(m, { lr = 1e-4, weight_decay = 0.1, grad_clip = 1.0 })
  local gen = clrt.tensor.generator(1)
  local toks = clrt.tensor.zeros({ B, T }, { dtype = "i32" })
  for i = 1, B do for j = 1, T do toks:set(i, j, math.floor(clrt.tensor.rand({ 1 }, { generator = gen }):get(1) * cfg.vocab_size)) end end
  local d = clrt.tensor.full({ B, T - 1 }, -1 / (B * (T - 1)))
  local t_opt = 0
  local function step()
    m:zero_grad()
    m:logprobs(toks)
    m:backward(d)
    local t0 = now()
    opt:step()
    t_opt = t_opt + now() - t0
  end
  step()
  clrt.model.profile(true)
  t_opt = 0
  local times = {}
  local t0 = now()
  for i = 1, steps do
    local s0 = now()
    step()
    times[i] = now() - s0
  end
  local dt = now() - t0
  local prof_steps = steps
  if args.device == "cuda" then
    -- GPU kernels run asynchronously: the profile's kernel times are launch times unless it
    -- waits around each kernel, which slows the step, so it gets steps of its own
    clrt.model.profile_sync(true)
    clrt.model.profile(true)
    t_opt, prof_steps = 0, 2
    local p0 = now()
    for _ = 1, prof_steps do step() end
    dt = now() - p0
    clrt.model.profile_sync(false)
  end
  table.sort(times)
  print(("clrt tokens_per_s=%.1f peak_rss_mb=%.1f params=%d best_tokens_per_s=%.1f"):format(
    B * T / times[math.floor(steps / 2) + 1], peak_rss_mb(), m:num_params(), B * T / times[1]))
  print(("clrt flops_per_step=%.6g"):format(flops))
  local mem = m:memory()
  print(("clrt arenas_mb params=%.1f grads=%.1f activations=%.1f adamw=%.1f"):format(mem.params / 2^20,
    (mem.grads or 0) / 2^20, mem.activations / 2^20, opt:memory() / 2^20))
  local prof, total = clrt.model.profile(), 0
  for _, p in ipairs(prof) do total = total + p.seconds end
  for _, p in ipairs(prof) do
    if p.seconds > 0 then print(("clrt kernel %-14s %7.3f s/step %5.1f%%"):format(p.name, p.seconds / prof_steps, 100 * p.seconds / dt)) end
  end
  print(("clrt kernel %-14s %7.3f s/step %5.1f%%"):format("adamw", t_opt / prof_steps, 100 * t_opt / dt))
  print(("clrt kernel %-14s %7.3f s/step %5.1f%%"):format("(unaccounted)", (dt - total - t_opt) / prof_steps, 100 * (dt - total - t_opt) / dt))
  local products = 0   -- the matrix products' kernels (the output layer's includes its log-softmax)
  for _, p in ipairs(prof) do
    if p.name:find("^linear") or p.name:find("^output") or p.name == "lora" then products = products + p.seconds end
  end
  print(("clrt kernel %-14s %7.3f s/step %5.1f%% (of which the optimizer step, copies refreshed in place: %.3f s)"):format(
    "outside products", (dt - products) / prof_steps, 100 * (dt - products) / dt, t_opt / prof_steps))
  os.exit(0)
end

local steps = tonumber(args.steps or 3)
-- B and T per shape unless given: the world's model trains 32 conversations per step (its SFT
-- settings; max_len 256), the 0.5B shape 2 rows for memory, the others 8
local BATCH = { ["0.9M"] = 32, ["0.5B"] = 2, ["1.5B"] = 2 }
local function shape_bt(size) return tonumber(args.B or BATCH[size] or 8), tonumber(args.T or 256) end
local threads = tonumber(args.threads or 2)
local device = args.device or "cpu"
local peak = 0
if device == "cuda" then
  if not clrt.cuda_available() then
    print("train step, device=cuda: no GPU here (" .. clrt.cuda_status() .. "); nothing measured")
    os.exit(0)
  end
  peak = clrt.cuda_peak_tflops()
  print(("GPU: %s, dense bf16 peak %s TFLOP/s"):format(clrt.cuda_device_name(),
    peak > 0 and tostring(peak) or "unknown (set CLRT_PEAK_TFLOPS)"))
end
-- The checkout this script runs from (its worker and peer sit beside it), whichever clrt runs it.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/bench/[^/]*$") or "."
local src = os.getenv("CLRT_SOURCE_DIR") or here
local bin = os.getenv("CLRT_BIN") or (arg and arg[-1]) or "clrt"
local sh_quote = require("clrt.util.shell").quote
local python = os.getenv("CLRT_PYTHON") or "/usr/bin/python3"
local matmul = args.precision or args.matmul or "f32"
if matmul ~= "f32" and matmul ~= "bf16" then error("precision=" .. matmul .. " (f32, bf16)") end

local function run(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("*a")
  p:close()
  return out
end

print(("train step: %d timed steps after 1 warm-up, %d threads each"):format(steps, threads))
local lora_r = tonumber(args.lora or 16)
local ROWS = {
  full = { label = "full fine-tune", r = 0, base = "f32" },
  lora = { label = ("LoRA r=%d, f32 base"):format(lora_r), r = lora_r, base = "f32" },
  lora_bf16 = { label = ("LoRA r=%d, bf16 base"):format(lora_r), r = lora_r, base = "bf16" },
}
local rows = args.rows or (args.lora and (args.base_dtype == "bf16" and "lora_bf16" or "lora")) or "full"
-- The peaks this machine reaches over the bench's threads, measured before any worker runs.
local peak_gflops, unit, unit_peak = tonumber(args.peak_gflops), clrt.model.matrix_unit(), 0
if device == "cpu" then
  peak_gflops = peak_gflops or clrt.model.unit_peak_gflops("f32", threads)
  if unit ~= "f32" then unit_peak = clrt.model.unit_peak_gflops(unit, threads) end
  print("CPU: " .. clrt.model.cpu_paths())
  print(("CPU peaks over %d threads (measured): f32 FMA %.0f GFLOP/s; bf16 matrix unit %s%s"):format(threads,
    peak_gflops, unit, unit_peak > 0 and (" %.0f GFLOP/s (%.1fx f32)"):format(unit_peak, unit_peak / peak_gflops) or " (none)"))
end
for size in (args.sizes or "5M,50M"):gmatch("[^,]+") do
 for row_name in rows:gmatch("[^,]+") do
  local cfg = SIZES[size]
  if not cfg then error("unknown size " .. size) end
  local B, T = shape_bt(size)
  local row = ROWS[row_name]
  if not row then error("unknown row " .. row_name .. " (full, lora, lora_bf16)") end
  local lora_args = row.r > 0 and (" lora=%d base_dtype=%s"):format(row.r, row.base) or ""
  local mm = row.base == "bf16" and "f32" or matmul   -- a bf16 base multiplies in bf16 already
  local c_out = run(("CLRT_PROFILE=1 OMP_NUM_THREADS=%d %s %s/bench/train_step.lua worker=%s B=%d T=%d steps=%d threads=%d device=%s matmul=%s%s"):format(
    threads, sh_quote(bin), sh_quote(src), size, B, T, steps, threads, device, mm, lora_args))
  local t_out = run(("OMP_NUM_THREADS=%d %s %s/bench/train_step_torch.py %s %d %d %d %d %s %d %s %s"):format(
    threads, sh_quote(python), sh_quote(src), sh_quote(cjson.encode(cfg)), B, T, steps, threads, device, row.r, row.base, mm))
  local ctok, crss = c_out:match("clrt tokens_per_s=([%d.]+) peak_rss_mb=([%d.]+)")
  local ttok, trss = t_out:match("torch tokens_per_s=([%d.]+) peak_rss_mb=([%d.]+)")
  if not ctok then error("clrt worker failed:\n" .. c_out) end
  if not ttok and device == "cuda" then   -- no CUDA torch: report clrt alone
    print("torch peer unavailable on cuda: " .. t_out:gsub("%s+$", ""))
    ttok, trss = 0 / 0, 0 / 0
  end
  if not ttok then error("torch peer failed:\n" .. t_out) end
  print(("\n== %s (%s params), B=%d T=%d, %s%s =="):format(size, c_out:match("params=(%d+)"), B, T, row.label,
    mm == "bf16" and (", bf16 products on %s, torch under autocast(bfloat16)"):format(c_out:match("matrix_unit=(%S+)") or "?") or ""))
  local cbest = tonumber(c_out:match("best_tokens_per_s=([%d.]+)"))
  local tbest = tonumber(t_out:match("best_tokens_per_s=([%d.]+)")) or 0 / 0
  print(("clrt : %9.1f tokens/s (median step; best %.1f)  peak RSS %7.1f MB"):format(tonumber(ctok), cbest, tonumber(crss)))
  print(("torch: %9.1f tokens/s (median step; best %.1f)  peak RSS %7.1f MB"):format(tonumber(ttok), tbest, tonumber(trss)))
  print(("ratio: speed %.2fx torch (best steps: %.2fx), memory %.2fx torch"):format(ctok / ttok, cbest / tbest, crss / trss))
  if args.baseline == "1" and row.r == 0 then
    local s_out = run(("CLRT_PROFILE=1 OMP_NUM_THREADS=%d %s %s/bench/train_step.lua worker=%s B=%d T=%d steps=%d threads=%d device=%s pack=0"):format(
      threads, sh_quote(bin), sh_quote(src), size, B, T, steps, threads, device))
    local stok = tonumber(s_out:match("clrt tokens_per_s=([%d.]+)"))
    local sbest = tonumber(s_out:match("best_tokens_per_s=([%d.]+)"))
    if stok then
      print(("sgemm: %9.1f tokens/s (median step; best %.1f): AVX-512 kernels %.2fx the sgemm path (best steps: %.2fx)")
        :format(stok, sbest, ctok / stok, cbest / sbest))
    end
  end
  if args.deterministic == "1" then
    local d_out = run(("CLRT_TRAIN_PACK_MAX_MB=1000000 CLRT_PROFILE=1 OMP_NUM_THREADS=%d %s %s/bench/train_step.lua worker=%s B=%d T=%d steps=%d threads=%d device=%s matmul=%s%s invariant=1"):format(
      threads, sh_quote(bin), sh_quote(src), size, B, T, steps, threads, device, mm, lora_args))
    local dtok = tonumber(d_out:match("clrt tokens_per_s=([%d.]+)"))
    local dbest = tonumber(d_out:match("best_tokens_per_s=([%d.]+)"))
    if dtok then
      print(("batch-invariant: %9.1f tokens/s (median step; best %.1f): %.2fx the default's step time (best steps: %.2fx)")
        :format(dtok, dbest, ctok / dtok, cbest / dbest))
    end
  end
  if device == "cpu" then
    local flops = tonumber(c_out:match("flops_per_step=([%d.e+-]+)"))
    local cg, tg = flops * ctok / (B * T) / 1e9, flops * ttok / (B * T) / 1e9
    print(("GFLOP/s: clrt %.1f (%.1f%% of the %.0f f32 FMA peak), torch %.1f (%.1f%%) (model FLOPs per step %.3g)"):format(cg,
      100 * cg / peak_gflops, peak_gflops, tg, 100 * tg / peak_gflops, flops))
    if mm == "bf16" and unit_peak > 0 then
      print(("share of the %s peak (%.0f GFLOP/s): clrt %.1f%%, torch %.1f%%"):format(unit, unit_peak, 100 * cg / unit_peak,
        100 * tg / unit_peak))
    end
  end
  if device == "cuda" then   -- the same FLOPs count for both sides
    local flops = tonumber(c_out:match("flops_per_step=([%d.e+-]+)"))
    local ctf, ttf = flops * ctok / (B * T) / 1e12, flops * ttok / (B * T) / 1e12
    local function mfu(tf) return peak > 0 and ("%.2f%%"):format(100 * tf / peak) or "n/a" end
    print(("TFLOP/s: clrt %.2f (MFU %s), torch %.2f (MFU %s); %.3g FLOPs/step"):format(ctf, mfu(ctf), ttf, mfu(ttf), flops))
  end
  for line in c_out:gmatch("[^\n]+") do
    if line:find("^clrt kernel") or line:find("^clrt arenas") then print("  " .. line:sub(6)) end
  end
end
 end
