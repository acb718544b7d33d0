/* reduce.c — sum/mean/max/min/argmax/argmin over one dimension, and over everything.
   A slab is [n, inner]; columns are done in blocks of COLS so the accumulators sit on the
   stack and the reads of one row of the slab stay contiguous. NaN wins max/min/argmax, as
   in numpy. */
#include "tensor_kernels.h"

enum { COLS = 64 };

static int better_f(int op, float v, float best) {
  if (best != best) return 0;
  if (v != v) return 1;
  return (op == K_RED_MAX || op == K_RED_ARGMAX) ? v > best : v < best;
}

void clrt_k_reduce_f32(int op, int64_t n, int64_t inner, int64_t i0, int64_t i1,
                       const float *in, float *out, int32_t *idx) {
  for (int64_t c0 = i0; c0 < i1; c0 += COLS) {
    int64_t w = i1 - c0 < COLS ? i1 - c0 : COLS;
    if (op == K_RED_SUM || op == K_RED_MEAN) {
      double acc[COLS] = {0};
      for (int64_t j = 0; j < n; j++) {
        const float *row = in + j * inner + c0;
        for (int64_t c = 0; c < w; c++) acc[c] += row[c];
      }
      for (int64_t c = 0; c < w; c++)
        out[c0 + c] = (float)(op == K_RED_MEAN ? (n ? acc[c] / (double)n : 0.0 / 0.0) : acc[c]);
    } else {
      float best[COLS];
      int32_t pos[COLS];
      for (int64_t c = 0; c < w; c++) best[c] = in[c0 + c], pos[c] = 0;
      for (int64_t j = 1; j < n; j++) {
        const float *row = in + j * inner + c0;
        for (int64_t c = 0; c < w; c++)
          if (better_f(op, row[c], best[c])) best[c] = row[c], pos[c] = (int32_t)j;
      }
      for (int64_t c = 0; c < w; c++) {
        if (op == K_RED_ARGMAX || op == K_RED_ARGMIN)
          idx[c0 + c] = pos[c];
        else
          out[c0 + c] = best[c];
      }
    }
  }
}

void clrt_k_reduce_i32(int op, int64_t n, int64_t inner, int64_t i0, int64_t i1,
                       const int32_t *in, int32_t *out, int32_t *idx) {
  int want_max = op == K_RED_MAX || op == K_RED_ARGMAX;
  for (int64_t c0 = i0; c0 < i1; c0 += COLS) {
    int64_t w = i1 - c0 < COLS ? i1 - c0 : COLS;
    if (op == K_RED_SUM) {
      uint64_t acc[COLS] = {0};
      for (int64_t j = 0; j < n; j++) {
        const int32_t *row = in + j * inner + c0;
        for (int64_t c = 0; c < w; c++) acc[c] += (uint64_t)(int64_t)row[c];
      }
      for (int64_t c = 0; c < w; c++) out[c0 + c] = (int32_t)(uint32_t)acc[c];
    } else {
      int32_t best[COLS], pos[COLS];
      for (int64_t c = 0; c < w; c++) best[c] = in[c0 + c], pos[c] = 0;
      for (int64_t j = 1; j < n; j++) {
        const int32_t *row = in + j * inner + c0;
        for (int64_t c = 0; c < w; c++)
          if (want_max ? row[c] > best[c] : row[c] < best[c]) best[c] = row[c], pos[c] = (int32_t)j;
      }
      for (int64_t c = 0; c < w; c++) {
        if (op == K_RED_ARGMAX || op == K_RED_ARGMIN)
          idx[c0 + c] = pos[c];
        else
          out[c0 + c] = best[c];
      }
    }
  }
}

void clrt_k_reduce_all_f32(int op, int64_t n, const float *in, double *val, int64_t *pos) {
  if (op == K_RED_SUM || op == K_RED_MEAN) {
    double acc = 0;
    for (int64_t i = 0; i < n; i++) acc += in[i];
    *val = acc;
    *pos = 0;
    return;
  }
  float best = in[0];
  int64_t p = 0;
  for (int64_t i = 1; i < n; i++)
    if (better_f(op, in[i], best)) best = in[i], p = i;
  *val = best;
  *pos = p;
}

void clrt_k_reduce_all_i32(int op, int64_t n, const int32_t *in, double *val, int64_t *pos) {
  if (op == K_RED_SUM || op == K_RED_MEAN) {
    double acc = 0;   /* exact up to 2^53, far beyond any int32 tensor we can hold */
    for (int64_t i = 0; i < n; i++) acc += in[i];
    *val = acc;
    *pos = 0;
    return;
  }
  int want_max = op == K_RED_MAX || op == K_RED_ARGMAX;
  int32_t best = in[0];
  int64_t p = 0;
  for (int64_t i = 1; i < n; i++)
    if (want_max ? in[i] > best : in[i] < best) best = in[i], p = i;
  *val = best;
  *pos = p;
}
