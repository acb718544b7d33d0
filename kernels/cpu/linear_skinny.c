/* linear_skinny.c — y = x w^T + b for few rows (a decode step: one row per sequence).
   OpenBLAS packs the whole weight matrix on every sgemm call, which for N = 1..32 rows costs
   more than the product itself: a decode step is memory-bound and packing doubles the bytes
   it moves. This kernel reads each weight row once, straight from the model, and dots it
   with every x row while it is in L1. Each output is one dot product over K, accumulated in
   16 lanes and reduced at the end (a different summation order from sgemm's, so results
   agree to rounding, not bit for bit).
   The bf16 variant reads bf16 copies of the weights (half the bytes of a memory-bound step)
   and bf16-rounded x; with AVX512-BF16 it multiplies them with vdpbf16ps
   (linear_skinny_dpbf16.c), else it widens both to f32 in registers. Accumulation and y are f32.
   AVX-512 only, chosen at run time (the build targets x86-64-v2); elsewhere the caller
   falls back to sgemm. */
#include "model_kernels.h"

#include <stdlib.h>

#include "bf16.h"
#include "simd512.h"

#if CLRT_AVX512
#define TARGET CLRT_TARGET_AVX512

/* acc[j] += x * v_j: one x row against four weight rows. */
TARGET static inline void fma4(__m512 acc[4], __m512 x, __m512 v0, __m512 v1, __m512 v2, __m512 v3) {
  acc[0] = _mm512_fmadd_ps(x, v0, acc[0]);
  acc[1] = _mm512_fmadd_ps(x, v1, acc[1]);
  acc[2] = _mm512_fmadd_ps(x, v2, acc[2]);
  acc[3] = _mm512_fmadd_ps(x, v3, acc[3]);
}

/* The weight loads of the two kernels: 16 f32, or 16 bf16 widened to f32 (a shift). */
#define LOAD_F32(p, k) _mm512_loadu_ps((p) + (k))
#define LOADM_F32(m, p, k) _mm512_maskz_loadu_ps((m), (p) + (k))
#define LOAD_BF16(p, k) \
  _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((p) + (k)))), 16))
#define LOADM_BF16(m, p, k) \
  _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16((m), (p) + (k))), 16))

/* block4_T: y[n, o0..o0+3] for rows n0..n0+nr-1 (nr <= 4) of x against weight rows
   o0..o0+3; dot1_T: one weight row against one x row (the O % 4 leftovers); skinny_T: the
   whole product, threads splitting the weight rows so each reads its share of w once. */
#define SKINNY_KERNELS(T, WT, LOADW, LOADMW)                                                      \
  TARGET static inline __attribute__((always_inline)) void block4_##T(                             \
      float *y, const float *x, const WT *w, const float *b, int n0, int nr, int K, int O, int o0) { \
    __m512 acc[4][4];                                                                              \
    for (int i = 0; i < 4; i++)                                                                    \
      for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();                                 \
    const WT *w0 = w + (int64_t)o0 * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;                  \
    const float *xr[4];                                                                            \
    for (int i = 0; i < 4; i++) xr[i] = x + (int64_t)(n0 + (i < nr ? i : 0)) * K;                 \
    int k = 0;                                                                                     \
    for (; k + 16 <= K; k += 16) {                                                                 \
      __m512 v0 = LOADW(w0, k), v1 = LOADW(w1, k), v2 = LOADW(w2, k), v3 = LOADW(w3, k);           \
      for (int i = 0; i < 4; i++) {                                                                \
        if (i >= nr) break;                                                                        \
        fma4(acc[i], _mm512_loadu_ps(xr[i] + k), v0, v1, v2, v3);                                  \
      }                                                                                            \
    }                                                                                              \
    if (k < K) {                                                                                   \
      __mmask16 mk = clrt_tail_mask16(K - k);                                                      \
      __m512 v0 = LOADMW(mk, w0, k), v1 = LOADMW(mk, w1, k), v2 = LOADMW(mk, w2, k),               \
             v3 = LOADMW(mk, w3, k);                                                               \
      for (int i = 0; i < nr; i++) {                                                               \
        fma4(acc[i], _mm512_maskz_loadu_ps(mk, xr[i] + k), v0, v1, v2, v3);                        \
      }                                                                                            \
    }                                                                                              \
    __m128 bias = b ? _mm_loadu_ps(b + o0) : _mm_setzero_ps();                                     \
    for (int i = 0; i < nr; i++)                                                                   \
      _mm_storeu_ps(y + (int64_t)(n0 + i) * O + o0,                                                \
                    _mm_add_ps(bias, clrt_reduce4_512(acc[i][0], acc[i][1], acc[i][2], acc[i][3]))); \
  }                                                                                                \
  TARGET static float dot1_##T(const float *x, const WT *w, int K) {                               \
    __m512 acc = _mm512_setzero_ps();                                                              \
    int k = 0;                                                                                     \
    for (; k + 16 <= K; k += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), LOADW(w, k), acc);  \
    if (k < K) {                                                                                   \
      __mmask16 mk = clrt_tail_mask16(K - k);                                                      \
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, x + k), LOADMW(mk, w, k), acc);              \
    }                                                                                              \
    return _mm512_reduce_add_ps(acc);                                                              \
  }                                                                                                \
  /* Every row of y against weight rows o0..o0+3. Called from the parallel loop rather than     \
     inlined into it: clang outlines OpenMP regions without the enclosing target attribute. */  \
  TARGET static void column4_##T(float *y, const float *x, const WT *w, const float *b, int N,    \
                                 int K, int O, int o0) {                                           \
    for (int n0 = 0; n0 < N; n0 += 4)                                                              \
      if (N - n0 >= 4) /* a constant row count: the x loop unrolls, acc stays in registers */     \
        block4_##T(y, x, w, b, n0, 4, K, O, o0);                                                   \
      else                                                                                         \
        block4_##T(y, x, w, b, n0, N - n0, K, O, o0);                                              \
  }                                                                                                \
  TARGET static void skinny_##T(float *y, const float *x, const WT *w, const float *b, int N,     \
                                int K, int O) {                                                    \
    int blocks = O / 4;                                                                            \
    _Pragma("omp parallel for schedule(static) if ((int64_t)N * O * K > CLRT_OMP_MIN_WORK)")   \
    for (int ob = 0; ob < blocks; ob++) column4_##T(y, x, w, b, N, K, O, 4 * ob);                  \
    for (int o = 4 * blocks; o < O; o++)                                                           \
      for (int n = 0; n < N; n++)                                                                  \
        y[(int64_t)n * O + o] = (b ? b[o] : 0.0f) + dot1_##T(x + (int64_t)n * K, w + (int64_t)o * K, K); \
  }

