// attention.cu — causal grouped-query attention with an online softmax: no [T, T] scores
// exist, forward or backward. One warp per query row (forward, dq) or key row (dk/dv); the
// lanes split the head dimension (lane holds d = lane + 32 i), and a block's warps share key
// (or query) tiles staged in shared memory. Straightforward rather than tensor-core fast; the
// per-score math (online step, probabilities, score gradients) is model_math.h's.
// A sliding window (window > 0) drops the keys j <= p - window of the query at position p
// (clrt_window_first_key); each block starts at the first key tile its first query sees.
#include "common.cuh"
#include "model_math.h"

#include <stdio.h>

enum { WARPS = 4, TILE = 16, MAXD = 256, NI = MAXD / 32 };

// Rows of a [rows, ld] slab into shared [TILE, D]; rows past `n` are left alone (unused).
__device__ __forceinline__ void load_tile(float *dst, const float *src, int64_t ld, int n, int D) {
  for (int e = threadIdx.x; e < TILE * D; e += blockDim.x) {
    int r = e / D, d = e - r * D;
    if (r < n) dst[e] = src[r * ld + d];
  }
}

__device__ __forceinline__ float warp_dot(const float *reg, const float *row, int D) {
  int lane = threadIdx.x & 31;
  float s = 0;
#pragma unroll
  for (int i = 0; i < NI; i++) {
    int d = lane + 32 * i;
    if (d < D) s += reg[i] * row[d];
  }
  return clrt_warp_sum(s);
}

// grid (ceil(Tq / WARPS), H, B); shared: K and V tiles [TILE, D] each.
static __global__ void attn_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                                int Tq, int H, int KV, int D, const int32_t *pos0, int64_t kv_bstride,
                                const int32_t *kv_row, int window, float scale) {
  extern __shared__ float sm[];
  float *Ks = sm, *Vs = sm + TILE * D;
  int b = blockIdx.z, h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int t = blockIdx.x * WARPS + warp;   // this warp's query
  int p0 = pos0 ? pos0[b] : 0;
  int64_t kr = kv_row ? kv_row[b] : b;
  int ldk = KV * D, group = H / KV;
  const float *kb = k + kr * kv_bstride + (int64_t)(h / group) * D;
  const float *vb = v + kr * kv_bstride + (int64_t)(h / group) * D;
  int tlast = min(Tq - 1, (int)blockIdx.x * WARPS + WARPS - 1);
  int nk = p0 + tlast + 1;             // keys the block's last query sees
  int lim = p0 + t + 1;                // keys this query sees: first .. lim - 1
  int first = clrt_window_first_key(p0 + t, window);
  int jstart = clrt_window_first_key(p0 + (int)blockIdx.x * WARPS, window) / TILE * TILE;
  float qr[NI], acc[NI];
  const float *qrow = q + (((int64_t)b * Tq + t) * H + h) * D;
#pragma unroll
  for (int i = 0; i < NI; i++) {
    int d = lane + 32 * i;
    qr[i] = (t < Tq && d < D) ? qrow[d] : 0.0f;
    acc[i] = 0;
  }
  float m = -INFINITY, l = 0;
  for (int j0 = jstart; j0 < nk; j0 += TILE) {
    int n = min(TILE, nk - j0);
    __syncthreads();
    load_tile(Ks, kb + (int64_t)j0 * ldk, ldk, n, D);
    load_tile(Vs, vb + (int64_t)j0 * ldk, ldk, n, D);
    __syncthreads();
    if (t >= Tq) continue;
    for (int jj = first > j0 ? first - j0 : 0; jj < n && j0 + jj < lim; jj++) {
      float s = scale * warp_dot(qr, Ks + jj * D, D), corr, p;
      clrt_online_softmax_step(&m, &l, s, &corr, &p);
#pragma unroll
      for (int i = 0; i < NI; i++) {
        int d = lane + 32 * i;
        if (d < D) acc[i] = acc[i] * corr + p * Vs[jj * D + d];
      }
    }
  }
  if (t >= Tq) return;
  float inv = 1.0f / l;
  float *orow = out + (((int64_t)b * Tq + t) * H + h) * D;
#pragma unroll
  for (int i = 0; i < NI; i++) {
    int d = lane + 32 * i;
    if (d < D) orow[d] = acc[i] * inv;
  }
  if (lse && lane == 0) lse[((int64_t)b * H + h) * Tq + t] = clrt_lse_value(m, l);
}

