/* sample.c — the runtime's sampling calls over the CPU kernels (kernels/cpu/sample.c): a
   batch of rows in parallel, arguments checked and failures reported here, so the kernels
   stay pure. */
#include "clrt.h"
#include "cpu/model_kernels.h"

#include <stdlib.h>

int clrt_sample(const float *logits /* [B, V] */, int B, int V,
                const clrt_sample_params *params /* [B] */, const double *uniforms /* [B] */,
                const uint8_t *allowed /* [B, V] or NULL */, int32_t *tokens /* out: [B] */,
                float *logprobs /* out: [B] */) {
  int failed = -1;
#pragma omp parallel if (B > 1)
  {
    void *scratch = malloc(clrt_sample_row_scratch(V));
#pragma omp for schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
      if (!scratch) {
        failed = b;
        continue;
      }
      const clrt_sample_params *p = &params[b];
      tokens[b] = clrt_sample_row(logits + (size_t)b * V, V, p->temperature, p->top_k, p->top_p,
                                  uniforms[b], allowed ? allowed + (size_t)b * V : NULL, scratch,
                                  &logprobs[b]);
      if (tokens[b] < 0) failed = b;
    }
    free(scratch);
  }
  if (failed >= 0) {
    clrt_set_error("sample: row %d has no allowed token (or out of memory)", failed);
    return -1;
  }
  return 0;
}

int clrt_top_logprobs(const float *logits /* [V] */, int V, int32_t chosen, int k,
                      int32_t *ids /* out: [k] */, float *lps /* out: [k] */,
                      float *chosen_lp /* out: scalar */) {
  if (V < 1 || chosen < 0 || chosen >= V || k < 0 || k > 64 || k > V) {
    clrt_set_error("top_logprobs: bad arguments (V %d, chosen %d, k %d)", V, (int)chosen, k);
    return -1;
  }
  clrt_top_logprobs_row(logits, V, chosen, k, ids, lps, chosen_lp);
  return 0;
}
