/* embedding.c — token embedding lookup and its scatter-add backward. */
#include "model_kernels.h"

#include <omp.h>
#include <string.h>

void clrt_embedding_forward(float *out /* [N, C] */, const int32_t *tok /* [N] */,
                            const float *wte /* [V, C] */, int64_t N, int C) {
#pragma omp parallel for schedule(static) if (N * C > CLRT_OMP_MIN_WORK)
  for (int64_t n = 0; n < N; n++)
    memcpy(out + n * C, wte + (int64_t)tok[n] * C, sizeof(float) * (size_t)C);
}

void clrt_embedding_backward(float *dwte /* [V, C] += */, const float *dout /* [N, C] */,
                             const int32_t *tok /* [N] */, int64_t N, int C) {
  /* Columns are split across threads so a token repeated in the batch never races. */
#pragma omp parallel
  {
    int nt = omp_get_num_threads(), id = omp_get_thread_num();
    int c0 = (int)((int64_t)C * id / nt), c1 = (int)((int64_t)C * (id + 1) / nt);
    for (int64_t n = 0; n < N; n++) {
      float *d = dwte + (int64_t)tok[n] * C;
      const float *s = dout + n * C;
      for (int c = c0; c < c1; c++) d[c] += s[c];
    }
  }
}
