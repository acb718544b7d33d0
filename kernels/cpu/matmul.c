/* matmul.c — single-precision matrix product through OpenBLAS. */
#include "tensor_kernels.h"

#include <cblas.h>

void clrt_k_matmul_f32(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                       int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              (blasint)M, (blasint)N, (blasint)K, 1.0f, A, (blasint)lda, B, (blasint)ldb, 0.0f,
              C, (blasint)ldc);
}
