/* lora.c — LoRA adapters beside the linear layers: their own arena (params + grads, PEFT's
   tensor names, so the optimizer and the adapter file see only them), PEFT's initialisation
   (A uniform in +-1/sqrt(in), B zero; the embedding's the other way round: A zero, B normal),
   the layer hooks forward.c and backward.c call next to each target linear (and beside the
   embedding and the fused output layer), the switch that runs the bare base (the RL
   reference) and the merge into the base weights (untying a tied head when the output or
   the embedding has an adapter). With adapters the base is frozen: no base gradient arena. */
#include "model_internal.h"
#include "lora_math.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const target_name[LORA_NT] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};

/* in and out features of target t's linear, and its weight's offset in layer l. */
static void target_dims(const clrt_model *m, int t, int *in, int *out) {
  const clrt_model_config *c = &m->cfg;
  int C = c->hidden_size, I = c->intermediate_size, HD = c->num_attention_heads * c->head_dim,
      KVD = c->num_key_value_heads * c->head_dim;
  static const int io[LORA_NT][2] = {{0, 1}, {0, 2}, {0, 2}, {1, 0}, {0, 3}, {0, 3}, {3, 0}};
  int dims[4] = {C, HD, KVD, I};
  *in = dims[io[t][0]];
  *out = dims[io[t][1]];
}

static int64_t target_weight(const clrt_model *m, int l, int t) {
  const clrt_layer_offsets *o = &m->layer[l];
  int64_t w[LORA_NT] = {o->wq, o->wk, o->wv, o->wo, o->wg, o->wu, o->wd};
  return w[t];
}

/* The next adapter tensor, [rows, cols], at the end of the arena (16-float aligned). */
static clrt_param_info *next_param(model_lora *lo, int64_t rows, int64_t cols) {
  clrt_param_info *p = &lo->p[lo->np++];
  p->ndim = 2;
  p->shape[0] = rows;
  p->shape[1] = cols;
  p->numel = rows * cols;
  p->offset = lo->total;
  p->loaded = 1;
  lo->total += (p->numel + 15) & ~(int64_t)15;
  return p;
}

/* Phi-3's fused qkv_proj and gate_up_proj: one adapter beside each fused linear, as PEFT puts
   it (A [r, in] shared by the row blocks, B [q+k+v or gate+up rows, r]). It runs as the
   blocks' adapters with the same A, B's row blocks and one dropout mask: the blocks' dA sum
   into the shared A. fused_lead(t): the target whose adapter and mask target t shares. */
static int fused_lead(const clrt_model *m, int t) {
  if (!m->cfg.fused_qkv_gate_up) return t;
  if (t == LORA_K || t == LORA_V) return LORA_Q;
  if (t == LORA_UP) return LORA_GATE;
  return t;
}

/* Fused: adds both A and B of the fused adapter of layer l led by target t (LORA_Q or
   LORA_GATE) and points its blocks at them. */
static void add_fused_adapter(clrt_model *m, model_lora *lo, int l, int t, int r);

