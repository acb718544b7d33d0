/* linear_packed.c — y = x w^T + b for the few rows of a decode step, over a copy of w packed
   in column panels.
   The skinny kernel (linear_skinny.c) dots each weight row with each x row: every output is
   a 16-lane sum reduced at the end, and each multiply-add needs a load of x and of w. Packed,
   48 outputs sit side by side for each k: a tile of 8 rows loads three vectors of weights and
   broadcasts one x value per row, 24 multiply-adds for 11 loads, with no horizontal sums.
   On the 2-core Zen 5 this runs 300-340 GFLOP/s at 32 rows against 150-230 for the skinny
   kernel, and at one row (memory-bound) it streams the weights as fast.
   Layout (clrt_linear_pack): panel p holds weight rows o0 = 48p .. o0 + pw - 1, pw =
   min(48, O - o0), transposed: wp[o0 * K + k * pw + j] = w[(o0 + j) * K + k]. The copy has
   w's size, so a packed arena keeps the offsets of the arena it was packed from.
   Each output is a sum over k in order (one lane per output), so results agree with sgemm to
   rounding, not bit for bit, and a row's outputs are the same bits at any number of rows and
   any position among them (batch invariance: one row, three panels at a time, keeps that
   order too). AVX-512 here, AVX2 + FMA in panels_avx2.c (the same order: the same bits),
   chosen at run time (cpu_level.c); on aarch64 NEON in panels_neon.c (the same order again).
   At 32 rows a panel is read from memory by its first tile of rows and from cache by the
   other three, so the first tile waits on memory while the others compute. Each tile asks for
   its share of the next panel as it goes (software prefetch), which spreads the weight stream
   over the whole product: 253-281 -> 289-333 GFLOP/s with the weights coming from memory
   (270-380 MB of matrices cycled), where 320-380 is the rate with them in cache.
   Products that share x (q/k/v, gate/up) go through one call, clrt_linear_packed_forward_parts,
   so the threads split all their panels at once and the prefetch runs across their seams.
   Any number of rows: each 8-row tile reads the panel from cache again, and the kernel ran
   ~2x OpenBLAS's sgemm at 32-4096 rows on the 2-core Zen 5 (364-416 against 138-196 GFLOP/s;
   OpenBLAS runs its AVX2 kernels there), so a decode step of many rows, a prefill, or a
   forward right after a decode takes it too.
   bf16 (CPUs with AVX512-BF16): the same panels hold bf16 pairs of k, the 48 outputs' two
   weights side by side for each pair: wp[o0 * K + kp * 2 pw + 2 j + e] = w[(o0 + j) * K + 2 kp + e]
   (K even). vdpbf16ps multiplies a broadcast pair of x by 16 outputs' pairs and adds both
   products into f32 lanes: twice the multiply-adds of an f32 FMA from half the bytes. x is
   rounded to bf16 once per call. On a CPU with AMX a panel whose shape suits (gemm_amx.c:
   width a multiple of 16, K of 32) runs on the tiles instead, whatever the row count. */
#include "model_kernels.h"

#include "bf16.h"
#include "simd512.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

enum { PANEL = 48, TILE_ROWS = 8 };

/* Both layouts: f32 (element k of output j at k * pw + j) or bf16 pairs (at 2 (k / 2) pw +
   2 j + k % 2). */
static void pack(void *wp, const float *w /* [O, K] */, int K, int O, int bf16) {
  int panels = (O + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static) if ((int64_t)O * K > CLRT_OMP_MIN_WORK)
  for (int p = 0; p < panels; p++) {
    int o0 = p * PANEL, pw = O - o0 < PANEL ? O - o0 : PANEL;
    /* 16 k at a time: the reads stay sequential per row and the writes within a few lines. */
    for (int k0 = 0; k0 < K; k0 += 16) {
      int k1 = k0 + 16 < K ? k0 + 16 : K;
      for (int j = 0; j < pw; j++) {
        const float *src = w + (int64_t)(o0 + j) * K;
        for (int k = k0; k < k1; k++) {
          int64_t at = (int64_t)o0 * K + (bf16 ? (int64_t)(k / 2) * 2 * pw + 2 * j + (k & 1) : (int64_t)k * pw + j);
          if (bf16) ((uint16_t *)wp)[at] = clrt_f32_to_bf16(src[k]);
          else ((float *)wp)[at] = src[k];
        }
      }
    }
  }
}

