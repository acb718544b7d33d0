-- bench/data_parallel.lua — data-parallel scaling on this machine (issue 21): SFT training
-- tokens/s with 1 and 2 ranks of 1 thread each over the same global batch, the scaling
-- efficiency (tokens/s at 2 ranks / (2 x tokens/s at 1)), and the gradient all-reduce's
-- share of a 2-rank step, at ~5M and ~50M parameters (bench/train_step.lua's shapes); then
-- the same for an RL step of the built-in world (collabllm_rl.lua, tiny settings: its
-- time_step_s at 1 and 2 ranks). Each configuration runs under mpirun in its own job;
-- timings are medians over the steps after a warm-up step.
--   clrt bench/data_parallel.lua [sizes=5M,50M] [B=8] [T=128] [steps=3] [rl_steps=3 (0: no RL)] [sharded=1]
-- Needs clrt built with MPI and mpirun on PATH. As root it sets OpenMPI's run-as-root
-- variables; --oversubscribe lets 2 ranks start on any core count.
local cjson = require("cjson")

local args = { sizes = "5M,50M", B = "8", T = "128", steps = "3", rl_steps = "3", sharded = "1" }
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^([%w_]+)=(.*)$")
  if k then args[k] = v end
end

local SIZES = dofile((debug.getinfo(1, "S").source:sub(2):match("^(.*)/") or ".") .. "/shapes.lua")

local now = require("clrt.log").now   -- the monotonic clock

local function median(list)
  local s = {}
  for i, v in ipairs(list) do s[i] = v end
  table.sort(s)
  return s[math.ceil(#s / 2)]
end

-- A worker rank: the global batch B x T split across the ranks, forward + backward of its
-- share, then the optimizer step as training takes it (clrt.train.update): with 2 ranks the
-- sharded step (reduce-scatter, AdamW over the rank's slice, all-gather; sharded=0: the
-- all-reduce and the whole AdamW step on every rank). Rank 0 prints one JSON line; reduce_s
-- is the time in collectives.
if args.worker then
  local dist = require("clrt.dist")
  clrt.set_num_threads(1)
  local cfg = SIZES[args.worker]
  local B, T, steps = tonumber(args.B), tonumber(args.T), tonumber(args.steps)
  local first, last = dist.share(B)
  local b = last - first + 1
  local m = clrt.model.new(cfg, { seed = 0 })
  local opt = clrt.optim.adamw(m, { lr = 1e-4, weight_decay = 0.1, grad_clip = 1.0 })
  local rows, lens = {}, {}
  local x = 12345
  for i = 1, B do
    local r = {}
    for t = 1, T do x = (x * 1103515245 + 12345) % 2147483648; r[t] = x % cfg.vocab_size end
    rows[i], lens[i] = r, T
  end
  local mine, mylens = {}, {}
  for i = first, last do mine[#mine + 1], mylens[#mylens + 1] = rows[i], lens[i] end
  local d = clrt.tensor.full({ b, T - 1 }, -1 / (B * (T - 1)))
  local sharded = args.sharded ~= "0"
  local t_step, t_reduce = {}, {}
  for s = 0, steps do
    dist.barrier()
    local t0 = now()
    m:logprobs(mine, { lengths = mylens, grad = true })
    m:backward(d)
    local t1 = now()
    local comm
    if sharded and opt:sharded() then
      opt:step_sharded({ lr = 1e-4 })
      comm = opt.comm_s
    else
      dist.all_reduce_grads(m)
      comm = now() - t1
      opt:step({ lr = 1e-4 })
    end
    m:zero_grad()
    dist.barrier()
    local t3 = now()
    if s > 0 then t_step[#t_step + 1], t_reduce[#t_reduce + 1] = t3 - t0, comm end
  end
  if dist.is_main() then
    print(cjson.encode({ params = m:num_params(), step_s = median(t_step), reduce_s = median(t_reduce),
      tokens_per_s = B * T / median(t_step) }))
  end
  return
end

local bin = arg[-1] or "clrt"
local here = arg[0]
local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local ENV = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 "
local function mpirun(n, rest)
  local p = io.popen(ENV .. "mpirun --oversubscribe -np " .. n .. " " .. q(bin) .. " " .. rest .. " 2>&1")
  local out = p:read("*a")
  p:close()
  return out
end
local function json_line(out)
  for line in out:gmatch("[^\n]+") do
    if line:sub(1, 1) == "{" then return cjson.decode(line) end
  end
  error("bench: a job printed no result:\n" .. out, 0)
end

if not require("clrt.dist").available() then
  print("bench/data_parallel: clrt was built without MPI (CLRT_MPI off)")
  return
end
print(("data-parallel SFT step: global batch %d x %d tokens, 1 thread per rank, median of %d steps")
  :format(tonumber(args.B), tonumber(args.T), tonumber(args.steps)))
print(("%-5s %10s %12s %12s %11s %14s"):format("size", "params", "tok/s 1 rank", "tok/s 2 ranks", "efficiency",
  args.sharded ~= "0" and "collectives %" or "all-reduce %"))
for size in args.sizes:gmatch("[^,]+") do
  local rest = ("%s worker=%s B=%s T=%s steps=%s sharded=%s"):format(q(here), size, args.B, args.T, args.steps, args.sharded)
  local one, two = json_line(mpirun(1, rest)), json_line(mpirun(2, rest))
  print(("%-5s %9.1fM %12.0f %12.0f %10.0f%% %13.1f%%"):format(size, one.params / 1e6, one.tokens_per_s,
    two.tokens_per_s, 100 * two.tokens_per_s / (2 * one.tokens_per_s), 100 * two.reduce_s / two.step_s))
end

if tonumber(args.rl_steps) == 0 then return end

-- An RL step of the built-in world: its warm start trained once (1 process), then the same
-- RL run at 1 and 2 ranks; time_step_s from metrics.jsonl (median after the first step).
local root = os.tmpname()
os.remove(root)
local sft_args = "train.steps=20 train.batch_size=8 world.conversations=200 arch.hidden_size=64 arch.intermediate_size=128 arch.num_hidden_layers=2"
local p = io.popen(("OMP_NUM_THREADS=1 %s recipes/collabllm_sft.lua run_dir=%s %s 2>&1"):format(q(bin), q(root .. "/sft"), sft_args))
p:read("*a")
p:close()
local function rl(n)
  local dir = root .. "/rl" .. n
  local out = mpirun(n, ("recipes/collabllm_rl.lua config=%s model=%s run_dir=%s steps=%s prompts_per_step=8 rollout.n=4 rollout.num_repeat_rollouts=2 rollout.max_new_tokens=24 eval.before=false eval.after=false save_every=0")
    :format(q(require("collab_world.world").config_path()), q(root .. "/sft/model"), q(dir), args.rl_steps))
  local rows = require("clrt.data").read_jsonl(dir .. "/metrics.jsonl")
  if #rows == 0 then error("bench: the RL run wrote no metrics:\n" .. out, 0) end
  local times = {}
  for i = 2, #rows do times[#times + 1] = rows[i].time_step_s end
  return median(#times > 0 and times or { rows[1].time_step_s }), rows
end
local t1 = rl(1)
local t2 = rl(2)
print(("RL step (built-in world, 8 prompts x 4 samples x 2 futures): %.3fs at 1 rank, %.3fs at 2 ranks: speed-up %.2fx, efficiency %.0f%%")
  :format(t1, t2, t1 / t2, 100 * t1 / (2 * t2)))
os.execute("rm -rf " .. q(root))
