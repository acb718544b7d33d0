/* panels_avx2.c — the packed products on AVX2 + FMA (CPUs without AVX-512: Zen 2/3, Intel
   before Ice Lake, most cloud VMs of their generation), over the same panels the AVX-512
   kernels read (linear_packed.c, gemm_bf16.c), so no copy is laid out twice:
     f32   panel of pw <= 48 outputs, wp[k * pw + j] (clrt_linear_pack);
     bf16  panel of pairs of k, bp[(k / 2) * 2 pw + 2 j + k % 2] (clrt_pack_pairs), with the
           rows of a already rounded to bf16.
   f32: every output is one sum over k in order, c = fma(a_k, w_k, c) from 0, the bias added at
   the end — the AVX-512 tile's order, so the two levels give the same bits, and a row's bits
   never depend on the other rows or the tile it lands in (batch invariance, the prefix cache).
   bf16: the CPU has no bf16 unit, so each pair is two FMAs into the output's one f32 sum, the
   odd element first: vdpbf16ps's order (Intel SDM, VDPBF16PS: srcdest += a[2i+1] b[2i+1], then
   += a[2i] b[2i], each rounded to nearest even). A product of two bf16 values is exact in f32,
   so each FMA rounds exactly where that instruction does; only its flushing of denormal inputs
   and outputs to zero differs (a weight or activation below 1.2e-38 in magnitude).
   Tiles: 6 rows by 16 outputs for f32 (12 sums, 2 weight vectors, 1 broadcast: 15 of the 16
   registers), 4 rows by 16 for bf16 (each 16 outputs' pairs widen into 4 vectors); one row
   runs a whole panel's 48 outputs (6 independent sums) so a decode step does not wait on the
   FMA latency. The same f32 tiles read b in place through strides for gemm_strided.c's
   training products (clrt_avx2_tile_strided), again in the AVX-512 tiles' order. */
#include "model_kernels.h"
#include "simd512.h"

#include <string.h>

enum { PANEL = 48, ROWS_F32 = 6, ROWS_BF16 = 4 };

#if CLRT_AVX2
/* The packed products add their bias or these zeros, as the AVX-512 tiles do (a sum of -0
   then stores +0); the strided tiles add nothing, as theirs. */
static const float zero_bias[PANEL];

#define TARGET CLRT_TARGET_AVX2

