/* logsoftmax_gather.c — the output layer fused with log-softmax and the gather of the
   target's log-probability. Logits exist only `chunk` rows at a time; forward keeps the
   per-row logsumexp, and backward recomputes the chunk's logits (unless the caller kept
   them all, see logits_ready), turning them in place into dlogits = dlp * (onehot(target) - softmax) before the two sgemms. */
/* GCC may vectorize clrt_expf's clamps only without trapping math (FP exceptions, unused). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "model_kernels.h"
#include "model_math.h"
#include "rowops.h"

#include <cblas.h>
#include <math.h>

static float row_lse(const float *z, int V) {
  float m = clrt_row_max(z, V);
  return clrt_lse_value(m, clrt_row_sumexp(z, V, m));
}

void clrt_logsoftmax_gather_forward(float *lp /* [N] */, float *lse /* [N] or NULL */,
                                    const float *x /* [N, C] */, const float *w /* [V, C] */,
                                    const int32_t *target /* [N] */, int64_t N, int C, int V,
                                    float *scratch /* [chunk, V] */, int chunk) {
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    int rows = N - n0 < chunk ? (int)(N - n0) : chunk;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, V, C, 1.0f, x + n0 * C, C, w, C,
                0.0f, scratch, V);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
      const float *z = scratch + (int64_t)r * V;
      float L = row_lse(z, V);
      if (lse) lse[n0 + r] = L;
      lp[n0 + r] = z[target[n0 + r]] - L;
    }
  }
}

void clrt_logsoftmax_gather_backward(float *dx /* [N, C] = */, float *dw /* [V, C] += */,
                                     const float *dlp /* [N] */, const float *x /* [N, C] */,
                                     const float *w /* [V, C] */, const int32_t *target /* [N] */,
                                     const float *lse /* [N] */, int64_t N, int C, int V,
                                     float *scratch /* [chunk, V] */, int chunk, int logits_ready) {
  if (logits_ready && chunk < N) logits_ready = 0;
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    int rows = N - n0 < chunk ? (int)(N - n0) : chunk;
    if (!logits_ready)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, V, C, 1.0f, x + n0 * C, C, w, C,
                  0.0f, scratch, V);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
      float *z = scratch + (int64_t)r * V;
      float g = dlp[n0 + r], L = lse[n0 + r];
      for (int j = 0; j < V; j++) z[j] = clrt_lsm_dlogit(z[j], L, g);
      z[target[n0 + r]] += g;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, C, V, 1.0f, scratch, V, w, C,
                0.0f, dx + n0 * C, C);
    if (dw)   /* NULL: a frozen output layer (LoRA) */
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, rows, 1.0f, scratch, V,
                  x + n0 * C, C, 1.0f, dw, C);
  }
}
