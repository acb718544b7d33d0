/* gemm_strided.c — c (+)= a b for the three products of a linear layer in training, with no
   packed copy of the weights:
     dx = dy w      a = dy [N, O] (rows),        b = w [O, K] (rows of K): c = dx [N, K]
     dw += dy^T x   a = dy^T (dy [N, O] read by column), b = x [N, K]:    c = dw [O, K]
     y = x w^T      a = x, b = w^T: each [KBLOCK, 48] slice of w^T is transposed into a
                    buffer on the fly (clrt_linear_forward_strided), once per row block
   Both b's are row-major with unit column stride, so a 48-wide column panel of b is 48
   consecutive floats per row: the same register tile as linear_packed.c (8 rows of a, three
   16-lane vectors of b per k, 24 multiply-adds for 3 loads and 8 broadcasts, no horizontal
   sums) reads b in place instead of from a packed copy. a is read through two strides (row
   and k), so dy^T needs no transposed copy either: a tile of 8 outputs broadcasts 8
   consecutive floats of a dy row.
   Blocking: the work is split in (block of MBLOCK rows, group of column panels) items over the
   threads; within an item k runs in KBLOCK steps, outermost, so the rows' [MBLOCK, KBLOCK]
   slice of a (192 KiB) stays in L2 across the group's panels and each panel's [KBLOCK, 48]
   slice of b (48 KiB) stays in L1/L2 while every 8-row tile passes over it, the tile's sums
   being added into c at the end of each step. Each element of c is a sum over k in order per k block, so results
   agree with sgemm to rounding, not bit for bit. The tile is AVX-512's or AVX2's
   (panels_avx2.c's 6 x 16 tiles, the same order per element: the same bits), chosen at run
   time; without either clrt_gemm_strided returns 0 and the caller runs sgemm. */
#include "model_kernels.h"

#include "simd512.h"

#include <omp.h>

enum { PANEL = 48, TILE_ROWS = 8, MBLOCK = 192, KBLOCK = 256 };
/* The forward's blocks: its transposed [FWD_KBLOCK, 48] slice of w stays in L1 (24 KiB), and
   each is made once per FWD_MBLOCK rows ([512, 128] of x: 256 KiB, in L2). */
enum { FWD_KBLOCK = 128, FWD_MBLOCK = 512 };

#if CLRT_AVX512
#define TARGET CLRT_TARGET_AVX512

static inline __mmask16 chunk_mask(int c, int pw) {
  int n = pw - 16 * c;
  return n >= 16 ? (__mmask16)0xFFFF : n > 0 ? clrt_tail_mask16(n) : (__mmask16)0;
}

/* c[r, 0 .. pw) (+)= sum over k in [0, kn) of a(r, k) b[k, 0 .. pw) for the nr (<= 8) rows of
   a tile; add: add onto c (else store). Inlined with constant nr and pw for full tiles. */
