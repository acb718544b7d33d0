/* model_math.h — per-element and per-row math of the transformer, shared by the CPU kernels and
   the CUDA kernels (which include this header and get __host__ __device__ functions), so the
   CPU tests check exactly the arithmetic the GPU runs. No loops over tensors here: each
   function is one element, one pair or one row step. Not named math.h: with kernels/ on the
   include path that name would shadow the C library's <math.h>. */
#ifndef CLRT_MODEL_MATH_H
#define CLRT_MODEL_MATH_H
#include <math.h>

#include "bf16.h"   /* CLRT_HD */

/* ---- RMSNorm: y = w * x * r, r = 1/sqrt(mean(x^2) + eps) -------------------------------- */

/* r from the row's sum of squares over n elements. */
CLRT_HD float clrt_rms_rstd(float sumsq, int n, float eps) {
  return 1.0f / sqrtf(sumsq / (float)n + eps);
}

/* dx_i = r * (w_i dy_i) - x_i * r^3 / n * sum_j(w_j dy_j x_j); `dot` is that sum. */
CLRT_HD float clrt_rms_dx(float x, float wdy, float r, float dot, int n) {
  return r * wdy - x * (r * r * r) * dot / (float)n;
}

/* ---- RoPE, the Hugging Face rotate-half convention --------------------------------------- */
/* The pair (x1, x2) = (x[i], x[i + D/2]) rotates by the angle pos * inv_freq[i]. */

CLRT_HD void clrt_rope_rotate(float *y1, float *y2, float x1, float x2, float c, float s) {
  *y1 = x1 * c - x2 * s;
  *y2 = x2 * c + x1 * s;
}

/* The inverse (transposed) rotation carries the gradient back. */
CLRT_HD void clrt_rope_rotate_back(float *dx1, float *dx2, float dy1, float dy2, float c, float s) {
  *dx1 = dy1 * c + dy2 * s;
  *dx2 = dy2 * c - dy1 * s;
}

/* ---- exp ------------------------------------------------------------------------------ */
/* exp(x) to ~2 ulp with no libm call, so loops over it vectorize (libm's expf does not
   without -ffast-math): x = k ln2 + r, |r| <= ln2/2, exp(r) by a degree-6 polynomial
   (Cephes' coefficients), 2^k built in the exponent bits. Inputs below -87.3 return ~1e-38
   rather than 0; callers never feed it -inf. */
CLRT_HD float clrt_expf(float x) {
  x = x < -87.3f ? -87.3f : x > 88.7f ? 88.7f : x;
  /* round to nearest by the 1.5 * 2^23 trick: no libm call, so the loop stays branch-free */
  float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - k * 0.693359375f;
  r = r + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  int32_t bits = ((int32_t)k + 127) << 23;
  float scale;
  memcpy(&scale, &bits, 4);
  return y * scale;
}

/* ---- RoPE angle: a float product, as in transformers (positions @ inv_freq in f32) ---- */
CLRT_HD float clrt_rope_angle(int pos, float inv_freq) { return (float)pos * inv_freq; }

/* ---- SwiGLU: h = silu(g) * u ---------------------------------------------------------- */

CLRT_HD float clrt_sigmoid(float x) { return 1.0f / (1.0f + clrt_expf(-x)); }

CLRT_HD float clrt_swiglu(float g, float u) { return g * clrt_sigmoid(g) * u; }

/* dg = dh * u * silu'(g), silu'(g) = s * (1 + g * (1 - s)); du = dh * silu(g). */
CLRT_HD void clrt_swiglu_back(float *dg, float *du, float g, float u, float dh) {
  float s = clrt_sigmoid(g);
  *dg = dh * u * s * (1.0f + g * (1.0f - s));
  *du = dh * g * s;
}

/* ---- online softmax / logsumexp ------------------------------------------------------- */
/* Running (max m, sum l of exp(x - m)); fold in one value x. Start with m = -INFINITY, l = 0. */
CLRT_HD void clrt_lse_step(float *m, float *l, float x) {
  if (x > *m) {
    *l = *l * clrt_expf(*m - x) + 1.0f;
    *m = x;
  } else {
    *l += clrt_expf(x - *m);
  }
}

/* Merge two running states (for a reduction split across threads or blocks). */
CLRT_HD void clrt_lse_merge(float *m, float *l, float m2, float l2) {
  if (m2 == -INFINITY) return;
  if (m2 > *m) {
    *l = *l * clrt_expf(*m - m2) + l2;
    *m = m2;
  } else {
    *l += l2 * clrt_expf(m2 - *m);
  }
}

CLRT_HD float clrt_lse_value(float m, float l) { return m + logf(l); }

/* Online softmax-weighted sum (attention): fold score x into (m, l); *corr rescales what was
   accumulated so far and *p weighs the new value: acc = acc * corr + p * v. */
CLRT_HD void clrt_online_softmax_step(float *m, float *l, float x, float *corr, float *p) {
  if (x > *m) {
    *corr = clrt_expf(*m - x);
    *p = 1.0f;
    *l = *l * *corr + 1.0f;
    *m = x;
  } else {
    *corr = 1.0f;
    *p = clrt_expf(x - *m);
    *l += *p;
  }
}

/* ---- sliding-window attention ----------------------------------------------------------- */
/* The first key position the query at position p sees: p - window + 1 (transformers' mask
   keeps keys j with p - window < j <= p), 0 without a window (window <= 0) or near the start. */
CLRT_HD int clrt_window_first_key(int p, int window) {
  return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
}

/* ---- softmax backward ----------------------------------------------------------------- */

/* Attention: p = exp(s - lse) recomputed from the scaled score s; the score's gradient is
   p (dp - D_i) * scale, D_i = dot(dout_i, out_i), dp = dout_i . v_j. */
CLRT_HD float clrt_attn_prob(float s, float lse) { return clrt_expf(s - lse); }
CLRT_HD float clrt_attn_dscore(float p, float dp, float Di, float scale) { return p * (dp - Di) * scale; }

/* Log-softmax + gather: d lp / d z_j = onehot_j - softmax_j; this is the softmax term times the
   upstream gradient g (the caller adds g at the target). */
CLRT_HD float clrt_lsm_dlogit(float z, float lse, float g) { return -g * clrt_expf(z - lse); }

/* ---- gradient clipping ----------------------------------------------------------------- */
/* Scale applied to every gradient when the global norm exceeds clip (clip <= 0: off). */
CLRT_HD float clrt_clip_scale(double norm, float clip) {
  return (clip > 0 && norm > clip) ? (float)(clip / (norm + 1e-6)) : 1.0f;
}

/* ---- AdamW, one element (decoupled weight decay, bias-corrected moments) --------------- */
/* bc1 = 1 - beta1^step, bc2_sqrt = sqrt(1 - beta2^step); decay = lr * weight_decay or 0. */
CLRT_HD void clrt_adamw_update(float *p, float *m, float *v, float g, float lr, float beta1,
                               float beta2, float eps, float decay, float bc1, float bc2_sqrt) {
  *p -= decay * *p;
  *m += (1.0f - beta1) * (g - *m);
  *v = beta2 * *v + (1.0f - beta2) * g * g;
  float denom = sqrtf(*v) / bc2_sqrt + eps;
  *p -= (lr / bc1) * *m / denom;
}

#endif
