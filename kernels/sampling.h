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

#endif
