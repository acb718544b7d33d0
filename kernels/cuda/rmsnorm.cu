// rmsnorm.cu — RMSNorm forward (a block per row) and backward (dx a block per row, dw a block
// per 32 columns walking all rows, so neither needs atomics). Math: model_math.h.
#include "common.cuh"
#include "model_math.h"

enum { THREADS = 256 };

static __global__ void rms_fwd(float *out, float *rstd, const float *x, const float *w, int C, float eps) {
  __shared__ float sh[32];
  const float *xr = x + (int64_t)blockIdx.x * C;
  float *o = out + (int64_t)blockIdx.x * C;
  float ss = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) ss += xr[c] * xr[c];
  float r = clrt_rms_rstd(clrt_block_sum(ss, sh), C, eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = w[c] * (xr[c] * r);
}

static __global__ void rms_bwd_dx(float *dx, const float *dout, const float *x, const float *w,
                                  const float *rstd, int C) {
  __shared__ float sh[32];
  int64_t row = (int64_t)blockIdx.x * C;
  const float *xr = x + row, *dy = dout + row;
  float dot = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) dot += w[c] * dy[c] * xr[c];
  dot = clrt_block_sum(dot, sh);
  float r = rstd[blockIdx.x];
  for (int c = threadIdx.x; c < C; c += blockDim.x) dx[row + c] += clrt_rms_dx(xr[c], w[c] * dy[c], r, dot, C);
}

static __global__ void rms_bwd_dw(float *dw, const float *dout, const float *x, const float *rstd,
                                  int64_t N, int C) {
  __shared__ float part[8][33];
  int c = blockIdx.x * 32 + threadIdx.x;
  float s = 0;
  if (c < C)
    for (int64_t n = threadIdx.y; n < N; n += blockDim.y) s += dout[n * C + c] * x[n * C + c] * rstd[n];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int r = 1; r < (int)blockDim.y; r++) s += part[r][threadIdx.x];
    dw[c] += s;
  }
}

extern "C" void clrt_cuda_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w,
                                          int64_t N, int C, float eps) {
  if (N <= 0) return;
  rms_fwd<<<(unsigned)N, THREADS, 0, clrt_cuda_cstream()>>>(out, rstd, x, w, C, eps);
  CLRT_LAUNCHED("rmsnorm_forward");
}

extern "C" void clrt_cuda_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                                           const float *w, const float *rstd, int64_t N, int C) {
  if (N <= 0) return;
  rms_bwd_dx<<<(unsigned)N, THREADS, 0, clrt_cuda_cstream()>>>(dx, dout, x, w, rstd, C);
  CLRT_LAUNCHED("rmsnorm_backward dx");
  if (!dw) return;   // a frozen norm (LoRA)
  rms_bwd_dw<<<(C + 31) / 32, dim3(32, 8), 0, clrt_cuda_cstream()>>>(dw, dout, x, rstd, N, C);
  CLRT_LAUNCHED("rmsnorm_backward dw");
}
