/* attention_decode.c — one new query per row against that row's KV-cache slot. Rows belong
   to arbitrary slots of the cache, so work is split by (row, head), not by a batch stride. */
#include "decode_kernels.h"
#include "model_math.h"

#include <math.h>
#include <omp.h>

size_t clrt_attention_decode_scratch_floats(int max_len) {
  return (size_t)omp_get_max_threads() * (size_t)max_len;
}

void clrt_attention_decode(float *out /* [n, H, D] */, const float *q /* [n, H, D] */,
                           const float *kcache /* [slots, max_len, KV, D] */,
                           const float *vcache /* [slots, max_len, KV, D] */,
                           const int32_t *slot /* [n] */, const int32_t *len /* [n] keys seen */,
                           int n, int H, int KV, int D, int max_len, float *scratch) {
  const float scale = 1.0f / sqrtf((float)D);
  const int group = H / KV;
  const int64_t slot_stride = (int64_t)max_len * KV * D, row_stride = (int64_t)KV * D;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int i = 0; i < n; i++)
    for (int h = 0; h < H; h++) {
      float *s = scratch + (size_t)omp_get_thread_num() * (size_t)max_len;
      const float *qi = q + ((int64_t)i * H + h) * D;
      const float *k = kcache + slot[i] * slot_stride + (int64_t)(h / group) * D;
      const float *v = vcache + slot[i] * slot_stride + (int64_t)(h / group) * D;
      int T = len[i];
      float m = -INFINITY;
      for (int t = 0; t < T; t++) {
        const float *kt = k + t * row_stride;
        float dot = 0;
        for (int d = 0; d < D; d++) dot += qi[d] * kt[d];
        s[t] = dot * scale;
        if (s[t] > m) m = s[t];
      }
      float l = 0;
      for (int t = 0; t < T; t++) {
        s[t] = expf(s[t] - m);
        l += s[t];
      }
      float *o = out + ((int64_t)i * H + h) * D;
      for (int d = 0; d < D; d++) o[d] = 0;
      for (int t = 0; t < T; t++) {
        const float *vt = v + t * row_stride;
        float p = s[t] / l;
        for (int d = 0; d < D; d++) o[d] += p * vt[d];
      }
    }
}
