-- bench/generate.lua — decode tokens/s of m:generate at batch 1 and 32 for a ~15M and a
-- ~110M parameter model (random weights, greedy, no early stop), next to a KV-cache decode
-- loop over the PyTorch reference model (float32, 2 threads) run in the same invocation.
-- device=cuda runs both on the GPU (the PyTorch peer too when it has CUDA) and adds the
-- decode's achieved TFLOP/s (2 FLOPs per parameter per token) and its MFU.
-- weights=bf16 adds rows where clrt decodes with bf16 weight copies (m:set_matmul("bf16"))
-- against the PyTorch model in bfloat16 (same bytes per weight on both sides). weights=int8
-- (or quant=int8) adds rows where clrt decodes from int8 weights (m:set_quant("int8"),
-- docs/quantization.md) against PyTorch's dynamic int8 linear layers (per-channel qint8
-- weights, activations quantized per call: the same scheme). Timings need a quiet machine.
-- deterministic=0,1 runs clrt both ways, without and with m:set_batch_invariant(true) (what RL
-- rollouts and `clrt serve --deterministic` run), and prints each mode's decode and prefill
-- rates and the deterministic one's cost against the other (docs/reproducibility.md).
--   clrt bench/generate.lua [sizes=15m,110m|0.5b] [batches=1,32] [new=64] [prompt=16] [device=cpu|cuda]
--                           [weights=f32|bf16|int8|f32,bf16,int8] [quant=int8] [deterministic=0|1|0,1] [reps=3]
-- Each figure is the median of reps timed runs (the peer's too). CLRT_PYTHON names the peer's
-- Python (default /usr/bin/python3, Debian's).
local cjson = require("cjson")
local now = require("clrt.log").now   -- monotonic seconds (the library's one clock)

local args = {}
for _, a in ipairs(arg) do
  local k, v = a:match("^([%w_]+)=(.*)$")
  if k then args[k] = v end
end
local device = args.device or "cpu"
local function list(s, d)
  local out = {}
  for x in (s or d):gmatch("[^,]+") do out[#out + 1] = x end
  return out
end
local sizes = list(args.sizes, "15m,110m")
local batches = list(args.batches, "1,32")
local new_tokens = tonumber(args.new or 64)
local prompt_len = tonumber(args.prompt or 16)
local weight_kinds = list(args.weights, "f32")
if args.quant == "int8" and not args.weights then weight_kinds = { "f32", "int8" } end
for _, wk in ipairs(weight_kinds) do
  if wk ~= "f32" and wk ~= "bf16" and wk ~= "int8" then error("weights=" .. wk .. ": f32, bf16 or int8") end
end
if device ~= "cpu" then
  for _, wk in ipairs(weight_kinds) do if wk == "int8" then error("weights=int8 runs on the cpu only") end end
end
local reps = tonumber(args.reps or 3)
local modes = list(args.deterministic, "0")

local models = {
  ["15m"] = { hidden_size = 384, intermediate_size = 1024, num_hidden_layers = 6, num_attention_heads = 6,
    num_key_value_heads = 6, vocab_size = 8192 },
  ["110m"] = { hidden_size = 768, intermediate_size = 2048, num_hidden_layers = 12, num_attention_heads = 12,
    num_key_value_heads = 12, vocab_size = 32000 },
  -- Qwen2.5-0.5B-Instruct's shape (QKV bias, GQA 14/2, 151,936 tokens): what RL sampling costs
  ["0.5b"] = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 896, intermediate_size = 4864,
    num_hidden_layers = 24, num_attention_heads = 14, num_key_value_heads = 2, vocab_size = 151936,
    rms_norm_eps = 1e-6, rope_theta = 1000000.0 },
}
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/") or "."
local peak = 0
if device == "cuda" then
  if not clrt.cuda_available() then
    print("decode benchmark, device=cuda: no GPU here (" .. clrt.cuda_status() .. "); nothing measured")
    os.exit(0)
  end
  peak = clrt.cuda_peak_tflops()
  print(("GPU: %s, dense bf16 peak %s TFLOP/s"):format(clrt.cuda_device_name(), peak > 0 and tostring(peak) or "unknown"))
end

print(("decode benchmark: %d new tokens after a %d-token prompt, greedy, %d threads"):format(new_tokens, prompt_len, clrt.num_threads()))
print(("%-6s %-7s %-5s %5s %12s %12s %12s %8s"):format("model", "weights", "det", "batch", "clrt tok/s",
  "prefill tok/s", "torch tok/s", "ratio"))
local plain = {}   -- (size, weights, batch) -> the non-deterministic decode and prefill rates
local gen = require("clrt.gen.engine")
local options = require("clrt.gen.options")

-- The median decode and prefill rates (tokens/s) of reps engine runs of B prompts.
local function time_clrt(m, cfg, B)
  local prompts = {}
  for b = 1, B do
    local p = {}
    for t = 1, prompt_len do p[t] = (b * 7919 + t * 104729) % cfg.vocab_size end
    prompts[b] = p
  end
  m:generate(prompts, { temperature = 0, max_new_tokens = 4 })   -- warm-up, sizes the cache
  local dec = m:decoder(B, prompt_len + new_tokens)
  local o = options.check({ temperature = 0, max_new_tokens = new_tokens }, cfg.vocab_size)
  -- Time the decode steps alone, as the peer does: prefill first, then new-1 steps; the
  -- median of reps runs on each side (a 110M batch-1 run is half a second, and a shared
  -- machine's hiccups move a single one by half).
  local secs, pre = {}, {}
  for r = 1, reps do
    local eng = gen.engine(dec)
    for _, p in ipairs(prompts) do eng:add(p, o) end
    local t0 = now()
    eng:step()   -- the first token comes from the prefill logits
    local t1 = now()
    while eng:busy() do eng:step() end
    secs[r], pre[r] = now() - t1, t1 - t0
  end
  table.sort(secs)
  table.sort(pre)
  local mid = math.floor(reps / 2) + 1
  return B * (new_tokens - 1) / secs[mid], B * prompt_len / pre[mid]
end

local function time_peer(cfg, B, wk)
  local py = io.popen(("OMP_NUM_THREADS=2 BENCH_REPS=%d %s %s/generate_ref.py %s %d %d %d %s %s"):format(
    reps, os.getenv("CLRT_PYTHON") or "/usr/bin/python3", here, require("clrt.util.shell").quote(cjson.encode(cfg)), B,
    prompt_len, new_tokens, device, wk))
  local line = py:read("*a")
  py:close()
  local ok, peer = pcall(cjson.decode, line)
  return ok and peer.tokens_per_s or 0 / 0
end

for _, size in ipairs(sizes) do
  local base = models[size] or error("unknown size " .. size)
  local cfg = {
    architectures = { "LlamaForCausalLM" }, rms_norm_eps = 1e-5, rope_theta = 10000.0,
    max_position_embeddings = 1024, tie_word_embeddings = true,
  }
  for k, v in pairs(base) do cfg[k] = v end
  local m = clrt.model.new(cfg, { seed = 0, device = device })
  for _, wk in ipairs(weight_kinds) do
    if wk == "int8" then
      m:set_matmul("f32"):set_quant("int8")
    else
      m:set_quant("none"):set_matmul(wk)
    end
    local peers = {}   -- batch -> the peer's rate, measured once for both modes
    for _, mode in ipairs(modes) do
      m:set_batch_invariant(mode == "1")
      local single
      for _, bs in ipairs(batches) do
        local B = tonumber(bs)
        local ours, prefill = time_clrt(m, cfg, B)
        peers[B] = peers[B] or time_peer(cfg, B, wk)
        local theirs, key = peers[B], size .. wk .. B
        if mode == "0" then plain[key] = { ours, prefill } end
        if B == 1 then single = ours end
        local cost = (mode == "1" and plain[key])
          and ("   (deterministic: decode %.2fx, prefill %.2fx the other's time)"):format(plain[key][1] / ours,
            plain[key][2] / prefill) or ""
        print(("%-6s %-7s %-5s %5d %12.1f %12.1f %12.1f %7.2fx%s%s"):format(size, wk, mode, B, ours, prefill, theirs,
          ours / theirs, (B > 1 and single) and ("   (batch %d / batch 1: %.1fx)"):format(B, ours / single) or "", cost))
        if device == "cuda" then
          local per_tok = 2 * m:num_params()
          local ctf, ttf = ours * per_tok / 1e12, theirs * per_tok / 1e12
          local function mfu(tf) return peak > 0 and ("%.3f%%"):format(100 * tf / peak) or "n/a" end
          print(("       TFLOP/s: clrt %.3f (MFU %s), torch %.3f (MFU %s)"):format(ctf, mfu(ctf), ttf, mfu(ttf)))
        end
      end
    end
  end
end
