/* gemm_bf16.c — c (+)= a b in bf16 with f32 sums, for the three products of a linear layer
   in bf16 mixed precision (train.precision=bf16, m:set_matmul("bf16")):
     y = x w^T + b   a = x [N, K],     b(k, o) = w[o, k]: the weight's panels (pairs of k)
     dx (+)= dy w    a = dy [N, O],    b(o, k) = w[o, k]: the transposed panels (pairs of o)
     dw += dy^T x    a = dy^T [O, N],  b(n, k) = x[n, k]: x packed per call (pairs of n)
   b is always a set of column panels of bf16 pairs (clrt_pack_pairs): panel p holds columns
   j0 = 48p .. j0 + pw - 1, element (k, j) at bp[j0 Kp + (k / 2) 2 pw + 2 (j - j0) + k % 2],
   Kp the padded length of k (even; zeros past the end). Both units read that layout as it is:
   AMX (gemm_amx.c) as 16 x 64-byte B tiles, AVX512-BF16 by broadcasting a pair of a and
   multiplying 16 columns' pairs per vdpbf16ps (2 multiply-adds a lane). Each panel takes AMX
   when its shape suits (clrt_amx_panel_fits: the shape only), else the AVX512-BF16 tile.
   Every output is its row's sum over k in order within its unit, so a row's bits do not
   depend on the other rows of the product. Without either unit, AVX2 computes vdpbf16ps's
   sums with FMAs (fma-bf16, panels_avx2.c; on aarch64 NEON, panels_neon.c); without that the calls return 0 and the caller
   multiplies in f32. */
#include "model_kernels.h"

#include "bf16.h"
#include "simd512.h"

#include <omp.h>
#include <string.h>

enum { PANEL = 48, TILE_ROWS = 8, MBLOCK = 64 };

void clrt_pack_pairs_part(uint16_t *bp, const float *src, int64_t rs, int64_t cs, int64_t Kc, int Nc, int64_t Kp,
                          int64_t k0, int64_t k1, int j0, int j1) {
  for (int p = j0 / PANEL; p * PANEL < j1; p++) {
    int c0 = p * PANEL, pw = Nc - c0 < PANEL ? Nc - c0 : PANEL;
    int ja = j0 > c0 ? j0 : c0, jb = j1 < c0 + pw ? j1 : c0 + pw;
    uint16_t *panel = bp + (int64_t)c0 * Kp;
    int64_t kend = k1 == Kc ? Kp : k1;   /* the last rows of k also write the padding */
    for (int64_t k = k0; k < kend; k += 2) {
      uint16_t *dst = panel + k * pw + 2 * (int64_t)(ja - c0);
      const float *s0 = src + k * rs, *s1 = s0 + rs;
      int have0 = k < Kc, have1 = k + 1 < Kc;
      for (int j = ja; j < jb; j++, dst += 2) {
        dst[0] = have0 ? clrt_f32_to_bf16(s0[(int64_t)j * cs]) : 0;
        dst[1] = have1 ? clrt_f32_to_bf16(s1[(int64_t)j * cs]) : 0;
      }
    }
  }
}

void clrt_pack_pairs(uint16_t *bp /* [Nc * Kp] */, const float *src /* b(k, j) at src[k rs + j cs] */,
                     int64_t rs, int64_t cs, int64_t Kc, int Nc, int64_t Kp) {
  int panels = (Nc + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static) if ((int64_t)Nc * Kp > CLRT_OMP_MIN_WORK)
  for (int p = 0; p < panels; p++) {
    int j1 = (p + 1) * PANEL < Nc ? (p + 1) * PANEL : Nc;
    clrt_pack_pairs_part(bp, src, rs, cs, Kc, Nc, Kp, 0, Kc, p * PANEL, j1);
  }
}

