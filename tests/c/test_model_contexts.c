/* test_model_contexts.c — two contexts over one model at the same time: a training forward
   and backward in one (LoRA adapters, so that both read the kernels' workspace) and KV-cache
   decoding in another, each on its own pthread, give the same bits as each run alone; and a
   context refuses to mix weight versions (a backward after the weights changed under its
   kept forward). Run in f32 and with bf16 products. */
#include "clrt.h"
#include "check.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, T = 24, SLOTS = 2, PROMPT = 7, STEPS = 10, CACHE_T = 32, ROUNDS = 3 };

typedef struct train_run {
  clrt_model *m;
  clrt_context *x;
  const int32_t *tok;   /* [B, T] */
  float lp[B * (T - 1)];
  float *grads;         /* the adapters' gradients, back to back */
  int64_t ngrad;
  int rc;
  char err[256];
} train_run;

typedef struct decode_run {
  clrt_context *x;
  const int32_t *tok;   /* [SLOTS, PROMPT + STEPS] */
  int V;
  float *logits;        /* [STEPS + 1, SLOTS, V] */
  int rc;
  char err[256];
} decode_run;

static int64_t lora_grad_floats(clrt_model *m) {
  int64_t n = 0;
  for (int i = 0; i < clrt_model_lora_num_tensors(m); i++) {
    clrt_tensor *g = clrt_model_lora_grad(m, i);
    n += clrt_tensor_numel(g);
    clrt_tensor_free(g);
  }
  return n;
}

/* logprobs kept, then backward with dL/dlogp = -1/n, in r->x; the gradients copied out. */
static void *train(void *arg) {
  train_run *r = arg;
  static float dlp[B * (T - 1)];
  for (int i = 0; i < B * (T - 1); i++) dlp[i] = -1.0f / (B * (T - 1));
  r->rc = clrt_context_logprobs(r->x, r->tok, B, T, NULL, NULL, r->lp, NULL, 1) ||
          clrt_context_backward(r->x, dlp, NULL);
  if (r->rc) snprintf(r->err, sizeof r->err, "%s", clrt_last_error());
  return NULL;
}

static void copy_grads(train_run *r) {
  int64_t at = 0;
  for (int i = 0; i < clrt_model_lora_num_tensors(r->m); i++) {
    clrt_tensor *g = clrt_model_lora_grad(r->m, i);
    int64_t n = clrt_tensor_numel(g);
    memcpy(r->grads + at, clrt_tensor_data(g), sizeof(float) * (size_t)n);
    at += n;
    clrt_tensor_free(g);
  }
}

/* Both prompts prefilled, then STEPS decode steps of one token each, in r->x. */
static void *decode(void *arg) {
  decode_run *r = arg;
  const int W = PROMPT + STEPS;
  clrt_decoder *d = clrt_decoder_new_in(r->x, SLOTS, CACHE_T);
  int32_t slots[SLOTS], lens[SLOTS], prompts[SLOTS * PROMPT], step[SLOTS];
  for (int s = 0; s < SLOTS; s++) {
    slots[s] = s;
    lens[s] = PROMPT;
    memcpy(prompts + s * PROMPT, r->tok + s * W, sizeof(int32_t) * PROMPT);
  }
  r->rc = !d || clrt_decoder_prefill_many(d, SLOTS, slots, prompts, lens, r->logits);
  for (int t = 0; !r->rc && t < STEPS; t++) {
    for (int s = 0; s < SLOTS; s++) step[s] = r->tok[s * W + PROMPT + t];
    r->rc = clrt_decoder_decode(d, SLOTS, slots, step, r->logits + (size_t)(t + 1) * SLOTS * r->V);
  }
  if (r->rc) snprintf(r->err, sizeof r->err, "%s", clrt_last_error());
  clrt_decoder_free(d);
  return NULL;
}

/* Runs the two on their own threads, one after the other (together = 0) or at once. */
static void run_pair(clrt_model *m, train_run *tr, decode_run *dr, int together) {
  pthread_t a, b;
  clrt_model_lora_set_dropout_state(m, 11, 0);   /* the same dropout masks every round */
  clrt_model_zero_grad(m);
  pthread_create(&a, NULL, train, tr);
  if (!together) pthread_join(a, NULL);
  pthread_create(&b, NULL, decode, dr);
  if (together) pthread_join(a, NULL);
  pthread_join(b, NULL);
  copy_grads(tr);
  if (tr->rc) fprintf(stderr, "train: %s\n", tr->err);
  if (dr->rc) fprintf(stderr, "decode: %s\n", dr->err);
}

