/* test_linear_int8.c — the int8 products (kernels/cpu/linear_int8.c): every path this CPU runs
   (AVX512-VNNI, AVX-VNNI, portable; the others are named as skipped) against a
   scalar int8 reference written here from the definition (exact, to the bit), against the f32
   product within the quantization's error bound, and the same outputs whatever the row count;
   the activations' stored form (q + 128) byte by byte, and sums at the ends of its range. */
#include "clrt.h"
#include "check.h"
#include "cpu/linear_int8.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static clrt_rng rng;

static float *randv(size_t n, float scale) {
  float *p = malloc(sizeof(float) * (n ? n : 1));
  for (size_t i = 0; i < n; i++) p[i] = (float)(scale * clrt_rng_normal(&rng));
  return p;
}

/* Symmetric int8 of v with scale max|v| / 127, from the definition (not the kernel's code). */
static float quantize_ref(int8_t *q, const float *v, int n) {
  float amax = 0;
  for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(v[i]));
  if (amax == 0) {
    memset(q, 0, (size_t)n);
    return 1;
  }
  for (int i = 0; i < n; i++) {
    float r = nearbyintf(v[i] * (127.0f / amax));
    q[i] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
  }
  return amax / 127.0f;
}

static int exact_equal(const float *a, const float *b, size_t n) { return memcmp(a, b, sizeof(float) * n) == 0; }