int clrt_model_lora_add(clrt_model *m, int r, float alpha, float dropout, unsigned targets, uint64_t seed) {
  if (m->lora) {
    clrt_set_error("lora: the model already has adapters");
    return -1;
  }
  if (r <= 0 || !(alpha > 0) || !(dropout >= 0 && dropout < 1) || !targets || targets >= (1u << LORA_NALL)) {
    clrt_set_error("lora: need r > 0 (got %d), alpha > 0 (got %g), 0 <= dropout < 1 (got %g) and "
                   "at least one target", r, alpha, dropout);
    return -1;
  }
  if (m->cfg.fused_qkv_gate_up) {
    unsigned qkv = (1u << LORA_Q) | (1u << LORA_K) | (1u << LORA_V), gu = (1u << LORA_GATE) | (1u << LORA_UP);
    if (((targets & qkv) && (targets & qkv) != qkv) || ((targets & gu) && (targets & gu) != gu)) {
      clrt_set_error("lora: this model (Phi-3) fuses q, k, v into qkv_proj and gate, up into gate_up_proj; "
                     "target qkv_proj and gate_up_proj rather than their parts");
      return -1;
    }
  }
  int L = m->cfg.num_hidden_layers, nt = 0;
  for (int t = 0; t < LORA_NT; t++) nt += (targets >> t) & 1;
  model_lora *lo = calloc(1, sizeof *lo);
  if (!lo || !(lo->p = calloc((size_t)(2 * nt * L + 4), sizeof *lo->p)) ||
      !(lo->ab = calloc((size_t)L, sizeof *lo->ab))) {
    model_lora_free(lo);
    clrt_set_error("lora: out of memory");
    return -1;
  }
  lo->r = r;
  lo->alpha = alpha;
  lo->scale = alpha / (float)r;
  lo->dropout = dropout;
  lo->targets = targets;
  lo->enabled = 1;
  lo->seed = seed;
  for (int l = 0; l < L; l++)   /* first: a fused adapter sets its later blocks' entries */
    for (int t = 0; t < LORA_NT; t++) lo->ab[l][t][0] = lo->ab[l][t][1] = -1;
  for (int l = 0; l < L; l++)
    for (int t = 0; t < LORA_NT; t++) {
      if (!((targets >> t) & 1) || fused_lead(m, t) != t) continue;
      if (m->cfg.fused_qkv_gate_up && (t == LORA_Q || t == LORA_GATE)) {
        add_fused_adapter(m, lo, l, t, r);
        continue;
      }
      int in, out;
      target_dims(m, t, &in, &out);
      for (int k = 0; k < 2; k++) {
        clrt_param_info *p = next_param(lo, k ? out : r, k ? r : in);
        snprintf(p->name, sizeof p->name, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", l,
                 t < LORA_GATE ? "self_attn" : "mlp", target_name[t], k ? 'B' : 'A');
        lo->ab[l][t][k] = p->offset;
      }
    }
  /* The output layer and the embedding, after the blocks' (so that the blocks' adapters draw
     the same initial values with or without them). */
  int C = m->cfg.hidden_size, V = m->cfg.vocab_size;
  lo->head[0] = lo->head[1] = lo->emb[0] = lo->emb[1] = -1;
  for (int t = LORA_HEAD; t < LORA_NALL; t++) {
    if (!((targets >> t) & 1)) continue;
    for (int k = 0; k < 2; k++) {
      int64_t in = t == LORA_HEAD ? C : V, out = t == LORA_HEAD ? V : C;
      clrt_param_info *p = next_param(lo, k ? out : r, k ? r : in);
      if (t == LORA_HEAD) snprintf(p->name, sizeof p->name, "base_model.model.lm_head.lora_%c.weight", k ? 'B' : 'A');
      else snprintf(p->name, sizeof p->name, "base_model.model.model.embed_tokens.lora_embedding_%c", k ? 'B' : 'A');
      (t == LORA_HEAD ? lo->head : lo->emb)[k] = p->offset;
    }
  }
  size_t bytes = sizeof(float) * (size_t)lo->total;
  float *host = calloc((size_t)lo->total, sizeof(float));
  if (!host || !(lo->params = clrt_storage_new(bytes, m->device)) || !(lo->grads = clrt_storage_new(bytes, m->device))) {
    free(host);
    model_lora_free(lo);
    if (!host) clrt_set_error("lora: out of memory");
    return -1;
  }
  /* PEFT: A kaiming-uniform with a = sqrt(5), i.e. uniform in +-1/sqrt(in); B zero, so the
     adapted model starts equal to its base. */
  clrt_rng g;
  clrt_rng_seed(&g, seed);
  for (int i = 0; i < lo->np; i += 2) {
    const clrt_param_info *A = &lo->p[i];
    if (A->offset == lo->emb[0]) {   /* PEFT's Embedding: A zero, B standard normal */
      const clrt_param_info *B = &lo->p[i + 1];
      for (int64_t k = 0; k < B->numel; k++) host[B->offset + k] = (float)clrt_rng_normal(&g);
      continue;
    }
    double bound = 1.0 / sqrt((double)A->shape[1]);
    for (int64_t k = 0; k < A->numel; k++) host[A->offset + k] = (float)((2 * clrt_rng_uniform(&g) - 1) * bound);
  }
  int rc = m->ops->upload(lo->params->data, host, bytes);
  free(host);
  if (rc) {
    model_lora_free(lo);
    return -1;
  }
  m->ops->zero(lo->grads->data, (size_t)lo->total);
  /* The base is frozen from now on: its gradients go. */
  clrt_storage_release(m->grads);
  m->grads = NULL;
  model_forget_contexts(m, 0);
  m->lora = lo;
  return 0;
}

