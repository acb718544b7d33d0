/* gemma3.c — the element ops only Gemma 3 has: the GELU-tanh gated MLP activation, RMSNorm
   scaled by (1 + w) (its norms store w around zero), and an in-place scale (the embedding's
   sqrt(hidden)). Plain loops: these run on the CPU only (Gemma 3 refuses device=cuda). */
#include "model_kernels.h"
#include "model_math.h"

#include <math.h>

enum { UNIT_OMP_MIN = 1 << 15 };

/* PyTorch's gelu(approximate="tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
static inline float gelu_tanh(float x, float *dgelu) {
  const float k0 = 0.7978845608028654f, k1 = 0.044715f;
  float t = tanhf(k0 * (x + k1 * x * x * x));
  if (dgelu) *dgelu = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k0 * (1.0f + 3.0f * k1 * x * x);
  return 0.5f * x * (1.0f + t);
}

void clrt_geglu_forward(float *h /* [N, I] */, const float *g /* [N, I] */, const float *u /* [N, I] */,
                        int64_t n /* N * I */) {
#pragma omp parallel for schedule(static) if (n > UNIT_OMP_MIN)
  for (int64_t i = 0; i < n; i++) h[i] = gelu_tanh(g[i], NULL) * u[i];
}

void clrt_geglu_backward(float *dg /* [N, I] = */, float *du /* [N, I] = */, const float *dh /* [N, I] */,
                         const float *g, const float *u, int64_t n) {
#pragma omp parallel for schedule(static) if (n > UNIT_OMP_MIN)
  for (int64_t i = 0; i < n; i++) {
    float d, a = gelu_tanh(g[i], &d), dy = dh[i];   /* dh is read before dg (which may alias it) is written */
    du[i] = dy * a;
    dg[i] = dy * u[i] * d;
  }
}

void clrt_rmsnorm_unit_forward(float *out /* [N, C] */, float *rstd /* [N] */, const float *x /* [N, C] */,
                               const float *w /* [C] */, int64_t N, int C, float eps) {
#pragma omp parallel for schedule(static) if (N * C > UNIT_OMP_MIN)
  for (int64_t n = 0; n < N; n++) {
    const float *xr = x + n * C;
    float *o = out + n * C, ss = 0;
    for (int c = 0; c < C; c++) ss += xr[c] * xr[c];
    float r = clrt_rms_rstd(ss, C, eps);
    for (int c = 0; c < C; c++) o[c] = (xr[c] * r) * (1.0f + w[c]);
    rstd[n] = r;
  }
}

void clrt_rmsnorm_unit_backward(float *dx /* [N, C] += */, float *dw /* [C] += or NULL */,
                                const float *dout /* [N, C] */, const float *x /* [N, C] */,
                                const float *w /* [C] */, const float *rstd /* [N] */, int64_t N, int C) {
#pragma omp parallel if (N * C > UNIT_OMP_MIN)
  {
#pragma omp for schedule(static) nowait
    for (int64_t n = 0; n < N; n++) {
      const float *xr = x + n * C, *dy = dout + n * C;
      float *d = dx + n * C, r = rstd[n], dot = 0;
      for (int c = 0; c < C; c++) dot += (1.0f + w[c]) * dy[c] * xr[c];
      for (int c = 0; c < C; c++) d[c] += clrt_rms_dx(xr[c], (1.0f + w[c]) * dy[c], r, dot, C);
    }
    /* by columns: each thread walks every row for its own columns, so no two write one dw */
#pragma omp for schedule(static)
    for (int c = 0; c < (dw ? C : 0); c++) {
      float acc = 0;
      for (int64_t n = 0; n < N; n++) acc += dout[n * C + c] * x[n * C + c] * rstd[n];
      dw[c] += acc;
    }
  }
}

void clrt_scale_inplace(float *x /* [n] */, float s, int64_t n) {
#pragma omp parallel for schedule(static) if (n > UNIT_OMP_MIN)
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}
