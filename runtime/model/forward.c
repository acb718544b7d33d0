/* forward.c — the transformer's forward: one layer as a sequence of ops, and the entry points
   clrt_model_logprobs (training and scoring: the log-probability of each next token) and
   clrt_model_forward_cached (decode with a KV cache: the same layer, run for the new
   positions only, writing their keys/values into the caller's cache and attending over it).

   One layer (N = B*T rows):
     xn = rmsnorm(x) ; q,k,v = xn W^T (+b) ; [qk-norm per head] ; rope(q, k)
     att = causal_gqa(q, k, v) ; xmid = x + att Wo^T (+b)
     xn = rmsnorm(xmid) ; h = silu(xn Wg^T) * (xn Wu^T) ; x' = xmid + h Wd^T
   Kept per layer for backward: xmid, q, k, v (after RoPE), att, the attention logsumexp,
   gate and up, the norms' rstd (and q/k before their norm for Qwen3). The normalised inputs
   and h are recomputed in backward instead of stored. Which kernel, device and precision run
   each op is the ops table's business (device.c). */
#include "model_internal.h"
#include "lora_math.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

static void layer_forward(clrt_model *m, acts *a, const fwd_step *s, int l, const float *x, float *out) {
  const model_ops *op = m->ops;
  const clrt_model_config *c = &m->cfg;
  const clrt_layer_offsets *o = &m->layer[l];
  if (c->gemma3) {
    gemma3_layer_forward(m, a, s, l, x, out);
    return;
  }
  layer_acts *A = s->keep ? &a->la[l] : &a->la[0];
  int C = c->hidden_size, I = c->intermediate_size, H = c->num_attention_heads,
      KV = c->num_key_value_heads, D = c->head_dim, B = s->B, T = s->T;
  int64_t N = (int64_t)B * T;
  float eps = c->rms_norm_eps;
  /* Attention: xmid = x + attention(rope(q), rope(k), v) Wo^T over q, k, v of rmsnorm(x). */
  PROF(CLRT_K_RMSNORM, op->rmsnorm(a->xn, A->rstd1, x, PW(m, o->ln1), N, C, eps));
  float *qd = c->qk_norm ? A->qpre : A->q, *kd = c->qk_norm ? A->kpre : A->k;
  lin_part qkv[3] = {{qd, o->wq, PW(m, o->bq), H * D, LORA_Q},
                     {kd, o->wk, PW(m, o->bk), KV * D, LORA_K},
                     {A->v, o->wv, PW(m, o->bv), KV * D, LORA_V}};
  model_linear(m, a, A, l, s->keep, a->xn, N, C, qkv, 3);
  if (c->qk_norm)
    PROF(CLRT_K_RMSNORM, {
      op->rmsnorm(A->q, A->qrstd, A->qpre, PW(m, o->qn), N * H, D, eps);
      op->rmsnorm(A->k, A->krstd, A->kpre, PW(m, o->kn), N * KV, D, eps);
    });
  PROF(CLRT_K_ROPE, {
    if (s->pack) {
      model_pack_rope(a->cx, s->pack, A->q, A->k, 0);
    } else {
      op->rope(A->q, a->cx->rope_c, a->cx->rope_s, s->pos0, B, T, H, D, m->cfg.rope_dim);
      op->rope(A->k, a->cx->rope_c, a->cx->rope_s, s->pos0, B, T, KV, D, m->cfg.rope_dim);
    }
  });
  attn_args at = {B, T, H, KV, D, model_layer_window(m, l), s->pos0, NULL, (int64_t)T * KV * D};
  const float *keys = A->k, *vals = A->v;
  if (s->kcache) {   /* decode: the new keys/values join the cache and attention reads it */
    float *kc = s->kcache[l], *vc = s->vcache[l];
    at.kv_bstride = (int64_t)s->cache_T * KV * D;
    at.slot = s->slot;
    op->kv_write(kc, vc, A->k, A->v, s->pos0, s->slot, B, T, KV * D, at.kv_bstride);
    keys = kc;
    vals = vc;
  }
  if (s->pack)
    PROF(CLRT_K_ATTN_F, model_pack_attention(m, a, s->pack, A->att, s->keep ? A->lse : NULL, A->q, keys, vals,
                                             at.window));
  else
    PROF(CLRT_K_ATTN_F, op->attention(m, a, A->att, s->keep ? A->lse : NULL, A->q, keys, vals, &at));
  lin_part proj = {a->tmp, o->wo, PW(m, o->bo), C, LORA_O};
  model_linear(m, a, A, l, s->keep, A->att, N, H * D, &proj, 1);
  PROF(CLRT_K_RESIDUAL, op->add(A->xmid, x, a->tmp, N * C));
  /* MLP: out = xmid + swiglu(xn Wg^T, xn Wu^T) Wd^T over xn = rmsnorm(xmid). */
  PROF(CLRT_K_RMSNORM, op->rmsnorm(a->xn, A->rstd2, A->xmid, PW(m, o->ln2), N, C, eps));
  lin_part gate_up[2] = {{A->g, o->wg, NULL, I, LORA_GATE}, {A->u, o->wu, NULL, I, LORA_UP}};
  model_linear(m, a, A, l, s->keep, a->xn, N, C, gate_up, 2);
  PROF(CLRT_K_SWIGLU, op->swiglu(a->h, A->g, A->u, N * I));
  lin_part down = {a->tmp, o->wd, NULL, C, LORA_DOWN};
  model_linear(m, a, A, l, s->keep, a->h, N, I, &down, 1);
  PROF(CLRT_K_RESIDUAL, op->add(out, A->xmid, a->tmp, N * C));
}