static void add_fused_adapter(clrt_model *m, model_lora *lo, int l, int t, int r) {
  int in, out, rows = 0, last = t == LORA_Q ? LORA_V : LORA_UP;
  for (int u = t; u <= last; u++) {
    target_dims(m, u, &in, &out);
    rows += out;
  }
  clrt_param_info *A = next_param(lo, r, in), *B = next_param(lo, rows, r);
  const char *name = t == LORA_Q ? "self_attn.qkv_proj" : "mlp.gate_up_proj";
  snprintf(A->name, sizeof A->name, "base_model.model.model.layers.%d.%s.lora_A.weight", l, name);
  snprintf(B->name, sizeof B->name, "base_model.model.model.layers.%d.%s.lora_B.weight", l, name);
  int64_t below = 0;   /* rows of the blocks before u */
  for (int u = t; u <= last; u++) {
    lo->ab[l][u][0] = A->offset;
    lo->ab[l][u][1] = B->offset + below * r;
    target_dims(m, u, &in, &out);
    below += out;
  }
}

static model_lora *need_lora(const clrt_model *m, const char *who) {
  if (!m->lora) clrt_set_error("%s: the model has no LoRA adapters (add_lora first)", who);
  return m->lora;
}

int clrt_model_lora_enable(clrt_model *m, int on) {
  if (!need_lora(m, "lora enable")) return -1;
  m->lora->enabled = on != 0;
  return 0;
}

int clrt_model_lora_enabled(const clrt_model *m) { return m->lora && m->lora->enabled; }
int clrt_model_lora_num_tensors(const clrt_model *m) { return m->lora ? m->lora->np : 0; }

const char *clrt_model_lora_tensor_name(const clrt_model *m, int i) {
  if (!need_lora(m, "lora")) return NULL;
  if (i < 0 || i >= m->lora->np) {
    clrt_set_error("lora: tensor index %d out of range (%d tensors)", i, m->lora->np);
    return NULL;
  }
  return m->lora->p[i].name;
}

clrt_tensor *clrt_model_lora_param(clrt_model *m, int i) {
  if (!clrt_model_lora_tensor_name(m, i)) return NULL;
  return model_param_view(m->lora->params, &m->lora->p[i]);
}

clrt_tensor *clrt_model_lora_grad(clrt_model *m, int i) {
  if (!clrt_model_lora_tensor_name(m, i)) return NULL;
  return model_param_view(m->lora->grads, &m->lora->p[i]);
}

uint64_t clrt_model_lora_dropout_state(const clrt_model *m, int which) {
  return !m->lora ? 0 : which ? m->lora->step : m->lora->seed;
}

int clrt_model_lora_set_dropout_state(clrt_model *m, uint64_t seed, uint64_t step) {
  if (!need_lora(m, "lora dropout state")) return -1;
  m->lora->seed = seed;
  m->lora->step = step;
  return 0;
}

/* The head becomes a parameter of its own, lm_head.weight (a copy of the embedding, at the end
   of a larger params arena), and the config says untied: what a merge of an adapter on the
   output layer or the embedding of a tied model writes. On the cpu, f32 base. */
static int untie_head(clrt_model *m) {
  int V = m->cfg.vocab_size, C = m->cfg.hidden_size;
  int64_t numel = (int64_t)V * C, off = m->total, total = m->total + ((numel + 15) & ~(int64_t)15);
  clrt_storage *np = clrt_storage_new(sizeof(float) * (size_t)total, CLRT_CPU);
  clrt_param_info *p = realloc(m->p, sizeof *m->p * (size_t)(m->np + 1));
  if (p) m->p = p;
  if (!np || !p) {
    clrt_storage_release(np);
    if (np || !p) clrt_set_error("lora merge: out of memory untying the output layer");
    return -1;
  }
  memcpy(np->data, m->params->data, sizeof(float) * (size_t)m->total);
  memcpy((float *)np->data + off, PW(m, m->wte), sizeof(float) * (size_t)numel);
  p = &m->p[m->np++];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "lm_head.weight");
  p->ndim = 2;
  p->shape[0] = V;
  p->shape[1] = C;
  p->numel = numel;
  p->offset = off;
  p->loaded = 1;
  clrt_storage_release(m->params);
  m->params = np;
  m->total = total;
  m->head = off;
  m->cfg.tie_word_embeddings = 0;
  /* the copies made from the old arena have its size and offsets */
  model_copy_drop(&m->wpk);
  model_copy_drop(&m->wbf);
  return 0;
}

