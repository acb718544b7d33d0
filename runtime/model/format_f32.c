/* format_f32.c — the f32 formats of the linear weights and their products:
     f32 rows    the master params themselves, [O, K] row-major. Its kernel sets: sgemm (the
                 skinny kernel below 33 rows, kernels/cpu/linear.c); the tiles that pack w on
                 the fly past a decode step's rows and run the backward in place
                 (gemm_strided.c, ~1.3-2.5x sgemm here; at the vector levels only); and the
                 batch-invariant forward, each row's sums in an order fixed by K alone
                 (linear_rowwise.c), with either backward.
     f32 panels  clrt_linear_pack's 48-wide panels (wpk, same offsets), any number of rows
                 in one order per row (linear_packed.c: faster than sgemm, and batch
                 invariant); made at the vector levels only; trains with f32 rows' backward. */
#include "model_internal.h"

/* ---- f32 rows --------------------------------------------------------------------------------- */

static int blas_forward(clrt_model *m, acts *a, float *y, const float *x, int64_t w, const float *b, int64_t N,
                        int K, int O) {
  (void)a;
  clrt_linear_forward(y, x, PW(m, w), b, N, K, O);
  return 1;
}

/* Few rows read w once per row anyway: the skinny kernel (through clrt_linear_forward) then. */
static int tiles_forward(clrt_model *m, acts *a, float *y, const float *x, int64_t w, const float *b, int64_t N,
                         int K, int O) {
  if (N > CLRT_SKINNY_MAX_ROWS && clrt_linear_forward_strided(y, x, PW(m, w), b, N, K, O)) return 1;
  return blas_forward(m, a, y, x, w, b, N, K, O);
}

static int invariant_forward(clrt_model *m, acts *a, float *y, const float *x, int64_t w, const float *b,
                             int64_t N, int K, int O) {
  (void)a;
  clrt_linear_rowwise_forward(y, x, PW(m, w), b, N, K, O);
  return 1;
}

static int blas_backward(clrt_model *m, acts *a, float *dx, int64_t w, float *db, const float *dy, const float *x,
                         int64_t N, int K, int O, int acc) {
  (void)a;
  clrt_linear_backward(dx, GW(m, w), db, dy, x, PW(m, w), N, K, O, acc);
  return 1;
}

/* The tiles decline only sizes past int32 (sgemm then). */
static int tiles_backward(clrt_model *m, acts *a, float *dx, int64_t w, float *db, const float *dy,
                          const float *x, int64_t N, int K, int O, int acc) {
  if (clrt_linear_backward_strided(dx, GW(m, w), db, dy, x, PW(m, w), N, K, O, acc)) return 1;
  return blas_backward(m, a, dx, w, db, dy, x, N, K, O, acc);
}

static const linear_kernels blas = {"f32 rows: sgemm", blas_forward, NULL, blas_backward},
                            tiles = {"f32 rows: tiles", tiles_forward, NULL, tiles_backward},
                            blas_invariant = {"f32 rows: row-wise, sgemm backward", invariant_forward, NULL,
                                              blas_backward},
                            tiles_invariant = {"f32 rows: row-wise, tiles backward", invariant_forward, NULL,
                                               tiles_backward};

/* Indexed by F32_BLAS .. F32_TILES_INVARIANT; the tiles have no portable kernel: there the
   sets are sgemm's. */
const weight_format model_f32_rows[F32_ROWS_SETS] = {
    [F32_BLAS] = {"f32 rows [O, K] (the master weights)", 1, NULL, NULL, FORMAT_LEVELS(&blas, &blas)},
    [F32_TILES] = {"f32 rows [O, K] (the master weights)", 1, NULL, NULL, FORMAT_LEVELS(&blas, &tiles)},
    [F32_BLAS_INVARIANT] = {"f32 rows [O, K] (the master weights)", 1, NULL, NULL,
                            FORMAT_LEVELS(&blas_invariant, &blas_invariant)},
    [F32_TILES_INVARIANT] = {"f32 rows [O, K] (the master weights)", 1, NULL, NULL,
                             FORMAT_LEVELS(&blas_invariant, &tiles_invariant)},
};

/* ---- f32 panels ------------------------------------------------------------------------------- */

static int panels_forward(clrt_model *m, acts *a, float *y, const float *x, int64_t w, const float *b,
                          int64_t N, int K, int O) {
  (void)a;
  return clrt_linear_packed_forward(y, x, (const float *)m->wpk.s->data + w, b, N, K, O);
}

/* One parallel pass over all the parts' panels (see linear_packed.c). */
static int panels_forward_parts(clrt_model *m, acts *a, const float *x, int64_t N, int K, const lin_part *parts,
                                int count) {
  (void)a;
  clrt_packed_part packed[3] = {{0}};
  if (count > 3) return 0;
  for (int i = 0; i < count; i++)
    packed[i] = (clrt_packed_part){parts[i].y, (const float *)m->wpk.s->data + parts[i].w, parts[i].b, parts[i].O};
  return clrt_linear_packed_forward_parts(x, N, K, packed, count);
}

static void make_panels(void *dst, const float *w, int K, int O) { clrt_linear_pack(dst, w, K, O); }
static void make_panel_rows(void *dst, const float *w, int K, int O, int r0, int r1) {
  clrt_pack_rows_f32(dst, w, K, O, r0, r1);
}

static const linear_kernels panels = {"f32 panels", panels_forward, panels_forward_parts, NULL};
const weight_format model_f32_panels = {"f32 panels of 48 output rows (clrt_linear_pack)", 1, make_panels,
                                        make_panel_rows, FORMAT_LEVELS(NULL, &panels)};