/* Embedding, then every layer; the last layer's output is returned. */
static float *run_layers(clrt_model *m, acts *a, const fwd_step *s, const char *who) {
  int L = m->cfg.num_hidden_layers, C = m->cfg.hidden_size;
  PROF(CLRT_K_EMBED, m->ops->embedding(a->res[0], a->tok, PW(m, m->wte), (int64_t)s->B * s->T, C));
  PROF(CLRT_K_LORA, model_lora_embed_forward(m, a, a->res[0], (int64_t)s->B * s->T));
  PROF(CLRT_K_EMBED, model_embed_scale(m, a->res[0], (int64_t)s->B * s->T));
  for (int l = 0; l < L; l++) {
    if (clrt_interrupted()) {
      clrt_set_error("%s: interrupted", who);
      return NULL;
    }
    float *x = s->keep ? a->res[l] : a->res[l % 2], *out = s->keep ? a->res[l + 1] : a->res[(l + 1) % 2];
    layer_forward(m, a, s, l, x, out);
  }
  return s->keep ? a->res[L] : a->res[L % 2];
}

/* Row b's first len tokens (the row starts at b * stride) are in the vocabulary; the error
   names the entry point `who`, the row and the position, 1-based. */
static int check_tokens(const clrt_model *m, const char *who, const int32_t *tokens, int b,
                        int stride, int len) {
  int V = m->cfg.vocab_size;
  for (int t = 0; t < len; t++) {
    int32_t id = tokens[(int64_t)b * stride + t];
    if (id < 0 || id >= V) {
      clrt_set_error("%s: token %d at row %d, position %d is outside the vocabulary [0, %d)", who,
                     id, b + 1, t + 1, V);
      return -1;
    }
  }
  return 0;
}

static int check_batch(const clrt_model *m, const int32_t *tokens, int B, int T, const int32_t *lengths) {
  if (B <= 0 || T <= 0) {
    clrt_set_error("logprobs: empty batch [%d, %d]", B, T);
    return -1;
  }
  for (int b = 0; b < B; b++) {
    int len = lengths ? lengths[b] : T;
    if (len < 1 || len > T) {
      clrt_set_error("logprobs: length %d of row %d is outside [1, %d]", len, b + 1, T);
      return -1;
    }
    if (check_tokens(m, "logprobs", tokens, b, T, len) != 0) return -1;
  }
  return 0;
}

/* The step's tokens (padding: any id; packed: the context's pack) and the rows with a target,
   built on the host and copied into the arena; the count of rows with a target, or -1. The
   context's hidx keeps each target's place in the caller's rows (b * T + t) for backward and
   the copies out; rowidx, uploaded, its row in the layout (the packed position when pk). */
