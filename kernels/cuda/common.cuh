// common.cuh — what every .cu file shares: error recording, launch sizes, block reductions.
#ifndef CLRT_CUDA_COMMON_CUH
#define CLRT_CUDA_COMMON_CUH
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <stdint.h>

#include "cuda_kernels.h"

// Remembers the first failure of an asynchronous operation; clrt_cuda_sync() reports it.
void clrt_cuda_note(const char *what, const char *err);
cublasHandle_t clrt_cuda_blas(void);
cudaStream_t clrt_cuda_cstream(void);

// After a launch: a bad configuration shows up here, a fault later at clrt_cuda_sync().
#define CLRT_LAUNCHED(name)                                       \
  do {                                                            \
    cudaError_t e_ = cudaGetLastError();                          \
    if (e_ != cudaSuccess) clrt_cuda_note(name, cudaGetErrorString(e_)); \
  } while (0)

#define CLRT_BLAS(name, call)                                     \
  do {                                                            \
    cublasStatus_t s_ = (call);                                   \
    if (s_ != CUBLAS_STATUS_SUCCESS) clrt_cuda_note(name, cublasGetStatusString(s_)); \
  } while (0)

static inline unsigned clrt_blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return (unsigned)(b < 1 ? 1 : b > 65535 * 16 ? 65535 * 16 : b);   // grid-stride beyond this
}

__device__ __forceinline__ float clrt_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ double clrt_warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `sh` is 32 entries of shared memory; the leading barrier lets callers reuse it back to back.
template <typename T>
__device__ T clrt_block_sum(T v, T *sh) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  T s = lane < nw ? sh[lane] : (T)0;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

#endif