/* The first n (0..8) lanes. */
TARGET static inline __m256i lanes(int n) {
  n = n < 0 ? 0 : n > 8 ? 8 : n;
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* c[r, 0..n) (+)= acc[r] + bias[0..n) for the nr rows, n <= 16 outputs in two halves. */
TARGET static inline __attribute__((always_inline)) void store16(float *c, int64_t ldc, __m256 acc[][2], int nr,
                                                                 int n, const float *bias, int add) {
  __m256i m0 = lanes(n), m1 = lanes(n - 8);
  int full = n == 16;
  __m256 b0 = _mm256_setzero_ps(), b1 = b0;
  if (bias) {
    b0 = full ? _mm256_loadu_ps(bias) : _mm256_maskload_ps(bias, m0);
    b1 = full ? _mm256_loadu_ps(bias + 8) : _mm256_maskload_ps(bias + 8, m1);
  }
  for (int r = 0; r < nr; r++) {
    float *cr = c + r * ldc;
    __m256 v0 = _mm256_add_ps(acc[r][0], b0), v1 = _mm256_add_ps(acc[r][1], b1);
    if (full) {
      if (add) v0 = _mm256_add_ps(_mm256_loadu_ps(cr), v0), v1 = _mm256_add_ps(_mm256_loadu_ps(cr + 8), v1);
      _mm256_storeu_ps(cr, v0);
      _mm256_storeu_ps(cr + 8, v1);
    } else {
      if (add) v0 = _mm256_add_ps(_mm256_maskload_ps(cr, m0), v0), v1 = _mm256_add_ps(_mm256_maskload_ps(cr + 8, m1), v1);
      _mm256_maskstore_ps(cr, m0, v0);
      _mm256_maskstore_ps(cr + 8, m1, v1);
    }
  }
}

/* f32: c[r, 0..n) (+)= sum over k < kn of a(r, k) b[k, 0..n) (+ bias) for nr (<= 6) rows of
   a, a(r, k) at a[r a_rs + k a_ks], b's rows ldb apart, n <= 16 outputs. */
TARGET static inline __attribute__((always_inline)) void tile_f32(float *c, int64_t ldc, const float *a, int64_t a_rs,
                                                                  int64_t a_ks, const float *b, int64_t ldb, int n,
                                                                  int kn, const float *bias, int add, const int nr) {
  __m256 acc[ROWS_F32][2];
  for (int r = 0; r < ROWS_F32; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const __m256i m0 = lanes(n), m1 = lanes(n - 8);
  const int full = n == 16;
  for (int k = 0; k < kn; k++) {
    const float *bk = b + (int64_t)k * ldb, *ak = a + (int64_t)k * a_ks;
    __m256 w0 = full ? _mm256_loadu_ps(bk) : _mm256_maskload_ps(bk, m0);
    __m256 w1 = full ? _mm256_loadu_ps(bk + 8) : _mm256_maskload_ps(bk + 8, m1);
    for (int r = 0; r < nr; r++) {
      __m256 xb = _mm256_broadcast_ss(ak + r * a_rs);
      acc[r][0] = _mm256_fmadd_ps(xb, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(xb, w1, acc[r][1]);
    }
  }
  store16(c, ldc, acc, nr, n, bias, add);
}

/* f32, one row against a whole panel of 48 (six sums in flight). */
TARGET static void row_f32(float *c, const float *a, const float *wp, int K, const float *bias, int add) {
  __m256 acc[6];
  for (int i = 0; i < 6; i++) acc[i] = _mm256_setzero_ps();
  for (int k = 0; k < K; k++) {
    __m256 xb = _mm256_broadcast_ss(a + k);
    const float *wk = wp + (int64_t)k * PANEL;
    for (int i = 0; i < 6; i++) acc[i] = _mm256_fmadd_ps(xb, _mm256_loadu_ps(wk + 8 * i), acc[i]);
  }
  for (int i = 0; i < 6; i++) {
    __m256 v = _mm256_add_ps(acc[i], bias ? _mm256_loadu_ps(bias + 8 * i) : _mm256_setzero_ps());
    if (add) v = _mm256_add_ps(_mm256_loadu_ps(c + 8 * i), v);
    _mm256_storeu_ps(c + 8 * i, v);
  }
}

/* A constant row count for each tile (the row loop unrolls); bf16 tiles stop at 4. */
#define ROWS_DISPATCH_4(ROWS, CALL) \
  switch (ROWS) {                   \
    case 4: CALL(4); break;         \
    case 3: CALL(3); break;         \
    case 2: CALL(2); break;         \
    default: CALL(1); break;        \
  }
#define ROWS_DISPATCH(ROWS, CALL)                  \
  switch (ROWS) {                                  \
    case 6: CALL(6); break;                        \
    case 5: CALL(5); break;                        \
    default: ROWS_DISPATCH_4(ROWS, CALL) break;    \
  }

/* c[i, 0..pw) (+)= a(i, .) b (+ bias) for rows [0, M): the tiles over b's pw (<= 48) columns;
   one row against a full packed panel (b's rows 48 apart) takes row_f32. */
TARGET static void rows_f32(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_ks, int64_t M,
                            const float *b, int64_t ldb, int pw, int kn, const float *bias, int add) {
  for (int64_t i = 0; i < M;) {
    int nr = M - i < ROWS_F32 ? (int)(M - i) : ROWS_F32;
    float *ci = c + i * ldc;
    const float *ai = a + i * a_rs;
    if (nr == 1 && pw == PANEL && ldb == PANEL && a_ks == 1) {
      row_f32(ci, ai, b, kn, bias, add);
    } else {
      for (int j0 = 0; j0 < pw; j0 += 16) {
        int n = pw - j0 < 16 ? pw - j0 : 16;
#define F32_TILE(R) tile_f32(ci + j0, ldc, ai, a_rs, a_ks, b + j0, ldb, n, kn, bias ? bias + j0 : NULL, add, R)
        ROWS_DISPATCH(nr, F32_TILE)
#undef F32_TILE
      }
    }
    i += nr;
  }
}

/* The even (low) and odd (high) bf16 of each 32-bit lane, widened to f32. */
TARGET static inline __m256 even_f32(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
TARGET static inline __m256 odd_f32(__m256i v) {
  return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xFFFF0000u)));
}

/* bf16: nr (<= 4) rows of a (bf16) against outputs j0 .. j0 + n (n <= 16) of a pair panel pw
   wide, Kp / 2 pairs. Each 8 outputs' pairs are 8 32-bit lanes; a masked load keeps the lanes
   of the outputs past n at zero. */
TARGET static inline __attribute__((always_inline)) void tile_bf16(float *c, int64_t ldc, const uint16_t *a,
                                                                   int64_t lda, const uint16_t *bp, int pw, int j0,
                                                                   int n, int64_t Kp, const float *bias, int add,
                                                                   const int nr) {
  __m256 acc[ROWS_BF16][2];
  for (int r = 0; r < ROWS_BF16; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const __m256i m0 = lanes(n), m1 = lanes(n - 8);
  const int full = n == 16;
  for (int64_t kp = 0; kp < Kp / 2; kp++) {
    const int *wk = (const int *)(bp + kp * 2 * pw + 2 * j0);
    __m256i v0 = full ? _mm256_loadu_si256((const __m256i *)wk) : _mm256_maskload_epi32(wk, m0);
    __m256i v1 = full ? _mm256_loadu_si256((const __m256i *)(wk + 8)) : _mm256_maskload_epi32(wk + 8, m1);
    __m256 e0 = even_f32(v0), o0 = odd_f32(v0), e1 = even_f32(v1), o1 = odd_f32(v1);
    for (int r = 0; r < nr; r++) {
      /* the pair broadcast as one 32-bit lane, split into its two bf16 as the weights are */
      int32_t pair;
      memcpy(&pair, a + r * lda + 2 * kp, sizeof pair);
      __m256i xp = _mm256_set1_epi32(pair);
      __m256 xe = even_f32(xp), xo = odd_f32(xp);
      acc[r][0] = _mm256_fmadd_ps(xe, e0, _mm256_fmadd_ps(xo, o0, acc[r][0]));
      acc[r][1] = _mm256_fmadd_ps(xe, e1, _mm256_fmadd_ps(xo, o1, acc[r][1]));
    }
  }
  store16(c + j0, ldc, acc, nr, n, bias ? bias + j0 : NULL, add);
}

/* bf16, one row against a whole pair panel of 48 outputs: six sums in flight (each still its
   own chain, odd then even per pair), where the 16-output tile keeps two and waits on the FMA
   latency at every pair (a decode step of one sequence). */
TARGET static void row_bf16(float *c, const uint16_t *a, const uint16_t *bp, int64_t Kp, const float *bias, int add) {
  __m256 acc[6];
  for (int i = 0; i < 6; i++) acc[i] = _mm256_setzero_ps();
  for (int64_t kp = 0; kp < Kp / 2; kp++) {
    int32_t pair;
    memcpy(&pair, a + 2 * kp, sizeof pair);
    __m256i xp = _mm256_set1_epi32(pair);
    __m256 xe = even_f32(xp), xo = odd_f32(xp);
    const __m256i *wk = (const __m256i *)(bp + kp * 2 * PANEL);
    for (int i = 0; i < 6; i++) {
      __m256i v = _mm256_loadu_si256(wk + i);
      acc[i] = _mm256_fmadd_ps(xe, even_f32(v), _mm256_fmadd_ps(xo, odd_f32(v), acc[i]));
    }
  }
  for (int i = 0; i < 6; i++) {
    __m256 v = _mm256_add_ps(acc[i], _mm256_loadu_ps(bias + 8 * i));
    if (add) v = _mm256_add_ps(_mm256_loadu_ps(c + 8 * i), v);
    _mm256_storeu_ps(c + 8 * i, v);
  }
}

TARGET static void panel_bf16(float *c, int64_t ldc, const uint16_t *a, int64_t lda, int64_t M, const uint16_t *bp,
                              int pw, int64_t Kp, const float *bias, int add) {
  if (M == 1 && pw == PANEL) {
    row_bf16(c, a, bp, Kp, bias, add);
    return;
  }
  for (int64_t i = 0; i < M;) {
    int nr = M - i < ROWS_BF16 ? (int)(M - i) : ROWS_BF16;
    for (int j0 = 0; j0 < pw; j0 += 16) {
      int n = pw - j0 < 16 ? pw - j0 : 16;
#define BF16_TILE(R) tile_bf16(c + i * ldc, ldc, a + i * lda, lda, bp, pw, j0, n, Kp, bias, add, R)
      ROWS_DISPATCH_4(nr, BF16_TILE)
#undef BF16_TILE
    }
    i += nr;
  }
}
#endif

int clrt_avx2_panel_f32(float *c /* [M, ldc] at the panel's first output */, int64_t ldc,
                        const float *a /* [M, lda] */, int64_t lda, int64_t M,
                        const float *wp /* [K, pw] */, int pw, int K, const float *bias /* [pw] or NULL */,
                        int add) {
#if CLRT_AVX2
  if (!clrt_have_avx2() || pw < 1 || pw > PANEL) return 0;
  rows_f32(c, ldc, a, lda, 1, M, wp, pw, pw, K, bias ? bias : zero_bias, add);
  return 1;
#else
  (void)c, (void)ldc, (void)a, (void)lda, (void)M, (void)wp, (void)pw, (void)K, (void)bias, (void)add;
  return 0;
#endif
}

int clrt_avx2_panel_bf16(float *c /* [M, ldc] at the panel's first output */, int64_t ldc,
                         const uint16_t *a /* [M, lda] bf16 */, int64_t lda, int64_t M,
                         const uint16_t *bp /* [Kp / 2, pw, 2] bf16 */, int pw, int64_t Kp,
                         const float *bias /* [pw] or NULL */, int add) {
#if CLRT_AVX2
  if (!clrt_have_avx2() || pw < 1 || pw > PANEL || Kp % 2) return 0;
  panel_bf16(c, ldc, a, lda, M, bp, pw, Kp, bias ? bias : zero_bias, add);
  return 1;
#else
  (void)c, (void)ldc, (void)a, (void)lda, (void)M, (void)bp, (void)pw, (void)Kp, (void)bias, (void)add;
  return 0;
#endif
}

int clrt_avx2_tile_strided(float *c /* [nr, ldc] */, int64_t ldc, const float *a, int64_t a_rs, int64_t a_ks,
                           const float *b /* [kn, ldb] */, int64_t ldb, int nr, int kn, int pw, int add) {
#if CLRT_AVX2
  if (!clrt_have_avx2() || pw < 1 || pw > PANEL) return 0;
  rows_f32(c, ldc, a, a_rs, a_ks, nr, b, ldb, pw, kn, NULL, add);
  return 1;
#else
  (void)c, (void)ldc, (void)a, (void)a_rs, (void)a_ks, (void)b, (void)ldb, (void)nr, (void)kn, (void)pw, (void)add;
  return 0;
#endif
}