static int64_t stage_targets(clrt_model *m, acts *a, const int32_t *tokens, int B, int T,
                             const int32_t *lengths, const int32_t *context, const model_pack *pk) {
  int64_t N = (int64_t)B * T, nv = 0;
  int32_t *place = model_host_ints(a->cx, 4 * (size_t)N);
  if (!place) return -1;
  int32_t *rowidx = place + N, *tok = place + 2 * N, *target = place + 3 * N;
  for (int b = 0; b < B; b++) {
    int len = lengths ? lengths[b] : T, from = context ? context[b] : 0;
    for (int t = 0; t < T; t++) {
      if (!pk) tok[(int64_t)b * T + t] = t < len ? tokens[(int64_t)b * T + t] : 0;
      if (t + 1 < len && t + 1 >= from) {
        place[nv] = (int32_t)((int64_t)b * T + t);
        rowidx[nv] = (int32_t)(pk ? model_pack_index(pk, b, t) : (int64_t)b * T + t);
        target[nv] = tokens[(int64_t)b * T + t + 1];
        nv++;
      }
    }
  }
  const model_ops *op = m->ops;
  if (op->upload(a->tok, pk ? pk->tok : tok, sizeof(int32_t) * (size_t)(pk ? pk->N : N)) ||
      op->upload(a->rowidx, rowidx, sizeof(int32_t) * (size_t)nv) ||
      op->upload(a->target, target, sizeof(int32_t) * (size_t)nv))
    return -1;
  return nv;
}

/* lp [B, T-1] from the nv log-probabilities in the arena (one copy to the host). */
static int unstage_logprobs(clrt_model *m, const acts *a, float *lp, int B, int T, int64_t nv) {
  memset(lp, 0, sizeof(float) * (size_t)B * (size_t)(T - 1));
  float *lpv = malloc(sizeof(float) * (size_t)(nv ? nv : 1));
  if (!lpv) {
    clrt_set_error("logprobs: out of host memory");
    return -1;
  }
  if (m->ops->download(lpv, a->lpv, sizeof(float) * (size_t)nv)) {
    free(lpv);
    return -1;
  }
  const int32_t *rowidx = a->cx->hidx;
  for (int64_t i = 0; i < nv; i++) {
    int64_t r = rowidx[i], b = r / T, t = r % T;
    lp[b * (T - 1) + t] = lpv[i];
  }
  free(lpv);
  return 0;
}

/* hidden [B, T-1, C] from the nv final-norm rows in the arena, by the same row map as lp. */
static int unstage_hidden(clrt_model *m, const acts *a, float *hidden, int B, int T, int64_t nv) {
  int C = m->cfg.hidden_size;
  memset(hidden, 0, sizeof(float) * (size_t)B * (size_t)(T - 1) * (size_t)C);
  float *hv = malloc(sizeof(float) * (size_t)(nv ? nv * C : 1));
  if (!hv) {
    clrt_set_error("logprobs: out of host memory for the hidden states");
    return -1;
  }
  if (m->ops->download(hv, a->xn, sizeof(float) * (size_t)(nv * C))) {
    free(hv);
    return -1;
  }
  for (int64_t i = 0; i < nv; i++) {
    int64_t r = a->cx->hidx[i], b = r / T, t = r % T;
    memcpy(hidden + (b * (T - 1) + t) * C, hv + i * C, sizeof(float) * (size_t)C);
  }
  free(hv);
  return 0;
}

int clrt_model_logprobs(clrt_model *m, const int32_t *tokens, int B, int T,
                        const int32_t *lengths, float *lp, int keep) {
  return clrt_context_logprobs(m->ctx, tokens, B, T, lengths, NULL, lp, NULL, keep);
}

int clrt_model_logprobs_hidden(clrt_model *m, const int32_t *tokens, int B, int T,
                               const int32_t *lengths, float *lp, float *hidden, int keep) {
  return clrt_context_logprobs(m->ctx, tokens, B, T, lengths, NULL, lp, hidden, keep);
}

int clrt_model_logprobs_context(clrt_model *m, const int32_t *tokens, int B, int T, const int32_t *lengths,
                                const int32_t *context, float *lp, float *hidden, int keep) {
  return clrt_context_logprobs(m->ctx, tokens, B, T, lengths, context, lp, hidden, keep);
}

/* What a call reads besides the weights, made from them under the copies' lock (another
   context may be starting at the same time): the RoPE tables for `positions`, and the copies
   its products read (decode: the packed f32 or int8 ones; else logprobs' share of that
   policy), then the formats its products read and the weights' version all of them follow. */
