/* panels_neon.c — the packed products on Armv8 Advanced SIMD (NEON: every aarch64 CPU), over
   the panels the x86 kernels read (linear_packed.c, gemm_bf16.c, gemm_strided.c), in the
   order panels_avx2.c keeps, so each level gives the bits of the scalar references in
   tests/c/test_cpu_levels.c:
     f32   panel of pw <= 48 outputs, wp[k * pw + j]: every output one sum over k in order,
           c = fma(a_k, w_k, c) from 0 (vfmaq_f32 is a fused multiply-add, one rounding, as
           vfmadd231ps), then + bias or + 0 (a sum of -0 stores +0, as on x86), then onto c
           when adding;
     bf16  panel of pairs of k, bp[(k / 2) * 2 pw + 2 j + k % 2], the rows of a already in
           bf16: each pair is two FMAs into the output's one f32 sum, the odd element first,
           then the even (vdpbf16ps's order: the fma-bf16 unit's numerics). The weights are
           widened in registers (a bf16 is the top half of an f32: shift or mask), so a
           product of two bf16 values is exact and each FMA rounds once. Armv8.6's BFDOT/BFMMLA
           are not used: they do not round each step as an FMA does.
     strided  gemm_strided.c's tile: the f32 order above over b read in place through
           strides, nothing added at the end.
   Tiles: 6 rows by 16 outputs for f32 (24 sums, 4 weight vectors, 1 broadcast: 29 of the 32
   vector registers), 4 rows by 16 for bf16 (16 sums, each 4 outputs' pairs widen into an even
   and an odd vector); one row runs a whole panel's 48 outputs (12 independent sums). A tile
   narrower than 16 outputs goes through zero-filled copies for its last partial vector; the
   order of each output's sum is the same in every case. */
#include "model_kernels.h"
#include "simd512.h"

#include <string.h>

#if CLRT_NEON
enum { PANEL = 48, ROWS_F32 = 6, ROWS_BF16 = 4 };

/* The packed products add their bias or these zeros (see the header comment). */
static const float zero_bias[PANEL];

/* The first n floats at p (n >= 4: a whole vector), zeros past them. */
static inline float32x4_t load_n(const float *p, int n) {
  if (n >= 4) return vld1q_f32(p);
  float t[4] = {0, 0, 0, 0};
  for (int i = 0; i < n; i++) t[i] = p[i];
  return vld1q_f32(t);
}

static inline void store_n(float *p, float32x4_t v, int n) {
  if (n >= 4) {
    vst1q_f32(p, v);
    return;
  }
  float t[4];
  vst1q_f32(t, v);
  for (int i = 0; i < n; i++) p[i] = t[i];
}

/* c[r, 0..n) (+)= acc[r] + bias[0..n) (bias NULL: nothing added before c) for nr rows. */
static inline __attribute__((always_inline)) void store16(float *c, int64_t ldc, float32x4_t acc[][4], int nr, int n,
                                                          const float *bias, int add) {
  for (int v = 0; v < 4; v++) {
    int m = n - 4 * v;
    if (m <= 0) break;
    float32x4_t bv = bias ? load_n(bias + 4 * v, m) : vdupq_n_f32(0);
    for (int r = 0; r < nr; r++) {
      float *cr = c + r * ldc + 4 * v;
      float32x4_t s = bias ? vaddq_f32(acc[r][v], bv) : acc[r][v];
      if (add) s = vaddq_f32(load_n(cr, m), s);
      store_n(cr, s, m);
    }
  }
}

/* f32: c[r, 0..n) (+)= sum over k < kn of a(r, k) b[k, 0..n) (+ bias) for nr (<= 6) rows of
   a, a(r, k) at a[r a_rs + k a_ks], b's rows ldb apart, n <= 16 outputs. */
