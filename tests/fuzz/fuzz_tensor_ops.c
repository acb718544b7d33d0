/* fuzz_tensor_ops.c — every tensor op on tensors whose dtypes, shapes (empty ones included),
   views and values come from the fuzzer's bytes. Each call must either succeed with a result
   of the expected shape that reads back cleanly, or fail with a message; the sanitizers catch
   any out-of-bounds access, leak or undefined behaviour on the way. */
#include "clrt.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const uint8_t *p;
  size_t n;
} reader;

static unsigned take(reader *r) {
  if (!r->n) return 0;
  r->n--;
  return *r->p++;
}

static clrt_tensor *make(reader *r) {
  int dtype = (int)(take(r) % 3), nd = (int)(take(r) % 4);
  int64_t shape[4];
  for (int i = 0; i < nd; i++) shape[i] = take(r) % 6;
  clrt_tensor *t = clrt_tensor_new(dtype, nd, shape, CLRT_CPU);
  if (!t) abort();   /* tiny valid shapes always allocate */
  int64_t n = clrt_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) clrt_tensor_set(t, i, (double)(int8_t)take(r) / 4.0);
  clrt_tensor *v = NULL;
  switch (take(r) % 3) {
    case 1:
      if (nd >= 2) v = clrt_tensor_transpose(t, (int)(take(r) % nd), (int)(take(r) % nd));
      break;
    case 2:
      if (nd >= 1) {
        int d = (int)(take(r) % nd);
        int64_t size = t->dims[d], start = size ? take(r) % size : 0;
        v = clrt_tensor_narrow(t, d, start, take(r) % (size - start + 1));
      }
      break;
  }
  if (v) {
    clrt_tensor_free(t);
    t = v;
  }
  return t;
}

/* Read every element so a wrong shape or stride shows up as an out-of-bounds read. */
static void touch(const clrt_tensor *t) {
  if (!t) return;
  volatile double sink = 0;
  int64_t n = clrt_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) sink += clrt_tensor_get(t, i);
  (void)sink;
}

/* A failure must say why (clrt_last_error() reports "unknown error" when nothing was set). */
static void must_fail_with_message(const void *res) {
  if (!res && !strcmp(clrt_last_error(), "unknown error")) abort();
  clrt_clear_error();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader r = {data, size};
  clrt_clear_error();
  clrt_tensor *a = make(&r), *b = make(&r), *c = make(&r), *res = NULL;
  double out = 0;
  unsigned what = take(&r) % 9, op = take(&r);
  clrt_clear_error();
  int dim = (int)(take(&r) % 5) - 1, flag = (int)(take(&r) & 1);
  switch (what) {
    case 0: res = clrt_tensor_binary((int)(op % CLRT_OP_BINARY_COUNT), a, b); break;
    case 1:
      res = clrt_tensor_binary_scalar((int)(op % CLRT_OP_BINARY_COUNT), a, (double)(int8_t)take(&r) / 8, flag);
      break;
    case 2:
      if (clrt_tensor_binary_((int)(op % CLRT_OP_BINARY_COUNT), a, b)) must_fail_with_message(NULL);
      touch(a);
      break;
    case 3:
      res = clrt_tensor_unary((int)(op % CLRT_OP_UNARY_COUNT), a);
      if (clrt_tensor_unary_((int)(op % CLRT_OP_UNARY_COUNT), b)) must_fail_with_message(NULL);
      break;
    case 4:
      res = clrt_tensor_reduce((int)(op % CLRT_RED_COUNT), a, dim, flag);
      if (clrt_tensor_reduce_all((int)(op % CLRT_RED_COUNT), b, &out)) must_fail_with_message(NULL);
      break;
    case 5: res = clrt_tensor_softmax(a, dim, flag); break;
    case 6: res = clrt_tensor_matmul(a, b); break;
    case 7: res = clrt_tensor_where(c, a, b); break;
    case 8:
      if (clrt_tensor_masked_fill_(a, b, (double)(int8_t)take(&r))) must_fail_with_message(NULL);
      touch(a);
      break;
  }
  if (what != 2 && what != 8 && what != 4 && !res) must_fail_with_message(res);
  touch(res);
  clrt_tensor_free(res);
  clrt_tensor_free(a);
  clrt_tensor_free(b);
  clrt_tensor_free(c);
  return 0;
}
