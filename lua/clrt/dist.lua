-- clrt.dist — data-parallel ranks (MPI; NCCL for device buffers on CUDA builds). A process
-- started without a launcher is rank 0 of 1 and every call below returns at once, so the
-- same script runs alone and under `mpirun -np N` / `srun`.
--   dist.rank(), dist.world_size(), dist.local_rank(), dist.is_main(), dist.available()
--   dist.all_reduce(t, "sum" | "max" | "min")   -- f32 tensor (host or device), in place
--   dist.all_reduce_numbers({...}, op)          -- a list of Lua numbers (f64), returns it
--   dist.broadcast(t, root), dist.broadcast_string(s, root) -> s, dist.barrier()
--   dist.all_reduce_grads(m)                    -- the sum of a model's gradients, in place
--   dist.reduce_scatter(t) -> sum_sq, dist.all_gather(t), dist.slice(n) -> lo, hi  -- ZeRO-1's halves
--   dist.check_params(m, step)                  -- error naming the step when ranks differ
--   dist.agree(number, what)                    -- error naming `what` when ranks differ
--   dist.share(n, rank, size) -> first, last    -- this rank's contiguous part of 1..n
local ffi = require("ffi")
local core = require("clrt.core.ffi")
local C = core.C

local M = {}

local OPS = { sum = C.CLRT_DIST_SUM, max = C.CLRT_DIST_MAX, min = C.CLRT_DIST_MIN }

function M.available() return C.clrt_dist_available() == 1 end
function M.rank() return C.clrt_dist_rank() end
function M.world_size() return C.clrt_dist_size() end
function M.local_rank() return C.clrt_dist_local_rank() end
function M.is_main() return C.clrt_dist_rank() == 0 end

local function op_id(op, level)
  local id = OPS[op or "sum"]
  if not id then error(("dist: unknown reduction '%s' (sum, max or min)"):format(tostring(op)), level + 1) end
  return id
end

local function check(rc, level)
  if rc ~= 0 then error(ffi.string(C.clrt_last_error()), level + 1) end
end

function M.all_reduce(t, op)
  if type(t) ~= "cdata" or t:dtype() ~= "f32" or not t:is_contiguous() then
    error("dist.all_reduce: expected a contiguous f32 tensor", 2)
  end
  check(C.clrt_dist_all_reduce(t:data_ptr(), t:numel(), C.CLRT_DIST_F32, op_id(op, 2), t.device_id), 2)
  return t
end

function M.all_reduce_numbers(list, op)
  local n = #list
  if M.world_size() == 1 or n == 0 then return list end
  local buf = ffi.new("double[?]", n)
  for i = 1, n do buf[i - 1] = list[i] end
  check(C.clrt_dist_all_reduce(buf, n, C.CLRT_DIST_F64, op_id(op, 2), C.CLRT_CPU), 2)
  for i = 1, n do list[i] = buf[i - 1] end
  return list
end

function M.broadcast(t, root)
  if type(t) ~= "cdata" or t:device() ~= "cpu" or not t:is_contiguous() then
    error("dist.broadcast: expected a contiguous tensor in host memory", 2)
  end
  local bytes = t:numel() * (t:dtype() == "bf16" and 2 or 4)
  check(C.clrt_dist_broadcast(t:data_ptr(), bytes, C.CLRT_DIST_BYTES, root or 0), 2)
  return t
end

