// cuda_context.cu — the runtime's side of CUDA: the device, the kernels' launch context made on
// first use (kernels/cuda/launch_context.cu), device memory with clear out-of-memory errors,
// and the first asynchronous failure of a step turned into the runtime's error at sync.
#include "cuda/common.cuh"
#include "cuda_context.h"

#include <stdio.h>
#include <string.h>

extern "C" {
#include "clrt.h"
}

static int g_ready;

static char g_status[160] = "no CUDA device";

extern "C" int clrt_cuda_device_count(void) {
  int n = 0;
  // No driver or no GPU is a normal case on CPU machines: report zero devices, and keep the
  // reason (an old driver reads differently from no GPU) for clrt_cuda_status().
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    snprintf(g_status, sizeof g_status, "no usable CUDA device: %s", cudaGetErrorString(e));
    return 0;
  }
  if (n == 0) snprintf(g_status, sizeof g_status, "no CUDA device");
  else snprintf(g_status, sizeof g_status, "%d CUDA device(s)", n);
  return n;
}

extern "C" const char *clrt_cuda_status(void) {
  clrt_cuda_device_count();
  return g_status;
}

extern "C" int clrt_cuda_init(void) {
  if (g_ready) return 0;
  if (clrt_cuda_device_count() == 0) {
    clrt_set_error("cuda: no CUDA device is available");
    return -1;
  }
  char err[256];
  if (clrt_cuda_launch_context_create(err, sizeof err) != 0) {
    clrt_set_error("%s", err);
    return -1;
  }
  g_ready = 1;
  return 0;
}

// Gives back the cuBLAS handle (and its workspace) and the stream. A process that ends does
// not need it; a leak check that runs at exit (compute-sanitizer's) does.
extern "C" void clrt_cuda_shutdown(void) {
  if (!g_ready) return;
  clrt_cuda_launch_context_destroy();
  g_ready = 0;
}

extern "C" int clrt_cuda_sync(void) {
  if (!g_ready) return 0;
  cudaError_t e = cudaStreamSynchronize(clrt_cuda_cstream());
  if (e != cudaSuccess) clrt_cuda_note("stream", cudaGetErrorString(e));
  char err[512];
  if (clrt_cuda_take_note(err, sizeof err)) {
    clrt_set_error("%s", err);
    return -1;
  }
  return 0;
}

extern "C" void *clrt_cuda_malloc(size_t bytes, const char *what) {
  if (clrt_cuda_init() != 0) return NULL;
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    cudaGetLastError();   // clear it: out of memory is not sticky
    size_t freeb = 0, total = 0;
    cudaMemGetInfo(&freeb, &total);
    clrt_set_error("cuda: out of memory allocating %s: %.1f MiB requested, %.1f MiB free of %.1f MiB (%s)",
                   what ? what : "a buffer", bytes / 1048576.0, freeb / 1048576.0,
                   total / 1048576.0, cudaGetErrorString(e));
    return NULL;
  }
  return p;
}

extern "C" void clrt_cuda_free(void *p) {
  if (p) cudaFree(p);
}

extern "C" int clrt_cuda_memcpy(void *dst, const void *src, size_t bytes, int kind) {
  if (clrt_cuda_init() != 0) return -1;
  if (bytes == 0) return 0;
  cudaMemcpyKind k = kind == 0 ? cudaMemcpyHostToDevice : kind == 1 ? cudaMemcpyDeviceToHost
                                                                    : cudaMemcpyDeviceToDevice;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, k, clrt_cuda_cstream());
  // Host memory may be pageable and reused by the caller right away: wait for host copies.
  if (e == cudaSuccess && kind != 2) e = cudaStreamSynchronize(clrt_cuda_cstream());
  if (e != cudaSuccess) {
    clrt_set_error("cuda: copying %zu bytes (%s): %s", bytes,
                   kind == 0 ? "host to device" : kind == 1 ? "device to host" : "device to device",
                   cudaGetErrorString(e));
    return -1;
  }
  return 0;
}

extern "C" int clrt_cuda_memset0(void *p, size_t bytes) {
  if (clrt_cuda_init() != 0) return -1;
  cudaError_t e = cudaMemsetAsync(p, 0, bytes, clrt_cuda_cstream());
  if (e != cudaSuccess) {
    clrt_set_error("cuda: clearing %zu bytes: %s", bytes, cudaGetErrorString(e));
    return -1;
  }
  return 0;
}

extern "C" int clrt_cuda_device_name(char *buf, size_t n) {
  int dev = 0;
  cudaDeviceProp prop;
  if (clrt_cuda_device_count() == 0 || cudaGetDevice(&dev) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    cudaGetLastError();
    clrt_set_error("cuda: no CUDA device is available");
    return -1;
  }
  snprintf(buf, n, "%s", prop.name);
  return 0;
}
