/* backward.c — the transformer's backward over the activations the last kept forward left
   (clrt_model_logprobs with keep): gradients += dL/dparams for dL/dlogp. Each layer recomputes
   its normalised inputs and h instead of reading them (see forward.c). */
#include "model_internal.h"
#include "lora_math.h"

#include <stdlib.h>
#include <string.h>

/* a->dres holds dL/d(layer output) and leaves as dL/dx. */
static void layer_backward(clrt_model *m, acts *a, int l, const float *x, int B, int T) {
  const model_ops *op = m->ops;
  const clrt_model_config *c = &m->cfg;
  const clrt_layer_offsets *o = &m->layer[l];
  if (c->gemma3) {
    gemma3_layer_backward(m, a, l, x, B, T);
    return;
  }
  const layer_acts *A = &a->la[l];
  int C = c->hidden_size, I = c->intermediate_size, H = c->num_attention_heads,
      KV = c->num_key_value_heads, D = c->head_dim;
  int64_t N = (int64_t)B * T;
  float eps = c->rms_norm_eps;
  /* MLP: x' = xmid + (silu(g) * u) Wd^T; dres becomes dL/dxmid. */
  PROF(CLRT_K_RMSNORM, op->rmsnorm(a->xn, A->rstd2, A->xmid, PW(m, o->ln2), N, C, eps));
  PROF(CLRT_K_SWIGLU, op->swiglu(a->h, A->g, A->u, N * I));
  model_linear_backward(m, a, A, l, LORA_DOWN, a->dA, o->wd, NULL, a->dres, a->h, N, I, C, 0);
  float *du = a->h;   /* h is spent: its buffer takes du */
  PROF(CLRT_K_SWIGLU, op->swiglu_backward(a->dA, du, a->dA, A->g, A->u, N * I));
  model_linear_backward(m, a, A, l, LORA_GATE, a->dxn, o->wg, NULL, a->dA, a->xn, N, C, I, 0);
  model_linear_backward(m, a, A, l, LORA_UP, a->dxn, o->wu, NULL, du, a->xn, N, C, I, 1);
  PROF(CLRT_K_RMSNORM, op->rmsnorm_backward(a->dres, GW(m, o->ln2), a->dxn, A->xmid, PW(m, o->ln2), A->rstd2, N, C));
  /* Attention: xmid = x + att Wo^T; the residual passes dres to x unchanged. */
  model_linear_backward(m, a, A, l, LORA_O, a->datt, o->wo, GW(m, o->bo), a->dres, A->att, N, H * D, C, 0);
  if (a->cx->packed) {
    PROF(CLRT_K_ATTN_B, model_pack_attention_backward(m, a, &a->cx->pack, A, model_layer_window(m, l)));
    PROF(CLRT_K_ROPE, model_pack_rope(a->cx, &a->cx->pack, a->dq, a->dk, 1));
  } else {
    PROF(CLRT_K_ATTN_B, op->attention_backward(m, a, A, B, T, model_layer_window(m, l)));
    PROF(CLRT_K_ROPE, {
      op->rope_backward(a->dq, a->cx->rope_c, a->cx->rope_s, NULL, B, T, H, D, m->cfg.rope_dim);
      op->rope_backward(a->dk, a->cx->rope_c, a->cx->rope_s, NULL, B, T, KV, D, m->cfg.rope_dim);
    });
  }
  float *dq = a->dq, *dk = a->dk;
  if (c->qk_norm) {
    /* datt is spent: it takes dL/dq before the norm; dk2 takes dL/dk before it. */
    op->zero(a->datt, (size_t)(N * H * D));
    op->zero(a->dk2, (size_t)(N * KV * D));
    PROF(CLRT_K_RMSNORM, {
      op->rmsnorm_backward(a->datt, GW(m, o->qn), a->dq, A->qpre, PW(m, o->qn), A->qrstd, N * H, D);
      op->rmsnorm_backward(a->dk2, GW(m, o->kn), a->dk, A->kpre, PW(m, o->kn), A->krstd, N * KV, D);
    });
    dq = a->datt;
    dk = a->dk2;
  }
  PROF(CLRT_K_RMSNORM, op->rmsnorm(a->xn, A->rstd1, x, PW(m, o->ln1), N, C, eps));
  model_linear_backward(m, a, A, l, LORA_Q, a->dxn, o->wq, GW(m, o->bq), dq, a->xn, N, C, H * D, 0);
  model_linear_backward(m, a, A, l, LORA_K, a->dxn, o->wk, GW(m, o->bk), dk, a->xn, N, C, KV * D, 1);
  model_linear_backward(m, a, A, l, LORA_V, a->dxn, o->wv, GW(m, o->bv), a->dv, a->xn, N, C, KV * D, 1);
  PROF(CLRT_K_RMSNORM, op->rmsnorm_backward(a->dres, GW(m, o->ln1), a->dxn, x, PW(m, o->ln1), A->rstd1, N, C));
}

/* dL/dlogp [B, T-1] gathered to the forward's rows with a target (the context's hidx) and
   copied into the arena. */
static int stage_dlogp(clrt_model *m, acts *a, const float *dlogp) {
  const clrt_context *x = a->cx;
  int64_t nv = x->nv, T = x->T;
  float *dlpv = malloc(sizeof(float) * (size_t)(nv ? nv : 1));
  if (!dlpv) {
    clrt_set_error("backward: out of host memory");
    return -1;
  }
  for (int64_t i = 0; i < nv; i++) {
    int64_t r = x->hidx[i], b = r / T, t = r % T;
    dlpv[i] = dlogp[b * (T - 1) + t];
  }
  int rc = m->ops->upload(a->dlpv, dlpv, sizeof(float) * (size_t)nv);
  free(dlpv);
  return rc;
}

