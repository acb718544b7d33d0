/* linear.c — y = x w^T + b and its backward, all through OpenBLAS sgemm (row-major). */
#include "model_kernels.h"

#include <cblas.h>

void clrt_linear_forward(float *y /* [N, O] */, const float *x /* [N, K] */,
                         const float *w /* [O, K] */, const float *b /* [O] or NULL */,
                         int64_t N, int K, int O) {
  if (N == 0 || clrt_linear_skinny_forward(y, x, w, b, N, K, O)) return;
  if (b) {
#pragma omp parallel for schedule(static) if (N * O > CLRT_OMP_MIN_WORK)
    for (int64_t n = 0; n < N; n++)
      for (int o = 0; o < O; o++) y[n * O + o] = b[o];
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, O, K, 1.0f, x, K, w, K,
              b ? 1.0f : 0.0f, y, O);
}

void clrt_linear_backward(float *dx /* [N, K] */, float *dw /* [O, K] */, float *db /* [O] */,
                          const float *dy /* [N, O] */, const float *x /* [N, K] */,
                          const float *w /* [O, K] */, int64_t N, int K, int O, int dx_accumulate) {
  if (N == 0) return;
  if (dx)   /* dx = dy w */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, K, O, 1.0f, dy, O, w, K,
                dx_accumulate ? 1.0f : 0.0f, dx, K);
  if (dw)   /* dw += dy^T x */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, O, K, (int)N, 1.0f, dy, O, x, K, 1.0f, dw, K);
  if (db) {
#pragma omp parallel for schedule(static)
    for (int o = 0; o < O; o++) {
      float s = 0;
      for (int64_t n = 0; n < N; n++) s += dy[n * O + o];
      db[o] += s;
    }
  }
}