static inline __attribute__((always_inline)) void tile_f32(float *c, int64_t ldc, const float *a, int64_t a_rs,
                                                           int64_t a_ks, const float *b, int64_t ldb, int n, int kn,
                                                           const float *bias, int add, const int nr) {
  float32x4_t acc[ROWS_F32][4];
  for (int r = 0; r < ROWS_F32; r++)
    for (int v = 0; v < 4; v++) acc[r][v] = vdupq_n_f32(0);
  if (n == 16) {
    for (int k = 0; k < kn; k++) {
      const float *bk = b + (int64_t)k * ldb, *ak = a + (int64_t)k * a_ks;
      float32x4_t w0 = vld1q_f32(bk), w1 = vld1q_f32(bk + 4), w2 = vld1q_f32(bk + 8), w3 = vld1q_f32(bk + 12);
      for (int r = 0; r < nr; r++) {
        float32x4_t xb = vld1q_dup_f32(ak + r * a_rs);
        acc[r][0] = vfmaq_f32(acc[r][0], xb, w0);
        acc[r][1] = vfmaq_f32(acc[r][1], xb, w1);
        acc[r][2] = vfmaq_f32(acc[r][2], xb, w2);
        acc[r][3] = vfmaq_f32(acc[r][3], xb, w3);
      }
    }
  } else {
    const int nv = (n + 3) / 4;
    for (int k = 0; k < kn; k++) {
      const float *bk = b + (int64_t)k * ldb, *ak = a + (int64_t)k * a_ks;
      float32x4_t w[4];
      for (int v = 0; v < nv; v++) w[v] = load_n(bk + 4 * v, n - 4 * v);
      for (int r = 0; r < nr; r++) {
        float32x4_t xb = vld1q_dup_f32(ak + r * a_rs);
        for (int v = 0; v < nv; v++) acc[r][v] = vfmaq_f32(acc[r][v], xb, w[v]);
      }
    }
  }
  store16(c, ldc, acc, nr, n, bias, add);
}

