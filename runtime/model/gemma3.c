/* gemma3.c — Gemma 3's decoder layer (Gemma3ForCausalLM text models) over the ops table, beside
   the Llama-family one in forward.c / backward.c, which hand a Gemma 3 model's layers here.

   One layer (N = B*T rows; every norm is RMSNorm scaled by (1 + w)):
     xn = norm1(x) ; q,k,v = xn W^T ; q,k = qk-norm per head ; rope(q, k) with the layer's base
     att = causal_gqa(q, k, v), scores times query_pre_attn_scalar^-1/2, a local layer seeing
           only the last sliding_window positions
     ao = att Wo^T ; xmid = x + norm_pa(ao)
     xn = norm2(xmid) ; h = gelu_tanh(xn Wg^T) * (xn Wu^T) ; mo = h Wd^T ; x' = xmid + norm_pf(mo)
   Kept for backward beyond the Llama layer's: ao and mo with their norms' rstd. Embeddings are
   scaled by sqrt(hidden_size) (model_embed_scale), the final norm is a (1 + w) one too, and
   final_logit_softcapping, when set, caps the logits (the output op's softcap variant);
   attn_logit_softcapping the attention scores (after their scale, before the mask). */
#include "model_internal.h"

#include <math.h>
#include <stdlib.h>

static float score_scale(const clrt_model_config *c) { return (float)pow(c->query_pre_attn_scalar, -0.5); }

void gemma3_layer_forward(clrt_model *m, acts *a, const fwd_step *s, int l, const float *x, float *out) {
  const model_ops *op = m->ops;
  const clrt_model_config *c = &m->cfg;
  const clrt_layer_offsets *o = &m->layer[l];
  layer_acts *A = s->keep ? &a->la[l] : &a->la[0];
  int C = c->hidden_size, I = c->intermediate_size, H = c->num_attention_heads,
      KV = c->num_key_value_heads, D = c->head_dim, B = s->B, T = s->T, window = model_layer_window(m, l), local = window > 0;
  int64_t N = (int64_t)B * T;
  float eps = c->rms_norm_eps;
  const float *rc = local ? m->rope_cos_local : a->cx->rope_c, *rs = local ? m->rope_sin_local : a->cx->rope_s;
  PROF(CLRT_K_RMSNORM, op->rmsnorm_unit(a->xn, A->rstd1, x, PW(m, o->ln1), N, C, eps));
  lin_part qkv[3] = {{A->qpre, o->wq, PW(m, o->bq), H * D, LORA_Q},
                     {A->kpre, o->wk, PW(m, o->bk), KV * D, LORA_K},
                     {A->v, o->wv, PW(m, o->bv), KV * D, LORA_V}};
  model_linear(m, a, A, l, s->keep, a->xn, N, C, qkv, 3);
  PROF(CLRT_K_RMSNORM, {
    op->rmsnorm_unit(A->q, A->qrstd, A->qpre, PW(m, o->qn), N * H, D, eps);
    op->rmsnorm_unit(A->k, A->krstd, A->kpre, PW(m, o->kn), N * KV, D, eps);
  });
  PROF(CLRT_K_ROPE, {
    op->rope(A->q, rc, rs, s->pos0, B, T, H, D, m->cfg.rope_dim);
    op->rope(A->k, rc, rs, s->pos0, B, T, KV, D, m->cfg.rope_dim);
  });
  attn_args at = {B, T, H, KV, D, window, s->pos0, NULL, (int64_t)T * KV * D};
  const float *keys = A->k, *vals = A->v;
  if (s->kcache) {   /* decode: every layer caches all positions; the window is a mask */
    float *kc = s->kcache[l], *vc = s->vcache[l];
    at.kv_bstride = (int64_t)s->cache_T * KV * D;
    at.slot = s->slot;
    op->kv_write(kc, vc, A->k, A->v, s->pos0, s->slot, B, T, KV * D, at.kv_bstride);
    keys = kc;
    vals = vc;
  }
  /* per query, as a decode step runs it, on a batch-invariant model and over the KV cache (ops_cpu.c) */
  PROF(CLRT_K_ATTN_F, op->attention_scaled(m, a, A->att, s->keep ? A->lse : NULL, A->q, keys, vals, &at,
                                           score_scale(c), (float)c->attn_logit_softcapping));
  lin_part proj = {A->ao, o->wo, PW(m, o->bo), C, LORA_O};
  model_linear(m, a, A, l, s->keep, A->att, N, H * D, &proj, 1);
  PROF(CLRT_K_RMSNORM, op->rmsnorm_unit(a->tmp, A->aorstd, A->ao, PW(m, o->lpa), N, C, eps));
  PROF(CLRT_K_RESIDUAL, op->add(A->xmid, x, a->tmp, N * C));
  PROF(CLRT_K_RMSNORM, op->rmsnorm_unit(a->xn, A->rstd2, A->xmid, PW(m, o->ln2), N, C, eps));
  lin_part gate_up[2] = {{A->g, o->wg, NULL, I, LORA_GATE}, {A->u, o->wu, NULL, I, LORA_UP}};
  model_linear(m, a, A, l, s->keep, a->xn, N, C, gate_up, 2);
  PROF(CLRT_K_SWIGLU, op->geglu(a->h, A->g, A->u, N * I));
  lin_part down = {A->mo, o->wd, NULL, C, LORA_DOWN};
  model_linear(m, a, A, l, s->keep, a->h, N, I, &down, 1);
  PROF(CLRT_K_RMSNORM, op->rmsnorm_unit(a->tmp, A->morstd, A->mo, PW(m, o->lpf), N, C, eps));
  PROF(CLRT_K_RESIDUAL, op->add(out, A->xmid, a->tmp, N * C));
}

