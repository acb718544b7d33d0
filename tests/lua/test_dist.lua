-- Data-parallel SFT and RL over MPI (issue 21), on the built-in world at toy size: 2 ranks of
-- 1 thread against 1 process with the same global batch (SFT losses and final parameters
-- over 12 steps; RL rewards, stats and parameters over 2 steps); a parameter check that
-- catches ranks that drifted apart; an error raised on one rank and a rank killed with
-- SIGKILL each end the whole job, naming the rank, within a bound; Ctrl-C to mpirun stops
-- every rank, rank 0 saying how to continue, and the run resumes; a 2-rank RL run stopped and
-- resumed with 2 ranks logs what an uninterrupted one does. Skipped when clrt was built without MPI or mpirun is not installed.
--
-- Tolerances: every rank computes its share of the micro-batches, and the gradients are
-- summed across ranks instead of accumulated in one buffer, so sums run in another order:
-- losses and gradient norms agree to 1e-6 relative, parameters to 1e-5 absolute (SFT, lr
-- 1e-3). The RL comparison sets train.kl_coef=0: at step 1 the policy is the reference, so
-- the KL gradient is pure rounding noise, and Adam turns noise of any size into steps of
-- lr; with a different micro-batch size one process differs from itself the same way.
local T = require("clrt.test")
local ffi = require("ffi")
local data = require("clrt.data")
local dist = require("clrt.dist")
local files = require("clrt.files")

local bin = os.getenv("CLRT_BIN") or "clrt"
local root = T.tmpdir()
local BOUND = 30   -- seconds within which a failed rank must end the job

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"__rc=$?\"")
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("__rc=(%d+)%s*$"))
  return (out:gsub("__rc=%d+%s*$", "")), rc
end

-- ctest reports the file as skipped (77) with the reason
local have_mpirun = select(2, sh("command -v mpirun")) == 0
local why_not = not dist.available() and "clrt was built without MPI (CLRT_MPI off, or CMake found no MPI)"
  or not have_mpirun and "mpirun is not installed (Debian: openmpi-bin)" or nil
if why_not then
  io.write("skip  test_dist: ", why_not, "\n")
  os.exit(77)
end

-- Root may run OpenMPI only when it says so; 1 thread per rank; 2 ranks on any core count.
local ENV = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
-- a hang (ranks that part ways) fails the case instead of stopping the suite
local function mpirun(n, args) return ENV .. "timeout 300 mpirun --oversubscribe -np " .. n .. " " .. q(bin) .. " " .. args end
local function single(args) return "OMP_NUM_THREADS=1 " .. q(bin) .. " " .. args end
local function argv(list)
  local out = {}
  for i, a in ipairs(list) do out[i] = q(a) end
  return table.concat(out, " ")
end

local function metrics(dir) return data.read_jsonl(dir .. "/metrics.jsonl") end

local function close(a, b, rel, what)
  T.ok(type(a) == "number" and type(b) == "number", what .. ": both numbers")
  local d = math.abs(a - b)
  T.ok(d <= rel * math.max(math.abs(a), math.abs(b), 1e-12),
    ("%s: %.17g vs %.17g (relative tolerance %g)"):format(what, a, b, rel))
end

-- The largest absolute difference between two model folders' parameters.
local function max_param_diff(dir_a, dir_b)
  local a, b = clrt.model.load(dir_a), clrt.model.load(dir_b)
  local pb, worst = b:params(), 0
  for name, t in pairs(a:params()) do
    local u = pb[name]
    local x, y = ffi.cast("float *", t:contiguous():data_ptr()), ffi.cast("float *", u:contiguous():data_ptr())
    for i = 0, t:numel() - 1 do
      local d = math.abs(x[i] - y[i])
      if d > worst then worst = d end
    end
  end
  return worst
end

local SFT = { "train.steps=12", "train.batch_size=8", "train.micro_batch_size=2", "world.conversations=200",
  "arch.hidden_size=32", "arch.intermediate_size=64", "arch.num_hidden_layers=2", "train.val_every=4",
  "train.lr=1e-3", "dist.check_every=3", "seed=5" }
local start   -- the 1-process SFT model, RL's starting point