/* f32, one row against a whole panel of 48 (twelve sums in flight). */
static void row_f32(float *c, const float *a, const float *wp, int K, const float *bias, int add) {
  float32x4_t acc[12];
  for (int i = 0; i < 12; i++) acc[i] = vdupq_n_f32(0);
  for (int k = 0; k < K; k++) {
    float32x4_t xb = vld1q_dup_f32(a + k);
    const float *wk = wp + (int64_t)k * PANEL;
    for (int i = 0; i < 12; i++) acc[i] = vfmaq_f32(acc[i], xb, vld1q_f32(wk + 4 * i));
  }
  for (int i = 0; i < 12; i++) {
    float32x4_t v = vaddq_f32(acc[i], vld1q_f32(bias + 4 * i));
    if (add) v = vaddq_f32(vld1q_f32(c + 4 * i), v);
    vst1q_f32(c + 4 * i, v);
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
#define ROWS_DISPATCH(ROWS, CALL)               \
  switch (ROWS) {                               \
    case 6: CALL(6); break;                     \
    case 5: CALL(5); break;                     \
    default: ROWS_DISPATCH_4(ROWS, CALL) break; \
  }

/* c[i, 0..pw) (+)= a(i, .) b (+ bias) for rows [0, M): tiles over b's pw (<= 48) columns; one
   row against a full packed panel (b's rows 48 apart, bias given) takes row_f32. */
static void rows_f32(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_ks, int64_t M, const float *b,
                     int64_t ldb, int pw, int kn, const float *bias, int add) {
  for (int64_t i = 0; i < M;) {
    int nr = M - i < ROWS_F32 ? (int)(M - i) : ROWS_F32;
    float *ci = c + i * ldc;
    const float *ai = a + i * a_rs;
    if (nr == 1 && pw == PANEL && ldb == PANEL && a_ks == 1 && bias) {
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
static inline float32x4_t even_f32(uint32x4_t v) { return vreinterpretq_f32_u32(vshlq_n_u32(v, 16)); }
static inline float32x4_t odd_f32(uint32x4_t v) { return vreinterpretq_f32_u32(vandq_u32(v, vdupq_n_u32(0xFFFF0000u))); }

static inline float bf16_at(const uint16_t *p) {
  uint32_t u = (uint32_t)*p << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* The pairs of the first n outputs at p (n >= 4: a whole vector), zeros past them. */
static inline uint32x4_t load_pairs(const uint16_t *p, int n) {
  uint32_t t[4] = {0, 0, 0, 0};
  if (n >= 4) {
    memcpy(t, p, sizeof t);
  } else {
    memcpy(t, p, sizeof(uint32_t) * (size_t)n);
  }
  return vld1q_u32(t);
}

/* bf16: nr (<= 4) rows of a (bf16) against outputs j0 .. j0 + n (n <= 16) of a pair panel pw
   wide, Kp / 2 pairs. Each 4 outputs' pairs are 4 32-bit lanes. */
static inline __attribute__((always_inline)) void tile_bf16(float *c, int64_t ldc, const uint16_t *a, int64_t lda,
                                                            const uint16_t *bp, int pw, int j0, int n, int64_t Kp,
                                                            const float *bias, int add, const int nr) {
  float32x4_t acc[ROWS_BF16][4];
  for (int r = 0; r < ROWS_BF16; r++)
    for (int v = 0; v < 4; v++) acc[r][v] = vdupq_n_f32(0);
  const int nv = (n + 3) / 4, full = n == 16;
  for (int64_t kp = 0; kp < Kp / 2; kp++) {
    const uint16_t *wk = bp + kp * 2 * pw + 2 * j0;
    float32x4_t e[4], o[4];
    for (int v = 0; v < 4; v++) e[v] = o[v] = vdupq_n_f32(0);   /* the lanes past n stay 0 */
    for (int v = 0; v < 4; v++) {
      if (!full && v >= nv) break;
      uint32x4_t u = full ? vreinterpretq_u32_u16(vld1q_u16(wk + 8 * v)) : load_pairs(wk + 8 * v, n - 4 * v);
      e[v] = even_f32(u), o[v] = odd_f32(u);
    }
    for (int r = 0; r < nr; r++) {
      const uint16_t *ar = a + r * lda + 2 * kp;
      float32x4_t xe = vdupq_n_f32(bf16_at(ar)), xo = vdupq_n_f32(bf16_at(ar + 1));
      for (int v = 0; v < 4; v++) {
        if (!full && v >= nv) break;
        acc[r][v] = vfmaq_f32(vfmaq_f32(acc[r][v], xo, o[v]), xe, e[v]);
      }
    }
  }
  store16(c + j0, ldc, acc, nr, n, bias + j0, add);
}

static void panel_bf16(float *c, int64_t ldc, const uint16_t *a, int64_t lda, int64_t M, const uint16_t *bp, int pw,
                       int64_t Kp, const float *bias, int add) {
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

int clrt_neon_panel_f32(float *c /* [M, ldc] at the panel's first output */, int64_t ldc,
                        const float *a /* [M, lda] */, int64_t lda, int64_t M, const float *wp /* [K, pw] */, int pw,
                        int K, const float *bias /* [pw] or NULL */, int add) {
#if CLRT_NEON
  if (!clrt_have_neon() || pw < 1 || pw > PANEL) return 0;
  rows_f32(c, ldc, a, lda, 1, M, wp, pw, pw, K, bias ? bias : zero_bias, add);
  return 1;
#else
  (void)c, (void)ldc, (void)a, (void)lda, (void)M, (void)wp, (void)pw, (void)K, (void)bias, (void)add;
  return 0;
#endif
}

int clrt_neon_panel_bf16(float *c /* [M, ldc] at the panel's first output */, int64_t ldc,
                         const uint16_t *a /* [M, lda] bf16 */, int64_t lda, int64_t M,
                         const uint16_t *bp /* [Kp / 2, pw, 2] bf16 */, int pw, int64_t Kp,
                         const float *bias /* [pw] or NULL */, int add) {
#if CLRT_NEON
  if (!clrt_have_neon() || pw < 1 || pw > PANEL || Kp % 2) return 0;
  panel_bf16(c, ldc, a, lda, M, bp, pw, Kp, bias ? bias : zero_bias, add);
  return 1;
#else
  (void)c, (void)ldc, (void)a, (void)lda, (void)M, (void)bp, (void)pw, (void)Kp, (void)bias, (void)add;
  return 0;
#endif
}

int clrt_neon_tile_strided(float *c /* [nr, ldc] */, int64_t ldc, const float *a, int64_t a_rs, int64_t a_ks,
                           const float *b /* [kn, ldb] */, int64_t ldb, int nr, int kn, int pw, int add) {
#if CLRT_NEON
  if (!clrt_have_neon() || pw < 1 || pw > PANEL) return 0;
  rows_f32(c, ldc, a, a_rs, a_ks, nr, b, ldb, pw, kn, NULL, add);
  return 1;
#else
  (void)c, (void)ldc, (void)a, (void)a_rs, (void)a_ks, (void)b, (void)ldb, (void)nr, (void)kn, (void)pw, (void)add;
  return 0;
#endif
}
