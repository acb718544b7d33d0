/* linear_skinny_dpbf16.c — the few-row product with bf16 weights and bf16 inputs on CPUs
   with AVX512-BF16: vdpbf16ps multiplies 32 bf16 pairs and adds them into 16 f32 lanes, twice
   the multiply-adds of an f32 FMA per instruction, reading half the bytes. The tiling is
   linear_skinny.c's (four weight rows by up to four x rows, each weight row read once per
   call); see there for why. */
#include "model_kernels.h"
#include "simd512.h"

#if CLRT_AVX512
#define TARGET CLRT_TARGET_AVX512BF16

/* 32 bf16 from p, or those the mask m selects and zeros. */
#define LOAD_BH(p) ((__m512bh)_mm512_loadu_si512((const void *)(p)))
#define LOADM_BH(m, p) ((__m512bh)_mm512_maskz_loadu_epi16((m), (const void *)(p)))

/* acc[j] += x . v_j pairwise: one x row against four weight rows. */
TARGET static inline void dp4(__m512 acc[4], __m512bh x, __m512bh v0, __m512bh v1, __m512bh v2,
                              __m512bh v3) {
  acc[0] = _mm512_dpbf16_ps(acc[0], x, v0);
  acc[1] = _mm512_dpbf16_ps(acc[1], x, v1);
  acc[2] = _mm512_dpbf16_ps(acc[2], x, v2);
  acc[3] = _mm512_dpbf16_ps(acc[3], x, v3);
}

TARGET static inline __attribute__((always_inline)) void block4(
    float *y, const uint16_t *x /* [N, K] */, const uint16_t *w /* [O, K] */, const float *b,
    int n0, int nr, int K, int O, int o0) {
  __m512 acc[4][4];
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
  const uint16_t *w0 = w + (int64_t)o0 * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
  const uint16_t *xr[4];
  for (int i = 0; i < 4; i++) xr[i] = x + (int64_t)(n0 + (i < nr ? i : 0)) * K;
  int k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512bh v0 = LOAD_BH(w0 + k), v1 = LOAD_BH(w1 + k), v2 = LOAD_BH(w2 + k), v3 = LOAD_BH(w3 + k);
    for (int i = 0; i < nr; i++) dp4(acc[i], LOAD_BH(xr[i] + k), v0, v1, v2, v3);
  }
  if (k < K) {
    __mmask32 m = (__mmask32)((1ull << (K - k)) - 1);
    __m512bh v0 = LOADM_BH(m, w0 + k), v1 = LOADM_BH(m, w1 + k), v2 = LOADM_BH(m, w2 + k),
             v3 = LOADM_BH(m, w3 + k);
    for (int i = 0; i < nr; i++) dp4(acc[i], LOADM_BH(m, xr[i] + k), v0, v1, v2, v3);
  }
  __m128 bias = b ? _mm_loadu_ps(b + o0) : _mm_setzero_ps();
  for (int i = 0; i < nr; i++)
    _mm_storeu_ps(y + (int64_t)(n0 + i) * O + o0,
                  _mm_add_ps(bias, clrt_reduce4_512(acc[i][0], acc[i][1], acc[i][2], acc[i][3])));
}

TARGET static float dot1(const uint16_t *x, const uint16_t *w, int K) {
  __m512 acc = _mm512_setzero_ps();
  int k = 0;
  for (; k + 32 <= K; k += 32) acc = _mm512_dpbf16_ps(acc, LOAD_BH(x + k), LOAD_BH(w + k));
  if (k < K) {
    __mmask32 m = (__mmask32)((1ull << (K - k)) - 1);
    acc = _mm512_dpbf16_ps(acc, LOADM_BH(m, x + k), LOADM_BH(m, w + k));
  }
  return _mm512_reduce_add_ps(acc);
}

/* Every row of y against weight rows o0..o0+3 (a function of its own: clang outlines OpenMP
   regions without the enclosing target attribute, so nothing AVX-512 is inlined into one). */
TARGET static void column4(float *y, const uint16_t *x, const uint16_t *w, const float *b, int N,
                           int K, int O, int o0) {
  for (int n0 = 0; n0 < N; n0 += 4)
    if (N - n0 >= 4)   /* a constant row count: the x loop unrolls */
      block4(y, x, w, b, n0, 4, K, O, o0);
    else
      block4(y, x, w, b, n0, N - n0, K, O, o0);
}

TARGET static void skinny_dp(float *y, const uint16_t *x, const uint16_t *w, const float *b, int N,
                             int K, int O) {
  int blocks = O / 4;
#pragma omp parallel for schedule(static) if ((int64_t)N * O * K > CLRT_OMP_MIN_WORK)
  for (int ob = 0; ob < blocks; ob++) column4(y, x, w, b, N, K, O, 4 * ob);
  for (int o = 4 * blocks; o < O; o++)
    for (int n = 0; n < N; n++)
      y[(int64_t)n * O + o] = (b ? b[o] : 0.0f) + dot1(x + (int64_t)n * K, w + (int64_t)o * K, K);
}
#endif

int clrt_linear_skinny_dpbf16(float *y /* [N, O] */, const uint16_t *x /* [N, K] bf16 */,
                              const uint16_t *w /* [O, K] bf16 */, const float *b /* [O] or NULL */,
                              int N, int K, int O) {
#if CLRT_AVX512
  if (!clrt_have_avx512bf16()) return 0;
  skinny_dp(y, x, w, b, N, K, O);
  return 1;
#else
  (void)y, (void)x, (void)w, (void)b, (void)N, (void)K, (void)O;
  return 0;
#endif
}
