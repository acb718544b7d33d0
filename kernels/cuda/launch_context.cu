// launch_context.cu — what every kernel launches on: the process's one stream and cuBLAS
// handle, and the first launch or cuBLAS failure since it was last taken. The runtime makes
// and destroys them (runtime/core/cuda_context.cu) and turns a taken failure into its error;
// nothing here knows the runtime.
#include "common.cuh"

#include <stdio.h>

static cudaStream_t g_stream;
static cublasHandle_t g_blas;
static char g_note[512];

void clrt_cuda_note(const char *what, const char *err) {
  if (!g_note[0]) snprintf(g_note, sizeof g_note, "cuda: %s: %s", what, err);
}

extern "C" int clrt_cuda_take_note(char *buf, size_t n) {
  if (!g_note[0]) return 0;
  snprintf(buf, n, "%s", g_note);
  g_note[0] = 0;
  return 1;
}

cublasHandle_t clrt_cuda_blas(void) { return g_blas; }
cudaStream_t clrt_cuda_cstream(void) { return g_stream; }
extern "C" void *clrt_cuda_stream(void) { return (void *)g_stream; }

extern "C" int clrt_cuda_launch_context_create(char *err, size_t n) {
  cudaError_t e = cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    snprintf(err, n, "cuda: creating the stream: %s", cudaGetErrorString(e));
    return -1;
  }
  cublasStatus_t s = cublasCreate(&g_blas);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(g_blas, g_stream);
  // fp32 GEMMs stay true fp32 (no TF32): the CPU comparison tests rely on it.
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetMathMode(g_blas, CUBLAS_DEFAULT_MATH);
  if (s != CUBLAS_STATUS_SUCCESS) {
    snprintf(err, n, "cuda: creating the cuBLAS handle: %s", cublasGetStatusString(s));
    return -1;
  }
  return 0;
}

extern "C" void clrt_cuda_launch_context_destroy(void) {
  cudaStreamSynchronize(g_stream);
  cublasDestroy(g_blas);
  cudaStreamDestroy(g_stream);
}
