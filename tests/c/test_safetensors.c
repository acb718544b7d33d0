/* test_safetensors.c — dtype conversions (F16 subnormals, infinities, BF16, F64, I64), the
   writer's layout (8-byte aligned data, escaped names and metadata) and a round trip. */
#include "clrt.h"
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t image(uint8_t *buf, const char *header, const void *data, size_t n) {
  uint64_t h = strlen(header);
  for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(h >> (8 * i));
  memcpy(buf + 8, header, h);
  memcpy(buf + 8 + h, data, n);
  return 8 + h + n;
}

static void test_conversions(void) {
  uint16_t f16[6] = {0x3C00, 0xC000, 0x0001, 0x03FF, 0x7C00, 0x8000};   /* 1, -2, subnormals, inf, -0 */
  uint16_t bf16[2] = {0x3F80, 0xC0A0};                                  /* 1, -5 */
  double f64[2] = {0.1, -1e300};
  int64_t i64[2] = {7, -3};
  uint8_t data[12 + 4 + 16 + 16];
  memcpy(data, f16, 12);
  memcpy(data + 12, bf16, 4);
  memcpy(data + 16, f64, 16);
  memcpy(data + 32, i64, 16);
  const char *hdr = "{\"h\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[12,16]},"
                    "\"d\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[16,32]},"
                    "\"i\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[32,48]},"
                    "\"__metadata__\":{\"k\":\"v\\u00e9\"}}";
  uint8_t buf[1024];
  size_t len = image(buf, hdr, data, sizeof data);
  clrt_safetensors *st = clrt_safetensors_open_memory(buf, len, "mem");
  CHECK(st != NULL);
  if (!st) return;
  CHECK(clrt_safetensors_count(st) == 4);
  CHECK(strcmp(clrt_safetensors_metadata(st, "k"), "v\xc3\xa9") == 0);
  float out[6];
  int h = clrt_safetensors_find(st, "h");
  CHECK(clrt_safetensors_read_f32(st, h, out, 6) == 0);
  CHECK_NEAR(out[0], 1, 0);
  CHECK_NEAR(out[1], -2, 0);
  CHECK_NEAR(out[2], ldexp(1, -24), 0);
  CHECK_NEAR(out[3], ldexp(1023, -24), 0);
  CHECK(isinf(out[4]) && out[4] > 0);
  CHECK(out[5] == 0 && signbit(out[5]));
  CHECK(clrt_safetensors_read_f32(st, h, out, 5) == -1);
  CHECK_ERROR("has 6 elements, expected 5");
  CHECK(clrt_safetensors_read_f32(st, clrt_safetensors_find(st, "b"), out, 2) == 0);
  CHECK_NEAR(out[1], -5, 0);
  CHECK(clrt_safetensors_read_f32(st, clrt_safetensors_find(st, "d"), out, 2) == 0);
  CHECK_NEAR(out[0], 0.1f, 0);
  CHECK(isinf(out[1]));
  int i = clrt_safetensors_find(st, "i");
  CHECK(clrt_safetensors_read_f32(st, i, out, 2) == -1);
  CHECK_ERROR("tensor 'i' has dtype I64");
  clrt_tensor *t = clrt_safetensors_tensor(st, i);
  CHECK(t && t->dtype_id == CLRT_I32 && clrt_tensor_get(t, 1) == -3);
  clrt_tensor_free(t);
  CHECK(clrt_safetensors_find(st, "nope") == -1);
  clrt_safetensors_close(st);
}

static void test_write_round_trip(void) {
  char path[] = "/tmp/clrt-st-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  close(fd);
  int64_t s1[2] = {2, 3}, s2[1] = {5};
  clrt_tensor *a = clrt_tensor_new(CLRT_F32, 2, s1, CLRT_CPU), *b = clrt_tensor_new(CLRT_BF16, 1, s2, CLRT_CPU);
  for (int k = 0; k < 6; k++) clrt_tensor_set(a, k, k * 0.5 - 1);
  for (int k = 0; k < 5; k++) clrt_tensor_set(b, k, k + 0.25);
  const char *names[2] = {"a \"quoted\"\n", "b"};
  const clrt_tensor *ts[2] = {a, b};
  const char *mk[1] = {"step"}, *mv[1] = {"12"};
  CHECK(clrt_safetensors_write(path, 2, names, ts, 1, mk, mv) == 0);
  FILE *f = fopen(path, "rb");
  uint8_t len8[8];
  CHECK(f && fread(len8, 1, 8, f) == 8);
  uint64_t hl = 0;
  for (int k = 7; k >= 0; k--) hl = (hl << 8) | len8[k];
  CHECK(hl % 8 == 0);   /* the data section starts 8-byte aligned */
  if (f) fclose(f);
  clrt_safetensors *st = clrt_safetensors_open(path);
  CHECK(st != NULL);
  if (st) {
    CHECK(strcmp(clrt_safetensors_metadata(st, "step"), "12") == 0);
    int ia = clrt_safetensors_find(st, "a \"quoted\"\n");
    CHECK(ia >= 0 && strcmp(clrt_safetensors_dtype(st, ia), "F32") == 0);
    CHECK(clrt_safetensors_ndim(st, ia) == 2 && clrt_safetensors_dim(st, ia, 1) == 3);
    float out[6];
    CHECK(clrt_safetensors_read_f32(st, ia, out, 6) == 0);
    CHECK_NEAR(out[5], 1.5, 0);
    int ib = clrt_safetensors_find(st, "b");
    CHECK(strcmp(clrt_safetensors_dtype(st, ib), "BF16") == 0);
    CHECK(clrt_safetensors_read_f32(st, ib, out, 5) == 0);
    CHECK_NEAR(out[4], 4.25, 0);
    clrt_safetensors_close(st);
  }
  CHECK(clrt_safetensors_write("/nonexistent-dir/x.safetensors", 2, names, ts, 0, NULL, NULL) == -1);
  CHECK_ERROR("/nonexistent-dir/x.safetensors");
  CHECK(clrt_safetensors_open("/nonexistent-dir/x.safetensors") == NULL);
  CHECK_ERROR("cannot open");
  clrt_tensor_free(a);
  clrt_tensor_free(b);
  unlink(path);
}

static void test_header_errors(void) {
  struct { const char *hdr; size_t data; const char *err; } cases[] = {
      {"[1,2]", 0, "header is not a JSON object"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0, "not a non-negative integer"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 8, "out of range"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "\"data_offsets\" is not a pair"},
      {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "missing or non-string \"dtype\""},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "appears twice"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,4]}}", 4, "need"},
      {"{\"__metadata__\":{\"k\":1}}", 0, "is not a string"},
      {"{\"a\":1} x", 0, "trailing characters"},
      {"{\"a\":\"\\ud800\"}", 0, "unpaired surrogate"},
  };
  uint8_t buf[512], zeros[16] = {0};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    size_t len = image(buf, cases[k].hdr, zeros, cases[k].data);
    clrt_safetensors *st = clrt_safetensors_open_memory(buf, len, "case");
    CHECK(st == NULL);
    clrt_safetensors_close(st);
    CHECK_ERROR(cases[k].err);
  }
  /* deep nesting is refused, not recursed into */
  char deep[300];
  memset(deep, '[', 200);
  memcpy(deep + 200, "]", 2);
  size_t len = image(buf, deep, zeros, 0);
  CHECK(clrt_safetensors_open_memory(buf, len, "deep") == NULL);
  CHECK_ERROR("nesting too deep");
}

int main(void) {
  test_conversions();
  test_write_round_trip();
  test_header_errors();
  return check_summary();
}
