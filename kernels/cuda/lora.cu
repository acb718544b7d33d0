// lora.cu — the LoRA adapter ops of kernels/cpu/lora.c on the GPU: the same products through
// cuBLAS (row-major [R, Cc] is column-major [Cc, R] to cuBLAS) and the dropout mask of
// lora_math.h, so both devices draw the same masks; also the embedding's adapter and the
// output layer's per-chunk products for logsoftmax_gather.cu.
#include "common.cuh"
#include "lora_math.h"

// Row-major C[M, N] = alpha op(A) op(B) + beta C, A [M, K] (or [K, M] when ta), B [K, N] (or
// [N, K] when tb): column-major C^T = op(B)^T op(A)^T.
static void gemm_rm(const char *name, bool ta, bool tb, int M, int N, int K, float alpha,
                    const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  CLRT_BLAS(name, cublasSgemm(clrt_cuda_blas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                              ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb, A, lda,
                              &beta, C, ldc));
}

static __global__ void drop_kernel(float *out, const float *x, int64_t n, uint64_t key, float p) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = x[i] * clrt_lora_keep(key, i, p);
}

static __global__ void drop_acc_kernel(float *dx, const float *g, int64_t n, uint64_t key, float p) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dx[i] += g[i] * clrt_lora_keep(key, i, p);
}

extern "C" void clrt_cuda_lora_dropout(float *out, const float *x, int64_t n, uint64_t key, float p) {
  drop_kernel<<<clrt_blocks(n, 256), 256, 0, clrt_cuda_cstream()>>>(out, x, n, key, p);
  CLRT_LAUNCHED("lora_dropout");
}

extern "C" void clrt_cuda_lora_forward(float *y, float *xa, const float *xd, const float *A,
                                       const float *B, int64_t N, int K, int O, int r, float scale) {
  if (N <= 0) return;
  gemm_rm("lora_forward xa", false, true, (int)N, r, K, 1.0f, xd, K, A, K, 0.0f, xa, r);
  gemm_rm("lora_forward y", false, true, (int)N, O, r, scale, xa, r, B, r, 1.0f, y, O);
}

extern "C" void clrt_cuda_lora_backward(float *dx, float *dA, float *dB, float *dxa, float *xd,
                                        const float *dy, const float *xa, const float *A,
                                        const float *B, int64_t N, int K, int O, int r, float scale,
                                        uint64_t key, float p) {
  if (N <= 0) return;
  gemm_rm("lora_backward dxa", false, false, (int)N, r, O, scale, dy, O, B, r, 0.0f, dxa, r);
  gemm_rm("lora_backward dB", true, false, O, r, (int)N, scale, dy, O, xa, r, 1.0f, dB, r);
  clrt_cuda_lora_input_backward(dx, dA, dxa, xd, A, N, K, r, key, p);
}

extern "C" void clrt_cuda_lora_xa(float *xa, const float *xd, const float *A, int64_t N, int K, int r) {
  if (N > 0) gemm_rm("lora_xa", false, true, (int)N, r, K, 1.0f, xd, K, A, K, 0.0f, xa, r);
}

extern "C" void clrt_cuda_lora_input_backward(float *dx, float *dA, const float *dxa, float *xd, const float *A,
                                              int64_t N, int K, int r, uint64_t key, float p) {
  if (N <= 0) return;
  gemm_rm("lora_input_backward dA", true, false, r, K, (int)N, 1.0f, dxa, r, xd, K, 1.0f, dA, K);
  if (p <= 0) {
    gemm_rm("lora_input_backward dx", false, false, (int)N, K, r, 1.0f, dxa, r, A, K, 1.0f, dx, K);
    return;
  }
  gemm_rm("lora_input_backward dx", false, false, (int)N, K, r, 1.0f, dxa, r, A, K, 0.0f, xd, K);
  int64_t n = N * (int64_t)K;
  drop_acc_kernel<<<clrt_blocks(n, 256), 256, 0, clrt_cuda_cstream()>>>(dx, xd, n, key, p);
  CLRT_LAUNCHED("lora_input_backward dropout");
}

// ea [N, r] = A[:, tok[n]] (A [r, V])
static __global__ void embed_gather_kernel(float *ea, const int32_t *tok, const float *A, int64_t N, int V, int r) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N * r; i += (int64_t)gridDim.x * blockDim.x)
    ea[i] = A[(int64_t)(i % r) * V + tok[i / r]];
}

// dA[k, tok[n]] += dea[n, k]: one thread per k walks the rows in order (a token may repeat),
// so the sums are the same every run.
static __global__ void embed_scatter_kernel(float *dA, const float *dea, const int32_t *tok, int64_t N, int V, int r) {
  int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= r) return;
  for (int64_t n = 0; n < N; n++) dA[(int64_t)k * V + tok[n]] += dea[n * r + k];
}

extern "C" void clrt_cuda_lora_embed_forward(float *y, float *ea, const int32_t *tok, const float *A, const float *B,
                                             int64_t N, int V, int C, int r, float scale) {
  if (N <= 0) return;
  embed_gather_kernel<<<clrt_blocks(N * r, 256), 256, 0, clrt_cuda_cstream()>>>(ea, tok, A, N, V, r);
  CLRT_LAUNCHED("lora_embed_forward gather");
  gemm_rm("lora_embed_forward y", false, true, (int)N, C, r, scale, ea, r, B, r, 1.0f, y, C);
}

extern "C" void clrt_cuda_lora_embed_backward(float *dA, float *dB, float *dea, const float *dy, const float *ea,
                                              const int32_t *tok, const float *B, int64_t N, int V, int C, int r,
                                              float scale) {
  if (N <= 0) return;
  gemm_rm("lora_embed_backward dB", true, false, C, r, (int)N, scale, dy, C, ea, r, 1.0f, dB, r);
  gemm_rm("lora_embed_backward dea", false, false, (int)N, r, C, scale, dy, C, B, r, 0.0f, dea, r);
  embed_scatter_kernel<<<(r + 31) / 32, 32, 0, clrt_cuda_cstream()>>>(dA, dea, tok, N, V, r);
  CLRT_LAUNCHED("lora_embed_backward scatter");
}

extern "C" void clrt_cuda_lora_head_block(float *z, const clrt_head_lora *hl, int64_t n0, int rows, int V) {
  gemm_rm("lora_head z", false, true, rows, V, hl->r, hl->scale, hl->xa + n0 * hl->r, hl->r, hl->B, hl->r, 1.0f,
          z, V);
}

extern "C" void clrt_cuda_lora_head_block_backward(const float *dz, const clrt_head_lora *hl, int64_t n0, int rows,
                                                   int V) {
  int r = hl->r;
  gemm_rm("lora_head dxa", false, false, rows, r, V, hl->scale, dz, V, hl->B, r, 0.0f, hl->dxa + n0 * r, r);
  gemm_rm("lora_head dB", true, false, V, r, rows, hl->scale, dz, V, hl->xa + n0 * r, r, 1.0f, hl->dB, r);
}
