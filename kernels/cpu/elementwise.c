/* elementwise.c — binary, unary and select kernels over one strided row.
   Each op's loop is written out once per op so the contiguous case (all strides 1)
   vectorizes; the strided case shares the same expression. */
#include "tensor_kernels.h"

#include <math.h>

/* Expand EXPR (using x, y) into a contiguous and a strided loop. */
#define ROW2(T, EXPR)                                                            \
  do {                                                                           \
    if (so == 1 && sa == 1 && sb == 1) {                                         \
      for (int64_t i = 0; i < n; i++) {                                          \
        T x = a[i], y = b[i];                                                    \
        out[i] = (EXPR);                                                         \
      }                                                                          \
    } else if (so == 1 && sa == 1 && sb == 0) {                                  \
      T y = b[0];                                                                \
      for (int64_t i = 0; i < n; i++) {                                          \
        T x = a[i];                                                              \
        out[i] = (EXPR);                                                         \
      }                                                                          \
    } else {                                                                     \
      for (int64_t i = 0; i < n; i++) {                                          \
        T x = a[i * sa], y = b[i * sb];                                          \
        out[i * so] = (EXPR);                                                    \
      }                                                                          \
    }                                                                            \
  } while (0)

#define ROW1(T, EXPR)                                                            \
  do {                                                                           \
    if (so == 1 && sa == 1) {                                                    \
      for (int64_t i = 0; i < n; i++) {                                          \
        T x = a[i];                                                              \
        out[i] = (EXPR);                                                         \
      }                                                                          \
    } else {                                                                     \
      for (int64_t i = 0; i < n; i++) {                                          \
        T x = a[i * sa];                                                         \
        out[i * so] = (EXPR);                                                    \
      }                                                                          \
    }                                                                            \
  } while (0)

void clrt_k_binary_f32(int op, int64_t n, float *out, int64_t so, const float *a, int64_t sa,
                       const float *b, int64_t sb) {
  switch (op) {
    case K_ADD: ROW2(float, x + y); break;
    case K_SUB: ROW2(float, x - y); break;
    case K_MUL: ROW2(float, x * y); break;
    case K_DIV: ROW2(float, x / y); break;
    case K_POW: ROW2(float, y == 2.0f ? x * x : powf(x, y)); break;
    /* NaN propagates, as in numpy's maximum/minimum. */
    case K_MAXIMUM: ROW2(float, (x != x || x > y) ? x : y); break;
    case K_MINIMUM: ROW2(float, (x != x || x < y) ? x : y); break;
    case K_EQ: ROW2(float, (float)(x == y)); break;
    case K_NE: ROW2(float, (float)(x != y)); break;
    case K_LT: ROW2(float, (float)(x < y)); break;
    case K_LE: ROW2(float, (float)(x <= y)); break;
    case K_GT: ROW2(float, (float)(x > y)); break;
    case K_GE: ROW2(float, (float)(x >= y)); break;
    default: break;
  }
}

static int32_t ipow(int32_t x, int32_t e) {
  if (e < 0) return x == 1 ? 1 : x == -1 ? ((e & 1) ? -1 : 1) : 0;
  uint32_t r = 1, b = (uint32_t)x;
  while (e) {
    if (e & 1) r *= b;
    b *= b;
    e >>= 1;
  }
  return (int32_t)r;
}

/* Unsigned arithmetic: wraps like the hardware does, without C's signed-overflow UB. */
#define WRAP(expr) ((int32_t)(uint32_t)(expr))

void clrt_k_binary_i32(int op, int64_t n, int32_t *out, int64_t so, const int32_t *a,
                       int64_t sa, const int32_t *b, int64_t sb) {
  switch (op) {
    case K_ADD: ROW2(int32_t, WRAP((uint32_t)x + (uint32_t)y)); break;
    case K_SUB: ROW2(int32_t, WRAP((uint32_t)x - (uint32_t)y)); break;
    case K_MUL: ROW2(int32_t, WRAP((uint32_t)x * (uint32_t)y)); break;
    case K_POW: ROW2(int32_t, ipow(x, y)); break;
    case K_MAXIMUM: ROW2(int32_t, x > y ? x : y); break;
    case K_MINIMUM: ROW2(int32_t, x < y ? x : y); break;
    case K_EQ: ROW2(int32_t, x == y); break;
    case K_NE: ROW2(int32_t, x != y); break;
    case K_LT: ROW2(int32_t, x < y); break;
    case K_LE: ROW2(int32_t, x <= y); break;
    case K_GT: ROW2(int32_t, x > y); break;
    case K_GE: ROW2(int32_t, x >= y); break;
    default: break;   /* DIV is done in f32 by the runtime */
  }
}

void clrt_k_unary_f32(int op, int64_t n, float *out, int64_t so, const float *a, int64_t sa) {
  switch (op) {
    case K_NEG: ROW1(float, -x); break;
    case K_ABS: ROW1(float, fabsf(x)); break;
    case K_EXP: ROW1(float, expf(x)); break;
    case K_LOG: ROW1(float, logf(x)); break;
    case K_SQRT: ROW1(float, sqrtf(x)); break;
    case K_TANH: ROW1(float, tanhf(x)); break;
    /* Split by sign so exp never overflows. */
    case K_SIGMOID:
      ROW1(float, x >= 0 ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x)));
      break;
    case K_RELU: ROW1(float, x > 0 ? x : (x != x ? x : 0.0f)); break;
    default: break;
  }
}

void clrt_k_unary_i32(int op, int64_t n, int32_t *out, int64_t so, const int32_t *a, int64_t sa) {
  switch (op) {
    case K_NEG: ROW1(int32_t, WRAP(0u - (uint32_t)x)); break;
    case K_ABS: ROW1(int32_t, x < 0 ? WRAP(0u - (uint32_t)x) : x); break;
    case K_RELU: ROW1(int32_t, x > 0 ? x : 0); break;
    default: break;
  }
}

void clrt_k_where_f32(int64_t n, float *out, int64_t so, const float *cond, int64_t sc,
                      const float *a, int64_t sa, const float *b, int64_t sb) {
  for (int64_t i = 0; i < n; i++) out[i * so] = cond[i * sc] != 0.0f ? a[i * sa] : b[i * sb];
}

void clrt_k_where_i32(int64_t n, int32_t *out, int64_t so, const float *cond, int64_t sc,
                      const int32_t *a, int64_t sa, const int32_t *b, int64_t sb) {
  for (int64_t i = 0; i < n; i++) out[i * so] = cond[i * sc] != 0.0f ? a[i * sa] : b[i * sb];
}
