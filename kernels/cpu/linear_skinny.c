/* linear_skinny.c — y = x w^T + b for few rows (a decode step: one row per sequence).
   OpenBLAS packs the whole weight matrix on every sgemm call, which for N = 1..32 rows costs
   more than the product itself: a decode step is memory-bound and packing doubles the bytes
   it moves. This kernel reads each weight row once, straight from the model, and dots it
   with every x row while it is in L1. Each output is one dot product over K, accumulated in
   16 lanes and reduced at the end (a different summation order from sgemm's, so results
   agree to rounding, not bit for bit).
   AVX-512 only, chosen at run time (the build targets x86-64-v2); elsewhere the caller
   falls back to sgemm. */
#include "model_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SKINNY_AVX512 1
#define TARGET __attribute__((target("avx512f,avx512dq")))
#else
#define SKINNY_AVX512 0
#endif

#if SKINNY_AVX512

/* Four 16-lane sums a, b, c, d -> {sum a, sum b, sum c, sum d}. */
TARGET static inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
  __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
  __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
  __m256 ab = _mm256_hadd_ps(a8, b8), cd = _mm256_hadd_ps(c8, d8);
  __m256 abcd = _mm256_hadd_ps(ab, cd);   /* lanes: a b c d (low half) | a b c d (high) */
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* y[n, o0..o0+3] for rows n0..n0+nr-1 (nr <= 4) of x against weight rows o0..o0+3. */
TARGET static void block4(float *y, const float *x, const float *w, const float *b, int n0, int nr,
                          int K, int O, int o0) {
  __m512 acc[4][4];
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
  const float *w0 = w + (int64_t)o0 * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
  const float *xr[4];
  for (int i = 0; i < 4; i++) xr[i] = x + (int64_t)(n0 + (i < nr ? i : 0)) * K;
  int k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 v0 = _mm512_loadu_ps(w0 + k), v1 = _mm512_loadu_ps(w1 + k), v2 = _mm512_loadu_ps(w2 + k),
           v3 = _mm512_loadu_ps(w3 + k);
    for (int i = 0; i < 4; i++) {
      if (i >= nr) break;
      __m512 xv = _mm512_loadu_ps(xr[i] + k);
      acc[i][0] = _mm512_fmadd_ps(xv, v0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(xv, v1, acc[i][1]);
      acc[i][2] = _mm512_fmadd_ps(xv, v2, acc[i][2]);
      acc[i][3] = _mm512_fmadd_ps(xv, v3, acc[i][3]);
    }
  }
  if (k < K) {
    __mmask16 mk = (__mmask16)((1u << (K - k)) - 1);
    __m512 v0 = _mm512_maskz_loadu_ps(mk, w0 + k), v1 = _mm512_maskz_loadu_ps(mk, w1 + k),
           v2 = _mm512_maskz_loadu_ps(mk, w2 + k), v3 = _mm512_maskz_loadu_ps(mk, w3 + k);
    for (int i = 0; i < nr; i++) {
      __m512 xv = _mm512_maskz_loadu_ps(mk, xr[i] + k);
      acc[i][0] = _mm512_fmadd_ps(xv, v0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(xv, v1, acc[i][1]);
      acc[i][2] = _mm512_fmadd_ps(xv, v2, acc[i][2]);
      acc[i][3] = _mm512_fmadd_ps(xv, v3, acc[i][3]);
    }
  }
  __m128 bias = b ? _mm_loadu_ps(b + o0) : _mm_setzero_ps();
  for (int i = 0; i < nr; i++)
    _mm_storeu_ps(y + (int64_t)(n0 + i) * O + o0,
                  _mm_add_ps(bias, reduce4(acc[i][0], acc[i][1], acc[i][2], acc[i][3])));
}

/* One weight row o against rows n of x (the O % 4 leftovers). */
TARGET static float dot1(const float *x, const float *w, int K) {
  __m512 acc = _mm512_setzero_ps();
  int k = 0;
  for (; k + 16 <= K; k += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), _mm512_loadu_ps(w + k), acc);
  if (k < K) {
    __mmask16 mk = (__mmask16)((1u << (K - k)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, x + k), _mm512_maskz_loadu_ps(mk, w + k), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

TARGET static void skinny_avx512(float *y, const float *x, const float *w, const float *b, int N, int K,
                                 int O) {
  int blocks = O / 4;
  /* Threads split the weight rows: each reads its share of w once. */
#pragma omp parallel for schedule(static) if ((int64_t)N * O * K > 8 * CLRT_OMP_MIN_WORK)
  for (int ob = 0; ob < blocks; ob++)
    for (int n0 = 0; n0 < N; n0 += 4) block4(y, x, w, b, n0, N - n0 < 4 ? N - n0 : 4, K, O, 4 * ob);
  for (int o = 4 * blocks; o < O; o++)
    for (int n = 0; n < N; n++)
      y[(int64_t)n * O + o] = (b ? b[o] : 0.0f) + dot1(x + (int64_t)n * K, w + (int64_t)o * K, K);
}

static int have_avx512(void) {
  static int known = -1;
  if (known < 0) {
    __builtin_cpu_init();
    known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  }
  return known;
}
#endif

int clrt_linear_skinny_forward(float *y /* [N, O] */, const float *x /* [N, K] */,
                               const float *w /* [O, K] */, const float *b /* [O] or NULL */,
                               int64_t N, int K, int O) {
#if SKINNY_AVX512
  if (N < 1 || N > CLRT_SKINNY_MAX_ROWS || !have_avx512()) return 0;
  skinny_avx512(y, x, w, b, (int)N, K, O);
  return 1;
#else
  (void)y, (void)x, (void)w, (void)b, (void)N, (void)K, (void)O;
  return 0;
#endif
}
