/* rowops.h — row reductions written with 8 independent lanes, so the compiler vectorizes
   them without -ffast-math (a plain `s += x[i]` loop may not be reassociated). CPU only. */
#ifndef CLRT_ROWOPS_H
#define CLRT_ROWOPS_H
#include <math.h>

#include "model_math.h"

static inline float clrt_row_max(const float *z, int n) {
  float mv[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int j = 0;
  for (; j + 8 <= n; j += 8)
    for (int q = 0; q < 8; q++) mv[q] = z[j + q] > mv[q] ? z[j + q] : mv[q];
  float m = -INFINITY;
  for (int q = 0; q < 8; q++) m = mv[q] > m ? mv[q] : m;
  for (; j < n; j++) m = z[j] > m ? z[j] : m;
  return m;
}

/* sum_j exp(z[j] - m) */
static inline float clrt_row_sumexp(const float *z, int n, float m) {
  float lv[8] = {0};
  int j = 0;
  for (; j + 8 <= n; j += 8)
    for (int q = 0; q < 8; q++) lv[q] += clrt_expf(z[j + q] - m);
  float l = 0;
  for (int q = 0; q < 8; q++) l += lv[q];
  for (; j < n; j++) l += clrt_expf(z[j] - m);
  return l;
}

/* z[j] = exp(z[j] - m); returns their sum */
static inline float clrt_row_exp_(float *z, int n, float m) {
  float lv[8] = {0};
  int j = 0;
  for (; j + 8 <= n; j += 8)
    for (int q = 0; q < 8; q++) {
      z[j + q] = clrt_expf(z[j + q] - m);
      lv[q] += z[j + q];
    }
  float l = 0;
  for (int q = 0; q < 8; q++) l += lv[q];
  for (; j < n; j++) {
    z[j] = clrt_expf(z[j] - m);
    l += z[j];
  }
  return l;
}

static inline float clrt_row_dot(const float *a, const float *b, int n) {
  float sv[8] = {0};
  int j = 0;
  for (; j + 8 <= n; j += 8)
    for (int q = 0; q < 8; q++) sv[q] += a[j + q] * b[j + q];
  float s = 0;
  for (int q = 0; q < 8; q++) s += sv[q];
  for (; j < n; j++) s += a[j] * b[j];
  return s;
}

#endif