/* a->dres holds dL/d(layer output) and leaves as dL/dx; dxc is scratch for the output norms. */
void gemma3_layer_backward(clrt_model *m, acts *a, int l, const float *x, int B, int T) {
  const model_ops *op = m->ops;
  const clrt_model_config *c = &m->cfg;
  const clrt_layer_offsets *o = &m->layer[l];
  const layer_acts *A = &a->la[l];
  int C = c->hidden_size, I = c->intermediate_size, H = c->num_attention_heads,
      KV = c->num_key_value_heads, D = c->head_dim, window = model_layer_window(m, l), local = window > 0;
  int64_t N = (int64_t)B * T;
  float eps = c->rms_norm_eps;
  const float *rc = local ? m->rope_cos_local : a->cx->rope_c, *rs = local ? m->rope_sin_local : a->cx->rope_s;
  /* MLP: x' = xmid + norm_pf(mo); dxc = dL/dmo, then dres becomes dL/dxmid. */
  op->zero(a->dxc, (size_t)(N * C));
  PROF(CLRT_K_RMSNORM, op->rmsnorm_unit_backward(a->dxc, GW(m, o->lpf), a->dres, A->mo, PW(m, o->lpf), A->morstd, N, C));
  PROF(CLRT_K_RMSNORM, op->rmsnorm_unit(a->xn, A->rstd2, A->xmid, PW(m, o->ln2), N, C, eps));
  PROF(CLRT_K_SWIGLU, op->geglu(a->h, A->g, A->u, N * I));
  model_linear_backward(m, a, A, l, LORA_DOWN, a->dA, o->wd, NULL, a->dxc, a->h, N, I, C, 0);
  float *du = a->h;   /* h is spent: its buffer takes du */
  PROF(CLRT_K_SWIGLU, op->geglu_backward(a->dA, du, a->dA, A->g, A->u, N * I));
  model_linear_backward(m, a, A, l, LORA_GATE, a->dxn, o->wg, NULL, a->dA, a->xn, N, C, I, 0);
  model_linear_backward(m, a, A, l, LORA_UP, a->dxn, o->wu, NULL, du, a->xn, N, C, I, 1);
  PROF(CLRT_K_RMSNORM, op->rmsnorm_unit_backward(a->dres, GW(m, o->ln2), a->dxn, A->xmid, PW(m, o->ln2), A->rstd2, N, C));
  /* Attention: xmid = x + norm_pa(ao); dxc = dL/dao; the residual passes dres to x. */
  op->zero(a->dxc, (size_t)(N * C));
  PROF(CLRT_K_RMSNORM, op->rmsnorm_unit_backward(a->dxc, GW(m, o->lpa), a->dres, A->ao, PW(m, o->lpa), A->aorstd, N, C));
  model_linear_backward(m, a, A, l, LORA_O, a->datt, o->wo, GW(m, o->bo), a->dxc, A->att, N, H * D, C, 0);
  PROF(CLRT_K_ATTN_B, op->attention_scaled_backward(m, a, A, B, T, window, score_scale(c),
                                                    (float)c->attn_logit_softcapping));
  PROF(CLRT_K_ROPE, {
    op->rope_backward(a->dq, rc, rs, NULL, B, T, H, D, m->cfg.rope_dim);
    op->rope_backward(a->dk, rc, rs, NULL, B, T, KV, D, m->cfg.rope_dim);
  });
  /* datt is spent: it takes dL/dq before the q norm; dk2 takes dL/dk before the k norm. */
  op->zero(a->datt, (size_t)(N * H * D));
  op->zero(a->dk2, (size_t)(N * KV * D));
  PROF(CLRT_K_RMSNORM, {
    op->rmsnorm_unit_backward(a->datt, GW(m, o->qn), a->dq, A->qpre, PW(m, o->qn), A->qrstd, N * H, D);
    op->rmsnorm_unit_backward(a->dk2, GW(m, o->kn), a->dk, A->kpre, PW(m, o->kn), A->krstd, N * KV, D);
  });
  PROF(CLRT_K_RMSNORM, op->rmsnorm_unit(a->xn, A->rstd1, x, PW(m, o->ln1), N, C, eps));
  model_linear_backward(m, a, A, l, LORA_Q, a->dxn, o->wq, GW(m, o->bq), a->datt, a->xn, N, C, H * D, 0);
  model_linear_backward(m, a, A, l, LORA_K, a->dxn, o->wk, GW(m, o->bk), a->dk2, a->xn, N, C, KV * D, 1);
  model_linear_backward(m, a, A, l, LORA_V, a->dxn, o->wv, GW(m, o->bv), a->dv, a->xn, N, C, KV * D, 1);
  PROF(CLRT_K_RMSNORM, op->rmsnorm_unit_backward(a->dres, GW(m, o->ln1), a->dxn, x, PW(m, o->ln1), A->rstd1, N, C));
}

