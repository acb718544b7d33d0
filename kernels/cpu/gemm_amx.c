/* gemm_amx.c — one column panel of a bf16 product through AMX tiles (Intel since Sapphire
   Rapids): c[r, 0 .. pw) (+)= sum over k of a[r, k] b(k, j), f32 sums, for every row of a.
   b is a panel of bf16 pairs of k (gemm_bf16.c's layout, linear_packed.c's for weights):
   element (k, j) at bp[(k / 2) 2 pw + 2 j + k % 2]. Sixteen pairs of k of 16 columns are then
   16 rows of 64 bytes, 4 pw bytes apart: exactly a B tile of TDPBF16PS, read in place, so the
   one bf16 copy of the weights serves AMX and AVX512-BF16 alike.
   Tiles: 0-2 the sums of up to 48 columns (16 rows x 16 f32 each), 3 the rows' 32 values of
   k (16 rows x 32 bf16), 4-6 the panel's three 16-column slices. Per 32 values of k: one A
   load, up to three B loads, up to three TDPBF16PS of 16 x 16 x 32 multiply-adds each.
   A row block of fewer than 16 rows configures its A and C tiles that many rows high, so a
   row's sums are the same whichever block it falls in (batch invariance).
   The tile sums are stored to a [16, 48] buffer, then added (with the bias, or onto c) by
   AVX-512 into c: one pass over the outputs per panel, 1/Kc of the multiply-adds.
   Shapes it takes: pw a multiple of 16, Kc a multiple of 32 (else the caller's AVX512-BF16
   tile runs the panel: a function of the shape alone, never of the row count). */
#include "model_kernels.h"
#include "simd512.h"

#include <string.h>

#if CLRT_AVX512
#define TARGET_AMX __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_config;

/* The rows the current thread's tiles are configured for (0: not yet): loading a
   configuration costs more than a small panel's products, so it is loaded only on change. */
static __thread int configured_rows;

TARGET_AMX static void configure(int rows) {
  if (configured_rows == rows) return;
  tile_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 7; t++) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = (uint8_t)(t >= 4 ? 16 : rows);   /* B tiles: 16 pairs of k; A and C: the rows */
  }
  _tile_loadconfig(&cfg);
  configured_rows = rows;
}

/* c[r, j] for the nr (<= 16) rows from buf[r, j] (the tile sums), plus bias or onto c. */
TARGET_AMX static void store_rows(float *c, int64_t ldc, const float *buf, int nr, int pw,
                                  const float *bias, int add) {
  for (int r = 0; r < nr; r++) {
    float *cr = c + (int64_t)r * ldc;
    for (int j = 0; j < pw; j += 16) {
      __m512 v = _mm512_loadu_ps(buf + r * 48 + j);
      if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + j));
      if (add) v = _mm512_add_ps(_mm512_loadu_ps(cr + j), v);
      _mm512_storeu_ps(cr + j, v);
    }
  }
}

/* Tile numbers are immediates, so each panel width has its own loop. */
#define AMX_KLOOP(NP)                                                               \
  for (int k0 = 0; k0 < Kc; k0 += 32) {                                             \
    const uint16_t *bk = bp + (int64_t)k0 * pw;                                     \
    _tile_loadd(3, a + k0, a_stride);                                               \
    _tile_loadd(4, bk, b_stride);                                                   \
    _tile_dpbf16ps(0, 3, 4);                                                        \
    if (NP > 1) {                                                                   \
      _tile_loadd(5, bk + 32, b_stride);                                            \
      _tile_dpbf16ps(1, 3, 5);                                                      \
    }                                                                               \
    if (NP > 2) {                                                                   \
      _tile_loadd(6, bk + 64, b_stride);                                            \
      _tile_dpbf16ps(2, 3, 6);                                                      \
    }                                                                               \
  }

TARGET_AMX static void block(float *c, int64_t ldc, const uint16_t *a, int64_t lda, int nr,
                             const uint16_t *bp, int pw, int Kc, const float *bias, int add) {
  float buf[16 * 48] __attribute__((aligned(64)));
  const int64_t a_stride = 2 * lda, b_stride = 4 * (int64_t)pw;
  configure(nr);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  if (pw == 48) {
    AMX_KLOOP(3)
  } else if (pw == 32) {
    AMX_KLOOP(2)
  } else {
    AMX_KLOOP(1)
  }
  _tile_stored(0, buf, 48 * sizeof(float));
  if (pw > 16) _tile_stored(1, buf + 16, 48 * sizeof(float));
  if (pw > 32) _tile_stored(2, buf + 32, 48 * sizeof(float));
  store_rows(c, ldc, buf, nr, pw, bias, add);
}
#endif

int clrt_amx_panel_fits(int pw, int64_t Kc) {
  return pw > 0 && pw <= 48 && pw % 16 == 0 && Kc > 0 && Kc % 32 == 0 && clrt_matrix_unit() == CLRT_UNIT_AMX;
}

int clrt_amx_panel(float *c /* [M, ldc] */, int64_t ldc, const uint16_t *a /* [M, lda] bf16 */, int64_t lda,
                   int64_t M, const uint16_t *bp /* [Kc / 2, pw, 2] bf16 */, int pw, int64_t Kc,
                   const float *bias /* [pw] or NULL */, int add) {
#if CLRT_AVX512
  if (!clrt_amx_panel_fits(pw, Kc)) return 0;
  for (int64_t r0 = 0; r0 < M; r0 += 16) {
    int nr = M - r0 < 16 ? (int)(M - r0) : 16;
    block(c + r0 * ldc, ldc, a + r0 * lda, lda, nr, bp, pw, (int)Kc, bias, add);
  }
  return 1;
#else
  (void)c, (void)ldc, (void)a, (void)lda, (void)M, (void)bp, (void)pw, (void)Kc, (void)bias, (void)add;
  return 0;
#endif
}

/* The unit's peak: TDPBF16PS into four independent 16 x 16 sums from tiles already loaded
   (nothing from memory), iters times; the multiply-adds done x 2 (0 without AMX). */
#if CLRT_AVX512
TARGET_AMX static int64_t amx_peak(int64_t iters) {
  static const uint16_t ones[16 * 32] = {0};
  configure(16);
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iters; i++) {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 5);
    _tile_dpbf16ps(2, 4, 5);
    _tile_dpbf16ps(3, 4, 5);
  }
  float sink[16 * 16];
  _tile_stored(0, sink, 64);
  __asm__ volatile("" : : "r"(sink) : "memory");
  return iters * 4 * 16 * 16 * 32 * 2;
}
#endif

int64_t clrt_amx_peak_flops(int64_t iters) {
#if CLRT_AVX512
  if (clrt_matrix_unit_best() != CLRT_UNIT_AMX) return 0;
  return amx_peak(iters);
#else
  (void)iters;
  return 0;
#endif
}
