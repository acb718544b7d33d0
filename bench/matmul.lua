-- bench/matmul.lua — clrt's f32 matmul (OpenBLAS sgemm through the runtime) against numpy's
-- (Debian python3-numpy), both measured in this run, square sizes 256..2048.
--   clrt bench/matmul.lua [sizes=256,512,1024,2048] [seconds=1]
--   clrt bench/matmul.lua training=1 [shapes=NxKxO,...] [seconds=1]
-- training=1: the three products of a linear layer in training (y = x W^T, dx = dy W,
-- dW += dy^T x) through the kernels the model runs (linear_packed.c, gemm_strided.c) against
-- OpenBLAS sgemm on the same buffers (y=xW^T over the packed copy decode keeps, y=xW^T* packing
-- W on the fly as training does), in turns in this run: the ratio is the figure (absolute
-- GFLOP/s move with the machine's other load).
-- GFLOP/s = 2 n^3 / time; each figure is the best of 3 timed batches (clrt and numpy in
-- turns), each repeating the product for at least `seconds`/3 after a warm-up.
local ffi = require("ffi")
local tensor = clrt.tensor

local opts = { sizes = "256,512,1024,2048", seconds = 1, training = 0,
  shapes = "512x896x896,512x896x4864,512x4864x896,256x896x16008,1024x128x384,1024x384x128" }
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^([%w_]+)=(.*)$")
  if not k or opts[k] == nil then error("matmul bench: unknown argument '" .. a .. "' (sizes=, seconds=, training=, shapes=)") end
  opts[k] = tonumber(v) or v
end
local sizes = {}
for s in tostring(opts.sizes):gmatch("%d+") do sizes[#sizes + 1] = tonumber(s) end
local seconds = tonumber(opts.seconds)

-- wall time (CLOCK_MONOTONIC), not CPU time summed over threads: the library's one clock
local now = require("clrt.log").now

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

-- The training products, kernel against sgemm, per shape N x K x O (rows, inputs, outputs).
local function training_bench()
  ffi.cdef [[
    void cblas_sgemm(int order, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc);
    void clrt_linear_pack(float *wp, const float *w, int K, int O);
    int clrt_linear_packed_forward(float *y, const float *x, const float *wp, const float *b, int64_t N, int K, int O);
    int clrt_linear_forward_strided(float *y, const float *x, const float *w, const float *b, int64_t N, int K, int O);
    int clrt_gemm_strided(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_ks, const float *b,
                          int64_t ldb, int64_t M, int Nc, int64_t Kc, int accumulate);
  ]]
  local C = ffi.C
  local RowMajor, NoTrans, Trans = 101, 111, 112
  local function buf(n, seed)
    local p = ffi.new("float[?]", n)
    local s = seed
    for i = 0, n - 1 do
      s = (s * 1103515245 + 12345) % 2147483648
      p[i] = s / 2147483648 - 0.5
    end
    return p
  end
  local function best(fn, secs)
    fn()
    local reps, t0 = 0, now()
    repeat
      fn()
      reps = reps + 1
    until now() - t0 >= secs
    return (now() - t0) / reps
  end
  print(("clrt %s, %d threads; kernel / sgemm, best of 3 turns each"):format(clrt.version, clrt.num_threads()))
  print(("%-16s %-8s %10s %10s %7s"):format("N x K x O", "product", "kernel GF", "sgemm GF", "ratio"))
  for shape in tostring(opts.shapes):gmatch("[^,]+") do
    local N, K, O = shape:match("^(%d+)x(%d+)x(%d+)$")
    N, K, O = tonumber(N), tonumber(K), tonumber(O)
    local x, w, dy = buf(N * K, 1), buf(O * K, 2), buf(N * O, 3)
    local wp, y, dx, dw = ffi.new("float[?]", O * K), ffi.new("float[?]", N * O), ffi.new("float[?]", N * K),
      ffi.new("float[?]", O * K)
    C.clrt_linear_pack(wp, w, K, O)
    local products = {
      { "y=xW^T", function() assert(C.clrt_linear_packed_forward(y, x, wp, nil, N, K, O) == 1, "no AVX-512") end,
        function() C.cblas_sgemm(RowMajor, NoTrans, Trans, N, O, K, 1, x, K, w, K, 0, y, O) end },
      { "y=xW^T*", function() assert(C.clrt_linear_forward_strided(y, x, w, nil, N, K, O) == 1) end,
        function() C.cblas_sgemm(RowMajor, NoTrans, Trans, N, O, K, 1, x, K, w, K, 0, y, O) end },
      { "dx=dyW", function() assert(C.clrt_gemm_strided(dx, K, dy, O, 1, w, K, N, K, O, 0) == 1) end,
        function() C.cblas_sgemm(RowMajor, NoTrans, NoTrans, N, K, O, 1, dy, O, w, K, 0, dx, K) end },
      { "dW+=dy^Tx", function() assert(C.clrt_gemm_strided(dw, K, dy, 1, O, x, K, O, K, N, 1) == 1) end,
        function() C.cblas_sgemm(RowMajor, Trans, NoTrans, O, K, N, 1, dy, O, x, K, 1, dw, K) end },
    }
    for _, p in ipairs(products) do
      local tk, ts = math.huge, math.huge
      for _ = 1, 3 do
        tk = math.min(tk, best(p[2], seconds / 6))
        ts = math.min(ts, best(p[3], seconds / 6))
      end
      local flops = 2 * N * K * O
      print(("%-16s %-8s %10.1f %10.1f %7.2f"):format(shape, p[1], flops / tk / 1e9, flops / ts / 1e9, ts / tk))
    end
  end
end

if tonumber(opts.training) == 1 then
  training_bench()
  os.remove(py_path)
  os.exit(0)
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
