// logsoftmax_gather.cu — the output layer fused with log-softmax and the target gather, `chunk`
// rows of logits at a time (cuBLAS for the products, a block per row for the softmax terms).
#include "common.cuh"
#include "lora_math.h"
#include "model_math.h"

enum { THREADS = 256 };

// The block's logsumexp of z[0, V): each thread folds its elements, then states merge.
static __device__ float block_lse(const float *z, int V) {
  __shared__ float sm_m[32], sm_l[32];
  float m = -INFINITY, l = 0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) clrt_lse_step(&m, &l, z[j]);
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o), l2 = __shfl_xor_sync(0xffffffffu, l, o);
    clrt_lse_merge(&m, &l, m2, l2);
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) sm_m[warp] = m, sm_l[warp] = l;
  __syncthreads();
  m = -INFINITY, l = 0;
  for (int w = 0; w < nw; w++) clrt_lse_merge(&m, &l, sm_m[w], sm_l[w]);   // same order everywhere
  return clrt_lse_value(m, l);
}

static __global__ void lsm_fwd(float *lp, float *lse, const float *z, const int32_t *target, int V) {
  const float *zr = z + (int64_t)blockIdx.x * V;
  float L = block_lse(zr, V);
  if (threadIdx.x == 0) {
    if (lse) lse[blockIdx.x] = L;
    lp[blockIdx.x] = zr[target[blockIdx.x]] - L;
  }
}

// z <- dlogits = dlp * (onehot(target) - softmax(z)), in place.
static __global__ void lsm_bwd(float *z, const float *dlp, const float *lse, const int32_t *target, int V) {
  float *zr = z + (int64_t)blockIdx.x * V;
  float g = dlp[blockIdx.x], L = lse[blockIdx.x];
  int tg = target[blockIdx.x];
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    float d = clrt_lsm_dlogit(zr[j], L, g);
    if (j == tg) d += g;
    zr[j] = d;
  }
}

extern "C" void clrt_cuda_logsoftmax_gather_forward(float *lp, float *lse, const float *x, const float *w,
                                                    const int32_t *target, int64_t N, int C, int V,
                                                    float *scratch, int chunk) {
  clrt_cuda_logsoftmax_gather_forward_lora(lp, lse, x, w, target, N, C, V, scratch, chunk, NULL);
}

extern "C" void clrt_cuda_logsoftmax_gather_backward(float *dx, float *dw, const float *dlp, const float *x,
                                                     const float *w, const int32_t *target, const float *lse,
                                                     int64_t N, int C, int V, float *scratch, int chunk,
                                                     int logits_ready) {
  clrt_cuda_logsoftmax_gather_backward_lora(dx, dw, dlp, x, w, target, lse, N, C, V, scratch, chunk, logits_ready,
                                            NULL);
}

// With a LoRA adapter beside the output layer (hl, or NULL): each chunk's logits gain its
// share, and its backward takes the chunk's dlogits (lora.cu's block products).
extern "C" void clrt_cuda_logsoftmax_gather_forward_lora(float *lp, float *lse, const float *x, const float *w,
                                                         const int32_t *target, int64_t N, int C, int V,
                                                         float *scratch, int chunk, const clrt_head_lora *hl) {
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    int rows = N - n0 < chunk ? (int)(N - n0) : chunk;
    clrt_cuda_linear_forward(scratch, x + n0 * C, w, NULL, rows, C, V);
    if (hl) clrt_cuda_lora_head_block(scratch, hl, n0, rows, V);
    lsm_fwd<<<rows, THREADS, 0, clrt_cuda_cstream()>>>(lp + n0, lse ? lse + n0 : NULL, scratch, target + n0, V);
    CLRT_LAUNCHED("logsoftmax_gather_forward");
  }
}

extern "C" void clrt_cuda_logsoftmax_gather_backward_lora(float *dx, float *dw, const float *dlp, const float *x,
                                                          const float *w, const int32_t *target, const float *lse,
                                                          int64_t N, int C, int V, float *scratch, int chunk,
                                                          int logits_ready, const clrt_head_lora *hl) {
  if (logits_ready && chunk < N) logits_ready = 0;
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    int rows = N - n0 < chunk ? (int)(N - n0) : chunk;
    if (!logits_ready) {
      clrt_cuda_linear_forward(scratch, x + n0 * C, w, NULL, rows, C, V);
      if (hl) clrt_cuda_lora_head_block(scratch, hl, n0, rows, V);
    }
    lsm_bwd<<<rows, THREADS, 0, clrt_cuda_cstream()>>>(scratch, dlp + n0, lse + n0, target + n0, V);
    CLRT_LAUNCHED("logsoftmax_gather_backward");
    if (hl) clrt_cuda_lora_head_block_backward(scratch, hl, n0, rows, V);
    // dx = dlogits w (=), dw += dlogits^T x: the linear layer's backward with O = V.
    clrt_cuda_linear_backward(dx + n0 * C, dw, NULL, scratch, x + n0 * C, w, rows, C, V, 0);
  }
}