static void check_shape(int64_t N, int K, int O, int with_bias, int zero_rows) {
  float *w = randv((size_t)O * K, 0.05f), *x = randv((size_t)N * K, 1.0f);
  float *b = with_bias ? randv((size_t)O, 0.1f) : NULL;
  if (zero_rows) {   /* an all-zero weight row and an all-zero input row: scale 1, output b */
    memset(w, 0, sizeof(float) * (size_t)K);
    memset(x, 0, sizeof(float) * (size_t)K);
  }
  int K4 = clrt_int8_k4(K);
  int8_t *wq = aligned_alloc(64, clrt_int8_packed_bytes(K, O));
  uint8_t *xq = malloc((size_t)N * K4);
  float *ws = malloc(sizeof(float) * O), *xs = malloc(sizeof(float) * N);
  int32_t *wsum = malloc(sizeof(int32_t) * O);
  clrt_int8_pack(wq, ws, wsum, w, K, O);
  clrt_int8_quantize_rows(xq, xs, x, N, K);

  /* reference: quantize from the definition, sum in int32, the documented epilogue */
  int8_t *qw = malloc((size_t)O * K), *qx = malloc((size_t)N * K);
  float *rws = malloc(sizeof(float) * O), *rxs = malloc(sizeof(float) * N);
  for (int o = 0; o < O; o++) rws[o] = quantize_ref(qw + (size_t)o * K, w + (size_t)o * K, K);
  for (int64_t n = 0; n < N; n++) rxs[n] = quantize_ref(qx + n * K, x + n * K, K);
  int scales_ok = 1, sums_ok = 1;
  for (int o = 0; o < O; o++) {
    int32_t s = 0;
    for (int k = 0; k < K; k++) s += qw[(size_t)o * K + k];
    scales_ok &= ws[o] == rws[o];
    sums_ok &= wsum[o] == s;
  }
  for (int64_t n = 0; n < N; n++) scales_ok &= xs[n] == rxs[n];
  CHECK(scales_ok);
  /* the activations' bytes: q + 128, the K4 padding q = 0 */
  int xq_ok = 1;
  for (int64_t n = 0; n < N; n++)
    for (int k = 0; k < K4; k++) xq_ok &= xq[n * K4 + k] == (k < K ? qx[n * K + k] : 0) + 128;
  CHECK(xq_ok);
  CHECK(sums_ok);
  float *yref = malloc(sizeof(float) * (size_t)N * O), *yf = malloc(sizeof(float) * (size_t)N * O);
  int dot_ok = 1;
  for (int64_t n = 0; n < N; n++)
    for (int o = 0; o < O; o++) {
      int32_t acc = 0;
      double f = b ? b[o] : 0;
      for (int k = 0; k < K; k++) {
        acc += (int32_t)qx[n * K + k] * qw[(size_t)o * K + k];
        f += (double)x[n * K + k] * w[(size_t)o * K + k];
      }
      dot_ok &= clrt_int8_dot_ref(xq + n * K4, wq, K, o) == acc;
      yref[n * O + o] = fmaf((float)acc * rxs[n], rws[o], b ? b[o] : 0.0f);
      yf[n * O + o] = (float)f;
    }
  CHECK(dot_ok);

  float *y = malloc(sizeof(float) * (size_t)N * O), *y1 = malloc(sizeof(float) * (size_t)O);
  for (int path = 0; path < CLRT_INT8_PATHS; path++) {
    if (!clrt_int8_path_available(path)) continue;
    for (size_t i = 0; i < (size_t)N * O; i++) y[i] = NAN;   /* an unwritten output shows */
    CHECK(clrt_int8_linear(y, xq, xs, wq, ws, wsum, b, N, K, O, path) == 0);
    if (!exact_equal(y, yref, (size_t)N * O))
      fprintf(stderr, "path %s, N=%lld K=%d O=%d: differs from the scalar int8 reference\n",
              clrt_int8_path_name(path), (long long)N, K, O);
    CHECK(exact_equal(y, yref, (size_t)N * O));
    /* one row at a time gives the same bits as the whole batch (no row-count dependence) */
    int rows_ok = 1;
    for (int64_t n = 0; n < N; n++) {
      clrt_int8_linear(y1, xq + n * K4, xs + n, wq, ws, wsum, b, 1, K, O, path);
      rows_ok &= exact_equal(y1, y + n * O, (size_t)O);
    }
    CHECK(rows_ok);
  }
  /* against f32: within the bound of the two roundings, sum_k |x| ws/2 + |w| xs/2 + xs ws/4,
     and the batch's relative error is small (measured ~0.5-1% for Gaussian data) */
  int bound_ok = 1;
  double num = 0, den = 0;
  for (int64_t n = 0; n < N; n++)
    for (int o = 0; o < O; o++) {
      double bound = 1e-5;
      for (int k = 0; k < K; k++)
        bound += fabs(x[n * K + k]) * ws[o] / 2 + fabs(w[(size_t)o * K + k]) * xs[n] / 2 + xs[n] * ws[o] / 4;
      double e = fabs((double)y[n * O + o] - yf[n * O + o]);
      bound_ok &= e <= bound;
      num += e * e;
      den += (double)yf[n * O + o] * yf[n * O + o];
    }
  CHECK(bound_ok);
  if (den > 0) CHECK(sqrt(num / den) < 0.03);
  if (zero_rows) {
    int zero_ok = 1;
    for (int o = 0; o < O; o++) zero_ok &= y[o] == (b ? b[o] : 0.0f);
    for (int64_t n = 0; n < N; n++) zero_ok &= y[n * O] == (b ? b[0] : 0.0f);
    CHECK(zero_ok);
  }
  free(w), free(x), free(b), free(wq), free(xq), free(ws), free(xs), free(wsum), free(qw), free(qx);
  free(rws), free(rxs), free(yref), free(yf), free(y), free(y1);
}

/* Halves round to even, the largest |x| maps to exactly +-127, and the row's scale is exact:
   rows built so that x * (127 / amax) lands on .5 (amax = 127, so the factor is 1). */
static void check_quantize_ties(void) {
  const int K = 37;   /* two 16-lane blocks and a tail */
  float x[2 * 37];
  for (int k = 0; k < K; k++) x[k] = (float)(k % 9) - 4.5f;   /* -4.5 .. 3.5: every one a half */
  x[5] = 127.0f;
  for (int k = 0; k < K; k++) x[K + k] = -x[k];
  uint8_t q[2 * 40];
  float xs[2];
  memset(q, 0x55, sizeof q);
  clrt_int8_quantize_rows(q, xs, x, 2, K);
  int ok = xs[0] == 1.0f && xs[1] == 1.0f;
  for (int n = 0; n < 2; n++)
    for (int k = 0; k < 40; k++) {
      float v = k < K ? x[n * K + k] : 0;
      ok &= q[n * 40 + k] == (int)nearbyintf(v) + 128;   /* v is the scaled value here */
    }
  CHECK(ok);
}