void clrt_linear_pack(float *wp /* [O * K] panels */, const float *w /* [O, K] */, int K, int O) {
  pack(wp, w, K, O, 0);
}

void clrt_linear_pack_bf16(uint16_t *wp /* [O * K] panels of pairs */, const float *w /* [O, K] */,
                           int K, int O) {
  pack(wp, w, K, O, 1);
}

/* Where panel p of a part starts (elements of esize bytes) and how wide it is. */
static inline const char *panel_at(const clrt_packed_part *part, int K, int p, int esize, int *pw) {
  int o0 = p * PANEL;
  *pw = part->O - o0 < PANEL ? part->O - o0 : PANEL;
  return (const char *)part->wp + (int64_t)o0 * K * esize;
}

static inline int64_t panels_of(const clrt_packed_part *part) { return (part->O + PANEL - 1) / PANEL; }

/* The 256-bit / 128-bit panel kernels of this architecture: NEON's on aarch64 (panels_neon.c),
   AVX2's elsewhere (panels_avx2.c); both sum as the AVX-512 tiles below do. */
#if CLRT_NEON
#define SIMD_PANEL_F32 clrt_neon_panel_f32
#define SIMD_PANEL_BF16 clrt_neon_panel_bf16
#else
#define SIMD_PANEL_F32 clrt_avx2_panel_f32
#define SIMD_PANEL_BF16 clrt_avx2_panel_bf16
#endif

/* Panels [g0, g1) of the parts laid end to end, each for all N rows, through those kernels
   (bf16 ones when x16 is given). */
static void panel_range_simd(const clrt_packed_part *parts, const float *x, const uint16_t *x16, int N, int K,
                             int64_t g0, int64_t g1) {
  int i = 0;
  int64_t base = 0;
  for (int64_t g = g0; g < g1; g++) {
    while (g - base >= panels_of(&parts[i])) base += panels_of(&parts[i++]);
    int p = (int)(g - base), pw, o0 = p * PANEL;
    const char *panel = panel_at(&parts[i], K, p, x16 ? 2 : 4, &pw);
    const float *b = parts[i].b ? parts[i].b + o0 : NULL;
    float *y = parts[i].y + o0;
    if (x16)
      SIMD_PANEL_BF16(y, parts[i].O, x16, K, N, (const uint16_t *)panel, pw, K, b, 0);
    else
      SIMD_PANEL_F32(y, parts[i].O, x, K, N, (const float *)panel, pw, K, b, 0);
  }
}

#if CLRT_AVX512
#define TARGET CLRT_TARGET_AVX512

/* Lanes of the 16-output chunk c of a panel pw wide. */
static inline __mmask16 panel_mask(int c, int pw) {
  int n = pw - 16 * c;
  return n >= 16 ? (__mmask16)0xFFFF : n > 0 ? clrt_tail_mask16(n) : (__mmask16)0;
}

