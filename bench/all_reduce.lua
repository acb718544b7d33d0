-- bench/all_reduce.lua — the gradient all-reduce alone (issue 21): a sum over a host f32
-- buffer of mb megabytes (200 MB: a 50M-parameter model's gradients) between N ranks on this
-- machine, through the shared-memory path (runtime/net/dist_shm.c) and through
-- MPI_Allreduce (CLRT_DIST_SHM=0) in two jobs; median seconds and GB/s (buffer bytes over
-- time) of each after one warm-up, and the ratio.
--   clrt bench/all_reduce.lua [mb=200] [ranks=2] [reps=5] [chunk=<bytes a round>]
-- Needs clrt built with MPI and mpirun on PATH.
local args = { mb = "200", ranks = "2", reps = "5" }
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^([%w_]+)=(.*)$")
  if k then args[k] = v end
end

local now = require("clrt.log").now   -- the monotonic clock

local dist = require("clrt.dist")
if args.worker then
  local t = clrt.tensor.full({ math.floor(tonumber(args.mb) * 1e6 / 4) }, dist.rank() + 0.5)
  local times = {}
  for i = 0, tonumber(args.reps) do
    dist.barrier()
    local t0 = now()
    dist.all_reduce(t, "sum")
    if i > 0 then times[#times + 1] = now() - t0 end
  end
  table.sort(times)
  if dist.is_main() then print(("result %.6f"):format(times[math.ceil(#times / 2)])) end
  return
end

if not dist.available() then
  print("bench/all_reduce: clrt was built without MPI (CLRT_MPI off)")
  return
end
local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local function job(env)
  local cmd = ("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 %s%s mpirun --oversubscribe -np %s %s %s worker=1 mb=%s reps=%s 2>&1")
    :format(env, args.chunk and ("CLRT_DIST_SHM_CHUNK=" .. args.chunk .. " ") or "", args.ranks, q(arg[-1] or "clrt"), q(arg[0]), args.mb, args.reps)
  local p = io.popen(cmd)
  local out = p:read("*a")
  p:close()
  local s = tonumber(out:match("result ([%d.]+)"))
  if not s then error("bench: the job printed no result:\n" .. out, 0) end
  return s
end
local shm, mpi = job(""), job("CLRT_DIST_SHM=0 ")
local gb = tonumber(args.mb) / 1000
print(("all-reduce (sum) of %s MB over %s ranks, median of %s:"):format(args.mb, args.ranks, args.reps))
print(("  shared memory  %.3f s  %5.2f GB/s"):format(shm, gb / shm))
print(("  MPI_Allreduce  %.3f s  %5.2f GB/s"):format(mpi, gb / mpi))
print(("  speed-up %.1fx"):format(mpi / shm))