/* dL/dhidden [B, T-1, C] gathered to the forward's rows with a target, added into dxn (dL/d the
   final norm's output); dxc, not yet in use, carries it to the device. */
static int add_dhidden(clrt_model *m, acts *a, const float *dhidden) {
  const clrt_context *x = a->cx;
  int64_t nv = x->nv, T = x->T;
  int C = m->cfg.hidden_size;
  float *dhv = malloc(sizeof(float) * (size_t)(nv ? nv * C : 1));
  if (!dhv) {
    clrt_set_error("backward: out of host memory for the hidden states' gradient");
    return -1;
  }
  for (int64_t i = 0; i < nv; i++) {
    int64_t r = x->hidx[i], b = r / T, t = r % T;
    memcpy(dhv + i * C, dhidden + (b * (T - 1) + t) * C, sizeof(float) * (size_t)C);
  }
  int rc = m->ops->upload(a->dxc, dhv, sizeof(float) * (size_t)(nv * C));
  free(dhv);
  if (rc) return rc;
  m->ops->add(a->dxn, a->dxn, a->dxc, nv * C);
  return 0;
}

int clrt_model_backward(clrt_model *m, const float *dlogp) {
  return clrt_context_backward(m->ctx, dlogp, NULL);
}

int clrt_model_backward_hidden(clrt_model *m, const float *dlogp, const float *dhidden) {
  return clrt_context_backward(m->ctx, dlogp, dhidden);
}

int clrt_context_backward(clrt_context *x, const float *dlogp, const float *dhidden) {
  clrt_model *m = x->m;
  model_context_begin(x);
  if (!x->saved) {
    clrt_set_error("backward: no forward pass was kept for it (call logprobs with grad = true first)");
    return -1;
  }
  /* The forward's activations are of the weights it read: a gradient at other weights
     would be neither's. */
  if (model_context_check_version(x, x->version, "backward") || model_ensure_grads(m)) return -1;
  const model_ops *op = m->ops;
  const clrt_model_config *c = &m->cfg;
  /* the activations' layout (packed: one row of segments), not the caller's rows */
  int L = c->num_hidden_layers, C = c->hidden_size, V = c->vocab_size, B, T;
  model_kept_layout(x, &B, &T);
  int64_t N = (int64_t)B * T, nv = x->nv;
  float *res[L + 1];
  layer_acts la[L];
  acts a = {.cx = x, .res = res, .la = la};
  model_layout(m, &a, x->acts->data, B, T, T, 1);
  if (model_reserve_workspace(x, model_step_workspace_bytes(m, N, x->packed ? &x->pack : NULL), "backward") ||
      stage_dlogp(m, &a, dlogp))
    return -1;
  /* Output layer and final norm over the rows with a target (compacted, as in forward). */
  PROF(CLRT_K_OTHER, op->gather_rows(a.tmp, a.res[L], a.rowidx, nv, C));
  PROF(CLRT_K_RMSNORM, model_final_norm(m, a.xn, a.rstdf, a.tmp, nv));
  clrt_head_lora hl;
  const clrt_head_lora *hla = model_lora_head_backward(m, &a, &hl);
  if (c->final_logit_softcapping > 0)   /* Gemma 3 */
    PROF(CLRT_K_OUT_B, op->output_softcap_backward(a.dxn, GW(m, m->head), a.dlpv, a.xn, PW(m, m->head),
                                                   model_packed_weight(m, m->head), model_output_kernels(m), a.target,
                                                   a.lsef, nv, C, V, a.logits, a.chunk, a.logits_kept, hla,
                                                   (float)c->final_logit_softcapping));
  else
    PROF(CLRT_K_OUT_B, op->output_backward(a.dxn, GW(m, m->head), a.dlpv, a.xn, PW(m, m->head),
                                           model_packed_weight(m, m->head), model_output_kernels(m), a.target,
                                           a.lsef, nv, C, V,
                                           a.logits, a.chunk, a.logits_kept, hla));
  PROF(CLRT_K_LORA, model_lora_head_backward_end(m, &a, a.dxn, a.xn, nv));
  if (dhidden && add_dhidden(m, &a, dhidden)) return -1;
  op->zero(a.dxc, (size_t)(nv * C));
  PROF(CLRT_K_RMSNORM, model_final_norm_backward(m, a.dxc, a.dxn, a.tmp, a.rstdf, nv));
  op->zero(a.dres, (size_t)(N * C));
  op->scatter_rows(a.dres, a.dxc, a.rowidx, nv, C);
  for (int l = L - 1; l >= 0; l--) {
    if (clrt_interrupted()) {
      clrt_set_error("backward: interrupted");
      return -1;
    }
    layer_backward(m, &a, l, a.res[l], B, T);
  }
  PROF(CLRT_K_EMBED, model_embed_scale(m, a.dres, N));   /* the scale covers the embedding's adapter too */
  if (!m->lora) {
    /* padding_idx: the lookup leaves the pad row's gradient as it was (a tied head's share
       is already in it), held in the spent dxc [nv, C] meanwhile. */
    float *pad_row = c->has_padding_idx && nv > 0 ? GW(m, m->wte) + (int64_t)c->padding_idx * C : NULL;
    if (pad_row && op->copy(a.dxc, pad_row, sizeof(float) * (size_t)C)) return -1;
    PROF(CLRT_K_EMBED, op->embedding_backward(GW(m, m->wte), a.dres, a.tok, N, C));
    if (pad_row && op->copy(pad_row, a.dxc, sizeof(float) * (size_t)C)) return -1;
  }
  else PROF(CLRT_K_LORA, model_lora_embed_backward(m, &a, a.dres, N));
  if (x->step_failed) return -1;
  return op->sync();   /* the end of the step: report any kernel failure */
}