/* y[r, o0 .. o0+pw) = acc[r] + b[o0 .. o0+pw) for the nr rows of a tile. */
TARGET static inline __attribute__((always_inline)) void store_tile(
    float *y /* [nr, O] at row 0 */, __m512 acc[][3], const float *b /* [O] or NULL */, int nr, int O,
    int o0, int pw) {
  const __mmask16 m0 = panel_mask(0, pw), m1 = panel_mask(1, pw), m2 = panel_mask(2, pw);
  __m512 b0 = _mm512_setzero_ps(), b1 = b0, b2 = b0;
  if (b) {
    b0 = _mm512_maskz_loadu_ps(m0, b + o0);
    b1 = _mm512_maskz_loadu_ps(m1, b + o0 + 16);
    b2 = _mm512_maskz_loadu_ps(m2, b + o0 + 32);
  }
  for (int r = 0; r < nr; r++) {
    float *yr = y + (int64_t)r * O + o0;
    _mm512_mask_storeu_ps(yr, m0, _mm512_add_ps(acc[r][0], b0));
    _mm512_mask_storeu_ps(yr + 16, m1, _mm512_add_ps(acc[r][1], b1));
    _mm512_mask_storeu_ps(yr + 32, m2, _mm512_add_ps(acc[r][2], b2));
  }
}

/* y[r, o0 .. o0+pw) for the nr (<= 8) rows of x, against one panel. Inlined with constant nr
   and pw for full tiles, so the row loop unrolls and the masks fold away. Every k also asks
   for the line at pf + k * pf_step (pf NULL: none). */