// Di = dot(dout_i, out_i) per (b, h, t): a warp per row.
static __global__ void attn_di(float *Di, const float *dout, const float *out, int B, int T, int H, int D) {
  int64_t row = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);   // (b, t, h)
  if (row >= (int64_t)B * T * H) return;
  int lane = threadIdx.x & 31;
  float s = 0;
  for (int d = lane; d < D; d += 32) s += dout[row * D + d] * out[row * D + d];
  s = clrt_warp_sum(s);
  int h = (int)(row % H);
  int64_t bt = row / H;
  int b = (int)(bt / T), t = (int)(bt % T);
  if (lane == 0) Di[((int64_t)b * H + h) * T + t] = s;
}

// dq_i = sum_j ds_ij k_j: grid (ceil(T / WARPS), H, B), warp per query, K/V tiles shared.
static __global__ void attn_dq(float *dq, const float *dout, const float *q, const float *k, const float *v,
                               const float *lse, const float *Di, int T, int H, int KV, int D, int window,
                               float scale) {
  extern __shared__ float sm[];
  float *Ks = sm, *Vs = sm + TILE * D;
  int b = blockIdx.z, h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int t = blockIdx.x * WARPS + warp;
  int ldk = KV * D, group = H / KV;
  const float *kb = k + (int64_t)b * T * ldk + (int64_t)(h / group) * D;
  const float *vb = v + (int64_t)b * T * ldk + (int64_t)(h / group) * D;
  int nk = min(T, (int)blockIdx.x * WARPS + WARPS);
  int first = clrt_window_first_key(t, window);
  int jstart = clrt_window_first_key((int)blockIdx.x * WARPS, window) / TILE * TILE;
  int64_t qoff = (((int64_t)b * T + t) * H + h) * D;
  float qr[NI], dor[NI], acc[NI];
#pragma unroll
  for (int i = 0; i < NI; i++) {
    int d = lane + 32 * i;
    bool ok = t < T && d < D;
    qr[i] = ok ? q[qoff + d] : 0.0f;
    dor[i] = ok ? dout[qoff + d] : 0.0f;
    acc[i] = 0;
  }
  float L = 0, Dv = 0;
  if (t < T) {
    L = lse[((int64_t)b * H + h) * T + t];
    Dv = Di[((int64_t)b * H + h) * T + t];
  }
  for (int j0 = jstart; j0 < nk; j0 += TILE) {
    int n = min(TILE, nk - j0);
    __syncthreads();
    load_tile(Ks, kb + (int64_t)j0 * ldk, ldk, n, D);
    load_tile(Vs, vb + (int64_t)j0 * ldk, ldk, n, D);
    __syncthreads();
    if (t >= T) continue;
    for (int jj = first > j0 ? first - j0 : 0; jj < n && j0 + jj <= t; jj++) {
      float p = clrt_attn_prob(scale * warp_dot(qr, Ks + jj * D, D), L);
      float ds = clrt_attn_dscore(p, warp_dot(dor, Vs + jj * D, D), Dv, scale);
#pragma unroll
      for (int i = 0; i < NI; i++) {
        int d = lane + 32 * i;
        if (d < D) acc[i] += ds * Ks[jj * D + d];
      }
    }
  }
  if (t >= T) return;
#pragma unroll
  for (int i = 0; i < NI; i++) {
    int d = lane + 32 * i;
    if (d < D) dq[qoff + d] = acc[i];
  }
}