void clrt_to_bf16_rows(uint16_t *dst /* [M, ldd] */, int64_t ldd, const float *src /* a(i, k) at src[i rs + k cs] */,
                       int64_t rs, int64_t cs, int64_t M, int64_t Kc) {
#pragma omp parallel for schedule(static) if (M * ldd > CLRT_OMP_MIN_WORK)
  for (int64_t i = 0; i < M; i++) {
    uint16_t *d = dst + i * ldd;
    const float *s = src + i * rs;
    int64_t k = 0;
    if (cs == 1)
      for (; k < Kc; k++) d[k] = clrt_f32_to_bf16(s[k]);
    else
      for (; k < Kc; k++) d[k] = clrt_f32_to_bf16(s[k * cs]);
    for (; k < ldd; k++) d[k] = 0;
  }
}

#if CLRT_AVX512
#define TARGET CLRT_TARGET_AVX512BF16

/* The 16-bit elements of chunk ch of a panel pw wide: two per column. */
static inline __mmask32 pair_mask(int ch, int pw) {
  int n = pw - 16 * ch;
  return n >= 16 ? (__mmask32)0xFFFFFFFFu : n > 0 ? (__mmask32)((1u << (2 * n)) - 1) : (__mmask32)0;
}

static inline __mmask16 lane_mask(int ch, int pw) {
  int n = pw - 16 * ch;
  return n >= 16 ? (__mmask16)0xFFFF : n > 0 ? clrt_tail_mask16(n) : (__mmask16)0;
}

/* c[r, 0 .. pw) for the nr (<= 8) rows of a tile against one panel, Kp / 2 pairs of k. */
TARGET static inline __attribute__((always_inline)) void dp_tile(
    float *c, int64_t ldc, const uint16_t *a, int64_t lda, const uint16_t *bp, int nr, int pw,
    int64_t Kp, const float *bias, int add) {
  const __mmask32 h0 = pair_mask(0, pw), h1 = pair_mask(1, pw), h2 = pair_mask(2, pw);
  __m512 acc[TILE_ROWS][3];
  for (int r = 0; r < TILE_ROWS; r++) acc[r][0] = acc[r][1] = acc[r][2] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < Kp / 2; kp++) {
    const uint16_t *bk = bp + kp * 2 * pw;
    __m512bh w0 = (__m512bh)_mm512_maskz_loadu_epi16(h0, bk), w1 = (__m512bh)_mm512_maskz_loadu_epi16(h1, bk + 32),
             w2 = (__m512bh)_mm512_maskz_loadu_epi16(h2, bk + 64);
    for (int r = 0; r < TILE_ROWS; r++) {
      if (r >= nr) break;
      int32_t pair;
      memcpy(&pair, a + (int64_t)r * lda + 2 * kp, sizeof pair);
      __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xb, w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xb, w1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], xb, w2);
    }
  }
  for (int ch = 0; ch < 3; ch++) {
    __mmask16 m = lane_mask(ch, pw);
    if (!m) break;
    __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias + 16 * ch) : _mm512_setzero_ps();
    for (int r = 0; r < nr; r++) {
      float *cr = c + (int64_t)r * ldc + 16 * ch;
      __m512 v = _mm512_add_ps(acc[r][ch], bv);
      if (add) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, cr), v);
      _mm512_mask_storeu_ps(cr, m, v);
    }
  }
}

/* Rows [i0, i1) against panel p: AMX when the panel's shape suits, else the tiles above. */
TARGET static void item(float *c, int64_t ldc, const uint16_t *a, int64_t lda, const uint16_t *bp, int Nc,
                        int64_t Kp, const float *bias, int add, int64_t i0, int64_t i1, int p) {
  int j0 = p * PANEL, pw = Nc - j0 < PANEL ? Nc - j0 : PANEL;
  const uint16_t *panel = bp + (int64_t)j0 * Kp;
  const float *bj = bias ? bias + j0 : NULL;
  if (clrt_amx_panel(c + i0 * ldc + j0, ldc, a + i0 * lda, lda, i1 - i0, panel, pw, Kp, bj, add)) return;
  for (int64_t i = i0; i < i1; i += TILE_ROWS) {
    int nr = i1 - i < TILE_ROWS ? (int)(i1 - i) : TILE_ROWS;
    float *ct = c + i * ldc + j0;
    const uint16_t *at = a + i * lda;
    if (nr == TILE_ROWS && pw == PANEL)
      dp_tile(ct, ldc, at, lda, panel, TILE_ROWS, PANEL, Kp, bj, add);
    else
      dp_tile(ct, ldc, at, lda, panel, nr, pw, Kp, bj, add);
  }
}
#endif