int clrt_model_lora_merge(clrt_model *m) {
  model_lora *lo = need_lora(m, "lora merge");
  if (!lo || model_mode_allows(m, MODE_F32_WEIGHTS, "lora merge")) return -1;
  if (m->device != CLRT_CPU) {
    clrt_set_error("lora merge: move the model to the cpu first");
    return -1;
  }
  /* A tied head shares the embedding: an adapter on either side changes one side only. */
  if ((lo->head[0] >= 0 || lo->emb[0] >= 0) && m->head == m->wte && untie_head(m)) return -1;
  const float *P = lo->params->data;
  for (int l = 0; l < m->cfg.num_hidden_layers; l++)
    for (int t = 0; t < LORA_NT; t++) {
      if (lo->ab[l][t][0] < 0) continue;
      int in, out;
      target_dims(m, t, &in, &out);
      clrt_lora_merge(PW(m, target_weight(m, l, t)), P + lo->ab[l][t][0], P + lo->ab[l][t][1], in,
                      out, lo->r, lo->scale);
    }
  int C = m->cfg.hidden_size, V = m->cfg.vocab_size;
  if (lo->head[0] >= 0)
    clrt_lora_merge(PW(m, m->head), P + lo->head[0], P + lo->head[1], C, V, lo->r, lo->scale);
  if (lo->emb[0] >= 0) clrt_lora_merge_embed(PW(m, m->wte), P + lo->emb[0], P + lo->emb[1], V, C, lo->r, lo->scale);
  model_lora_free(lo);
  m->lora = NULL;
  model_forget_contexts(m, 0);
  clrt_model_params_changed(m);
  return 0;
}

param_set model_param_set(clrt_model *m, int lora) {
  if (lora && m->lora)
    return (param_set){m->lora->params, m->lora->grads, m->lora->np, m->lora->p, m->lora->total};
  return (param_set){m->params, m->grads, m->np, m->p, m->total};
}

/* ---- the layer hooks ------------------------------------------------------------------------- */

void model_lora_begin(clrt_context *x, int keep) {
  model_lora *lo = x->m->lora;
  if (!lo) return;
  x->lora_enabled = lo->enabled;
  x->lora_dropout = keep && lo->dropout > 0;
  /* atomic: kept forwards of two contexts each take their own step */
  if (keep) x->lora_step = __atomic_fetch_add(&lo->step, 1, __ATOMIC_RELAXED);
}

void model_lora_forward(clrt_model *m, acts *a, layer_acts *A, int l, int t, float *y, const float *x,
                        int64_t N, int K, int O, int keep) {
  model_lora *lo = m->lora;
  if (!lo || !lo->enabled || lo->ab[l][t][0] < 0) return;
  const float *P = lo->params->data, *xd = x;
  if (keep && lo->dropout > 0) {
    m->ops->lora_dropout(a->lxd, x, N * K, clrt_lora_key(lo->seed, a->cx->lora_step, l, fused_lead(m, t)),
                         lo->dropout);
    xd = a->lxd;
  }
  m->ops->lora_forward(m, a, y, A->lxa[t], xd, P + lo->ab[l][t][0], P + lo->ab[l][t][1], N, K, O, lo->r, lo->scale);
}

void model_lora_backward(clrt_model *m, acts *a, const layer_acts *A, int l, int t, float *dx,
                         const float *dy, const float *x, int64_t N, int K, int O) {
  model_lora *lo = m->lora;
  if (!lo || !a->cx->lora_enabled || lo->ab[l][t][0] < 0) return;
  const float *P = lo->params->data;
  float *G = lo->grads->data, *xd = (float *)x;
  float p = a->cx->lora_dropout ? lo->dropout : 0.0f;
  uint64_t key = clrt_lora_key(lo->seed, a->cx->lora_step, l, fused_lead(m, t));
  if (p > 0) {   /* the forward's mask again, from its key */
    m->ops->lora_dropout(a->lxd, x, N * K, key, p);
    xd = a->lxd;
  }
  int64_t oa = lo->ab[l][t][0], ob = lo->ab[l][t][1];
  m->ops->lora_backward(m, a, dx, G + oa, G + ob, a->ldxa, xd, dy, A->lxa[t], P + oa, P + ob, N, K, O,
                        lo->r, lo->scale, key, p);
}

/* ---- the embedding's and the output layer's adapters ------------------------------------------ */

void model_lora_embed_forward(clrt_model *m, acts *a, float *y, int64_t N) {
  model_lora *lo = m->lora;
  if (!lo || !lo->enabled || lo->emb[0] < 0) return;
  const float *P = lo->params->data;
  m->ops->lora_embed_forward(y, a->lexa, a->tok, P + lo->emb[0], P + lo->emb[1], N, m->cfg.vocab_size,
                             m->cfg.hidden_size, lo->r, lo->scale);
}