void model_final_norm(const clrt_model *m, float *out, float *rstd, const float *x, int64_t N) {
  const clrt_model_config *c = &m->cfg;
  if (c->gemma3) m->ops->rmsnorm_unit(out, rstd, x, PW(m, m->norm), N, c->hidden_size, c->rms_norm_eps);
  else m->ops->rmsnorm(out, rstd, x, PW(m, m->norm), N, c->hidden_size, c->rms_norm_eps);
}

void model_final_norm_backward(const clrt_model *m, float *dx, const float *dout, const float *x,
                               const float *rstd, int64_t N) {
  int C = m->cfg.hidden_size;
  if (m->cfg.gemma3) m->ops->rmsnorm_unit_backward(dx, GW(m, m->norm), dout, x, PW(m, m->norm), rstd, N, C);
  else m->ops->rmsnorm_backward(dx, GW(m, m->norm), dout, x, PW(m, m->norm), rstd, N, C);
}

void model_embed_scale(const clrt_model *m, float *x, int64_t N) {
  /* transformers: sqrt(hidden_size) rounded to the weights' dtype (f32 here) */
  if (m->cfg.gemma3) m->ops->scale(x, (float)sqrt((double)m->cfg.hidden_size), N * m->cfg.hidden_size);
}

void model_softcap_logits(const clrt_model *m, float *logits, int B) {
  float cap = (float)m->cfg.final_logit_softcapping;
  if (!(cap > 0)) return;
  int64_t n = (int64_t)B * m->cfg.vocab_size;
  for (int64_t i = 0; i < n; i++) logits[i] = cap * tanhf(logits[i] / cap);
}
