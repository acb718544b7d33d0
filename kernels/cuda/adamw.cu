// adamw.cu — global-norm clipping and the fused AdamW update over the parameter arena, all on
// the device: the norm never visits the host before the update (the clip scale and the
// skip-on-non-finite rule are evaluated by the update kernel itself).
#include "common.cuh"
#include "model_math.h"

enum { PARTS = 512, THREADS = 256 };

extern "C" int clrt_cuda_adamw_partials(void) { return PARTS; }

static __global__ void sumsq(double *partial, const float *G, int64_t n) {
  __shared__ double sh[32];
  double s = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    s += (double)G[i] * G[i];
  s = clrt_block_sum(s, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

static __global__ void finish_norm(double *norm, const double *partial, int n) {
  __shared__ double sh[32];
  double s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = clrt_block_sum(s, sh);
  if (threadIdx.x == 0) *norm = sqrt(s);
}

// grid (x: blocks striding a segment, y: segment)
static __global__ void update(float *P, float *M1, float *M2, const float *G, const clrt_cuda_adamw_seg *segs,
                              const double *norm, float lr, float beta1, float beta2, float eps,
                              float weight_decay, float grad_clip, float bc1, float bc2_sqrt) {
  double nv = *norm;
  if (!isfinite(nv)) return;
  float gscale = clrt_clip_scale(nv, grad_clip);
  clrt_cuda_adamw_seg sg = segs[blockIdx.y];
  float decay = sg.decay ? lr * weight_decay : 0.0f;
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < sg.numel; k += (int64_t)gridDim.x * blockDim.x) {
    int64_t e = sg.offset + k;
    clrt_adamw_update(&P[e], &M1[e], &M2[e], G[e] * gscale, lr, beta1, beta2, eps, decay, bc1, bc2_sqrt);
  }
}

extern "C" void clrt_cuda_adamw_step(float *P, float *M1, float *M2, const float *G, int64_t total,
                                     const clrt_cuda_adamw_seg *segs, int nseg, double *partial,
                                     double *norm_dev, float lr, float beta1, float beta2, float eps,
                                     float weight_decay, float grad_clip, float bc1, float bc2_sqrt) {
  cudaStream_t st = clrt_cuda_cstream();
  sumsq<<<PARTS, THREADS, 0, st>>>(partial, G, total);
  CLRT_LAUNCHED("adamw gradient norm");
  finish_norm<<<1, THREADS, 0, st>>>(norm_dev, partial, PARTS);
  CLRT_LAUNCHED("adamw gradient norm");
  if (nseg <= 0) return;
  update<<<dim3(128, nseg), THREADS, 0, st>>>(P, M1, M2, G, segs, norm_dev, lr, beta1, beta2, eps,
                                              weight_decay, grad_clip, bc1, bc2_sqrt);
  CLRT_LAUNCHED("adamw update");
}
