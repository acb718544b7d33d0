/* format_bf16.c — the bf16 copies of the linear weights (wbf, same offsets as the params; the
   bf16 matmuls' weights, refreshed from the f32 master ones) and their products. Inputs are
   rounded to bf16, sums are f32, as autocast(bfloat16) runs them:
     bf16 rows   the whole params arena converted element by element, where no matrix unit
                 takes panels: few-row (decode) products over it (the skinny kernels, or the
                 plain loop that keeps bf16 numerics), the rest in f32 on the master weights;
                 batch-invariant: every forward row by row over it (linear_rowwise.c)
     bf16 pairs  clrt_linear_pack_bf16's panels of pairs along K, on a matrix unit (AMX,
                 AVX512-BF16, FMA over bf16 pairs): the forward at any row count, one choice per
                 weight shape, so a row gives the same bits in a decode step and a prefill
     bf16 pairs + transposed   the same, and after the first `total` uint16s the blocks'
                 weights transposed into pairs of output rows (clrt_pack_rows_bf16_t): backward's
                 dx = dy w reads them and dw += dy^T x packs dy^T and x per call (gemm_bf16.c).
   The bf16 kernels decline (an f32 product on the master weights runs instead) where the
   matrix unit is capped or missing, so every level lists the same sets. */
#include "model_internal.h"

#include <stdlib.h>

static const uint16_t *W16(const clrt_model *m, int64_t w) { return (const uint16_t *)m->wbf.s->data + w; }

/* ---- bf16 rows -------------------------------------------------------------------------------- */

/* The skinny kernels need AVX-512; without them the plain loop keeps decode's bf16 numerics. */
static int rows_forward(clrt_model *m, acts *a, float *y, const float *x, int64_t w, const float *b, int64_t N,
                        int K, int O) {
  clrt_context *cx = a->cx;
  if (model_workspace(cx, clrt_linear_skinny_bf16_workspace_bytes(N, K), "bf16 forward")) return 1;
  return clrt_linear_skinny_forward_bf16(y, x, W16(m, w), b, N, K, O, cx->ws, cx->ws_bytes) ||
         (N <= CLRT_SKINNY_MAX_ROWS &&
          clrt_linear_rowwise_forward_bf16(y, x, W16(m, w), b, N, K, O, cx->ws, cx->ws_bytes));
}

static int rows_invariant_forward(clrt_model *m, acts *a, float *y, const float *x, int64_t w, const float *b,
                                  int64_t N, int K, int O) {
  clrt_context *cx = a->cx;
  if (model_workspace(cx, clrt_linear_rowwise_bf16_workspace_bytes(N, K), "bf16 forward")) return 1;
  return clrt_linear_rowwise_forward_bf16(y, x, W16(m, w), b, N, K, O, cx->ws, cx->ws_bytes);
}

/* ---- bf16 pairs ------------------------------------------------------------------------------- */

static int pairs_forward_parts(clrt_model *m, acts *a, const float *x, int64_t N, int K, const lin_part *parts,
                               int count) {
  clrt_context *cx = a->cx;
  clrt_packed_part packed[3] = {{0}};
  if (count > 3) return 0;
  for (int i = 0; i < count; i++) packed[i] = (clrt_packed_part){parts[i].y, W16(m, parts[i].w), parts[i].b, parts[i].O};
  if (model_workspace(cx, clrt_linear_packed_bf16_workspace_bytes(N, K), "bf16 forward")) return 1;
  return clrt_linear_packed_bf16_forward_rows(x, N, K, packed, count, cx->ws, cx->ws_bytes);
}

static int pairs_forward(clrt_model *m, acts *a, float *y, const float *x, int64_t w, const float *b, int64_t N,
                         int K, int O) {
  lin_part part = {y, w, b, O, 0};
  return pairs_forward_parts(m, a, x, N, K, &part, 1);
}

/* dy and x rounded to bf16, dx = dy w over the transposed panels, dw += dy^T x with dy^T and x
   packed per call (N * (O + K) roundings against N * O * K multiply-adds), f32 sums into the
   f32 gradients; db in f32. No memory for the bf16 copies of dy and x: declined. */
static int pairs_t_backward(clrt_model *m, acts *a, float *dx, int64_t w, float *db, const float *dy,
                            const float *x, int64_t N, int K, int O, int acc) {
  (void)a;
  float *dw = GW(m, w);
  if (N < 1) return 0;
  int64_t Np = (N + 31) / 32 * 32;   /* dw's k is N: padded to AMX's 32 with zeros */
  size_t n16 = (size_t)N * O, nt = dw ? (size_t)O * Np + (size_t)K * Np : 0;
  uint16_t *s = malloc(sizeof(uint16_t) * (n16 > nt ? n16 : nt));
  int done = s != NULL;
  if (done && dx) {
    clrt_to_bf16_rows(s, O, dy, O, 1, N, O);
    done = clrt_gemm_bf16(dx, K, s, O, N, W16(m, m->total + w), K, O, NULL, acc);
  }
  if (done && dw) {
    uint16_t *dyt = s, *xp = s + (size_t)O * Np;
    clrt_to_bf16_rows(dyt, Np, dy, 1, O, O, N);   /* dy^T [O, N] */
    clrt_pack_pairs(xp, x, K, 1, N, K, Np);        /* x as b(n, k) */
    done = clrt_gemm_bf16(dw, K, dyt, Np, O, xp, K, Np, NULL, 1);
  }
  free(s);
  if (!done) return 0;
  if (db)
    for (int o = 0; o < O; o++) {
      float t = 0;
      for (int64_t n = 0; n < N; n++) t += dy[n * O + o];
      db[o] += t;
    }
  return 1;
}

static void make_pairs(void *dst, const float *w, int K, int O) { clrt_linear_pack_bf16(dst, w, K, O); }
static void make_pair_rows(void *dst, const float *w, int K, int O, int r0, int r1) {
  clrt_pack_rows_bf16(dst, w, K, O, r0, r1);
}

static const linear_kernels rows = {"bf16 rows", rows_forward, NULL, NULL},
                            rows_invariant = {"bf16 rows: row-wise", rows_invariant_forward, NULL, NULL},
                            pairs = {"bf16 pairs", pairs_forward, pairs_forward_parts, NULL},
                            pairs_t = {"bf16 pairs, bf16 backward", pairs_forward, pairs_forward_parts,
                                       pairs_t_backward};

const weight_format model_bf16_rows = {"bf16 rows [O, K]", 1, NULL, NULL, FORMAT_LEVELS(&rows, &rows)},
                    model_bf16_rows_invariant = {"bf16 rows [O, K]", 1, NULL, NULL,
                                                 FORMAT_LEVELS(&rows_invariant, &rows_invariant)},
                    model_bf16_pairs = {"bf16 panels of pairs along K (clrt_linear_pack_bf16)", 1, make_pairs,
                                        make_pair_rows, FORMAT_LEVELS(&pairs, &pairs)},
                    model_bf16_pairs_t = {"bf16 panels of pairs along K, then the blocks' transposed",
                                          1, make_pairs, make_pair_rows, FORMAT_LEVELS(&pairs_t, &pairs_t)};
