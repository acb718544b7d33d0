/* test_tensor_ops.c — the tensor ops through the C API against naive loops here, chosen to
   reach every code path (long rows split into chunks, four-operand where, strided and
   transposed matmul operands, the copy fallback, multi-piece reductions) so the sanitizer
   build checks each of them for memory and UB errors. */
#include "clrt.h"
#include "check.h"
#include "bf16.h"

#include <math.h>
#include <stdlib.h>

static clrt_rng rng;

static clrt_tensor *randn(int ndim, const int64_t *shape) {
  clrt_tensor *t = clrt_tensor_new(CLRT_F32, ndim, shape, CLRT_CPU);
  clrt_tensor_randn_(t, &rng);
  return t;
}

static float *F(const clrt_tensor *t) { return clrt_tensor_data(t); }

/* Max relative error of got (contiguous f32) against ref over n values. */
static double max_rel(const float *got, const double *ref, int64_t n, double atol) {
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs(got[i] - ref[i]) / (fabs(ref[i]) + atol);
    if (!(e <= worst)) worst = e;   /* NaN counts as the worst */
  }
  return worst;
}

static void test_broadcast_binary(void) {
  /* [7, 13, 5] op [13, 1], and a long contiguous row (> one chunk) */
  int64_t sa[3] = {7, 13, 5}, sb[2] = {13, 1};
  clrt_tensor *a = randn(3, sa), *b = randn(2, sb);
  double ref[7 * 13 * 5];
  for (int op = CLRT_OP_ADD; op < CLRT_OP_BINARY_COUNT; op++) {
    if (op == CLRT_OP_POW) continue;   /* negative bases; covered from Lua */
    clrt_tensor *r = clrt_tensor_binary(op, a, b);
    CHECK(r && r->ndim == 3 && r->dims[2] == 5);
    for (int i = 0; i < 7; i++)
      for (int j = 0; j < 13; j++)
        for (int k = 0; k < 5; k++) {
          double x = F(a)[(i * 13 + j) * 5 + k], y = F(b)[j], v = 0;
          switch (op) {
            case CLRT_OP_ADD: v = x + y; break;
            case CLRT_OP_SUB: v = x - y; break;
            case CLRT_OP_MUL: v = x * y; break;
            case CLRT_OP_DIV: v = x / y; break;
            case CLRT_OP_MAXIMUM: v = x > y ? x : y; break;
            case CLRT_OP_MINIMUM: v = x < y ? x : y; break;
            case CLRT_OP_EQ: v = x == y; break;
            case CLRT_OP_NE: v = x != y; break;
            case CLRT_OP_LT: v = x < y; break;
            case CLRT_OP_LE: v = x <= y; break;
            case CLRT_OP_GT: v = x > y; break;
            case CLRT_OP_GE: v = x >= y; break;
          }
          ref[(i * 13 + j) * 5 + k] = v;
        }
    CHECK(max_rel(F(r), ref, 7 * 13 * 5, 1e-30) < 1e-6);
    clrt_tensor_free(r);
  }
  int64_t sl[1] = {100003};
  clrt_tensor *l = randn(1, sl), *lt = clrt_tensor_binary_scalar(CLRT_OP_SUB, l, 1.5, 1);
  int bad = 0;
  for (int64_t i = 0; i < sl[0]; i++) bad += F(lt)[i] != (float)(1.5 - F(l)[i]);
  CHECK(bad == 0);
  clrt_tensor_free(l);
  clrt_tensor_free(lt);
  /* broadcast errors name both shapes */
  int64_t s4[1] = {4};
  clrt_tensor *c = clrt_tensor_new(CLRT_F32, 1, s4, CLRT_CPU);
  CHECK(clrt_tensor_binary(CLRT_OP_ADD, a, c) == NULL);
  CHECK_ERROR("add: shapes [7, 13, 5] and [4] cannot broadcast");
  CHECK(clrt_tensor_binary_(CLRT_OP_MUL, b, a) == -1);
  CHECK_ERROR("mul_: shapes [13, 1] and [7, 13, 5] cannot broadcast into [13, 1]");
  clrt_tensor_free(a);
  clrt_tensor_free(b);
  clrt_tensor_free(c);
}