#if CLRT_AVX512
/* Rows [i0, i1) against panel p on AVX2's FMAs (fma-bf16: panels_avx2.c, vdpbf16ps's sums). */
static void item_fma(float *c, int64_t ldc, const uint16_t *a, int64_t lda, const uint16_t *bp, int Nc, int64_t Kp,
                     const float *bias, int add, int64_t i0, int64_t i1, int p) {
  int j0 = p * PANEL, pw = Nc - j0 < PANEL ? Nc - j0 : PANEL;
  clrt_avx2_panel_bf16(c + i0 * ldc + j0, ldc, a + i0 * lda, lda, i1 - i0, bp + (int64_t)j0 * Kp, pw, Kp,
                       bias ? bias + j0 : NULL, add);
}
#endif

int clrt_gemm_bf16(float *c /* [M, ldc] */, int64_t ldc, const uint16_t *a /* [M, lda] bf16, Kp used */, int64_t lda,
                   int64_t M, const uint16_t *bp /* [Nc * Kp] pair panels */, int Nc, int64_t Kp,
                   const float *bias /* [Nc] or NULL */, int accumulate) {
#if CLRT_AVX512
  int unit = clrt_matrix_unit();
  if (M < 1 || Nc < 1 || Kp < 2 || Kp % 2 || unit == CLRT_UNIT_F32) return 0;
  int64_t panels = (Nc + PANEL - 1) / PANEL, mblocks = (M + MBLOCK - 1) / MBLOCK, items = panels * mblocks;
  /* a thread's items run along the panels of one row block: its rows of a stay in cache */
#pragma omp parallel for schedule(static) if (M * Nc * Kp > CLRT_OMP_MIN_WORK)
  for (int64_t t = 0; t < items; t++) {
    int64_t mb = t / panels, i0 = mb * MBLOCK, i1 = M - i0 < MBLOCK ? M : i0 + MBLOCK;
    if (unit == CLRT_UNIT_FMA_BF16)
      item_fma(c, ldc, a, lda, bp, Nc, Kp, bias, accumulate, i0, i1, (int)(t % panels));
    else
      item(c, ldc, a, lda, bp, Nc, Kp, bias, accumulate, i0, i1, (int)(t % panels));
  }
  return 1;
#elif CLRT_NEON
  /* aarch64: fma-bf16 on NEON's FMAs (panels_neon.c, the same sums), the same items */
  if (M < 1 || Nc < 1 || Kp < 2 || Kp % 2 || clrt_matrix_unit() == CLRT_UNIT_F32) return 0;
  int64_t panels = (Nc + PANEL - 1) / PANEL, mblocks = (M + MBLOCK - 1) / MBLOCK, items = panels * mblocks;
#pragma omp parallel for schedule(static) if (M * Nc * Kp > CLRT_OMP_MIN_WORK)
  for (int64_t t = 0; t < items; t++) {
    int64_t mb = t / panels, i0 = mb * MBLOCK, i1 = M - i0 < MBLOCK ? M : i0 + MBLOCK;
    int j0 = (int)(t % panels) * PANEL, pw = Nc - j0 < PANEL ? Nc - j0 : PANEL;
    clrt_neon_panel_bf16(c + i0 * ldc + j0, ldc, a + i0 * lda, lda, i1 - i0, bp + (int64_t)j0 * Kp, pw, Kp,
                         bias ? bias + j0 : NULL, accumulate);
  }
  return 1;
#else
  (void)c, (void)ldc, (void)a, (void)lda, (void)M, (void)bp, (void)Nc, (void)Kp, (void)bias, (void)accumulate;
  return 0;
#endif
}
