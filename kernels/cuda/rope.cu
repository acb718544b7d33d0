// rope.cu — rotary embedding in place, one thread per rotated pair (x[i], x[i + R/2]) of a
// head's first R of D dimensions (the rest pass: partial rotary).
#include "common.cuh"
#include "model_math.h"

static __global__ void rope_kernel(float *x, const float *cos_t, const float *sin_t, const int32_t *pos0,
                                   int B, int T, int nh, int D, int R, int backward) {
  int half = R / 2;
  int64_t total = (int64_t)B * T * nh * half;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    int i = (int)(e % half);
    int64_t row = e / half;            // (b, t, h)
    int64_t bt = row / nh;
    int b = (int)(bt / T), t = (int)(bt % T);
    int64_t pos = (pos0 ? pos0[b] : 0) + t;
    float c = cos_t[pos * half + i], s = sin_t[pos * half + i];
    float *v = x + row * D;
    float a = v[i], z = v[i + half];
    if (backward) clrt_rope_rotate_back(&v[i], &v[i + half], a, z, c, s);
    else clrt_rope_rotate(&v[i], &v[i + half], a, z, c, s);
  }
}

static void rope(const char *name, float *x, const float *cos_t, const float *sin_t, const int32_t *pos0,
                 int B, int T, int nh, int D, int R, int backward) {
  int64_t n = (int64_t)B * T * nh * (R / 2);
  if (n <= 0) return;
  rope_kernel<<<clrt_blocks(n, 256), 256, 0, clrt_cuda_cstream()>>>(x, cos_t, sin_t, pos0, B, T, nh, D, R, backward);
  CLRT_LAUNCHED(name);
}

extern "C" void clrt_cuda_rope_forward(float *x, const float *cos_t, const float *sin_t, const int32_t *pos0,
                                       int B, int T, int nh, int D, int R) {
  rope("rope_forward", x, cos_t, sin_t, pos0, B, T, nh, D, R, 0);
}

extern "C" void clrt_cuda_rope_backward(float *dx, const float *cos_t, const float *sin_t, const int32_t *pos0,
                                        int B, int T, int nh, int D, int R) {
  rope("rope_backward", dx, cos_t, sin_t, pos0, B, T, nh, D, R, 1);
}
