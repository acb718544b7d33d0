/* lora.c — a LoRA adapter beside a frozen linear layer: y += s (drop(x) A^T) B^T, A [r, K],
   B [O, r], s = alpha / r, and its backward (OpenBLAS sgemm, row-major; dropout mask from
   lora_math.h). */
#include "model_kernels.h"
#include "lora_math.h"

#include <cblas.h>

/* out[i] = x[i] * keep(i) (acc: out[i] += ...), in blocks of 2^32 elements whose index high
   half is fixed, so the mask's arithmetic stays 32-bit and vectorizes. */
static void apply_mask(float *out, const float *x, int64_t n, uint64_t key, float p, int acc) {
  float inv = 1.0f / (1.0f - p);
  uint32_t k0 = (uint32_t)key;
  for (int64_t b0 = 0; b0 < n; b0 += (int64_t)1 << 32) {
    int64_t len = n - b0 < ((int64_t)1 << 32) ? n - b0 : ((int64_t)1 << 32);
    uint32_t k1 = clrt_lora_k1(key, b0);
    float *o = out + b0;
    const float *xb = x + b0;
    if (acc) {
#pragma omp parallel for schedule(static) if (len > CLRT_OMP_MIN_WORK)
      for (int64_t i = 0; i < len; i++) o[i] += xb[i] * clrt_lora_keep_lo((uint32_t)i, k0, k1, p, inv);
    } else {
#pragma omp parallel for schedule(static) if (len > CLRT_OMP_MIN_WORK)
      for (int64_t i = 0; i < len; i++) o[i] = xb[i] * clrt_lora_keep_lo((uint32_t)i, k0, k1, p, inv);
    }
  }
}

void clrt_lora_dropout(float *out /* [n] */, const float *x /* [n] */, int64_t n, uint64_t key, float p) {
  apply_mask(out, x, n, key, p, 0);
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
  apply_mask(dx, xd, N * K, key, p, 1);
}

void clrt_lora_merge(float *W /* [O, K] += */, const float *A /* [r, K] */, const float *B /* [O, r] */,
                     int K, int O, int r, float scale) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, O, K, r, scale, B, r, A, K, 1.0f, W, K);
}
