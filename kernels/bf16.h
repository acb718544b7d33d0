/* bf16.h — bfloat16 <-> float conversion, shared by the CPU and CUDA paths. */
#ifndef CLRT_BF16_H
#define CLRT_BF16_H
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define CLRT_HD __host__ __device__ __forceinline__
#else
#define CLRT_HD static inline
#endif

/* Round to nearest even, as PyTorch does; NaN stays NaN. */
CLRT_HD uint16_t clrt_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

CLRT_HD float clrt_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

#endif