static int prepare(clrt_context *x, int positions, int decode, uint64_t *version) {
  clrt_model *m = x->m;
  pthread_mutex_lock(&m->copies_lock);
  int rc = model_ensure_rope(m, positions);
  if (!rc) rc = model_rope_choose(x, positions);
  if (!rc && decode) rc = model_q8_active(m) ? model_q8_refresh(m) : model_refresh_packed(m);
  else if (!rc) rc = model_refresh_packed_logprobs(m);
  if (!rc) rc = model_refresh_bf16(m);
  model_context_choose(x, decode);
  *version = model_weights_version(m);
  pthread_mutex_unlock(&m->copies_lock);
  return rc;
}

/* A row's context tokens (an RL or DPO row's prompt) need no log-probabilities: leaving them
   out of the targets spares the output layer (and its backward) every prompt position, most
   of a row whose prompt is longer than its response. */
int clrt_context_logprobs(clrt_context *x, const int32_t *tokens, int B, int T, const int32_t *lengths,
                          const int32_t *context, float *lp, float *hidden, int keep) {
  clrt_model *m = x->m;
  const clrt_model_config *c = &m->cfg;
  int L = c->num_hidden_layers, C = c->hidden_size, V = c->vocab_size;
  for (int b = 0; context && b < B; b++)
    if (context[b] < 0) {
      clrt_set_error("logprobs: context %d of row %d is negative", context[b], b + 1);
      return -1;
    }
  uint64_t version;
  model_context_begin(x);
  if (check_batch(m, tokens, B, T, lengths) || prepare(x, T, 0, &version)) return -1;
  /* The attention scratch has one slice per thread; backward keeps this forward's count even
     if the thread setting changes in between. */
  x->threads = omp_get_max_threads();
  float *res[L + 1];
  layer_acts la[L];
  acts a = {.cx = x, .res = res, .la = la};
  double t0 = model_prof_on > 0 ? model_now() : 0;
  x->saved = 0;
  /* Rows that share their context run it once (shared_prefix.c): one row of segments. */
  int packed = context && model_pack_wanted(m) ? model_pack_plan(x, tokens, B, T, lengths, context) : 0;
  if (packed < 0) return -1;
  const model_pack *pk = packed ? &x->pack : NULL;
  int LB = pk ? 1 : B, LT = pk ? pk->N : T;
  if (model_bind_acts(x, &a, LB, LT, LT, keep) ||
      model_reserve_workspace(x, model_step_workspace_bytes(m, (int64_t)LB * LT, pk), "logprobs"))
    return -1;
  int64_t nv = stage_targets(m, &a, tokens, B, T, lengths, context, pk);
  if (nv < 0) return -1;
  if (model_prof_on > 0) clrt_kernel_seconds[CLRT_K_OTHER] += model_now() - t0;
  model_lora_begin(x, keep);
  fwd_step s = {.B = LB, .T = LT, .keep = keep, .pack = pk};
  const float *xl = run_layers(m, &a, &s, "logprobs");
  if (!xl) return -1;
  /* The output layer over the rows with a target only. */
  const model_ops *op = m->ops;
  PROF(CLRT_K_OTHER, op->gather_rows(a.tmp, xl, a.rowidx, nv, C));
  PROF(CLRT_K_RMSNORM, model_final_norm(m, a.xn, a.rstdf, a.tmp, nv));
  if (hidden && unstage_hidden(m, &a, hidden, B, T, nv)) return -1;
  clrt_head_lora hl;
  const clrt_head_lora *hla;
  PROF(CLRT_K_LORA, hla = model_lora_head_forward(m, &a, &hl, a.xn, nv, keep));
  if (c->final_logit_softcapping > 0)   /* Gemma 3 */
    PROF(CLRT_K_OUT_F, op->output_softcap(a.lpv, a.lsef, a.xn, PW(m, m->head), model_packed_weight(m, m->head),
                                          model_output_kernels(m), a.target, nv, C, V, a.logits, a.chunk, hla,
                                          (float)c->final_logit_softcapping));
  else
    PROF(CLRT_K_OUT_F, op->output(a.lpv, a.lsef, a.xn, PW(m, m->head), model_packed_weight(m, m->head),
                                  model_output_kernels(m), a.target, nv, C, V, a.logits, a.chunk, hla));
  if (x->step_failed || unstage_logprobs(m, &a, lp, B, T, nv) ||
      model_context_check_version(x, version, "logprobs"))
    return -1;
  x->saved = keep;
  x->version = version;
  x->B = B;
  x->T = T;
  x->packed = packed;
  x->nv = nv;
  return 0;
}