TARGET static inline __attribute__((always_inline)) void tile(
    float *y /* [nr, O] at row 0 */, const float *x /* [nr, K] */, const float *wp /* [K, pw] */,
    const float *b /* [O] or NULL */, int nr, int K, int O, int o0, int pw, const char *pf,
    int pf_step) {
  const __mmask16 m0 = panel_mask(0, pw), m1 = panel_mask(1, pw), m2 = panel_mask(2, pw);
  __m512 acc[TILE_ROWS][3];
  for (int r = 0; r < TILE_ROWS; r++) acc[r][0] = acc[r][1] = acc[r][2] = _mm512_setzero_ps();
  for (int k = 0; k < K; k++) {
    const float *wk = wp + (int64_t)k * pw;
    if (pf) _mm_prefetch(pf + (int64_t)k * pf_step, _MM_HINT_T0);
    __m512 w0 = _mm512_maskz_loadu_ps(m0, wk), w1 = _mm512_maskz_loadu_ps(m1, wk + 16),
           w2 = _mm512_maskz_loadu_ps(m2, wk + 32);
    for (int r = 0; r < TILE_ROWS; r++) {
      if (r >= nr) break;
      __m512 xb = _mm512_set1_ps(x[(int64_t)r * K + k]);
      acc[r][0] = _mm512_fmadd_ps(xb, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(xb, w1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(xb, w2, acc[r][2]);
    }
  }
  store_tile(y, acc, b, nr, O, o0, pw);
}

/* One row against np (1..3) consecutive full panels. A single row's sums would wait on the
   multiply-add latency at every k with one panel's three chains; np panels at once keep 3 np
   chains in flight. Each output is still one sum over k in order, added to the bias at the
   end, exactly as tile() forms it: a row's outputs are the same bits at any number of rows. */
TARGET static inline __attribute__((always_inline)) void row_panels(
    float *y /* [O] */, const float *x /* [K] */, const float *wp /* np panels of [K, PANEL] */,
    const float *b /* [O] or NULL */, int K, int o0, int np) {
  __m512 acc[3][3];
  for (int i = 0; i < 3; i++) acc[i][0] = acc[i][1] = acc[i][2] = _mm512_setzero_ps();
  for (int k = 0; k < K; k++) {
    __m512 xb = _mm512_set1_ps(x[k]);
    for (int i = 0; i < 3; i++) {
      if (i >= np) break;
      const float *wk = wp + (int64_t)i * PANEL * K + (int64_t)k * PANEL;
      for (int c = 0; c < 3; c++) acc[i][c] = _mm512_fmadd_ps(xb, _mm512_loadu_ps(wk + 16 * c), acc[i][c]);
    }
  }
  for (int i = 0; i < np; i++)
    for (int c = 0; c < 3; c++) {
      int o = o0 + i * PANEL + 16 * c;
      __m512 bias = b ? _mm512_loadu_ps(b + o) : _mm512_setzero_ps();
      _mm512_storeu_ps(y + o, _mm512_add_ps(acc[i][c], bias));
    }
}

/* Every row of part's y against its panel p; next (NULL at the end of this thread's share)
   is the panel computed after it, next_bytes its size. Called from the parallel region rather
   than inlined into it: clang outlines OpenMP regions without the enclosing target attribute. */
TARGET static void panel_all_rows(const clrt_packed_part *part, const float *x, int N, int K, int p,
                                  const char *next, int64_t next_bytes) {
  int pw;
  const float *panel = (const float *)panel_at(part, K, p, sizeof(float), &pw);
  int o0 = p * PANEL, O = part->O;
  int tiles = (N + TILE_ROWS - 1) / TILE_ROWS;
  int64_t share = next_bytes / tiles;                  /* each tile fetches this much of next */
  int pf_step = (int)(share / K) + 1;
  for (int n0 = 0, t = 0; n0 < N; n0 += TILE_ROWS, t++) {
    int nr = N - n0 < TILE_ROWS ? N - n0 : TILE_ROWS;
    float *yt = part->y + (int64_t)n0 * O;
    const float *xt = x + (int64_t)n0 * K;
    const char *pf = next ? next + t * share : NULL;
    if (nr == TILE_ROWS && pw == PANEL)   /* constants: the row loop unrolls, the masks fold */
      tile(yt, xt, panel, part->b, TILE_ROWS, K, O, o0, PANEL, pf, pf_step);
    else
      tile(yt, xt, panel, part->b, nr, K, O, o0, pw, pf, pf_step);
  }
}

/* The 16-bit elements of chunk c of a bf16 panel pw wide: two per output. */
static inline __mmask32 pair_mask(int c, int pw) {
  int n = pw - 16 * c;
  return n >= 16 ? (__mmask32)0xFFFFFFFFu : n > 0 ? (__mmask32)((1u << (2 * n)) - 1) : (__mmask32)0;
}

/* The bf16 tile: as tile, over pairs of k. Lane i of chunk c is output o0 + 16c + i, and
   holds that output's two weights of the pair (an epi16 mask keeps two elements a lane). */
CLRT_TARGET_AVX512BF16 static inline __attribute__((always_inline)) void tile_bf16(
    float *y /* [nr, O] at row 0 */, const uint16_t *x /* [nr, K] bf16 */,
    const uint16_t *wp /* [K / 2, pw, 2] */, const float *b /* [O] or NULL */, int nr, int K, int O,
    int o0, int pw, const char *pf, int pf_step) {
  const __mmask32 h0 = pair_mask(0, pw), h1 = pair_mask(1, pw), h2 = pair_mask(2, pw);
  __m512 acc[TILE_ROWS][3];
  for (int r = 0; r < TILE_ROWS; r++) acc[r][0] = acc[r][1] = acc[r][2] = _mm512_setzero_ps();
  for (int kp = 0; kp < K / 2; kp++) {
    const uint16_t *wk = wp + (int64_t)kp * 2 * pw;
    if (pf) _mm_prefetch(pf + (int64_t)kp * pf_step, _MM_HINT_T0);
    __m512bh w0 = (__m512bh)_mm512_maskz_loadu_epi16(h0, wk), w1 = (__m512bh)_mm512_maskz_loadu_epi16(h1, wk + 32),
             w2 = (__m512bh)_mm512_maskz_loadu_epi16(h2, wk + 64);
    for (int r = 0; r < TILE_ROWS; r++) {
      if (r >= nr) break;
      int32_t pair;
      memcpy(&pair, x + (int64_t)r * K + 2 * kp, sizeof pair);
      __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xb, w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xb, w1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], xb, w2);
    }
  }
  store_tile(y, acc, b, nr, O, o0, pw);
}

/* panel_all_rows over bf16 pairs (one row included: its three sums per pair already cover the
   weight stream). */