static void test_inplace_views_and_dtypes(void) {
  int64_t s[2] = {6, 6};
  clrt_tensor *m = clrt_tensor_new(CLRT_F32, 2, s, CLRT_CPU);
  for (int i = 0; i < 36; i++) F(m)[i] = (float)i;
  clrt_tensor *mt = clrt_tensor_transpose(m, 0, 1);
  CHECK(clrt_tensor_binary_(CLRT_OP_ADD, m, mt) == 0);   /* reads a copy of the transpose */
  int bad = 0;
  for (int i = 0; i < 6; i++)
    for (int j = 0; j < 6; j++) bad += F(m)[i * 6 + j] != (float)(i * 6 + j + j * 6 + i);
  CHECK(bad == 0);
  clrt_tensor *col = clrt_tensor_narrow(m, 1, 2, 1);     /* [6, 1] strided view */
  CHECK(clrt_tensor_unary_(CLRT_OP_NEG, col) == 0);
  CHECK(F(m)[3 * 6 + 2] == -(float)(3 * 6 + 2 + 2 * 6 + 3));
  /* bf16 in place: computed in f32, rounded back */
  clrt_tensor *h = clrt_tensor_to_dtype(m, CLRT_BF16);
  CHECK(clrt_tensor_binary_scalar_(CLRT_OP_MUL, h, 0.5) == 0);
  CHECK_NEAR(clrt_tensor_get(h, 7), clrt_bf16_to_f32(clrt_f32_to_bf16(F(m)[7])) * 0.5, 1e-6);
  /* i32: exact integers, in-place float result refused */
  clrt_tensor *k = clrt_tensor_to_dtype(m, CLRT_I32);
  clrt_tensor *k2 = clrt_tensor_binary(CLRT_OP_MUL, k, k);
  CHECK(k2->dtype_id == CLRT_I32 && clrt_tensor_get(k2, 7) == 14.0 * 14.0);
  CHECK(clrt_tensor_binary_scalar_(CLRT_OP_ADD, k, 0.5) == -1);
  CHECK_ERROR("add_: result dtype f32 cannot be stored in the i32 tensor");
  clrt_tensor *kd = clrt_tensor_binary(CLRT_OP_DIV, k, k2);
  CHECK(kd->dtype_id == CLRT_F32);
  clrt_tensor *kc = clrt_tensor_binary(CLRT_OP_GE, k, k2);
  CHECK(kc->dtype_id == CLRT_F32 && clrt_tensor_get(kc, 0) == 1.0 && clrt_tensor_get(kc, 7) == 0.0);
  clrt_tensor *ka = clrt_tensor_unary(CLRT_OP_ABS, k);
  CHECK(ka->dtype_id == CLRT_I32 && clrt_tensor_get(ka, 14) == -clrt_tensor_get(k, 14));
  clrt_tensor *objs[] = {m, mt, col, h, k, k2, kd, kc, ka};
  for (size_t i = 0; i < sizeof objs / sizeof objs[0]; i++) clrt_tensor_free(objs[i]);
}

static void test_where_masked_fill(void) {
  int64_t sa[2] = {9, 40}, sc[2] = {9, 1}, sb[1] = {40};
  clrt_tensor *a = randn(2, sa), *c = randn(2, sc), *b = randn(1, sb);
  clrt_tensor *w = clrt_tensor_where(c, a, b);
  int bad = 0;
  for (int i = 0; i < 9; i++)
    for (int j = 0; j < 40; j++)
      bad += F(w)[i * 40 + j] != (F(c)[i] != 0 ? F(a)[i * 40 + j] : F(b)[j]);
  CHECK(bad == 0);
  clrt_tensor *orig = clrt_tensor_clone(a);
  clrt_tensor *at = clrt_tensor_transpose(a, 0, 1);   /* fill through a strided view */
  clrt_tensor *mask = clrt_tensor_binary_scalar(CLRT_OP_GT, at, 0.0, 0);
  CHECK(clrt_tensor_masked_fill_(at, mask, -7.0) == 0);
  bad = 0;
  for (int i = 0; i < 9 * 40; i++) bad += F(a)[i] != (F(orig)[i] > 0 ? -7.0f : F(orig)[i]);
  CHECK(bad == 0);
  clrt_tensor *objs[] = {a, c, b, w, at, mask, orig};
  for (size_t i = 0; i < sizeof objs / sizeof objs[0]; i++) clrt_tensor_free(objs[i]);
}