static int check_cached(const clrt_model *m, const int32_t *tokens, int B, int Tn, const int32_t *pos0,
                        const int32_t *last, int cache_T) {
  for (int b = 0; b < B; b++) {
    if (pos0[b] < 0 || pos0[b] + Tn > cache_T) {
      clrt_set_error("forward_cached: row %d writes positions [%d, %d) outside the cache's %d",
                     b + 1, pos0[b], pos0[b] + Tn, cache_T);
      return -1;
    }
    if (last && (last[b] < 0 || last[b] >= Tn)) {
      clrt_set_error("forward_cached: last position %d of row %d is outside [0, %d)", last[b], b + 1, Tn);
      return -1;
    }
    if (check_tokens(m, "forward_cached", tokens, b, Tn, Tn) != 0) return -1;
  }
  return 0;
}

int clrt_model_forward_cached(clrt_model *m, const int32_t *tokens, int B, int Tn,
                              const int32_t *pos0, const int32_t *slot, const int32_t *last,
                              float *const *kcache, float *const *vcache, int cache_T,
                              float *logits) {
  return clrt_context_forward_cached(m->ctx, tokens, B, Tn, pos0, slot, last, kcache, vcache, cache_T, logits);
}

/* quant=int8: the generation's products read the int8 copies (the policy's format for a
   decode step); logprobs and backward stay f32. */
int clrt_context_forward_cached(clrt_context *x, const int32_t *tokens, int B, int Tn,
                                const int32_t *pos0, const int32_t *slot, const int32_t *last,
                                float *const *kcache, float *const *vcache, int cache_T,
                                float *logits) {
  clrt_model *m = x->m;
  const clrt_model_config *c = &m->cfg;
  int L = c->num_hidden_layers, C = c->hidden_size;
  if (B <= 0 || Tn <= 0 || !pos0 || !kcache || !vcache) {
    clrt_set_error("forward_cached: need B, Tn > 0 [%d, %d], positions and caches", B, Tn);
    return -1;
  }
  if (check_cached(m, tokens, B, Tn, pos0, last, cache_T)) return -1;
  int Tk = 0;
  for (int b = 0; b < B; b++) Tk = pos0[b] + Tn > Tk ? pos0[b] + Tn : Tk;
  uint64_t version;
  model_context_begin(x);
  if (prepare(x, Tk, 1, &version)) return -1;
  x->threads = omp_get_max_threads();
  float *res[L + 1];
  layer_acts la[L];
  acts a = {.cx = x, .res = res, .la = la};
  if (model_bind_acts(x, &a, B, Tn, Tk, 0) ||
      model_reserve_workspace(x, model_workspace_bytes(m, (int64_t)B * Tn), "forward_cached"))
    return -1;
  x->saved = 0;
  const model_ops *op = m->ops;
  /* The kernels read tokens, positions and slots from the model's memory. */
  if (op->upload(a.tok, tokens, sizeof(int32_t) * (size_t)B * Tn) ||
      op->upload(a.pos0, pos0, sizeof(int32_t) * (size_t)B) ||
      (slot && op->upload(a.slot, slot, sizeof(int32_t) * (size_t)B)))
    return -1;
  model_lora_begin(x, 0);
  fwd_step s = {.B = B, .T = Tn, .pos0 = a.pos0, .slot = slot ? a.slot : NULL,
                .kcache = kcache, .vcache = vcache, .cache_T = cache_T};
  const float *xl = run_layers(m, &a, &s, "forward_cached");
  if (!xl) return -1;
  int32_t *rowidx = model_host_ints(x, (size_t)B);
  if (!rowidx) return -1;
  for (int b = 0; b < B; b++) rowidx[b] = b * Tn + (last ? last[b] : Tn - 1);
  if (op->upload(a.rowidx, rowidx, sizeof(int32_t) * (size_t)B)) return -1;
  PROF(CLRT_K_OTHER, op->gather_rows(a.tmp, xl, a.rowidx, B, C));
  PROF(CLRT_K_RMSNORM, model_final_norm(m, a.xn, a.rstdf, a.tmp, B));
  int rc;
  PROF(CLRT_K_OUT_F, rc = op->decode_logits(m, &a, logits, a.xn, B));
  if (x->step_failed || model_context_check_version(x, version, "forward_cached")) return -1;
  if (rc == 0) model_softcap_logits(m, logits, B);
  return rc;
}
