// elementwise.cu — embedding lookup/scatter, SwiGLU, residual add, f32 -> bf16; the element
// math comes from model_math.h / bf16.h.
#include "common.cuh"
#include "model_math.h"

#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

static __global__ void embed_fwd(float *out, const int32_t *tok, const float *wte, int64_t N, int C) {
  GRID_STRIDE(i, N * C) {
    int64_t n = i / C;
    out[i] = wte[(int64_t)tok[n] * C + (i - n * C)];
  }
}

// One thread per column walks the rows in order: no atomics, the CPU's summation order.
static __global__ void embed_bwd(float *dwte, const float *dout, const int32_t *tok, int64_t N, int C) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int64_t n = 0; n < N; n++) dwte[(int64_t)tok[n] * C + c] += dout[n * C + c];
}

static __global__ void swiglu_fwd(float *h, const float *g, const float *u, int64_t n) {
  GRID_STRIDE(i, n) h[i] = clrt_swiglu(g[i], u[i]);
}

static __global__ void swiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u,
                                  int64_t n) {
  GRID_STRIDE(i, n) {
    float a, b;
    clrt_swiglu_back(&a, &b, g[i], u[i], dh[i]);   // dg may alias dh: read before written
    dg[i] = a;
    du[i] = b;
  }
}

static __global__ void residual_fwd(float *out, const float *a, const float *b, int64_t n) {
  GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

static __global__ void residual_bwd(float *da, float *db, const float *dout, int64_t n) {
  GRID_STRIDE(i, n) {
    if (da) da[i] += dout[i];
    if (db) db[i] += dout[i];
  }
}

static __global__ void to_bf16(uint16_t *out, const float *in, int64_t n) {
  GRID_STRIDE(i, n) out[i] = clrt_f32_to_bf16(in[i]);
}

#define LAUNCH(name, kern, n, ...)                                                   \
  do {                                                                               \
    if ((n) <= 0) return;                                                            \
    kern<<<clrt_blocks((n), 256), 256, 0, clrt_cuda_cstream()>>>(__VA_ARGS__);       \
    CLRT_LAUNCHED(name);                                                             \
  } while (0)

extern "C" void clrt_cuda_embedding_forward(float *out, const int32_t *tok, const float *wte, int64_t N, int C) {
  LAUNCH("embedding_forward", embed_fwd, N * C, out, tok, wte, N, C);
}

extern "C" void clrt_cuda_embedding_backward(float *dwte, const float *dout, const int32_t *tok, int64_t N, int C) {
  if (N <= 0 || C <= 0) return;
  embed_bwd<<<(C + 127) / 128, 128, 0, clrt_cuda_cstream()>>>(dwte, dout, tok, N, C);
  CLRT_LAUNCHED("embedding_backward");
}

extern "C" void clrt_cuda_swiglu_forward(float *h, const float *g, const float *u, int64_t n) {
  LAUNCH("swiglu_forward", swiglu_fwd, n, h, g, u, n);
}

extern "C" void clrt_cuda_swiglu_backward(float *dg, float *du, const float *dh, const float *g,
                                          const float *u, int64_t n) {
  LAUNCH("swiglu_backward", swiglu_bwd, n, dg, du, dh, g, u, n);
}

extern "C" void clrt_cuda_residual_forward(float *out, const float *a, const float *b, int64_t n) {
  LAUNCH("residual_forward", residual_fwd, n, out, a, b, n);
}

extern "C" void clrt_cuda_residual_backward(float *da, float *db, const float *dout, int64_t n) {
  if (!da && !db) return;
  LAUNCH("residual_backward", residual_bwd, n, da, db, dout, n);
}

extern "C" void clrt_cuda_f32_to_bf16(uint16_t *out, const float *in, int64_t n) {
  LAUNCH("f32_to_bf16", to_bf16, n, out, in, n);
}

// ---- row movement for the model: target-row compaction and the KV-cache write ------------

static __global__ void gather_rows_k(float *dst, const float *src, const int32_t *rowidx, int64_t nv, int C) {
  GRID_STRIDE(e, nv * C) {
    int64_t i = e / C;
    dst[e] = src[(int64_t)rowidx[i] * C + (e - i * C)];
  }
}

static __global__ void scatter_rows_k(float *dst, const float *src, const int32_t *rowidx, int64_t nv, int C) {
  GRID_STRIDE(e, nv * C) {
    int64_t i = e / C;
    dst[(int64_t)rowidx[i] * C + (e - i * C)] += src[e];   /* rows are distinct here: no race */
  }
}

static __global__ void kv_write_k(float *kc, float *vc, const float *k, const float *v, const int32_t *pos0,
                                  const int32_t *slot, int B, int T, int row, int64_t bstride) {
  GRID_STRIDE(e, (int64_t)B * T * row) {
    int64_t bt = e / row;
    int b = (int)(bt / T), t = (int)(bt % T);
    int64_t dst = (slot ? slot[b] : b) * bstride + (int64_t)(pos0[b] + t) * row + (e - bt * row);
    kc[dst] = k[e];
    vc[dst] = v[e];
  }
}

extern "C" void clrt_cuda_gather_rows(float *dst, const float *src, const int32_t *rowidx, int64_t nv, int C) {
  LAUNCH("gather_rows", gather_rows_k, nv * C, dst, src, rowidx, nv, C);
}

extern "C" void clrt_cuda_scatter_rows(float *dst, const float *src, const int32_t *rowidx, int64_t nv, int C) {
  LAUNCH("scatter_rows", scatter_rows_k, nv * C, dst, src, rowidx, nv, C);
}

extern "C" void clrt_cuda_kv_write(float *kc, float *vc, const float *k, const float *v, const int32_t *pos0,
                                   const int32_t *slot, int B, int T, int row, int64_t bstride) {
  LAUNCH("kv_write", kv_write_k, (int64_t)B * T * row, kc, vc, k, v, pos0, slot, B, T, row, bstride);
}
