/* test_model_cached.c — decoding with a KV cache (prefill of ragged prompts, a two-token
   step, then one token at a time) gives the same next-token log-probs as the full causal
   forward over each whole sequence, for a GQA + llama3-RoPE + o-bias model and a Qwen3-style
   one (qk-norm, qkv bias, head_dim != hidden / heads). */
#include "clrt.h"
#include "check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, T = 12, CACHE_T = 16 };

static double log_softmax_at(const float *z, int V, int k) {
  double m = -1e300, l = 0;
  for (int v = 0; v < V; v++) m = fmax(m, z[v]);
  for (int v = 0; v < V; v++) l += exp(z[v] - m);
  return z[k] - m - log(l);
}

static void run(const clrt_model_config *cfg, const char *what) {
  clrt_model *m = clrt_model_new(cfg);
  CHECK(m != NULL);
  if (!m) return;
  clrt_model_init_random(m, 7);
  /* Larger weights than the 0.02 init, so attention patterns matter to the result. */
  for (int i = 0; i < clrt_model_num_tensors(m); i++) {
    clrt_tensor *p = clrt_model_param(m, i);
    float *d = clrt_tensor_data(p);
    int64_t n = clrt_tensor_numel(p);
    for (int64_t k = 0; k < n; k++) d[k] *= p->ndim == 2 ? 8.0f : 1.0f;
    clrt_tensor_free(p);
  }
  int V = cfg->vocab_size, L = cfg->num_hidden_layers;
  int32_t tok[B * T], len[B] = {12, 9}, prompt[B] = {5, 3};
  clrt_rng r;
  clrt_rng_seed(&r, 3);
  for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(clrt_rng_next(&r) % (uint64_t)V);
  float lp[B * (T - 1)];
  CHECK(clrt_model_logprobs(m, tok, B, T, len, lp, 0) == 0);

  size_t per = (size_t)B * CACHE_T * cfg->num_key_value_heads * cfg->head_dim;
  float *kc[8], *vc[8];
  for (int l = 0; l < L; l++) {
    kc[l] = calloc(per, sizeof(float));
    vc[l] = calloc(per, sizeof(float));
  }
  float *logits = malloc(sizeof(float) * (size_t)B * V);
  double worst = 0;
  int checked = 0;
  /* prefill: both prompts in one [B, 5] call, row 2 right-padded with junk */
  int32_t pre[B * 5], pos0[B] = {0, 0}, last[B] = {prompt[0] - 1, prompt[1] - 1};
  for (int b = 0; b < B; b++)
    for (int t = 0; t < 5; t++) pre[b * 5 + t] = t < prompt[b] ? tok[b * T + t] : 1;
  CHECK(clrt_model_forward_cached(m, pre, B, 5, pos0, NULL, last, kc, vc, CACHE_T, logits) == 0);
  for (int b = 0; b < B; b++) {
    int p = prompt[b];
    worst = fmax(worst, fabs(log_softmax_at(logits + (size_t)b * V, V, tok[b * T + p]) - lp[b * (T - 1) + p - 1]));
    checked++;
  }
  int cur[B] = {prompt[0], prompt[1]};
  /* one two-token step, then single tokens */
  for (int step = 0; step < 6; step++) {
    int tn = step == 0 ? 2 : 1;
    int32_t in[B * 2];
    for (int b = 0; b < B; b++) {
      pos0[b] = cur[b];
      for (int t = 0; t < tn; t++) in[b * tn + t] = tok[b * T + (cur[b] + t < T ? cur[b] + t : 0)];
    }
    CHECK(clrt_model_forward_cached(m, in, B, tn, pos0, NULL, NULL, kc, vc, CACHE_T, logits) == 0);
    for (int b = 0; b < B; b++) {
      int pos = cur[b] + tn - 1;   /* the logits predict token pos + 1 */
      if (pos + 1 < len[b]) {
        worst = fmax(worst, fabs(log_softmax_at(logits + (size_t)b * V, V, tok[b * T + pos + 1]) - lp[b * (T - 1) + pos]));
        checked++;
      }
      cur[b] += tn;
    }
  }
  CHECK(checked == 11);
  if (worst <= 2e-5) check_passed++;
  else {
    check_failed++;
    fprintf(stderr, "%s: cached decode differs from the full forward by %.3g\n", what, worst);
  }
  /* a position past the cache is an error, not a write out of bounds */
  pos0[0] = CACHE_T;
  CHECK(clrt_model_forward_cached(m, pre, B, 1, pos0, NULL, NULL, kc, vc, CACHE_T, logits) == -1);
  CHECK_ERROR("outside the cache");
  for (int l = 0; l < L; l++) {
    free(kc[l]);
    free(vc[l]);
  }
  free(logits);
  clrt_model_free(m);
}

int main(void) {
  clrt_set_num_threads(2);
  clrt_model_config a = {.vocab_size = 61, .hidden_size = 32, .intermediate_size = 48,
                         .num_hidden_layers = 2, .num_attention_heads = 4, .num_key_value_heads = 2,
                         .head_dim = 8, .max_position_embeddings = 64, .rms_norm_eps = 1e-5f,
                         .rope_theta = 10000, .rope_scaling = CLRT_ROPE_LLAMA3, .rope_factor = 8,
                         .rope_low_freq_factor = 1, .rope_high_freq_factor = 4,
                         .rope_original_max_position = 8, .qkv_bias = 1, .o_bias = 1};
  run(&a, "llama-style");
  clrt_model_config q = {.vocab_size = 50, .hidden_size = 24, .intermediate_size = 40,
                         .num_hidden_layers = 3, .num_attention_heads = 3, .num_key_value_heads = 1,
                         .head_dim = 10, .max_position_embeddings = 64, .rms_norm_eps = 1e-6f,
                         .rope_theta = 1e6, .tie_word_embeddings = 1, .qkv_bias = 1, .qk_norm = 1};
  run(&q, "qwen3-style");
  return check_summary();
}
