// device.cu — CUDA device discovery for the runtime (the kernels themselves live beside it).
#include <cuda_runtime.h>

extern "C" int clrt_cuda_device_count(void) {
  int n = 0;
  // No driver or no GPU is a normal case on CPU machines: report zero devices.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}