// dk_j, dv_j summed over the group's heads and queries i >= j: grid (ceil(T / WARPS), KV, B),
// warp per key; Q and dout tiles shared (with their lse and Di).
static __global__ void attn_dkv(float *dk, float *dv, const float *dout, const float *q, const float *k,
                                const float *v, const float *lse, const float *Di, int T, int H, int KV,
                                int D, int window, float scale) {
  extern __shared__ float sm[];
  float *Qs = sm, *Os = sm + TILE * D, *Ls = sm + 2 * TILE * D, *Ds = Ls + TILE;
  int b = blockIdx.z, g = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int j = blockIdx.x * WARPS + warp;
  int j0blk = blockIdx.x * WARPS;
  // queries past the window of the block's last key see none of its keys
  int iend = window > 0 ? min(T, j0blk + WARPS - 1 + window) : T;
  int ldq = H * D, group = H / KV;
  int64_t koff = (((int64_t)b * T + j) * KV + g) * D;
  float kr[NI], vr[NI], dka[NI], dva[NI];
#pragma unroll
  for (int i = 0; i < NI; i++) {
    int d = lane + 32 * i;
    bool ok = j < T && d < D;
    kr[i] = ok ? k[koff + d] : 0.0f;
    vr[i] = ok ? v[koff + d] : 0.0f;
    dka[i] = dva[i] = 0;
  }
  for (int h = g * group; h < (g + 1) * group; h++) {
    const float *qb = q + (int64_t)b * T * ldq + (int64_t)h * D;
    const float *ob = dout + (int64_t)b * T * ldq + (int64_t)h * D;
    const float *lb = lse + ((int64_t)b * H + h) * T, *db = Di + ((int64_t)b * H + h) * T;
    for (int i0 = j0blk; i0 < iend; i0 += TILE) {
      int n = min(TILE, iend - i0);
      __syncthreads();
      load_tile(Qs, qb + (int64_t)i0 * ldq, ldq, n, D);
      load_tile(Os, ob + (int64_t)i0 * ldq, ldq, n, D);
      if (threadIdx.x < n) {
        Ls[threadIdx.x] = lb[i0 + threadIdx.x];
        Ds[threadIdx.x] = db[i0 + threadIdx.x];
      }
      __syncthreads();
      if (j >= T) continue;
      for (int ii = 0; ii < n; ii++) {
        // causal: query i sees key j only when i >= j (and, in a window, i - j < window)
        if (i0 + ii < j || clrt_window_first_key(i0 + ii, window) > j) continue;
        float p = clrt_attn_prob(scale * warp_dot(kr, Qs + ii * D, D), Ls[ii]);
        float ds = clrt_attn_dscore(p, warp_dot(vr, Os + ii * D, D), Ds[ii], scale);
#pragma unroll
        for (int i = 0; i < NI; i++) {
          int d = lane + 32 * i;
          if (d < D) {
            dva[i] += p * Os[ii * D + d];
            dka[i] += ds * Qs[ii * D + d];
          }
        }
      }
    }
  }
  if (j >= T) return;
#pragma unroll
  for (int i = 0; i < NI; i++) {
    int d = lane + 32 * i;
    if (d < D) {
      dk[koff + d] = dka[i];
      dv[koff + d] = dva[i];
    }
  }
}

static int check_dims(const char *name, int H, int KV, int D) {
  if (D < 1 || D > MAXD || KV < 1 || H % KV != 0) {
    char msg[96];
    snprintf(msg, sizeof msg, "unsupported shape H=%d KV=%d D=%d (need D <= %d, KV | H)", H, KV, D, MAXD);
    clrt_cuda_note(name, msg);
    return -1;
  }
  return 0;
}

extern "C" void clrt_cuda_attention_forward(float *out, float *lse, const float *q, const float *k,
                                            const float *v, int B, int Tq, int H, int KV, int D,
                                            const int32_t *pos0, int64_t kv_bstride, const int32_t *kv_row,
                                            int window) {
  if (B <= 0 || Tq <= 0 || check_dims("attention_forward", H, KV, D)) return;
  dim3 grid((Tq + WARPS - 1) / WARPS, H, B);
  size_t smem = sizeof(float) * 2 * TILE * D;
  attn_fwd<<<grid, WARPS * 32, smem, clrt_cuda_cstream()>>>(out, lse, q, k, v, Tq, H, KV, D, pos0,
                                                            kv_bstride, kv_row, window, 1.0f / sqrtf((float)D));
  CLRT_LAUNCHED("attention_forward");
}

extern "C" size_t clrt_cuda_attention_scratch_floats(int B, int T, int H) {
  return (size_t)(B > 0 ? B : 1) * (size_t)(T > 0 ? T : 1) * (size_t)(H > 0 ? H : 1);
}

extern "C" void clrt_cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                             const float *k, const float *v, const float *out,
                                             const float *lse, int B, int T, int H, int KV, int D,
                                             int window, float *scratch) {
  if (B <= 0 || T <= 0 || check_dims("attention_backward", H, KV, D)) return;
  cudaStream_t st = clrt_cuda_cstream();
  float scale = 1.0f / sqrtf((float)D);
  int64_t rows = (int64_t)B * T * H;
  attn_di<<<(unsigned)((rows + WARPS - 1) / WARPS), WARPS * 32, 0, st>>>(scratch, dout, out, B, T, H, D);
  CLRT_LAUNCHED("attention_backward Di");
  size_t smem = sizeof(float) * 2 * TILE * D;
  attn_dq<<<dim3((T + WARPS - 1) / WARPS, H, B), WARPS * 32, smem, st>>>(dq, dout, q, k, v, lse, scratch,
                                                                          T, H, KV, D, window, scale);
  CLRT_LAUNCHED("attention_backward dq");
  smem = sizeof(float) * (2 * TILE * D + 2 * TILE);
  attn_dkv<<<dim3((T + WARPS - 1) / WARPS, KV, B), WARPS * 32, smem, st>>>(dk, dv, dout, q, k, v, lse, scratch,
                                                                            T, H, KV, D, window, scale);
  CLRT_LAUNCHED("attention_backward dk dv");
}
