/* lora.c — a LoRA adapter beside a frozen linear layer: y += s (drop(x) A^T) B^T, A [r, K],
   B [O, r], s = alpha / r, and its backward (OpenBLAS sgemm, row-major; dropout mask from
   lora_math.h). */
#include "model_kernels.h"
#include "lora_math.h"

#include <cblas.h>

void clrt_lora_dropout(float *out /* [n] */, const float *x /* [n] */, int64_t n, uint64_t key, float p) {
#pragma omp parallel for schedule(static) if (n > CLRT_OMP_MIN_WORK)
  for (int64_t i = 0; i < n; i++) out[i] = x[i] * clrt_lora_keep(key, i, p);
}

void clrt_lora_forward(float *y /* [N, O] += */, float *xa /* [N, r] = */, const float *xd /* [N, K] */,
                       const float *A /* [r, K] */, const float *B /* [O, r] */, int64_t N, int K,
                       int O, int r, float scale) {
  if (N == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, r, K, 1.0f, xd, K, A, K, 0.0f, xa, r);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, O, r, scale, xa, r, B, r, 1.0f, y, O);
}

void clrt_lora_backward(float *dx /* [N, K] += */, float *dA /* [r, K] += */, float *dB /* [O, r] += */,
                        float *dxa /* [N, r] scratch */, float *xd /* [N, K]: in, then scratch */,
                        const float *dy /* [N, O] */, const float *xa /* [N, r] */,
                        const float *A /* [r, K] */, const float *B /* [O, r] */, int64_t N, int K,
                        int O, int r, float scale, uint64_t key, float p) {
  if (N == 0) return;
  /* dxa = s dy B; dB += s dy^T xa; dA += dxa^T xd */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, r, O, scale, dy, O, B, r, 0.0f, dxa, r);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, O, r, (int)N, scale, dy, O, xa, r, 1.0f, dB, r);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, K, (int)N, 1.0f, dxa, r, xd, K, 1.0f, dA, K);
  if (p <= 0) {   /* dx += dxa A */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, K, r, 1.0f, dxa, r, A, K, 1.0f, dx, K);
    return;
  }
  /* Through the dropout: xd is spent, it takes dxa A, then dx += mask * it. */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, K, r, 1.0f, dxa, r, A, K, 0.0f, xd, K);
  int64_t n = N * K;
#pragma omp parallel for schedule(static) if (n > CLRT_OMP_MIN_WORK)
  for (int64_t i = 0; i < n; i++) dx[i] += xd[i] * clrt_lora_keep(key, i, p);
}

void clrt_lora_merge(float *W /* [O, K] += */, const float *A /* [r, K] */, const float *B /* [O, r] */,
                     int K, int O, int r, float scale) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, O, K, r, scale, B, r, A, K, 1.0f, W, K);
}
