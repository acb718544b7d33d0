/* quant8.c — quant=int8: generation (clrt_model_forward_cached: prefill and decode) reads int8
   copies of every linear weight, the output layer's included, with per-output-channel scales,
   and quantizes each product's input rows on the fly (kernels/cpu/linear_int8.c). Training and
   scoring (clrt_model_logprobs, backward) keep the f32 master weights: the copies are
   generation's alone, remade from the master weights when they change (a load, a write
   through a view; an optimizer step refreshes current copies in place, row by row, as it does
   the packed f32 and bf16 ones), so RL rollouts sample from the current policy rounded to int8.
   CPU only; a move to another device drops the copies. */
#include "model_internal.h"
#include "cpu/linear_int8.h"

#include <stdlib.h>
#include <string.h>

typedef struct q8_weight {
  int64_t w;        /* the weight's offset in the params (what the layer code names it by) */
  int K, O;
  int8_t *q;        /* clrt_int8_pack's panels, 64-byte aligned */
  float *ws;        /* [O] */
  int32_t *wsum;    /* [O] */
} q8_weight;

struct model_q8 {
  int n;
  q8_weight *wt;
  uint64_t ver;     /* params->version the copies were made from (COPY_STALE: none yet) */
  int path;         /* clrt_int8_path() when turned on */
};

void model_q8_free(model_q8 *q) {
  if (!q) return;
  for (int i = 0; i < q->n; i++) {
    free(q->wt[i].q);
    free(q->wt[i].ws);
    free(q->wt[i].wsum);
  }
  free(q->wt);
  free(q);
}

int model_q8_active(const clrt_model *m) { return m->q8 && m->device == CLRT_CPU; }

static int add_weight(model_q8 *q, int64_t w, int K, int O) {
  q8_weight *t = &q->wt[q->n++];
  size_t bytes = clrt_int8_packed_bytes(K, O);
  *t = (q8_weight){w, K, O, aligned_alloc(64, (bytes + 63) & ~(size_t)63), malloc(sizeof(float) * (size_t)O),
                   malloc(sizeof(int32_t) * (size_t)O)};
  return t->q && t->ws && t->wsum ? 0 : -1;
}

/* Every linear weight of the blocks and the output layer (the tied embedding's matrix when
   tied: its copy serves the logits only, the lookup reads the f32 one). */
static model_q8 *q8_new(const clrt_model *m) {
  const clrt_model_config *c = &m->cfg;
  int C = c->hidden_size, I = c->intermediate_size, HD = c->num_attention_heads * c->head_dim,
      KVD = c->num_key_value_heads * c->head_dim, L = c->num_hidden_layers;
  model_q8 *q = calloc(1, sizeof *q);
  if (!q || !(q->wt = calloc((size_t)(7 * L + 1), sizeof *q->wt))) {
    free(q);
    return NULL;
  }
  int bad = 0;
  for (int l = 0; l < L; l++) {
    const clrt_layer_offsets *o = &m->layer[l];
    bad |= add_weight(q, o->wq, C, HD) | add_weight(q, o->wk, C, KVD) | add_weight(q, o->wv, C, KVD) |
           add_weight(q, o->wo, HD, C) | add_weight(q, o->wg, C, I) | add_weight(q, o->wu, C, I) |
           add_weight(q, o->wd, I, C);
  }
  bad |= add_weight(q, m->head, C, c->vocab_size);
  q->ver = COPY_STALE;
  q->path = clrt_int8_path();
  /* CLRT_INT8_KERNEL names another path this CPU runs (tests: every path gives the same bits) */
  const char *want = getenv("CLRT_INT8_KERNEL");
  for (int p = 0; want && *want && p < CLRT_INT8_PATHS; p++)
    if (!strcmp(want, clrt_int8_path_name(p)) && clrt_int8_path_available(p)) q->path = p;
  if (bad) {
    model_q8_free(q);
    return NULL;
  }
  return q;
}

int model_q8_refresh(clrt_model *m) {
  model_q8 *q = m->q8;
  if (m->base16) {   /* set_base_dtype("bf16") after set_quant: no f32 weights to quantize */
    clrt_set_error("quant=int8: the base is held in bf16 (base_dtype=bf16); set_quant(\"none\") or load it in f32");
    return -1;
  }
  if (q->ver == m->params->version) return 0;
  for (int i = 0; i < q->n; i++) {
    q8_weight *t = &q->wt[i];
    clrt_int8_pack(t->q, t->ws, t->wsum, PW(m, t->w), t->K, t->O);
  }
  q->ver = m->params->version;
  m->repacks++;
  return 0;
}

