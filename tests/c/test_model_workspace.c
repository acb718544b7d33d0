/* test_model_workspace.c — the CPU kernels' workspace (kernels allocate nothing; the model
   reserves it per step from weights.c's model_workspace_bytes). In every mode whose products
   take one (bf16 panels, skinny and row-wise bf16, the bf16 base, LoRA adapters) forward,
   backward and cached steps of several row counts (a decode step's few rows to a prefill's
   many) succeed: a product the reservation did not cover would fail its step with an error
   (model_workspace), which these calls would return. A short workspace is an error naming
   the caller, and the next step reserves again. */
#include "clrt.h"
#include "check.h"
#include "model/model_internal.h"

#include <stdlib.h>
#include <string.h>

enum { NB = 4, MAXT = 40, CACHE_T = 48 };

static const char *modes[] = {"f32", "bf16", "bf16 batch-invariant", "bf16 unpacked", "bf16 unpacked batch-invariant",
                              "lora", "lora bf16", "bf16 base", "bf16 base unpacked"};

static clrt_model *make(const clrt_model_config *cfg, int mode) {
  clrt_model *m = clrt_model_new(cfg);
  if (!m) return NULL;
  clrt_model_init_random(m, 7);
  int lora = mode >= 5, base16 = mode >= 7, bf16 = (mode >= 1 && mode <= 4) || mode == 6;
  int unpacked = mode == 3 || mode == 4 || mode == 8, invariant = mode == 2 || mode == 4;
  if (unpacked) clrt_model_set_decode_pack(m, 0);
  if (lora && clrt_model_lora_add(m, 4, 8, 0.1f, (1u << LORA_NALL) - 1, 3)) return NULL;
  if (base16 && clrt_model_set_base_bf16(m)) return NULL;
  if (bf16 && clrt_model_set_matmul_bf16(m, 1)) return NULL;
  if (invariant) clrt_model_set_batch_invariant(m, 1);
  return m;
}

static void run(const clrt_model_config *cfg, int mode) {
  clrt_model *m = make(cfg, mode);
  CHECK(m != NULL);
  if (!m) {
    fprintf(stderr, "%s: %s\n", modes[mode], clrt_last_error());
    return;
  }
  int V = cfg->vocab_size, L = cfg->num_hidden_layers;
  static int32_t tok[NB * MAXT];
  for (int i = 0; i < NB * MAXT; i++) tok[i] = (int32_t)((i * 7 + 3) % V);
  static float lp[NB * MAXT], dlp[NB * MAXT];
  for (int i = 0; i < NB * MAXT; i++) dlp[i] = -0.01f;
  /* rows B * T: 4, 18 (skinny sized), 80 and 160 (where x in bf16 [N, K] outgrows the
     skinny kernels' 32-row share) */
  const int Bs[] = {2, 2, 2, NB}, Ts[] = {2, 9, MAXT, MAXT};
  for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++) {
    int B = Bs[i], T = Ts[i];
    int ok = clrt_model_logprobs(m, tok, B, T, NULL, lp, 1) == 0 && clrt_model_backward(m, dlp) == 0;
    if (!ok) fprintf(stderr, "%s, [%d, %d]: %s\n", modes[mode], B, T, clrt_last_error());
    CHECK(ok);
    CHECK(!m->ctx->step_failed && m->ctx->ws_bytes >= model_workspace_bytes(m, (int64_t)B * T));
  }
  int bf16_products = (mode >= 1 && mode <= 4) || mode >= 5;
  CHECK(!bf16_products || m->ctx->ws_bytes > 0);
  /* a cached prefill, then decode steps of one token */
  size_t per = (size_t)2 * CACHE_T * cfg->num_key_value_heads * cfg->head_dim;
  float *kc[4], *vc[4], *logits = malloc(sizeof(float) * 2 * (size_t)V);
  for (int l = 0; l < L; l++) kc[l] = calloc(per, sizeof(float)), vc[l] = calloc(per, sizeof(float));
  int32_t pos0[2] = {0, 0};
  int ok = clrt_model_forward_cached(m, tok, 2, 30, pos0, NULL, NULL, kc, vc, CACHE_T, logits) == 0;
  for (int s = 0; ok && s < 3; s++) {
    pos0[0] = pos0[1] = 30 + s;
    ok = clrt_model_forward_cached(m, tok + s, 2, 1, pos0, NULL, NULL, kc, vc, CACHE_T, logits) == 0;
  }
  if (!ok) fprintf(stderr, "%s, cached: %s\n", modes[mode], clrt_last_error());
  CHECK(ok);
  /* short: refused with an error naming the caller; the step is marked, the next one clears it */
  CHECK(model_workspace(m->ctx, m->ctx->ws_bytes + 1, "probe") == -1 && m->ctx->step_failed);
  CHECK(strstr(clrt_last_error(), "probe") != NULL);
  CHECK(clrt_model_logprobs(m, tok, 2, 9, NULL, lp, 0) == 0 && !m->ctx->step_failed);
  for (int l = 0; l < L; l++) free(kc[l]), free(vc[l]);
  free(logits);
  clrt_model_free(m);
}

int main(void) {
  clrt_set_num_threads(2);
  /* even sizes (bf16 pairs); intermediate 160 > 48: several panels and a narrow last one */
  clrt_model_config c = {.vocab_size = 70, .hidden_size = 64, .intermediate_size = 160,
                         .num_hidden_layers = 2, .num_attention_heads = 4, .num_key_value_heads = 2,
                         .head_dim = 16, .max_position_embeddings = 64, .rms_norm_eps = 1e-6f,
                         .rope_theta = 10000, .qkv_bias = 1};
  for (int mode = 0; mode < (int)(sizeof modes / sizeof *modes); mode++) run(&c, mode);
  return check_summary();
}