/* The ends of the stored range, sums known in closed form: rows of all +a, all -a (q = +-127,
   bytes 255 and 1) and zeros (byte 128) against weight rows of all +c and all -c (q = +-127)
   give +-127 * 127 * K and 0, on every path; K % 4 != 0 puts padding bytes beside them, and
   9 rows cover the 8-row and 1-row tiles. A byte read without its offset, flipped a second
   time, or a 128 * wsum correction dropped moves these sums by 128 * 127 * K or more. */
static void check_offset_extremes(void) {
  enum { N = 9, K = 38, K4 = 40, O = 18 };
  static const float row_sign[N] = {1, -1, 0, 1, -1, 0, -1, 1, 1};
  float x[N * K], w[O * K], y[N * O];
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++) x[n * K + k] = row_sign[n] * 0.75f;
  for (int o = 0; o < O; o++)
    for (int k = 0; k < K; k++) w[o * K + k] = (o % 3 == 1 ? -0.25f : 0.25f);
  CHECK(clrt_int8_k4(K) == K4);
  int8_t *wq = aligned_alloc(64, clrt_int8_packed_bytes(K, O));
  uint8_t xq[N * K4];
  float ws[O], xs[N];
  int32_t wsum[O];
  clrt_int8_pack(wq, ws, wsum, w, K, O);
  clrt_int8_quantize_rows(xq, xs, x, N, K);
  int bytes_ok = 1;
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K4; k++) bytes_ok &= xq[n * K4 + k] == (k < K ? 128 + 127 * (int)row_sign[n] : 128);
  CHECK(bytes_ok);
  for (int path = 0; path < CLRT_INT8_PATHS; path++) {
    if (!clrt_int8_path_available(path)) continue;
    CHECK(clrt_int8_linear(y, xq, xs, wq, ws, wsum, NULL, N, K, O, path) == 0);
    int ok = 1;
    for (int n = 0; n < N; n++)
      for (int o = 0; o < O; o++) {
        int32_t acc = (int32_t)row_sign[n] * (o % 3 == 1 ? -1 : 1) * 127 * 127 * K;
        ok &= clrt_int8_dot_ref(xq + n * K4, wq, K, o) == acc;
        ok &= y[n * O + o] == fmaf((float)acc * xs[n], ws[o], 0.0f);
      }
    if (!ok)
      fprintf(stderr, "path %s: the closed-form sums at the ends of the range differ\n", clrt_int8_path_name(path));
    CHECK(ok);
  }
  free(wq);
}

int main(void) {
  clrt_rng_seed(&rng, 7);
  printf("int8 path on this CPU: %s\n", clrt_int8_path_name(clrt_int8_path()));
  for (int path = 0; path < CLRT_INT8_PATHS; path++)
    if (!clrt_int8_path_available(path))
      printf("skip: this CPU does not run the %s path; it was not tested here\n", clrt_int8_path_name(path));
    else
      printf("tested: %s\n", clrt_int8_path_name(path));
  check_shape(1, 64, 16, 1, 0);
  check_shape(3, 37, 29, 1, 0);    /* K not a multiple of 4, O not of 16 */
  check_shape(5, 130, 70, 0, 1);   /* zero rows, no bias, P = 1..4 panels, R tails */
  check_shape(9, 256, 200, 1, 0);
  check_shape(7, 896, 128, 1, 0);  /* Qwen2.5-0.5B's k/v shape */
  check_shape(80, 903, 48, 1, 0);  /* enough rows for the threaded quantization, K % 16 != 0 */
  check_shape(15, 130, 70, 1, 1);  /* 8-row tiles, then 4 + 2 + 1; a last pair of one panel */
  check_shape(13, 64, 16, 0, 0);   /* 8 + 4 + 1 rows, one panel */
  check_quantize_ties();
  check_offset_extremes();
  return check_summary();
}