static void run(int bf16, const char *what) {
  clrt_model_config cfg = {.vocab_size = 61, .hidden_size = 32, .intermediate_size = 48,
                           .num_hidden_layers = 2, .num_attention_heads = 4, .num_key_value_heads = 2,
                           .head_dim = 8, .max_position_embeddings = 64, .rms_norm_eps = 1e-5f,
                           .rope_theta = 10000, .qkv_bias = 1};
  clrt_model *m = clrt_model_new(&cfg);
  CHECK(m != NULL);
  if (!m) return;
  CHECK(clrt_model_init_random(m, 5) == 0);
  CHECK(clrt_model_lora_add(m, 4, 8.0f, 0.1f, 0x7f, 11) == 0);
  /* B != 0 so that the adapters change the outputs (PEFT starts B at 0) */
  for (int i = 0; i < clrt_model_lora_num_tensors(m); i++) {
    clrt_tensor *p = clrt_model_lora_param(m, i);
    float *d = clrt_tensor_data(p);
    for (int64_t k = 0; k < clrt_tensor_numel(p); k++) d[k] = d[k] != 0 ? d[k] : 0.01f * (float)((k * 7) % 13 - 6);
    clrt_tensor_free(p);
  }
  if (bf16) CHECK(clrt_model_set_matmul_bf16(m, 1) == 0);
  int V = cfg.vocab_size;
  int32_t tok[B * T], dtok[SLOTS * (PROMPT + STEPS)];
  for (int i = 0; i < B * T; i++) tok[i] = (int32_t)((i * 13 + 5) % V);
  for (int i = 0; i < SLOTS * (PROMPT + STEPS); i++) dtok[i] = (int32_t)((i * 17 + 2) % V);
  int64_t ng = lora_grad_floats(m);
  size_t nlog = (size_t)(STEPS + 1) * SLOTS * V;
  train_run alone_t = {.m = m, .x = clrt_context_new(m), .tok = tok, .grads = calloc((size_t)ng, sizeof(float))};
  decode_run alone_d = {.x = clrt_context_new(m), .tok = dtok, .V = V, .logits = calloc(nlog, sizeof(float))};
  CHECK(alone_t.x && alone_d.x && alone_t.grads && alone_d.logits);
  run_pair(m, &alone_t, &alone_d, 0);
  CHECK(alone_t.rc == 0 && alone_d.rc == 0);
  for (int round = 0; round < ROUNDS; round++) {
    /* fresh contexts each round: nothing of the alone runs' state carries over */
    train_run t = {.m = m, .x = clrt_context_new(m), .tok = tok, .grads = calloc((size_t)ng, sizeof(float))};
    decode_run d = {.x = clrt_context_new(m), .tok = dtok, .V = V, .logits = calloc(nlog, sizeof(float))};
    run_pair(m, &t, &d, 1);
    CHECK(t.rc == 0 && d.rc == 0);
    int same_lp = !memcmp(t.lp, alone_t.lp, sizeof t.lp), same_g = !memcmp(t.grads, alone_t.grads, sizeof(float) * (size_t)ng),
        same_logits = !memcmp(d.logits, alone_d.logits, sizeof(float) * nlog);
    if (!same_lp || !same_g || !same_logits)
      fprintf(stderr, "%s, round %d: side by side differs from alone (logprobs %s, gradients %s, decode logits %s)\n",
              what, round, same_lp ? "same" : "DIFFER", same_g ? "same" : "DIFFER", same_logits ? "same" : "DIFFER");
    CHECK(same_lp && same_g && same_logits);
    clrt_context_free(t.x);
    clrt_context_free(d.x);
    free(t.grads);
    free(d.logits);
  }
  /* the default context is the model-level calls', apart from the others */
  float lp[B * (T - 1)];
  CHECK(clrt_model_context(m) != NULL && clrt_model_logprobs(m, tok, B, T, NULL, lp, 0) == 0);
  /* a kept forward records its weights' version; a change before its backward is refused */
  train_run v = {.m = m, .x = alone_t.x, .tok = tok};
  CHECK(clrt_context_logprobs(v.x, tok, B, T, NULL, NULL, v.lp, NULL, 1) == 0);
  uint64_t version = clrt_context_weights_version(v.x);
  CHECK(version > 0);
  clrt_tensor *p = clrt_model_lora_param(m, 0);
  ((float *)clrt_tensor_data(p))[0] += 1.0f;
  clrt_storage_written(p->storage);
  clrt_tensor_free(p);
  float dlp[B * (T - 1)] = {0};
  CHECK(clrt_context_backward(v.x, dlp, NULL) == -1);
  CHECK_ERROR("weights changed");
  CHECK(clrt_context_logprobs(v.x, tok, B, T, NULL, NULL, v.lp, NULL, 1) == 0 &&
        clrt_context_weights_version(v.x) > version && clrt_context_backward(v.x, dlp, NULL) == 0);
  clrt_context_free(alone_t.x);
  clrt_context_free(alone_d.x);
  free(alone_t.grads);
  free(alone_d.logits);
  clrt_model_free(m);
}

int main(void) {
  clrt_set_num_threads(2);
  run(0, "f32");
  run(1, "bf16 products");
  return check_summary();
}
