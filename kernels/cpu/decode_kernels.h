/* decode_kernels.h — CPU kernels used only by KV-cache decoding (runtime/decode.c). */
#ifndef CLRT_DECODE_KERNELS_H
#define CLRT_DECODE_KERNELS_H
#include <stddef.h>
#include <stdint.h>

size_t clrt_attention_decode_scratch_floats(int max_len);
/* Row i's query (at position len[i] - 1, already rotated) attends to keys 0 .. len[i]-1 of
   cache slot slot[i]; the new key/value must already be in the cache. */
void clrt_attention_decode(float *out /* [n, H, D] */, const float *q /* [n, H, D] */,
                           const float *kcache /* [slots, max_len, KV, D] */,
                           const float *vcache /* [slots, max_len, KV, D] */,
                           const int32_t *slot /* [n] */, const int32_t *len /* [n] */,
                           int n, int H, int KV, int D, int max_len, float *scratch);

#endif