SKINNY_KERNELS(f32, float, LOAD_F32, LOADM_F32)
SKINNY_KERNELS(bf16, uint16_t, LOAD_BF16, LOADM_BF16)

#define SKINNY_CALL(T) \
  if (N < 1 || N > CLRT_SKINNY_MAX_ROWS || !clrt_have_avx512()) return 0; \
  skinny_##T(y, x, w, b, (int)N, K, O); \
  return 1
#else
#define SKINNY_CALL(T) \
  (void)y, (void)x, (void)w, (void)b, (void)N, (void)K, (void)O; \
  return 0
#endif

int clrt_linear_skinny_forward(float *y /* [N, O] */, const float *x /* [N, K] */,
                               const float *w /* [O, K] */, const float *b /* [O] or NULL */,
                               int64_t N, int K, int O) {
  SKINNY_CALL(f32);
}

/* The bf16 product of the skinny kernels: widening bf16 x against bf16 w (x already rounded). */
static int skinny_bf16_widened(float *y, const float *x, const uint16_t *w, const float *b,
                               int64_t N, int K, int O) {
  SKINNY_CALL(bf16);
}

/* x rounded to bf16 [N, K] uint16, then widened back [N, K] f32 (the second kernel's input). */
size_t clrt_linear_skinny_bf16_workspace_bytes(int64_t N, int K) {
  if (N < 1 || N > CLRT_SKINNY_MAX_ROWS || K < 1) return 0;
  return (sizeof(uint16_t) + sizeof(float)) * (size_t)N * (size_t)K;
}

int clrt_linear_skinny_forward_bf16(float *y /* [N, O] */, const float *x /* [N, K] */,
                                    const uint16_t *w /* [O, K] bf16 */, const float *b /* [O] or NULL */,
                                    int64_t N, int K, int O, void *ws, size_t ws_bytes) {
  if (N < 1 || N > CLRT_SKINNY_MAX_ROWS || !clrt_have_avx512() ||
      ws_bytes < clrt_linear_skinny_bf16_workspace_bytes(N, K))
    return 0;
  /* x is rounded to bf16 once per call, so both kernels compute the same products (and the
     CUDA path's cublasGemmEx with bf16 inputs does too). */
  size_t n = (size_t)N * K;
  float *xr = ws;
  uint16_t *x16 = (uint16_t *)(xr + n);
  for (size_t i = 0; i < n; i++) x16[i] = clrt_f32_to_bf16(x[i]);
  int done = clrt_linear_skinny_dpbf16(y, x16, w, b, (int)N, K, O);
  if (!done) {
    for (size_t i = 0; i < n; i++) xr[i] = clrt_bf16_to_f32(x16[i]);
    done = skinny_bf16_widened(y, xr, w, b, N, K, O);
  }
  return done;
}