TARGET static inline __attribute__((always_inline)) void tile_avx512(
    float *c /* [nr, ldc] */, int64_t ldc, const float *a, int64_t a_rs, int64_t a_ks,
    const float *b /* [kn, ldb] */, int64_t ldb, int nr, int kn, int pw, int add) {
  const __mmask16 m0 = chunk_mask(0, pw), m1 = chunk_mask(1, pw), m2 = chunk_mask(2, pw);
  __m512 acc[TILE_ROWS][3];
  for (int r = 0; r < TILE_ROWS; r++) acc[r][0] = acc[r][1] = acc[r][2] = _mm512_setzero_ps();
  for (int k = 0; k < kn; k++) {
    const float *bk = b + (int64_t)k * ldb, *ak = a + (int64_t)k * a_ks;
    __m512 w0 = _mm512_maskz_loadu_ps(m0, bk), w1 = _mm512_maskz_loadu_ps(m1, bk + 16),
           w2 = _mm512_maskz_loadu_ps(m2, bk + 32);
    for (int r = 0; r < TILE_ROWS; r++) {
      if (r >= nr) break;
      __m512 xb = _mm512_set1_ps(ak[(int64_t)r * a_rs]);
      acc[r][0] = _mm512_fmadd_ps(xb, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(xb, w1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(xb, w2, acc[r][2]);
    }
  }
  for (int r = 0; r < nr; r++) {
    float *cr = c + (int64_t)r * ldc;
    if (add) {
      acc[r][0] = _mm512_add_ps(acc[r][0], _mm512_maskz_loadu_ps(m0, cr));
      acc[r][1] = _mm512_add_ps(acc[r][1], _mm512_maskz_loadu_ps(m1, cr + 16));
      acc[r][2] = _mm512_add_ps(acc[r][2], _mm512_maskz_loadu_ps(m2, cr + 32));
    }
    _mm512_mask_storeu_ps(cr, m0, acc[r][0]);
    _mm512_mask_storeu_ps(cr + 16, m1, acc[r][1]);
    _mm512_mask_storeu_ps(cr + 32, m2, acc[r][2]);
  }
}

/* The full tile inlined with constants, or the general one. */
TARGET static void tile512(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_ks, const float *b,
                           int64_t ldb, int nr, int kn, int pw, int add) {
  if (nr == TILE_ROWS && pw == PANEL)
    tile_avx512(c, ldc, a, a_rs, a_ks, b, ldb, TILE_ROWS, kn, PANEL, add);
  else
    tile_avx512(c, ldc, a, a_rs, a_ks, b, ldb, nr, kn, pw, add);
}
#endif

/* A tile of nr (<= 8) rows by pw (<= 48) columns, kn deep: AVX-512's or AVX2's. */
typedef void (*tile_fn)(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_ks, const float *b,
                        int64_t ldb, int nr, int kn, int pw, int add);

#if CLRT_NEON
/* aarch64: panels_neon.c's tiles, the same order per element. */
static void tile_neon(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_ks, const float *b,
                      int64_t ldb, int nr, int kn, int pw, int add) {
  clrt_neon_tile_strided(c, ldc, a, a_rs, a_ks, b, ldb, nr, kn, pw, add);
}
#else
static void tile_avx2(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_ks, const float *b,
                      int64_t ldb, int nr, int kn, int pw, int add) {
  clrt_avx2_tile_strided(c, ldc, a, a_rs, a_ks, b, ldb, nr, kn, pw, add);
}
#endif

static tile_fn level_tile(void) {
#if CLRT_AVX512
  if (clrt_have_avx512()) return tile512;
#endif
#if CLRT_NEON
  return clrt_have_neon() ? tile_neon : NULL;
#else
  return clrt_have_avx2() ? tile_avx2 : NULL;
#endif
}

/* One work item: rows [i0, i1) of c against the column panels [p0, p1). k runs outermost, so
   the item's [MBLOCK, KBLOCK] block of a stays in L2 while every panel's [KBLOCK, 48] slice of
   b passes under it. */
static void item(tile_fn tile, float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_ks,
                 const float *b, int64_t ldb, int i0, int i1, int p0, int p1, int Nc, int Kc, int accumulate) {
  for (int k0 = 0; k0 < Kc; k0 += KBLOCK) {
    int kn = Kc - k0 < KBLOCK ? Kc - k0 : KBLOCK, add = accumulate || k0 > 0;
    const float *ak = a + (int64_t)k0 * a_ks;
    for (int p = p0; p < p1; p++) {
      int j0 = p * PANEL, pw = Nc - j0 < PANEL ? Nc - j0 : PANEL;
      const float *bk = b + (int64_t)k0 * ldb + j0;
      for (int i = i0; i < i1; i += TILE_ROWS) {
        int nr = i1 - i < TILE_ROWS ? i1 - i : TILE_ROWS;
        float *ct = c + (int64_t)i * ldc + j0;
        const float *at = ak + (int64_t)i * a_rs;
        tile(ct, ldc, at, a_rs, a_ks, bk, ldb, nr, kn, pw, add);
      }
    }
  }
}

/* The forward's work item: y rows [i0, i1) against w's 48-row panels [p0, p1), each panel's
   [KBLOCK, 48] slice transposed into buf on the fly (once per slice and row block: 1/MBLOCK
   of the multiply-adds), then the same tiles as above over it. */
static void item_fwd(tile_fn tile, float *y, const float *x, const float *w, int K, int O, int i0, int i1,
                     int p0, int p1) {
  float buf[FWD_KBLOCK * PANEL] __attribute__((aligned(64)));
  for (int k0 = 0; k0 < K; k0 += FWD_KBLOCK) {
    int kn = K - k0 < FWD_KBLOCK ? K - k0 : FWD_KBLOCK;
    for (int p = p0; p < p1; p++) {
      int j0 = p * PANEL, pw = O - j0 < PANEL ? O - j0 : PANEL;
      for (int j = 0; j < pw; j++) {
        const float *src = w + (int64_t)(j0 + j) * K + k0;
        for (int k = 0; k < kn; k++) buf[k * PANEL + j] = src[k];
      }
      for (int i = i0; i < i1; i += TILE_ROWS) {
        int nr = i1 - i < TILE_ROWS ? i1 - i : TILE_ROWS;
        float *yt = y + (int64_t)i * O + j0;
        const float *xt = x + (int64_t)i * K + k0;
        tile(yt, O, xt, K, 1, buf, PANEL, nr, kn, pw, 1);
      }
    }
  }
}

/* Items: row blocks x groups of panels, at least 4 per thread where the shape allows (more
   panel groups first, then more row blocks) and a multiple of the thread count, the row
   blocks of equal height: a 256-row product (the output layer's row block) was split 192 + 64
   and a 512-row one 192 + 192 + 128 in 9 items, so one thread did up to 1.5x the other's
   share while the other waited. */
static int64_t plan(int64_t M, int Nc, int mblock, int *mrows_out, int *groups_out) {
  int panels = (Nc + PANEL - 1) / PANEL, threads = omp_get_max_threads(), groups = 1, mrows;
  int64_t want = (M + mblock - 1) / mblock, mblocks;
  for (;;) {
    mrows = (int)(((M + want - 1) / want + TILE_ROWS - 1) / TILE_ROWS * TILE_ROWS);
    mblocks = (M + mrows - 1) / mrows;
    if (mblocks * groups >= 4 * threads && (mblocks * groups) % threads == 0) break;
    if (groups < panels) groups++;
    else if (mrows > 2 * TILE_ROWS) want++;
    else break;
  }
  *mrows_out = mrows;
  *groups_out = groups;
  return mblocks * groups;
}

int clrt_gemm_strided(float *c /* [M, ldc] */, int64_t ldc, const float *a /* a(i, k) at a[i a_rs + k a_ks] */,
                      int64_t a_rs, int64_t a_ks, const float *b /* [Kc, ldb] */, int64_t ldb, int64_t M,
                      int Nc, int64_t Kc, int accumulate) {
  tile_fn tile = level_tile();
  if (M < 1 || Nc < 1 || M > INT32_MAX || Kc > INT32_MAX || !tile) return 0;
  if (Kc < 1) {   /* an empty sum: c = 0 (or unchanged) */
    if (!accumulate)
      for (int64_t i = 0; i < M; i++)
        for (int j = 0; j < Nc; j++) c[i * ldc + j] = 0;
    return 1;
  }
  int mrows, groups;
  int64_t items = plan(M, Nc, MBLOCK, &mrows, &groups);
  int panels = (Nc + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static) if (M * Nc * Kc > CLRT_OMP_MIN_WORK)
  for (int64_t t = 0; t < items; t++) {
    int g = (int)(t % groups), mb = (int)(t / groups);
    int p0 = (int)((int64_t)panels * g / groups), p1 = (int)((int64_t)panels * (g + 1) / groups);
    int i0 = mb * mrows, i1 = (int)(M - i0 < mrows ? M : i0 + mrows);
    item(tile, c, ldc, a, a_rs, a_ks, b, ldb, i0, i1, p0, p1, Nc, (int)Kc, accumulate);
  }
  return 1;
}

/* The linear layer's backward over clrt_gemm_strided (db as linear.c); 0 when this CPU has no
   kernel for it (then use clrt_linear_backward). */
int clrt_linear_backward_strided(float *dx /* [N, K] */, float *dw /* [O, K] += */, float *db /* [O] += */,
                                 const float *dy /* [N, O] */, const float *x /* [N, K] */,
                                 const float *w /* [O, K] */, int64_t N, int K, int O, int dx_accumulate) {
  if (N < 1 || !level_tile()) return 0;
  if (dx && !clrt_gemm_strided(dx, K, dy, O, 1, w, K, N, K, O, dx_accumulate)) return 0;
  if (dw && !clrt_gemm_strided(dw, K, dy, 1, O, x, K, O, K, N, 1)) return 0;
  if (db) {
#pragma omp parallel for schedule(static) if ((int64_t)N * O > CLRT_OMP_MIN_WORK)
    for (int o = 0; o < O; o++) {
      float s = 0;
      for (int64_t n = 0; n < N; n++) s += dy[n * O + o];
      db[o] += s;
    }
  }
  return 1;
}

/* y = x w^T + b with w packed on the fly (item_fwd): the packed forward's speed without a
   second copy of the weights; 0 when this CPU has no kernel for it (then sgemm). */
int clrt_linear_forward_strided(float *y /* [N, O] */, const float *x /* [N, K] */, const float *w /* [O, K] */,
                                const float *b /* [O] or NULL */, int64_t N, int K, int O) {
  tile_fn tile = level_tile();
  if (N < 1 || O < 1 || K < 1 || N > INT32_MAX || !tile) return 0;
#pragma omp parallel for schedule(static) if (N * O > CLRT_OMP_MIN_WORK)
  for (int64_t n = 0; n < N; n++)
    for (int o = 0; o < O; o++) y[n * O + o] = b ? b[o] : 0.0f;
  int mrows, groups;
  int64_t items = plan(N, O, FWD_MBLOCK, &mrows, &groups);
  int panels = (O + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static) if (N * O * (int64_t)K > CLRT_OMP_MIN_WORK)
  for (int64_t t = 0; t < items; t++) {
    int g = (int)(t % groups), mb = (int)(t / groups);
    int p0 = (int)((int64_t)panels * g / groups), p1 = (int)((int64_t)panels * (g + 1) / groups);
    int i0 = mb * mrows, i1 = (int)(N - i0 < mrows ? N : i0 + mrows);
    item_fwd(tile, y, x, w, K, O, i0, i1, p0, p1);
  }
  return 1;
}