-- Rank root's string on every rank (a run folder's name, a decision).
function M.broadcast_string(s, root)
  if M.world_size() == 1 then return s end
  root = root or 0
  local len = ffi.new("double[1]", M.rank() == root and #s or 0)
  check(C.clrt_dist_broadcast(len, 1, C.CLRT_DIST_F64, root), 2)
  local n = tonumber(len[0])
  local buf = ffi.new("char[?]", math.max(n, 1))
  if M.rank() == root then ffi.copy(buf, s, n) end
  check(C.clrt_dist_broadcast(buf, n, C.CLRT_DIST_BYTES, root), 2)
  return ffi.string(buf, n)
end

function M.barrier() check(C.clrt_dist_barrier(), 2) end

-- The gradients arena is one buffer: one all-reduce of every parameter's gradient.
function M.all_reduce_grads(m)
  if M.world_size() == 1 then return end
  -- under LoRA only the adapters have gradients (their own arena; the base is frozen)
  local g = m.lora and C.clrt_model_lora_grad(m.ptr, 0) or C.clrt_model_grad(m.ptr, 0)
  if g == nil then error("dist.all_reduce_grads: " .. ffi.string(C.clrt_last_error()), 2) end
  local s = g.storage
  local rc = C.clrt_dist_all_reduce(s.data, tonumber(s.bytes) / 4, C.CLRT_DIST_F32, C.CLRT_DIST_SUM, s.device)
  C.clrt_tensor_free(g)
  check(rc, 2)
end

-- The sharded optimizer step's collectives (ZeRO-1) over a contiguous host f32 tensor of n
-- values: rank r owns [lo, hi) of dist.slice(n, r) (0-based, hi exclusive, in rank order).
-- reduce_scatter(t) leaves the sum over ranks in this rank's slice and returns the slice's sum
-- of squares; all_gather(t) sends every rank's slice to every rank.
local function host_f32(t, what)
  if type(t) ~= "cdata" or t:dtype() ~= "f32" or t:device() ~= "cpu" or not t:is_contiguous() then
    error("dist." .. what .. ": expected a contiguous f32 tensor in host memory", 3)
  end
  return ffi.cast("float *", t:data_ptr()), t:numel()
end

function M.slice(n, rank)
  local lo, hi = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  C.clrt_dist_slice(n, rank or M.rank(), lo, hi)
  return tonumber(lo[0]), tonumber(hi[0])
end

function M.reduce_scatter(t)
  local p, n = host_f32(t, "reduce_scatter")
  local ss = ffi.new("double[1]")
  check(C.clrt_dist_reduce_scatter(p, n, ss), 2)
  return ss[0]
end

function M.all_gather(t)
  local p, n = host_f32(t, "all_gather")
  check(C.clrt_dist_all_gather(p, n), 2)
  return t
end

-- The parameters' hash, split into two exact halves so that max == min on every rank says
-- every rank holds the same bits.
function M.check_params(m, step)
  if M.world_size() == 1 then return true end
  local p = m.lora and C.clrt_model_lora_param(m.ptr, 0) or C.clrt_model_param(m.ptr, 0)
  local s = p.storage
  local h = C.clrt_dist_checksum(s.data, s.bytes, s.device)
  C.clrt_tensor_free(p)
  local hi, lo = tonumber(h / 4294967296ULL), tonumber(h % 4294967296ULL)
  local v = M.all_reduce_numbers({ hi, lo, -hi, -lo }, "max")
  if v[1] ~= -v[3] or v[2] ~= -v[4] then
    error(("dist: parameters differ across ranks after step %d (rank %d's checksum %08x%08x)")
      :format(step, M.rank(), hi, lo), 0)
  end
  return true
end

-- Every rank must hold the same number here: an error naming `what` and this rank's value
-- otherwise (on every rank, so the job ends instead of the ranks parting ways).
function M.agree(value, what)
  if M.world_size() == 1 then return value end
  local v = M.all_reduce_numbers({ value, -value }, "max")
  if v[1] ~= -v[2] then
    error(("dist: ranks disagree on %s: rank %d has %s, others up to %s"):format(what, M.rank(), tostring(value),
      tostring(v[1] == value and -v[2] or v[1])), 0)
  end
  return value
end

-- Rank `rank`'s contiguous share of n items: first, last (last < first when it has none).
-- The first n % size ranks take one more.
function M.share(n, rank, size)
  rank, size = rank or M.rank(), size or M.world_size()
  local base, extra = math.floor(n / size), n % size
  local first = rank * base + math.min(rank, extra) + 1
  local count = base + (rank < extra and 1 or 0)
  return first, first + count - 1
end

return M
