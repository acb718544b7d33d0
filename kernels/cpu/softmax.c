/* softmax.c — softmax and log_softmax over one dimension of an [n, inner] slab, as
   exp(x - max) / sum so no exponential overflows; sums accumulate in double. */
#include "tensor_kernels.h"

#include <math.h>

enum { COLS = 64 };

void clrt_k_softmax_f32(int use_log, int64_t n, int64_t inner, int64_t i0, int64_t i1,
                        const float *in, float *out) {
  for (int64_t c0 = i0; c0 < i1; c0 += COLS) {
    int64_t w = i1 - c0 < COLS ? i1 - c0 : COLS;
    float mx[COLS];
    double sum[COLS];
    for (int64_t c = 0; c < w; c++) mx[c] = -INFINITY, sum[c] = 0;
    for (int64_t j = 0; j < n; j++)
      for (int64_t c = 0; c < w; c++) {
        float v = in[j * inner + c0 + c];
        if (v > mx[c] || v != v) mx[c] = v;
      }
    for (int64_t j = 0; j < n; j++)
      for (int64_t c = 0; c < w; c++) {
        float e = expf(in[j * inner + c0 + c] - mx[c]);
        sum[c] += e;
        if (!use_log) out[j * inner + c0 + c] = e;
      }
    for (int64_t c = 0; c < w; c++) {
      if (use_log) {
        /* (x - max) - log(sum): x - max is exact for nearby values, so large logits keep
           their precision (folding max into the shift first would round it away). */
        float ls = (float)log(sum[c]);
        for (int64_t j = 0; j < n; j++) out[j * inner + c0 + c] = (in[j * inner + c0 + c] - mx[c]) - ls;
      } else {
        float inv = (float)(1.0 / sum[c]);
        for (int64_t j = 0; j < n; j++) out[j * inner + c0 + c] *= inv;
      }
    }
  }
}