CLRT_TARGET_AVX512BF16 static void panel_all_rows_bf16(const clrt_packed_part *part, const uint16_t *x16,
                                                       int N, int K, int p, const char *next,
                                                       int64_t next_bytes) {
  int pw;
  const uint16_t *panel = (const uint16_t *)panel_at(part, K, p, sizeof(uint16_t), &pw);
  int o0 = p * PANEL, O = part->O;
  /* AMX tiles where the CPU has them and the panel's shape suits (never a row count) */
  if (clrt_amx_panel(part->y + o0, O, x16, K, N, panel, pw, K, part->b ? part->b + o0 : NULL, 0)) return;
  int tiles = (N + TILE_ROWS - 1) / TILE_ROWS;
  int64_t share = next_bytes / tiles;
  int pf_step = (int)(share / (K / 2)) + 1;
  for (int n0 = 0, t = 0; n0 < N; n0 += TILE_ROWS, t++) {
    int nr = N - n0 < TILE_ROWS ? N - n0 : TILE_ROWS;
    float *yt = part->y + (int64_t)n0 * O;
    const uint16_t *xt = x16 + (int64_t)n0 * K;
    const char *pf = next ? next + t * share : NULL;
    if (nr == TILE_ROWS && pw == PANEL)
      tile_bf16(yt, xt, panel, part->b, TILE_ROWS, K, O, o0, PANEL, pf, pf_step);
    else if (nr == 1 && pw == PANEL)
      tile_bf16(yt, xt, panel, part->b, 1, K, O, o0, PANEL, pf, pf_step);
    else
      tile_bf16(yt, xt, panel, part->b, nr, K, O, o0, pw, pf, pf_step);
  }
}

/* One row (a decode step of one sequence) against panels p .. of part, at most left of them:
   up to three full panels at once (row_panels), a narrower last panel through tile(). Returns
   the panels done. One row streams the weights once: the hardware prefetcher keeps up. */
TARGET static int row_run(const clrt_packed_part *part, const float *x, int K, int p, int64_t left) {
  int pw, o0 = p * PANEL;
  const float *panel = (const float *)panel_at(part, K, p, sizeof(float), &pw);
  int full = (part->O - o0) / PANEL;   /* full panels from p on */
  int np = full < 3 ? full : 3;
  if (np > left) np = (int)left;
  switch (np) {
    case 3: row_panels(part->y, x, panel, part->b, K, o0, 3); return 3;
    case 2: row_panels(part->y, x, panel, part->b, K, o0, 2); return 2;
    case 1: row_panels(part->y, x, panel, part->b, K, o0, 1); return 1;
    default: tile(part->y, x, panel, part->b, 1, K, part->O, o0, pw, NULL, 0); return 1;
  }
}

/* Panels [g0, g1) of the parts' panels laid end to end (bf16 ones when x16 is given). */
TARGET static void panel_range(const clrt_packed_part *parts, const float *x, const uint16_t *x16,
                               int N, int K, int64_t g0, int64_t g1) {
  const int esize = x16 ? 2 : 4;
  int i = 0;
  int64_t base = 0;   /* the index of part i's first panel */
  for (int64_t g = g0; g < g1; g++) {
    while (g - base >= panels_of(&parts[i])) base += panels_of(&parts[i++]);
    int p = (int)(g - base), pw = 0;
    if (!x16 && N == 1) {
      int64_t left = panels_of(&parts[i]) - p;
      g += row_run(&parts[i], x, K, p, left < g1 - g ? left : g1 - g) - 1;
      continue;
    }
    const char *next = NULL;
    int64_t next_bytes = 0;
    if (g + 1 < g1) {
      int j = i, q = p + 1;
      while (q >= panels_of(&parts[j])) q -= (int)panels_of(&parts[j++]);
      next = panel_at(&parts[j], K, q, esize, &pw);
      next_bytes = (int64_t)pw * K * esize;
    }
    if (x16)
      panel_all_rows_bf16(&parts[i], x16, N, K, p, next, next_bytes);
    else
      panel_all_rows(&parts[i], x, N, K, p, next, next_bytes);
  }
}
#endif

