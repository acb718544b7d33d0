/* test_tensor_core.c — storage sharing, views, element access, copies and errors. */
#include "clrt.h"
#include "check.h"
#include "bf16.h"

static void test_views_share_storage(void) {
  int64_t shape[3] = {7, 13, 5};
  clrt_tensor *t = clrt_tensor_new(CLRT_F32, 3, shape, CLRT_CPU);
  for (int64_t i = 0; i < 7 * 13 * 5; i++) clrt_tensor_set(t, i, (double)i);
  clrt_tensor *tr = clrt_tensor_transpose(t, 0, 2);   /* [5, 13, 7] */
  CHECK(tr->dims[0] == 5 && tr->dims[2] == 7);
  CHECK(!clrt_tensor_is_contiguous(tr));
  /* tr[i][j][k] == t[k][j][i] */
  for (int i = 0; i < 5; i++)
    for (int k = 0; k < 7; k++) {
      int j = 11;
      CHECK_NEAR(clrt_tensor_get(tr, (i * 13 + j) * 7 + k), (double)((k * 13 + j) * 5 + i), 0);
    }
  clrt_tensor *nar = clrt_tensor_narrow(t, 1, 3, 4);   /* [7, 4, 5] */
  clrt_tensor_set(nar, 0, -1.0);
  CHECK_NEAR(clrt_tensor_get(t, 3 * 5), -1.0, 0);     /* the write shows through */
  CHECK(nar->storage == t->storage && t->storage->refcount == 3);
  clrt_tensor *c = clrt_tensor_clone(tr);
  CHECK(clrt_tensor_is_contiguous(c) && c->storage != t->storage);
  for (int64_t i = 0; i < 7 * 13 * 5; i += 17) CHECK_NEAR(clrt_tensor_get(c, i), clrt_tensor_get(tr, i), 0);
  clrt_tensor_free(t);  /* views keep the storage alive */
  CHECK_NEAR(clrt_tensor_get(nar, 0), -1.0, 0);
  clrt_tensor_free(nar);
  clrt_tensor_free(tr);
  clrt_tensor_free(c);
}

static void test_errors(void) {
  int64_t shape[2] = {2, 3};
  clrt_tensor *t = clrt_tensor_new(CLRT_F32, 2, shape, CLRT_CPU);
  int64_t bad[2] = {4, 2};
  CHECK(clrt_tensor_reshape(t, 2, bad) == NULL);
  CHECK_ERROR("reshape: cannot view 6 elements as a shape of 8 elements");
  CHECK(clrt_tensor_narrow(t, 1, 2, 2) == NULL);
  CHECK_ERROR("out of bounds for dimension 1 of size 3");
  CHECK(clrt_tensor_set(t, 6, 1.0) != 0);
  CHECK_ERROR("index 6 out of range for 6 elements");
  int64_t neg[1] = {-1};
  CHECK(clrt_tensor_new(CLRT_F32, 1, neg, CLRT_CPU) == NULL);
  CHECK_ERROR("negative size");
  clrt_tensor_free(t);
}

static void test_bf16_roundtrip(void) {
  /* bf16 keeps 8 bits of mantissa: values with few significant bits survive exactly, and
     rounding is to nearest even (1 + 2^-8 sits halfway between 1 and 1 + 2^-7). */
  CHECK(clrt_bf16_to_f32(clrt_f32_to_bf16(1.5f)) == 1.5f);
  CHECK(clrt_bf16_to_f32(clrt_f32_to_bf16(1.0f + 1.0f / 256)) == 1.0f);
  CHECK(clrt_bf16_to_f32(clrt_f32_to_bf16(1.0f + 3.0f / 256)) == 1.0f + 4.0f / 256);
  int64_t shape[1] = {3};
  clrt_tensor *t = clrt_tensor_new(CLRT_F32, 1, shape, CLRT_CPU);
  clrt_tensor_set(t, 0, 3.140625);
  clrt_tensor_set(t, 1, -2.0);
  clrt_tensor_set(t, 2, 7.5);
  clrt_tensor *b = clrt_tensor_to_dtype(t, CLRT_BF16);
  clrt_tensor *i = clrt_tensor_to_dtype(b, CLRT_I32);
  CHECK_NEAR(clrt_tensor_get(b, 0), 3.140625, 0);
  CHECK_NEAR(clrt_tensor_get(i, 2), 7.0, 0);
  clrt_tensor_free(t);
  clrt_tensor_free(b);
  clrt_tensor_free(i);
}

static void test_rng(void) {
  clrt_rng a, b;
  clrt_rng_seed(&a, 42);
  clrt_rng_seed(&b, 42);
  for (int k = 0; k < 100; k++) CHECK(clrt_rng_next(&a) == clrt_rng_next(&b));
  /* Moments of 200k normals: mean 0 and variance 1 within a few standard errors. */
  double s = 0, s2 = 0;
  int n = 200000;
  for (int k = 0; k < n; k++) {
    double x = clrt_rng_normal(&a);
    s += x;
    s2 += x * x;
  }
  CHECK_NEAR(s / n, 0.0, 0.01);
  CHECK_NEAR(s2 / n, 1.0, 0.02);
}

int main(void) {
  test_views_share_storage();
  test_errors();
  test_bf16_roundtrip();
  test_rng();
  return check_summary();
}