static void test_reductions_and_softmax(void) {
  /* inner = 300 > one column block; n = 257 */
  int64_t s[3] = {3, 257, 300};
  clrt_tensor *a = randn(3, s);
  clrt_tensor *sum = clrt_tensor_reduce(CLRT_RED_SUM, a, 1, 0);
  clrt_tensor *amax = clrt_tensor_reduce(CLRT_RED_ARGMAX, a, 1, 1);
  clrt_tensor *sm = clrt_tensor_softmax(a, 1, 0), *lsm = clrt_tensor_softmax(a, 2, 1);
  CHECK(sum->ndim == 2 && amax->ndim == 3 && amax->dims[1] == 1 && amax->dtype_id == CLRT_I32);
  double *ref = malloc(sizeof(double) * 3 * 257 * 300);
  int bad = 0;
  for (int o = 0; o < 3; o++)
    for (int c = 0; c < 300; c++) {
      double acc = 0, mx = -INFINITY, z = 0;
      int pos = 0;
      for (int j = 0; j < 257; j++) {
        double x = F(a)[(o * 257 + j) * 300 + c];
        acc += x;
        if (x > mx) mx = x, pos = j;
      }
      for (int j = 0; j < 257; j++) z += exp(F(a)[(o * 257 + j) * 300 + c] - mx);
      for (int j = 0; j < 257; j++)
        ref[(o * 257 + j) * 300 + c] = exp(F(a)[(o * 257 + j) * 300 + c] - mx) / z;
      CHECK_NEAR(F(sum)[o * 300 + c], acc, 1e-5 * (fabs(acc) + 1e-3));
      bad += ((int32_t *)clrt_tensor_data(amax))[o * 300 + c] != pos;
    }
  CHECK(bad == 0);
  CHECK(max_rel(F(sm), ref, 3 * 257 * 300, 1e-30) < 1e-5);
  /* log_softmax over the last dimension */
  for (int r = 0; r < 3 * 257; r++) {
    double mx = -INFINITY, z = 0;
    for (int c = 0; c < 300; c++) mx = fmax(mx, F(a)[r * 300 + c]);
    for (int c = 0; c < 300; c++) z += exp(F(a)[r * 300 + c] - mx);
    for (int c = 0; c < 300; c++) ref[r * 300 + c] = F(a)[r * 300 + c] - mx - log(z);
  }
  CHECK(max_rel(F(lsm), ref, 3 * 257 * 300, 1e-6) < 1e-5);
  /* over everything, in several pieces */
  double total = 0, got = 0, am = 0;
  for (int i = 0; i < 3 * 257 * 300; i++) total += F(a)[i];
  CHECK(clrt_tensor_reduce_all(CLRT_RED_SUM, a, &got) == 0);
  CHECK_NEAR(got, total, 1e-5 * fabs(total) + 1e-4);
  CHECK(clrt_tensor_reduce_all(CLRT_RED_ARGMIN, a, &am) == 0);
  int best = 0;
  for (int i = 1; i < 3 * 257 * 300; i++)
    if (F(a)[i] < F(a)[best]) best = i;
  CHECK(am == best);
  CHECK(clrt_tensor_reduce(CLRT_RED_MAX, a, 3, 0) == NULL);
  CHECK_ERROR("max: dimension index 3 (0-based) out of range for shape [3, 257, 300]");
  free(ref);
  clrt_tensor *objs[] = {a, sum, amax, sm, lsm};
  for (size_t i = 0; i < sizeof objs / sizeof objs[0]; i++) clrt_tensor_free(objs[i]);
}

/* C = A @ B naively from tensors of any strides (through clrt_tensor_get). */
static void check_matmul(const clrt_tensor *a, const clrt_tensor *b, int64_t M, int64_t K, int64_t N) {
  clrt_tensor *c = clrt_tensor_matmul(a, b);
  CHECK(c != NULL);
  if (!c) return;
  double worst = 0;
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double acc = 0, mag = 0;
      for (int64_t k = 0; k < K; k++) {
        double p = clrt_tensor_get(a, i * K + k) * clrt_tensor_get(b, k * N + j);
        acc += p;
        mag += fabs(p);
      }
      double e = fabs(F(c)[i * N + j] - acc) / (mag + 1e-30);
      if (!(e <= worst)) worst = e;
    }
  CHECK(worst < 1e-5);
  clrt_tensor_free(c);
}

static void test_matmul(void) {
  int64_t sa[2] = {257, 129}, sat[2] = {129, 257}, sb[2] = {129, 65}, sw[2] = {257, 140};
  clrt_tensor *a = randn(2, sa), *b = randn(2, sb), *at = randn(2, sat), *w = randn(2, sw);
  check_matmul(a, b, 257, 129, 65);
  clrt_tensor *t = clrt_tensor_transpose(at, 0, 1);   /* [257, 129], sgemm reads it transposed */
  check_matmul(t, b, 257, 129, 65);
  clrt_tensor *n = clrt_tensor_narrow(w, 1, 5, 129);  /* row stride 140 */
  check_matmul(n, b, 257, 129, 65);
  /* every other column: neither layout fits, so it is copied first */
  int64_t s2[2] = {257, 258};
  clrt_tensor *w2 = randn(2, s2);
  int64_t st[2] = {258, 2};
  clrt_tensor *odd = clrt_tensor_over(w2->storage, CLRT_F32, 2, sa, st, 0);
  check_matmul(odd, b, 257, 129, 65);
  int64_t s4[2] = {4, 5};
  clrt_tensor *bad = clrt_tensor_new(CLRT_F32, 2, s4, CLRT_CPU);
  CHECK(clrt_tensor_matmul(a, bad) == NULL);
  CHECK_ERROR("matmul: shapes [257, 129] and [4, 5] do not match (129 != 4)");
  clrt_tensor *objs[] = {a, b, at, w, t, n, w2, odd, bad};
  for (size_t i = 0; i < sizeof objs / sizeof objs[0]; i++) clrt_tensor_free(objs[i]);
}

int main(void) {
  clrt_rng_seed(&rng, 42);
  test_broadcast_binary();
  test_inplace_views_and_dtypes();
  test_where_masked_fill();
  test_reductions_and_softmax();
  test_matmul();
  return check_summary();
}