void model_lora_embed_backward(clrt_model *m, acts *a, const float *dy, int64_t N) {
  model_lora *lo = m->lora;
  if (!lo || !a->cx->lora_enabled || lo->emb[0] < 0) return;
  const float *P = lo->params->data;
  float *G = lo->grads->data;
  /* PEFT looks A up with the base's padding_idx: the pad column of dA [r, V] keeps its value */
  int64_t V = m->cfg.vocab_size, pad = m->cfg.has_padding_idx ? m->cfg.padding_idx : -1;
  float *held = pad >= 0 ? malloc(sizeof(float) * (size_t)lo->r) : NULL;
  if (pad >= 0 && !held) {
    clrt_set_error("lora: out of memory holding the pad column of the embedding adapter");
    a->cx->step_failed = 1;
    return;
  }
  for (int i = 0; held && i < lo->r; i++) m->ops->download(&held[i], G + lo->emb[0] + i * V + pad, sizeof(float));
  m->ops->lora_embed_backward(G + lo->emb[0], G + lo->emb[1], a->ldxa, dy, a->lexa, a->tok, P + lo->emb[1], N,
                              m->cfg.vocab_size, m->cfg.hidden_size, lo->r, lo->scale);
  for (int i = 0; held && i < lo->r; i++) m->ops->upload(G + lo->emb[0] + i * V + pad, &held[i], sizeof(float));
  free(held);
}

static uint64_t head_key(const clrt_model *m, const acts *a) {
  return clrt_lora_key(m->lora->seed, a->cx->lora_step, m->cfg.num_hidden_layers, LORA_HEAD);
}

/* xa [nv, r] = drop(xn) A^T. */
static void head_xa(clrt_model *m, acts *a, const float *xn, int64_t nv, int dropout) {
  model_lora *lo = m->lora;
  const float *P = lo->params->data, *xd = xn;
  int C = m->cfg.hidden_size;
  if (dropout) {
    m->ops->lora_dropout(a->lxd, xn, nv * C, head_key(m, a), lo->dropout);
    xd = a->lxd;
  }
  m->ops->lora_xa(a->lhxa, xd, P + lo->head[0], nv, C, lo->r);
}

const clrt_head_lora *model_lora_head_forward(clrt_model *m, acts *a, clrt_head_lora *hl, const float *xn,
                                              int64_t nv, int keep) {
  model_lora *lo = m->lora;
  if (!lo || !lo->enabled || lo->head[0] < 0) return NULL;
  head_xa(m, a, xn, nv, keep && lo->dropout > 0);
  *hl = (clrt_head_lora){a->lhxa, (const float *)lo->params->data + lo->head[1], NULL, NULL, lo->r, lo->scale};
  return hl;
}

const clrt_head_lora *model_lora_head_backward(clrt_model *m, acts *a, clrt_head_lora *hl) {
  model_lora *lo = m->lora;
  if (!lo || !a->cx->lora_enabled || lo->head[0] < 0) return NULL;
  *hl = (clrt_head_lora){a->lhxa, (const float *)lo->params->data + lo->head[1], a->ldxa,
                         (float *)lo->grads->data + lo->head[1], lo->r, lo->scale};
  return hl;
}

void model_lora_head_backward_end(clrt_model *m, acts *a, float *dx, const float *xn, int64_t nv) {
  model_lora *lo = m->lora;
  if (!lo || !a->cx->lora_enabled || lo->head[0] < 0) return;
  int C = m->cfg.hidden_size;
  float p = a->cx->lora_dropout ? lo->dropout : 0.0f, *xd = (float *)xn;
  uint64_t key = head_key(m, a);
  if (p > 0) {   /* the forward's mask again, from its key */
    m->ops->lora_dropout(a->lxd, xn, nv * C, key, p);
    xd = a->lxd;
  }
  m->ops->lora_input_backward(dx, (float *)lo->grads->data + lo->head[0], a->ldxa, xd,
                              (const float *)lo->params->data + lo->head[0], nv, C, lo->r, key, p);
}

void model_lora_head_decode(clrt_model *m, acts *a, float *logits, const float *xn, int B) {
  model_lora *lo = m->lora;
  if (!lo || !lo->enabled || lo->head[0] < 0) return;
  const float *P = lo->params->data;
  m->ops->lora_forward(m, a, logits, a->lhxa, xn, P + lo->head[0], P + lo->head[1], B, m->cfg.hidden_size,
                       m->cfg.vocab_size, lo->r, lo->scale);
}
