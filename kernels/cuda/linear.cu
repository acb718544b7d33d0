// linear.cu — y = x w^T + b and its backward through cuBLAS. Row-major [R, Cc] buffers are
// column-major [Cc, R] to cuBLAS, so y^T = w x^T reads: C[O, N] = op_T(w[K, O]) * x[K, N].
#include "common.cuh"

static __global__ void fill_bias(float *y, const float *b, int64_t N, int O) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N * O; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = b[i % O];
}

// db[o] += sum_n dy[n, o]: one warp per column block of 32, threads stride the rows.
static __global__ void bias_grad(float *db, const float *dy, int64_t N, int O) {
  __shared__ float part[8][33];
  int o = blockIdx.x * 32 + threadIdx.x;
  float s = 0;
  if (o < O)
    for (int64_t n = threadIdx.y; n < N; n += blockDim.y) s += dy[n * O + o];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && o < O) {
    for (int r = 1; r < (int)blockDim.y; r++) s += part[r][threadIdx.x];
    db[o] += s;
  }
}

static void bias_forward(float *y, const float *b, int64_t N, int O) {
  fill_bias<<<clrt_blocks(N * O, 256), 256, 0, clrt_cuda_cstream()>>>(y, b, N, O);
  CLRT_LAUNCHED("linear_forward bias");
}

static void bias_backward(float *db, const float *dy, int64_t N, int O) {
  bias_grad<<<(O + 31) / 32, dim3(32, 8), 0, clrt_cuda_cstream()>>>(db, dy, N, O);
  CLRT_LAUNCHED("linear_backward bias");
}

// C[m, n] (column-major, fp32 out) = alpha op(A) op(B) + beta C with A, B of type `ab`.
static void gemm(const char *name, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                 const void *A, int lda, const void *B, int ldb, float beta, float *C, int ldc,
                 cudaDataType_t ab) {
  const float one = 1.0f;
  if (ab == CUDA_R_32F)
    CLRT_BLAS(name, cublasSgemm(clrt_cuda_blas(), ta, tb, m, n, k, &one, (const float *)A, lda,
                                (const float *)B, ldb, &beta, C, ldc));
  else
    CLRT_BLAS(name, cublasGemmEx(clrt_cuda_blas(), ta, tb, m, n, k, &one, A, ab, lda, B, ab, ldb,
                                 &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void forward(float *y, const void *x, const void *w, const float *b, int64_t N, int K, int O,
                    cudaDataType_t t) {
  if (N <= 0) return;
  if (b) bias_forward(y, b, N, O);
  gemm("linear_forward", CUBLAS_OP_T, CUBLAS_OP_N, O, (int)N, K, w, K, x, K, b ? 1.0f : 0.0f, y, O, t);
}

static void backward(float *dx, float *dw, float *db, const float *dy, const void *dyt, const void *x,
                     const void *w, int64_t N, int K, int O, int dx_accumulate, cudaDataType_t t) {
  if (N <= 0) return;
  if (dx)   // dx[N, K] = dy w: col-major dx^T[K, N] = w^T[K, O] dy^T[O, N]
    gemm("linear_backward dx", CUBLAS_OP_N, CUBLAS_OP_N, K, (int)N, O, w, K, dyt, O,
         dx_accumulate ? 1.0f : 0.0f, dx, K, t);
  if (dw)   // dw[O, K] += dy^T x: col-major dw^T[K, O] = x^T[K, N] dy[N, O]
    gemm("linear_backward dw", CUBLAS_OP_N, CUBLAS_OP_T, K, O, (int)N, x, K, dyt, O, 1.0f, dw, K, t);
  if (db) bias_backward(db, dy, N, O);
}

extern "C" void clrt_cuda_linear_forward(float *y, const float *x, const float *w, const float *b,
                                         int64_t N, int K, int O) {
  forward(y, x, w, b, N, K, O, CUDA_R_32F);
}

extern "C" void clrt_cuda_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                                          const float *w, int64_t N, int K, int O, int dx_accumulate) {
  backward(dx, dw, db, dy, dy, x, w, N, K, O, dx_accumulate, CUDA_R_32F);
}

extern "C" void clrt_cuda_linear_forward_bf16(float *y, const uint16_t *x, const uint16_t *w,
                                              const float *b, int64_t N, int K, int O) {
  forward(y, x, w, b, N, K, O, CUDA_R_16BF);
}

extern "C" void clrt_cuda_linear_backward_bf16(float *dx, float *dw, float *db, const float *dy,
                                               const uint16_t *dy16, const uint16_t *x,
                                               const uint16_t *w, int64_t N, int K, int O,
                                               int dx_accumulate) {
  backward(dx, dw, db, dy, dy16, x, w, N, K, O, dx_accumulate, CUDA_R_16BF);
}