int clrt_linear_packed_available(void) { return clrt_have_avx512() || clrt_have_avx2() || clrt_have_neon(); }

/* bf16 panels need a matrix unit in use (clrt_matrix_unit: capped to f32, none); without bf16
   hardware (fma-bf16) AVX2 or NEON computes the same sums. */
int clrt_linear_packed_bf16_available(void) { return clrt_matrix_unit() != CLRT_UNIT_F32; }

/* Both forwards: x16 NULL for f32 panels, else x rounded to bf16 for bf16 ones. AVX-512's
   tiles where the CPU level has them (and, for bf16, a bf16 unit), else AVX2's. */
static int forward_parts(const float *x, const uint16_t *x16, int64_t N, int K,
                         const clrt_packed_part *parts, int count) {
  int64_t panels = 0, outs = 0;
  for (int i = 0; i < count; i++) {
    if (parts[i].O < 1) return 0;
    panels += panels_of(&parts[i]), outs += parts[i].O;
  }
  int wide = x16 ? clrt_matrix_unit() >= CLRT_UNIT_AVX512BF16 : clrt_have_avx512();
  if (!wide && !clrt_have_avx2() && !clrt_have_neon()) return 0;
#pragma omp parallel if (N * outs * K > CLRT_OMP_MIN_WORK)
  {
    /* Contiguous shares (schedule(static) by hand) so each thread knows its next panel. */
    int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    int64_t g0 = panels * t / nt, g1 = panels * (t + 1) / nt;
#if CLRT_AVX512
    if (wide)
      panel_range(parts, x, x16, (int)N, K, g0, g1);
    else
#endif
      panel_range_simd(parts, x, x16, (int)N, K, g0, g1);
  }
  return 1;
}

int clrt_linear_packed_forward_parts(const float *x /* [N, K] */, int64_t N, int K,
                                     const clrt_packed_part *parts, int count) {
  if (N < 1 || N > INT32_MAX || count < 1 || !clrt_linear_packed_available()) return 0;
  return forward_parts(x, NULL, N, K, parts, count);
}

/* bf16 panels for any number of rows (a frozen bf16 base in training, linear_bf16.c). */
size_t clrt_linear_packed_bf16_workspace_bytes(int64_t N, int K) {
  return N < 1 || K < 1 ? 0 : sizeof(uint16_t) * (size_t)N * (size_t)K;
}

int clrt_linear_packed_bf16_forward_rows(const float *x /* [N, K] */, int64_t N, int K,
                                         const clrt_packed_part *parts, int count,
                                         void *ws /* x in bf16 [N, K] */, size_t ws_bytes) {
  if (N < 1 || N > INT32_MAX || count < 1 || K % 2 || !clrt_linear_packed_bf16_available() ||
      ws_bytes < clrt_linear_packed_bf16_workspace_bytes(N, K))
    return 0;
  uint16_t *x16 = ws;
  clrt_to_bf16_rows(x16, K, x, K, 1, N, K);
  return forward_parts(NULL, x16, N, K, parts, count);
}

int clrt_linear_packed_bf16_forward_parts(const float *x /* [N, K] */, int64_t N, int K,
                                          const clrt_packed_part *parts, int count, void *ws, size_t ws_bytes) {
  return N <= CLRT_SKINNY_MAX_ROWS && clrt_linear_packed_bf16_forward_rows(x, N, K, parts, count, ws, ws_bytes);
}

int clrt_linear_packed_forward(float *y /* [N, O] */, const float *x /* [N, K] */,
                               const float *wp /* [O * K] packed by clrt_linear_pack */,
                               const float *b /* [O] or NULL */, int64_t N, int K, int O) {
  clrt_packed_part part = {y, wp, b, O};
  return clrt_linear_packed_forward_parts(x, N, K, &part, 1);
}