T.case("SFT: 2 ranks x 1 thread equal 1 process over 12 steps", function()
  local one, two = root .. "/sft1", root .. "/sft2"
  local out, rc = sh(single("recipes/collabllm_sft.lua run_dir=" .. q(one) .. " " .. argv(SFT)))
  T.eq(rc, 0, "1 process: " .. out)
  out, rc = sh(mpirun(2, "recipes/collabllm_sft.lua run_dir=" .. q(two) .. " " .. argv(SFT)))
  T.eq(rc, 0, "2 ranks: " .. out)
  start = one .. "/model"
  local a, b = metrics(one), metrics(two)
  T.eq(#a, 12)
  T.eq(#b, 12, "rank 0 alone writes the metrics, one row a step")
  for i = 1, 12 do
    close(a[i].loss, b[i].loss, 1e-6, "step " .. i .. " loss")
    close(a[i].grad_norm, b[i].grad_norm, 1e-6, "step " .. i .. " grad_norm")
    T.eq(a[i].tokens, b[i].tokens, "step " .. i .. " tokens of the global batch")
    if a[i].val_loss then close(a[i].val_loss, b[i].val_loss, 1e-6, "step " .. i .. " val_loss") end
  end
  T.ok(a[12].loss < a[1].loss, "the loss falls, so the steps do something")
  local d = max_param_diff(one .. "/model", two .. "/model")
  T.ok(d <= 1e-5, ("final parameters differ by %g (tolerance 1e-5)"):format(d))
end)

-- Each rank updates only its slice of the optimizer's moments; a checkpoint gathers them on
-- rank 0, so a 2-rank run stopped and resumed ends with the uninterrupted run's parameters.
T.case("SFT: 2 ranks stopped after step 6 and resumed end as the uninterrupted run", function()
  if not start then T.skip("needs the SFT case") end
  local dir = root .. "/sft2_resume"
  local out, rc = sh(mpirun(2, "recipes/collabllm_sft.lua run_dir=" .. q(dir) .. " stop_after=6 " .. argv(SFT)))
  T.eq(rc, 0, out)
  out, rc = sh(mpirun(2, "recipes/collabllm_sft.lua resume=" .. q(dir)))
  T.eq(rc, 0, out)
  local a, b = metrics(root .. "/sft2"), metrics(dir)
  T.eq(#b, 12)
  for i = 1, 12 do T.eq(b[i].loss, a[i].loss, "step " .. i .. " loss equals the uninterrupted run's") end
  T.eq(max_param_diff(root .. "/sft2/model", dir .. "/model"), 0, "final parameters equal the uninterrupted run's")
end)

T.case("a parameter check names the step where ranks drifted apart", function()
  local script = root .. "/drift.lua"
  local f = assert(io.open(script, "w"))
  f:write([[
local dist = require("clrt.dist")
local m = clrt.model.new({ vocab_size = 16, hidden_size = 8, intermediate_size = 16, num_hidden_layers = 1,
  num_attention_heads = 2, num_key_value_heads = 2, max_position_embeddings = 8, rms_norm_eps = 1e-6,
  rope_theta = 10000.0, tie_word_embeddings = true, architectures = { "Qwen2ForCausalLM" } }, { seed = 1 })
dist.check_params(m, 6)
if dist.rank() == 1 then
  local p = m:params()["model.norm.weight"]
  require("ffi").cast("float *", p:data_ptr())[0] = 1.5
end
dist.check_params(m, 7)
]])
  f:close()
  local out, rc = sh(mpirun(2, q(script)))
  T.ok(rc ~= 0, "the job fails")
  T.ok(out:find("parameters differ across ranks after step 7", 1, true), out)
  T.ok(not out:find("after step 6", 1, true), "equal parameters pass: " .. out)
end)

-- The all-reduce checks itself against the reference on every rank: a sum of 2 ranks is
-- exactly f32(a + b); with 4 ranks as 2 machines of 2 (CLRT_DIST_RANKS_PER_NODE) each machine
-- sums its ranks in order and the machines then add their sums. Sizes straddle the slices
-- and the rounds (CLRT_DIST_SHM_CHUNK bytes a round); max, min, and f64 through
-- all_reduce_numbers; a rank's threads share the work. Every rank matching the reference means every rank holds the same bits.
local function all_reduce_job()
  local script = root .. "/all_reduce_check.lua"
  local f = assert(io.open(script, "w"))
  f:write([[
local dist = require("clrt.dist")
local ffi = require("ffi")
clrt.set_num_threads(tonumber(os.getenv("CHECK_THREADS")) or 1)
local size, me = dist.world_size(), dist.rank()
local per_node = tonumber(os.getenv("CLRT_DIST_RANKS_PER_NODE")) or size
local E = math.floor((tonumber(os.getenv("CLRT_DIST_SHM_CHUNK")) or 8 * 1024 * 1024) / 4)
local f32 = ffi.new("float[1]")
local function round(x) f32[0] = x; return f32[0] end
local function val(i, r) return round(math.sin(i * 0.731 + r * 1.917) * (1 + (i % 13))) end
local function ref(i, op, rnd)
  if op == "max" or op == "min" then
    local v = val(i, 0)
    for r = 1, size - 1 do v = math[op](v, val(i, r)) end
    return v
  end
  local total
  for first = 0, size - 1, per_node do
    local s = val(i, first)
    for r = first + 1, first + per_node - 1 do s = rnd(s + val(i, r)) end
    total = total and rnd(total + s) or s
  end
  return total
end
local checks = 0
for _, n in ipairs({ 1, 7, 15, 16, 17, 33, E - 1, E, E + 3, 2 * E + 17 }) do
  for _, op in ipairs({ "sum", "max", "min" }) do
    local t = clrt.tensor.zeros({ n })
    local p = ffi.cast("float *", t:data_ptr())
    for i = 0, n - 1 do p[i] = val(i, me) end
    dist.all_reduce(t, op)
    for i = 0, n - 1 do
      local want = ref(i, op, round)
      if p[i] ~= want then
        error(("f32 %s of %d: element %d is %.9g, not %.9g"):format(op, n, i, p[i], want), 0)
      end
    end
    checks = checks + 1
  end
end
for _, n in ipairs({ 1, 7, 33, 1000 }) do
  local list = {}
  for i = 1, n do list[i] = math.sin(i * 0.731 + me * 1.917) * 1e3 / 7 end
  dist.all_reduce_numbers(list, "sum")
  local saved = val
  val = function(i, r) return math.sin(i * 0.731 + r * 1.917) * 1e3 / 7 end
  for i = 1, n do
    local want = ref(i, "sum", function(x) return x end)
    if list[i] ~= want then error(("f64 sum of %d: element %d is %.17g, not %.17g"):format(n, i, list[i], want), 0) end
  end
  val = saved
  checks = checks + 1
end
print(("rank %d: %d all-reduces equal the reference"):format(me, checks))
]])
  f:close()
  return script
end

T.case("the all-reduce equals the reference sum, max and min on every rank", function()
  local script = all_reduce_job()
  local runs = {
    { 2, "CLRT_DIST_SHM_CHUNK=256 ", "2 ranks, 64 floats a round" },
    { 2, "CHECK_THREADS=2 ", "2 ranks of 2 threads, the default round" },
    { 4, "CLRT_DIST_SHM_CHUNK=320 CLRT_DIST_RANKS_PER_NODE=2 ", "2 machines of 2 ranks" },
    { 2, "CLRT_DIST_SHM=0 ", "MPI_Allreduce" },
  }
  for _, r in ipairs(runs) do
    local out, rc = sh(r[2] .. mpirun(r[1], q(script)))
    T.eq(rc, 0, r[3] .. ": " .. out)
    T.eq(select(2, out:gsub("all%-reduces equal the reference", "")), r[1], r[3] .. ": every rank checked: " .. out)
  end
end)

-- The sharded optimizer's collectives: after reduce_scatter each rank's slice (dist.slice)
-- holds the sum over ranks and the rest of its buffer is untouched, the returned sum of
-- squares is its slice's; after all_gather every element holds its owner's value. Values are
-- small integers, so every sum is exact in any order (the MPI path's MPI_Reduce picks its own).
-- Both ways on one machine: reading the other ranks' buffers directly (process_vm_readv) and,
-- with CLRT_DIST_CMA=0, staging through the shared window.
local function sharded_job()
  local script = root .. "/sharded_check.lua"
  local f = assert(io.open(script, "w"))
  f:write([[
local dist = require("clrt.dist")
local ffi = require("ffi")
clrt.set_num_threads(tonumber(os.getenv("CHECK_THREADS")) or 1)
local size, me = dist.world_size(), dist.rank()
local function val(i, r) return (i * 7 + r * 13) % 29 - 14 end
local checks = 0
for _, n in ipairs({ 1, 5, 16, 17, 33, 100, 1000, 4099, 70001 }) do
  local t = clrt.tensor.zeros({ n })
  local p = ffi.cast("float *", t:data_ptr())
  for i = 0, n - 1 do p[i] = val(i, me) end
  local ss = dist.reduce_scatter(t)
  local lo, hi = dist.slice(n)
  local want_ss = 0
  for i = 0, n - 1 do
    local want = val(i, me)
    if i >= lo and i < hi then
      want = 0
      for r = 0, size - 1 do want = want + val(i, r) end
      want_ss = want_ss + want * want
    end
    if p[i] ~= want then
      error(("reduce_scatter of %d (slice [%d, %d)): element %d is %g, not %g"):format(n, lo, hi, i, p[i], want), 0)
    end
  end
  if ss ~= want_ss then error(("reduce_scatter of %d: sum of squares %g, not %g"):format(n, ss, want_ss), 0) end
  -- every rank's own slice set to its owner's marks, the rest to garbage, then gathered
  local owner = {}
  for r = 0, size - 1 do
    local a, b = dist.slice(n, r)
    for i = a, b - 1 do owner[i] = r end
  end
  for i = 0, n - 1 do p[i] = owner[i] == me and (i % 1000 + 1000 * me) or -1 end
  dist.all_gather(t)
  for i = 0, n - 1 do
    if owner[i] == nil then error(("slices of %d leave element %d to no rank"):format(n, i), 0) end
    local want = i % 1000 + 1000 * owner[i]
    if p[i] ~= want then error(("all_gather of %d: element %d is %g, not rank %d's %g"):format(n, i, p[i], owner[i], want), 0) end
  end
  checks = checks + 1
end
print(("rank %d: %d reduce-scatters and all-gathers equal the reference"):format(me, checks))
]])
  f:close()
  return script
end

T.case("the sharded step's reduce-scatter and all-gather put every slice where it belongs", function()
  local script = sharded_job()
  local runs = {
    { 2, "", "2 ranks reading each other's buffers" },
    { 3, "CHECK_THREADS=2 ", "3 ranks of 2 threads reading each other's buffers" },
    { 2, "CLRT_DIST_CMA=0 CLRT_DIST_SHM_CHUNK=256 ", "2 ranks through the window, 64 floats a round" },
    { 3, "CLRT_DIST_CMA=0 CLRT_DIST_SHM_CHUNK=320 ", "3 ranks through the window, 80 floats a round" },
    { 2, "CLRT_DIST_CMA=0 CHECK_THREADS=2 ", "2 ranks of 2 threads through the window, the default round" },
    { 4, "CLRT_DIST_RANKS_PER_NODE=2 ", "2 machines of 2 ranks (MPI's path)" },
    { 2, "CLRT_DIST_SHM=0 ", "MPI's path on one machine" },
  }
  for _, r in ipairs(runs) do
    local out, rc = sh(r[2] .. mpirun(r[1], q(script)))
    T.eq(rc, 0, r[3] .. ": " .. out)
    T.eq(select(2, out:gsub("all%-gathers equal the reference", "")), r[1], r[3] .. ": every rank checked: " .. out)
  end
end)

-- Between gathers a rank of the sharded step reads only its slice of the AdamW moments, so
-- after a checkpoint's save (which gathers them) and after a load every rank gives the rest
-- back: outside its slice every value in a whole 2 MiB page reads zero again.
-- The next save's gather must restore every moment bit for bit: the same two steps with only
-- gather_state (nothing given back) are the reference. Tied 3.4M-parameter model: every
-- moment is non-zero after a step, 13 MB per moment (several 2 MiB pages per slice).
local function release_job()
  local script = root .. "/release_check.lua"
  local f = assert(io.open(script, "w"))
  f:write([[
local dist = require("clrt.dist")
local ckpt = require("clrt.train.checkpoint")
local C = require("clrt.core.ffi").C
local ffi = require("ffi")
local dir = arg[1]
local me = dist.rank()
local cfg = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 4096, hidden_size = 256, intermediate_size = 512,
  num_hidden_layers = 4, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 64,
  rms_norm_eps = 1e-6, rope_theta = 10000.0, tie_word_embeddings = true }
local function rss_mb()
  local s = assert(io.open("/proc/self/status")):read("*a")
  return tonumber(s:match("VmRSS:%s+(%d+)")) / 1024
end
local function moments(opt)   -- both moments' arenas as float pointers, and their length
  local out = {}
  for w = 0, 1 do
    local t = C.clrt_adamw_moment(opt.ptr, w, 0)
    out[w + 1] = ffi.cast("float *", t.storage.data)
    C.clrt_tensor_free(t)
  end
  return out, tonumber(C.clrt_adamw_numel(opt.ptr))
end
-- Outside this rank's slice: how many values lie in whole 2 MiB pages (those can be given
-- back), how many of those are non-zero, and how many values are non-zero at all.
local PAGE = 2 ^ 21
local function outside(opt)
  local ms, n = moments(opt)
  local lo, hi = dist.slice(n)
  local in_pages, nonzero_in_pages, nonzero = 0, 0, 0
  for _, p in ipairs(ms) do
    local base = tonumber(ffi.cast("uintptr_t", p))
    for _, r in ipairs({ { 0, lo }, { hi, n } }) do
      local a, b = base + 4 * r[1], base + 4 * r[2]
      local pa, pb = math.ceil(a / PAGE) * PAGE, math.floor(b / PAGE) * PAGE   -- whole pages [pa, pb)
      for i = r[1], r[2] - 1 do
        local at = base + 4 * i
        local whole = at >= pa and at < pb
        if whole then in_pages = in_pages + 1 end
        if p[i] ~= 0 then
          nonzero = nonzero + 1
          if whole then nonzero_in_pages = nonzero_in_pages + 1 end
        end
      end
    end
  end
  return { in_pages = in_pages, nonzero_in_pages = nonzero_in_pages, nonzero = nonzero }
end
local toks = clrt.tensor.zeros({ 2, 16 }, { dtype = "i32" })
for b = 1, 2 do for t = 1, 16 do toks:set(b, t, (b * 131 + t * 17 + me * 29) % cfg.vocab_size) end end
local d = clrt.tensor.full({ 2, 15 }, -1 / 30)
local function model()
  local m = clrt.model.new(cfg, { seed = 1, max_batch = 2, max_seq = 16 })
  return m, clrt.optim.adamw(m, { lr = 1e-3, weight_decay = 0.1 })
end
local function step(m, opt)
  m:zero_grad(); m:logprobs(toks); m:backward(d); opt:step_sharded({})
end
-- the reference: two steps, moments gathered after each, nothing given back
local mr, optr = model()
step(mr, optr); optr:gather_state()
local gathered = outside(optr)
step(mr, optr); optr:gather_state()
-- the same two steps with a checkpoint after each
local m, opt = model()
step(m, opt)
ckpt.save(dir, { step = 1, model = m, optimizer = opt })
local kept = outside(opt)
-- not blind: after a gather nearly every value is non-zero, most of them in whole pages
if not (gathered.nonzero_in_pages > 0.95 * gathered.in_pages and gathered.in_pages > 0.6 * gathered.nonzero) then
  error(("rank %d: the check is blind (%d of %d values in whole pages non-zero after a gather)"):format(me, gathered.nonzero_in_pages, gathered.in_pages), 0)
end
if kept.nonzero_in_pages > 0 then
  error(("rank %d: %d of the %d moments in whole pages outside the slice are non-zero after the save"):format(me, kept.nonzero_in_pages, kept.in_pages), 0)
end
step(m, opt)
opt:gather_state()   -- every moment back, as a save's gather brings them
local a, n = moments(opt)
local r = moments(optr)
for w = 1, 2 do
  for i = 0, n - 1 do
    if a[w][i] ~= r[w][i] then error(("rank %d: moment %d element %d is %.9g after the gather, not %.9g"):format(me, w, i, a[w][i], r[w][i]), 0) end
  end
end
-- a resume loads the whole state and keeps its slice (the ranks check their slices of one file)
ckpt.save(dir, { step = 2, model = m, optimizer = opt })
dist.barrier()   -- rank 0 writes the file; the other ranks return from save before it is there
local m3, opt3 = model()
opt3:load(dir .. "/checkpoint-2/optimizer.safetensors")
local kept3 = outside(opt3)
if kept3.nonzero_in_pages > 0 then
  error(("rank %d: %d of the %d moments in whole pages outside the slice are non-zero after a load"):format(me, kept3.nonzero_in_pages, kept3.in_pages), 0)
end
local c, _ = moments(opt3)
local lo, hi = dist.slice(n)
for w = 1, 2 do
  for i = lo, hi - 1 do
    if c[w][i] ~= r[w][i] then error(("rank %d: loaded moment %d element %d is %.9g, not %.9g"):format(me, w, i, c[w][i], r[w][i]), 0) end
  end
end
local before = rss_mb()   -- the reference still holds every moment
optr:release_gathered()
print(("rank %d: slice kept after save and load (outside it %d of %d values non-zero, %d in whole pages; RSS %.0f -> %.0f MB given the reference's back), gathered bit for bit"):format(
  me, kept.nonzero, gathered.nonzero, gathered.in_pages, before, rss_mb()))
]])
  f:close()
  return script
end

T.case("after a checkpoint's save and load each rank keeps only its slice of the moments; the next gather restores them bit for bit", function()
  local script = release_job()
  local out, rc = sh(mpirun(2, q(script) .. " " .. q(root .. "/release_run")))
  T.eq(rc, 0, out)
  T.eq(select(2, out:gsub("gathered bit for bit", "")), 2, "both ranks checked: " .. out)
  io.write(out)
end)

local RL = { "steps=2", "prompts_per_step=4", "rollout.n=4", "rollout.num_repeat_rollouts=2",
  "rollout.max_new_tokens=24", "seed=3", "eval.before=false", "eval.after=false", "save_every=1",
  "sample_every=1", "train.kl_coef=0", "train.lr=1e-3", "dist.check_every=1" }

local function rl_args(dir, extra)
  local a = { "config=" .. require("collab_world.world").config_path(), "model=" .. start, "run_dir=" .. dir }
  for _, x in ipairs(RL) do a[#a + 1] = x end
  for _, x in ipairs(extra or {}) do a[#a + 1] = x end
  return argv(a)
end

T.case("RL: 2 ranks equal 1 process over 2 steps", function()
  if not start then T.skip("needs the SFT case") end
  local one, two = root .. "/rl1", root .. "/rl2"
  local out, rc = sh(single("recipes/collabllm_rl.lua " .. rl_args(one)))
  T.eq(rc, 0, "1 process: " .. out)
  out, rc = sh(mpirun(2, "recipes/collabllm_rl.lua " .. rl_args(two)))
  T.eq(rc, 0, "2 ranks: " .. out)
  local a, b = metrics(one), metrics(two)
  T.eq(#b, 2)
  for i = 1, 2 do
    -- the samples do not depend on the ranks: the same conversations, so the same rewards
    for _, k in ipairs({ "reward", "advantage_std", "first_reply_ask_rate", "trained_tokens", "dropped", "truncated" }) do
      T.eq(b[i][k], a[i][k], "step " .. i .. " " .. k)
    end
    for _, k in ipairs({ "loss", "pg_loss", "grad_norm", "clipfrac" }) do close(a[i][k], b[i][k], 1e-5, "step " .. i .. " " .. k) end
  end
  T.ok(a[2].grad_norm > 0, "step 2 trains")
  T.eq(#data.read_jsonl(two .. "/samples.jsonl") > 0, true, "rank 0 logs the samples")
  local d = max_param_diff(one .. "/checkpoint-2", two .. "/checkpoint-2")
  T.ok(d <= 1e-5, ("parameters after step 2 differ by %g (tolerance 1e-5)"):format(d))
end)

-- train.async.max_off_policy_steps=1 under 2 ranks: each rank's worker rolls out its share
-- from the version the schedule names, the ranks exchange the entries, and the run is the
-- 1-process asynchronous run's (its samples the same conversations, its losses within the
-- all-reduce's rounding).
T.case("RL with train.async.max_off_policy_steps=1: 2 ranks equal 1 process over 3 steps", function()
  if not start then T.skip("needs the SFT case") end
  local one, two = root .. "/rl_async1", root .. "/rl_async2"
  local extra = { "steps=3", "train.async.max_off_policy_steps=1" }
  local out, rc = sh(single("recipes/collabllm_rl.lua " .. rl_args(one, extra)))
  T.eq(rc, 0, "1 process: " .. out)
  out, rc = sh(mpirun(2, "recipes/collabllm_rl.lua " .. rl_args(two, extra)))
  T.eq(rc, 0, "2 ranks: " .. out)
  local a, b = metrics(one), metrics(two)
  T.eq(#b, 3)
  for i = 1, 3 do
    T.eq(b[i]["async/policy_version"], math.max(0, i - 2), "step " .. i .. "'s policy version")
    for _, k in ipairs({ "reward", "advantage_std", "first_reply_ask_rate", "trained_tokens", "dropped", "truncated",
        "async/policy_version", "async/age_max" }) do
      T.eq(b[i][k], a[i][k], "step " .. i .. " " .. k)
    end
    for _, k in ipairs({ "loss", "pg_loss", "grad_norm" }) do close(a[i][k], b[i][k], 1e-5, "step " .. i .. " " .. k) end
    -- the mismatch is a mean of log-probability differences near 0: absolute rounding
    local ka, kb = a[i]["tis/mismatch_kl"], b[i]["tis/mismatch_kl"]
    T.ok(type(ka) == "number" and type(kb) == "number" and math.abs(ka - kb) <= 1e-7,
      ("step %d tis/mismatch_kl: %s vs %s (absolute tolerance 1e-7)"):format(i, tostring(ka), tostring(kb)))
  end
  T.ok(math.abs(b[3]["tis/logp_mismatch"]) > 0, "step 3 trains weights one update past its rollouts'")
  T.ok(not files.exists(two .. "/async"), "a finished 2-rank run leaves no async/ folder")
  local d = max_param_diff(one .. "/checkpoint-3", two .. "/checkpoint-3")
  T.ok(d <= 1e-5, ("parameters after step 3 differ by %g (tolerance 1e-5)"):format(d))
  -- a resume under another rank count is one line
  local dir = root .. "/rl_async_stop"
  out, rc = sh(mpirun(2, "recipes/collabllm_rl.lua " .. rl_args(dir, { "steps=3", "stop_after=1", "train.async.max_off_policy_steps=1" })))
  T.eq(rc, 0, out)
  T.ok(files.exists(dir .. "/async/rank-1-of-2"), "each rank's folder is kept for the resume")
  out, rc = sh(single("recipes/collabllm_rl.lua resume=" .. q(dir)))
  T.ok(rc ~= 0 and out:find("holds the rollouts made ahead for 2 ranks; resume with as many ranks (mpirun -np 2)", 1, true), out)
  out, rc = sh(mpirun(2, "recipes/collabllm_rl.lua resume=" .. q(dir)))
  T.eq(rc, 0, out)
  local c = metrics(dir)
  T.eq(#c, 3, "the resumed run adds steps 2 and 3")
  for i = 1, 3 do T.eq(c[i].reward, b[i].reward, "step " .. i .. "'s reward equals the uninterrupted 2-rank run's") end
end)

-- rollout.quant=int8: every rank's entries carry their rollout log-probabilities through the
-- exchange, so each rank's share of the update applies TIS (a row without them is an error).
T.case("RL with rollout.quant=int8 over 2 ranks logs the TIS figures", function()
  if not start then T.skip("needs the SFT case") end
  local dir = root .. "/rl_int8"
  local out, rc = sh(mpirun(2, "recipes/collabllm_rl.lua " .. rl_args(dir, { "steps=1", "rollout.quant=int8", "save_every=0" })))
  T.eq(rc, 0, "2 ranks: " .. out)
  local row = metrics(dir)[1]
  T.ok(type(row["tis/logp_mismatch"]) == "number" and row["tis/logp_mismatch"] > 0, "mismatch " .. tostring(row["tis/logp_mismatch"]))
  T.ok(type(row["tis/weight_mean"]) == "number", "TIS weight")
end)

T.case("a 2-rank RL run stopped and resumed with 2 ranks continues its metrics", function()
  if not start then T.skip("needs the SFT case") end
  local dir = root .. "/rl_resume"
  local out, rc = sh(mpirun(2, "recipes/collabllm_rl.lua " .. rl_args(dir, { "stop_after=1" })))
  T.eq(rc, 0, out)
  T.eq(#metrics(dir), 1)
  out, rc = sh(mpirun(2, "recipes/collabllm_rl.lua resume=" .. q(dir)))
  T.eq(rc, 0, out)
  local a, b = metrics(root .. "/rl2"), metrics(dir)
  T.eq(#b, 2, "the resumed run adds step 2")
  for i = 1, 2 do
    for _, k in ipairs({ "reward", "trained_tokens", "loss", "grad_norm", "step" }) do
      T.eq(b[i][k], a[i][k], "step " .. i .. " " .. k .. " equals the uninterrupted 2-rank run")
    end
  end
  T.eq(T.read(dir .. "/latest"), "checkpoint-2\n")
  -- step 2's metrics come before its update; its parameters show that the optimizer state
  -- came back whole (each rank updates its slice of the moments, so rank 0 gathers them to save)
  local d = max_param_diff(root .. "/rl2/checkpoint-2", dir .. "/checkpoint-2")
  T.eq(d, 0, "parameters after step 2 equal the uninterrupted run's")
end)

-- A job script whose ranks meet in an all-reduce again and again; the rank given in the
-- environment misbehaves once rank 0 has seen it join.
local function looping_job(action)
  local script = root .. "/loop_" .. action .. ".lua"
  local f = assert(io.open(script, "w"))
  f:write(([[
local dist = require("clrt.dist")
local t = clrt.tensor.zeros({ 1000 })
local pidfile = %q
for i = 1, 1e9 do
  dist.all_reduce(t, "sum")
  if i == 50 and dist.rank() == 1 then
    if %q == "raise" then error("rank 1 broke on purpose", 0) end
    os.execute("echo $PPID > " .. pidfile)
  end
end
]]):format(root .. "/rank1." .. action, action))
  f:close()
  return script
end

T.case("an error raised on one rank ends the job, naming the rank and the error", function()
  local t0 = os.time()
  local out, rc = sh(ENV .. "timeout " .. (BOUND * 2) .. " mpirun --oversubscribe -np 2 " .. q(bin) .. " " .. q(looping_job("raise")))
  local took = os.time() - t0
  T.ok(rc ~= 0 and rc ~= 124, "the job fails by itself (rc " .. tostring(rc) .. "): " .. out)
  T.ok(took <= BOUND, ("ended in %ds (bound %ds)"):format(took, BOUND))
  T.ok(out:find("clrt: rank 1 of 2: rank 1 broke on purpose", 1, true), out)
end)

-- Both ranks fail at once: each calls MPI_Abort, and the launcher's SIGTERM reaches a rank
-- while it is no longer running Lua. That signal once went to the REPL's readline handler
-- (never set up in a script) and crashed the rank (3 of 5 jobs printed a segmentation fault).
T.case("an error raised on every rank at once ends the job without a crash", function()
  local script = root .. "/both_fail.lua"
  local f = assert(io.open(script, "w"))
  f:write('require("clrt.dist").barrier()\nerror("every rank broke on purpose", 0)\n')
  f:close()
  for attempt = 1, 4 do
    local out, rc = sh(ENV .. "timeout " .. (BOUND * 2) .. " mpirun --oversubscribe -np 2 " .. q(bin) .. " " .. q(script))
    T.ok(rc ~= 0 and rc ~= 124, "attempt " .. attempt .. ": the job fails by itself (rc " .. tostring(rc) .. "): " .. out)
    T.ok(out:find("every rank broke on purpose", 1, true), out)
    T.ok(not out:find("Segmentation fault", 1, true) and not out:find("signal 11", 1, true),
      "attempt " .. attempt .. ": no rank crashed: " .. out)
  end
end)

T.case("a rank killed with SIGKILL ends the job, naming the rank", function()
  local pidfile = root .. "/rank1.kill"
  local log = root .. "/kill.log"
  os.execute(("(%stimeout %d mpirun --oversubscribe -np 2 %s %s > %s 2>&1; echo \"rc=$?\" >> %s) &")
    :format(ENV, BOUND * 3, q(bin), q(looping_job("kill")), q(log), q(log)))
  local pid
  for _ = 1, 300 do
    pid = T.read(pidfile)
    if pid and pid:match("%d") then break end
    os.execute("sleep 0.1")
  end
  T.ok(pid and pid:match("%d"), "rank 1 wrote its pid")
  local t0 = os.time()
  os.execute("kill -9 " .. pid:match("%d+"))
  local text
  repeat
    os.execute("sleep 0.2")
    text = T.read(log) or ""
  until text:find("rc=%d") or os.time() - t0 > BOUND * 3
  local took = os.time() - t0
  T.ok(text:find("rc=%d"), "the job ended: " .. text)
  T.ok(not text:find("rc=0\n", 1, true) and not text:find("rc=124", 1, true), "with a failure, by itself: " .. text)
  T.ok(took <= BOUND, ("ended %ds after the kill (bound %ds)"):format(took, BOUND))
  T.ok(text:find("rank 1", 1, true), "the message names rank 1: " .. text)
end)

T.case("Ctrl-C to mpirun stops every rank; the run folder resumes", function()
  local dir, log, pidfile = root .. "/sft_int", root .. "/int.log", root .. "/mpirun.pid"
  local args = { "train.steps=100000", "train.batch_size=8", "train.micro_batch_size=2", "world.conversations=200",
    "arch.hidden_size=32", "arch.intermediate_size=64", "arch.num_hidden_layers=2", "train.val_every=0",
    "save_every=5", "seed=5", "run_dir=" .. dir }
  os.execute(("(%smpirun --oversubscribe -np 2 %s recipes/collabllm_sft.lua %s > %s 2>&1 & echo $! > %s; wait $!; echo \"rc=$?\" >> %s) &")
    :format(ENV, q(bin), argv(args), q(log), q(pidfile), q(log)))
  for _ = 1, 600 do
    if T.read(dir .. "/latest") then break end
    os.execute("sleep 0.1")
  end
  T.ok(T.read(dir .. "/latest"), "a checkpoint is written: " .. tostring(T.read(log)))
  local mpid = T.read(pidfile):match("%d+")
  local ranks = sh("pgrep -P " .. mpid)
  T.eq(select(2, ranks:gsub("%d+", "")), 2, "two ranks run: " .. ranks)
  local t0 = os.time()
  os.execute("kill -INT " .. mpid)
  local text
  repeat
    os.execute("sleep 0.2")
    text = T.read(log) or ""
  until text:find("rc=%d") or os.time() - t0 > BOUND
  T.ok(text:find("rc=%d"), "mpirun ended within " .. BOUND .. "s")
  -- mpirun passes Ctrl-C on as SIGTERM, which clrt's ranks treat as Ctrl-C
  T.ok(text:find("interrupted; continue this run with:", 1, true), "rank 0 says how to continue: " .. text)
  -- mpirun may return before the ranks it signalled are gone
  local alive
  repeat
    alive = {}
    for pid in ranks:gmatch("%d+") do
      if select(2, sh("kill -0 " .. pid)) == 0 then alive[#alive + 1] = pid end
    end
    if #alive > 0 then os.execute("sleep 0.2") end
  until #alive == 0 or os.time() - t0 > BOUND
  T.eq(#alive, 0, ("every rank stopped within %ds of Ctrl-C (still running: %s)"):format(BOUND, table.concat(alive, " ")))
  -- checkpoints are written whole or not at all, so the run continues from its latest
  local step = tonumber(T.read(dir .. "/latest"):match("%d+"))
  local out, rc = sh(mpirun(2, "recipes/collabllm_sft.lua resume=" .. q(dir) .. " stop_after=" .. (step + 2)))
  T.eq(rc, 0, out)
  local rows = metrics(dir)
  T.eq(rows[#rows].step, step + 2, "the resumed run logs the next steps")
end)

T.run()