/* The optimizer's in-place refresh (weights.c: model_copy_rows): current copies get the
   rows the step just updated, so no step remakes the whole int8 model. */
int model_q8_current(const clrt_model *m) { return m->q8 && !m->base16 && m->q8->ver == m->params->version; }

void model_q8_copy_rows(clrt_model *m, int64_t off, int K, int O, int r0, int r1) {
  const q8_weight *t = NULL;
  for (int i = 0; i < m->q8->n && !t; i++)
    if (m->q8->wt[i].w == off) t = &m->q8->wt[i];
  if (t && t->K == K && t->O == O) clrt_int8_pack_rows(t->q, t->ws, t->wsum, PW(m, off), K, O, r0, r1);
}

void model_q8_kept(clrt_model *m) { m->q8->ver = m->params->version; }

static const q8_weight *find_weight(const model_q8 *q, int64_t w) {
  for (int i = 0; i < q->n; i++)
    if (q->wt[i].w == w) return &q->wt[i];
  return NULL;
}

/* The input rows x [N, K] quantized once for every product that reads them, into the
   context's scratch (one decode step's, so that contexts decode side by side). */
static int quantize_input(clrt_context *q, const float *x, int64_t N, int K) {
  size_t need = (size_t)N * (size_t)clrt_int8_k4(K);
  if (need > q->xq_cap) {
    free(q->xq);
    if (!(q->xq = malloc(need))) return q->xq_cap = 0, -1;
    q->xq_cap = need;
  }
  if ((size_t)N > q->xs_cap) {
    free(q->xs);
    if (!(q->xs = malloc(sizeof(float) * (size_t)N))) return q->xs_cap = 0, -1;
    q->xs_cap = (size_t)N;
  }
  clrt_int8_quantize_rows(q->xq, q->xs, x, N, K);
  return 0;
}

/* ---- the int8 blocks format: its products ------------------------------------------------------ */

/* The products over the int8 copies, the input rows quantized once for all of them; a weight
   without one (none in this model's layout) or a failed scratch allocation: declined (the
   master weights' f32 product runs it). */
static int blocks_forward_parts(clrt_model *m, acts *a, const float *x, int64_t N, int K, const lin_part *parts,
                                int count) {
  model_q8 *q = m->q8;
  clrt_context *cx = a->cx;
  for (int i = 0; i < count; i++) {
    const q8_weight *t = find_weight(q, parts[i].w);
    if (!t || t->K != K || t->O != parts[i].O) return 0;
  }
  if (quantize_input(cx, x, N, K)) return 0;
  for (int i = 0; i < count; i++) {
    const q8_weight *t = find_weight(q, parts[i].w);
    if (clrt_int8_linear(parts[i].y, cx->xq, cx->xs, t->q, t->ws, t->wsum, parts[i].b, N, K, t->O, q->path))
      return 0;
  }
  return 1;
}

static int blocks_forward(clrt_model *m, acts *a, float *y, const float *x, int64_t w, const float *b, int64_t N,
                          int K, int O) {
  lin_part part = {y, w, b, O, 0};
  return blocks_forward_parts(m, a, x, N, K, &part, 1);
}

/* Made by model_q8_refresh (clrt_int8_pack: panels with each row's scale and sum beside), kept
   current row by row by the optimizer; decode only: no backward. The int8 path (VNNI, AVX2,
   NEON dot products or portable) is clrt_int8_path's, inside the kernel. */
static const linear_kernels blocks = {"int8 blocks", blocks_forward, blocks_forward_parts, NULL};
const weight_format model_int8_blocks = {"int8 blocks with per-row scales (clrt_int8_pack)", 1, NULL, NULL,
                                         FORMAT_LEVELS(&blocks, &blocks)};

int clrt_model_set_quant_int8(clrt_model *m, int on) {
  if (!on) {
    model_q8_free(m->q8);
    m->q8 = NULL;
    return 0;
  }
  if (m->q8) return 0;
  if (model_mode_allows(m, MODE_F32_WEIGHTS, "quant=int8")) return -1;
  if (m->device != CLRT_CPU) {
    clrt_set_error("quant=int8: int8 weights run on the cpu only (this model is on another device)");
    return -1;
  }
  if (!(m->q8 = q8_new(m))) {
    clrt_set_error("quant=int8: no memory for the int8 weight copies");
    return -1;
  }
  return 0;
}

int clrt_model_quant_int8(const clrt_model *m) { return m->q8 != NULL; }

const char *clrt_int8_kernel(const clrt_model *m) {
  return clrt_int8_path_name(m && m->q8 ? m->q8->path : clrt_int8_path());
}
