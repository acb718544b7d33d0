/* sampling.h — the arithmetic of turning one row of logits into a token, shared by the CPU
   (kernels/cpu/sample.c) and CUDA paths so both sample from the same distribution. */
#ifndef CLRT_SAMPLING_H
#define CLRT_SAMPLING_H
#include "bf16.h"   /* CLRT_HD */
#include <math.h>

/* Unnormalised probability of a logit at temperature t, relative to the row maximum. */
CLRT_HD float clrt_tempered_weight(float logit, float row_max, float temperature) {
  return expf((logit - row_max) / temperature);
}

/* Hugging Face's nucleus rule: walking tokens by decreasing probability, a token is kept while
   the mass before it is below top_p, so the token that crosses top_p is kept too. */
CLRT_HD int clrt_nucleus_keeps(double mass_before, double top_p) { return mass_before < top_p; }

/* A total order on (logit, id) as one integer: larger logit first, ties by smaller id (the
   CPU sampler's order), so a GPU can select top-k / nucleus sets by bisection on keys. */
CLRT_HD uint64_t clrt_sample_key(float logit, int32_t id) {
  uint32_t u;
  memcpy(&u, &logit, 4);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);   /* monotone float -> unsigned */
  return ((uint64_t)u << 32) | (uint32_t)~(uint32_t)id;
}

CLRT_HD int32_t clrt_sample_key_id(uint64_t key) { return (int32_t)~(uint32_t)key; }

#endif
