-- bench/matmul.lua — clrt's f32 matmul (OpenBLAS sgemm through the runtime) against numpy's
-- (Debian python3-numpy), both measured in this run, square sizes 256..2048.
--   clrt bench/matmul.lua [sizes=256,512,1024,2048] [seconds=1]
-- GFLOP/s = 2 n^3 / time; each figure is the best of 3 timed batches (clrt and numpy in
-- turns), each repeating the product for at least `seconds`/3 after a warm-up.
local ffi = require("ffi")
local tensor = clrt.tensor

local opts = { sizes = "256,512,1024,2048", seconds = 1 }
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^([%w_]+)=(.*)$")
  if not k or opts[k] == nil then error("matmul bench: unknown argument '" .. a .. "' (sizes=, seconds=)") end
  opts[k] = tonumber(v) or v
end
local sizes = {}
for s in tostring(opts.sizes):gmatch("%d+") do sizes[#sizes + 1] = tonumber(s) end
local seconds = tonumber(opts.seconds)

pcall(ffi.cdef, "struct clrt_bench_ts { long tv_sec; long tv_nsec; }; int clock_gettime(int, struct clrt_bench_ts *);")
local ts = ffi.new("struct clrt_bench_ts")
local function now()
  ffi.C.clock_gettime(1, ts)   -- CLOCK_MONOTONIC: wall time, not CPU time summed over threads
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

-- Best seconds per product over one batch repeated for at least `secs` after a warm-up.
local function clrt_time(a, b, secs)
  local c = a:matmul(b)
  local reps, t0 = 0, now()
  repeat
    c = a:matmul(b)
    reps = reps + 1
  until now() - t0 >= secs
  return (now() - t0) / reps
end

-- numpy runs the same protocol in its own process and prints the seconds per product.
local py = [[
import sys, time
import numpy as np
n, secs = int(sys.argv[1]), float(sys.argv[2])
rng = np.random.default_rng(0)
a = rng.standard_normal((n, n), dtype=np.float32)
b = rng.standard_normal((n, n), dtype=np.float32)
c = a @ b
reps, t0 = 0, time.perf_counter()
while True:
    c = a @ b
    reps += 1
    if time.perf_counter() - t0 >= secs:
        break
print("seconds", (time.perf_counter() - t0) / reps)
]]
local py_path = os.tmpname()
do
  local f = assert(io.open(py_path, "w"))
  f:write(py)
  f:close()
end

local function numpy_time(n, secs)
  local p = io.popen(("/usr/bin/python3 %s %d %g 2>&1"):format(py_path, n, secs))
  local out = p:read("*a")
  p:close()
  local t = tonumber(out:match("seconds ([%d%.e%+%-]+)"))
  if not t then io.stderr:write("matmul bench: numpy did not run (is python3-numpy installed?):\n", out, "\n") end
  return t
end

local function env(name) return os.getenv(name) or "(unset)" end
print(("clrt %s, %d threads, OPENBLAS_CORETYPE=%s, OMP_NUM_THREADS=%s")
  :format(clrt.version, clrt.num_threads(), env("OPENBLAS_CORETYPE"), env("OMP_NUM_THREADS")))
print(("%6s  %12s  %13s  %10s"):format("n", "clrt GFLOP/s", "numpy GFLOP/s", "clrt/numpy"))
-- The machine may be shared: the two run in turns, three times each, and the best counts.
for _, n in ipairs(sizes) do
  local a, b = tensor.randn({ n, n }, { seed = 1 }), tensor.randn({ n, n }, { seed = 2 })
  local tc, tn = math.huge, math.huge
  for _ = 1, 3 do
    tc = math.min(tc, clrt_time(a, b, seconds / 3))
    tn = math.min(tn, numpy_time(n, seconds / 3) or math.huge)
  end
  local g, ng = 2 * n ^ 3 / tc / 1e9, 2 * n ^ 3 / tn / 1e9
  print(("%6d  %12.2f  %13s  %10s"):format(n, g, tn < math.huge and ("%.2f"):format(ng) or "n/a",
    tn < math.huge and ("%.3f"):format(g / ng) or "n/a"))
end
os.remove(py_path)
