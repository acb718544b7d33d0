/* rope.c — RoPE's inverse frequencies and attention factor for each scaling kind of
   config.json (default, linear, llama3, yarn, longrope/su, dynamic NTK), as transformers'
   modeling_rope_utils computes them, for a call whose positions reach seq_len; arena.c makes
   the cos/sin tables from them. */
#include "model_internal.h"

#include <math.h>

/* theta^(2i/D) in f32, as transformers' base ** (arange(0, D, 2).float() / D): the power of
   the f32 exponent rounded to f32 (torch's f32 pow is within an ulp of that), whose f32
   reciprocal is the inverse frequency (docs/models.md: why f32 and what double would move). */
static float rope_pow(double base, int i, int D) {
  float e = (float)(2 * i) / (float)D;
  return (float)pow(base, (double)e);
}

/* YaRN's dimension at which a wavelength fits num_rotations times into n positions. */
static double yarn_correction_dim(double num_rotations, int D, double base, double n) {
  return D * log(n / (num_rotations * 2 * M_PI)) / (2 * log(base));
}

/* The scale transformers gives cos and sin (its rope_init functions' attention_factor). */
double model_rope_attention_factor(const clrt_model_config *c) {
  if (c->rope_attention_factor > 0) return c->rope_attention_factor;
  double f = c->rope_factor;
  if (c->rope_scaling == CLRT_ROPE_YARN) return f <= 1 ? 1.0 : 0.1 * log(f) + 1.0;
  if (c->rope_scaling == CLRT_ROPE_LONGROPE)
    return f <= 1 ? 1.0 : sqrt(1 + log(f) / log((double)c->rope_original_max_position));
  return 1.0;
}

/* inv_freq [R/2] (R = rope_dim, the rotated dimensions: transformers' dim) for a call whose
   positions reach seq_len (0: the model's own tables), by the config's scaling (transformers'
   rope_init functions, modeling_rope_utils). Only longrope (short or long factors) and dynamic
   (the base grown past max_position_embeddings) depend on seq_len. */
void model_rope_inv_freq(const clrt_model_config *c, int seq_len, float *inv) {
  int D = c->rope_dim ? c->rope_dim : c->head_dim, half = D / 2;
  double base = c->rope_theta;
  int dyn = c->rope_scaling == CLRT_ROPE_DYNAMIC && seq_len > c->max_position_embeddings;
  if (dyn) {   /* f32 like transformers, whose forward passes the length as a tensor */
    float ratio = (float)c->rope_factor * (float)seq_len / (float)c->max_position_embeddings - (float)(c->rope_factor - 1);
    base = (float)c->rope_theta * powf(ratio, (float)((double)D / (double)(D - 2)));
  }
  double ylo = 0, yhi = 0;
  if (c->rope_scaling == CLRT_ROPE_YARN) {
    double fast = c->rope_beta_fast > 0 ? c->rope_beta_fast : 32, slow = c->rope_beta_slow > 0 ? c->rope_beta_slow : 1;
    ylo = yarn_correction_dim(fast, D, base, c->rope_original_max_position);
    yhi = yarn_correction_dim(slow, D, base, c->rope_original_max_position);
    if (c->rope_yarn_truncate) ylo = floor(ylo), yhi = ceil(yhi);
    ylo = ylo > 0 ? ylo : 0;
    yhi = yhi < D - 1 ? yhi : D - 1;
    if (ylo == yhi) yhi += 0.001;   /* transformers' guard against a zero-width ramp */
  }
  int use_long = c->rope_scaling == CLRT_ROPE_LONGROPE && seq_len > c->rope_original_max_position;
  for (int i = 0; i < half; i++) {
    float p = rope_pow(base, i, D), f = 1.0f / p;
    switch (c->rope_scaling) {
      case CLRT_ROPE_LINEAR: f = f / (float)c->rope_factor; break;
      case CLRT_ROPE_LLAMA3: {   /* f32 tensors in transformers, the scalars cast to f32 */
        float factor = (float)c->rope_factor, lof = (float)c->rope_low_freq_factor, hif = (float)c->rope_high_freq_factor;
        float old = (float)c->rope_original_max_position;
        float wavelen = (float)(2 * M_PI) / f;
        if (wavelen > (float)(c->rope_original_max_position / c->rope_low_freq_factor)) f = f / factor;
        else if (!(wavelen < (float)(c->rope_original_max_position / c->rope_high_freq_factor))) {   /* between */
          float smooth = (old / wavelen - lof) / (hif - lof);
          f = (1 - smooth) * f / factor + smooth * f;
        }
        break;
      }
      case CLRT_ROPE_YARN: {   /* f32 tensors in transformers: extrapolation, interpolation, a ramp between */
        float interp = 1.0f / ((float)c->rope_factor * p);
        float ramp = ((float)i - (float)ylo) / (float)(yhi - ylo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float extrap_w = 1.0f - ramp;
        f = interp * (1.0f - extrap_w) + f * extrap_w;
        break;
      }
      case CLRT_ROPE_LONGROPE:
        f = 1.0f / ((use_long ? c->rope_long_factor[i] : c->rope_short_factor[i]) * p);
        break;
      default: break;
    }
    inv[i] = f;
  }
}

int clrt_model_rope_inv_freq(const clrt_model *m, int seq_len, float *inv, double *attention_factor) {
  if (seq_len < 0) {
    clrt_set_error("model: rope_inv_freq: seq_len %d is negative", seq_len);
    return -1;
  }
  model_rope_inv_freq(&m->cfg, seq_len, inv);
  if (attention_factor) *attention_factor = m->rope_scale;
  return 0;
}
