/* ops_cpu.c — the model's ops on the CPU: the kernels of kernels/cpu over host memory, one
   table for every precision (the linear products are the weight formats': format_f32.c,
   format_bf16.c, base16.c, quant8.c). */
#include "model_internal.h"

#include <string.h>

/* The output layer reads the format the blocks' layers read (a bf16 model's decode its bf16
   copy, an f32 one its packed copy, quant=int8 its int8 head; a bf16 base's head stays f32),
   straight into the caller's memory. */
static int cpu_decode_logits(clrt_model *m, acts *a, float *logits, const float *xn, int B) {
  model_linear_head(m, a, logits, xn, B);
  model_lora_head_decode(m, a, logits, xn, B);
  return 0;
}

/* Each query alone, as a decode step computes its row (clrt_attention_rows_forward): its sums
   then run in an order fixed by its own key range, whatever the batch, the padding or the chunk
   it came in. A batch-invariant model runs every attention so (a prefilled position gets a
   decode step's bits); any forward over the KV cache (a slot, no lse kept: prefills and decode
   steps) does too where the pass has its AVX-512 kernels, so keys and values reused from the
   prefix cache (decode.c) are the ones a prefill from the start would compute, bit for bit.
   Elsewhere (clrt_model_kv_reusable says no) the blocked kernel runs. scale 0: 1/sqrt(D);
   cap 0: no soft cap. Returns 0 when the caller runs the blocked kernel instead. */
static int cpu_attention_per_query(const clrt_model *m, acts *a, float *out, float *lse, const float *q,
                                   const float *k, const float *v, const attn_args *s, float scale, float cap) {
  if (!m->batch_invariant && !(s->slot && !lse && clrt_attention_rows_fast())) return 0;
  int Tk = 0;   /* the longest key range: each thread's scratch slice, as clrt_attention_forward sizes it */
  for (int b = 0; b < s->B; b++) {
    int tk = (s->pos0 ? s->pos0[b] : 0) + s->T;
    if (tk > Tk) Tk = tk;
  }
  clrt_attention_rows_forward(out, lse, q, k, v, s->B, s->T, s->H, s->KV, s->D, s->pos0, s->kv_bstride,
                              s->slot, s->window, a->attn, (int64_t)clrt_attention_scratch_floats(s->T, Tk, 1),
                              a->cx->threads, scale, cap);
  return 1;
}

static void cpu_attention(const clrt_model *m, acts *a, float *out, float *lse, const float *q,
                          const float *k, const float *v, const attn_args *s) {
  if (cpu_attention_per_query(m, a, out, lse, q, k, v, s, 0.0f, 0.0f)) return;
  clrt_attention_forward(out, lse, q, k, v, s->B, s->T, s->H, s->KV, s->D, s->pos0, s->kv_bstride,
                         s->slot, s->window, a->attn, a->cx->threads);
}

static void cpu_attention_backward(const clrt_model *m, acts *a, const layer_acts *A, int B, int T, int window) {
  const clrt_model_config *c = &m->cfg;
  clrt_attention_backward(a->dq, a->dk, a->dv, a->datt, A->q, A->k, A->v, A->att, A->lse, B, T,
                          c->num_attention_heads, c->num_key_value_heads, c->head_dim, window, a->attn,
                          a->cx->threads);
}

/* Gemma 3: its score scale and soft-capped scores (its local layers' window comes as the others'),
   per query where the others' attention is. */
static void cpu_attention_scaled(const clrt_model *m, acts *a, float *out, float *lse, const float *q,
                                 const float *k, const float *v, const attn_args *s, float scale, float cap) {
  if (cpu_attention_per_query(m, a, out, lse, q, k, v, s, scale, cap)) return;
  clrt_attention_scaled_forward(out, lse, q, k, v, s->B, s->T, s->H, s->KV, s->D, s->pos0, s->kv_bstride,
                                s->slot, s->window, a->attn, a->cx->threads, scale, cap);
}

static void cpu_attention_scaled_backward(const clrt_model *m, acts *a, const layer_acts *A, int B, int T,
                                          int window, float scale, float cap) {
  const clrt_model_config *c = &m->cfg;
  clrt_attention_scaled_backward(a->dq, a->dk, a->dv, a->datt, A->q, A->k, A->v, A->att, A->lse, B, T,
                                 c->num_attention_heads, c->num_key_value_heads, c->head_dim, window, a->attn,
                                 a->cx->threads, scale, cap);
}

static void cpu_attention_backward_offset(const clrt_model *m, acts *a, float *dq, float *dk, float *dv,
                                          const float *dout, const float *q, const float *k, const float *v,
                                          const float *out, const float *lse, int Tq, int p0, int window) {
  const clrt_model_config *c = &m->cfg;
  clrt_attention_backward_offset(dq, dk, dv, dout, q, k, v, out, lse, 1, Tq, p0, c->num_attention_heads,
                                 c->num_key_value_heads, c->head_dim, window, a->attn, a->cx->threads);
}

/* One slice per thread; backward keeps the forward's thread count (its context's threads). */
static size_t cpu_attention_scratch(const clrt_model *m, int threads, int B, int T, int Tk) {
  (void)m, (void)B;
  return clrt_attention_scratch_floats(T, Tk, threads);
}

/* cache[slot[b]][pos0[b] + t] = k[b][t] (and v), rows of `row` floats. */
static void cpu_kv_write(float *kc, float *vc, const float *k, const float *v, const int32_t *pos0,
                         const int32_t *slot, int B, int T, int row, int64_t bstride) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      int64_t dst = (slot ? slot[b] : b) * bstride + (int64_t)(pos0[b] + t) * row,
              src = ((int64_t)b * T + t) * row;
      memcpy(kc + dst, k + src, sizeof(float) * (size_t)row);
      memcpy(vc + dst, v + src, sizeof(float) * (size_t)row);
    }
}

static void cpu_gather_rows(float *dst, const float *src, const int32_t *rowidx, int64_t nv, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < nv; i++)
    memcpy(dst + i * C, src + (int64_t)rowidx[i] * C, sizeof(float) * (size_t)C);
}

/* Adds: a shared context's last position is the row of every branch's first target. */
static void cpu_scatter_rows(float *dst, const float *src, const int32_t *rowidx, int64_t nv, int C) {
  for (int64_t i = 0; i < nv; i++) clrt_residual_forward(dst + (int64_t)rowidx[i] * C, dst + (int64_t)rowidx[i] * C,
                                                         src + i * C, C);
}

static void cpu_zero(float *p, size_t n) { memset(p, 0, sizeof(float) * n); }

static int cpu_copy(void *dst, const void *src, size_t bytes) {
  memcpy(dst, src, bytes);
  return 0;
}

static int cpu_sync(void) { return 0; }

/* The adapters' kernels take their scratch from the context's workspace. */
static void cpu_lora_forward(clrt_model *m, acts *a, float *y, float *xa, const float *xd, const float *A, const float *B,
                             int64_t N, int K, int O, int r, float scale) {
  (void)m;
  if (!model_workspace(a->cx, clrt_lora_forward_workspace_bytes(K, O, r), "lora forward"))
    clrt_lora_forward(y, xa, xd, A, B, N, K, O, r, scale, a->cx->ws, a->cx->ws_bytes);
}

static void cpu_lora_backward(clrt_model *m, acts *a, float *dx, float *dA, float *dB, float *dxa, float *xd, const float *dy,
                              const float *xa, const float *A, const float *B, int64_t N, int K, int O, int r,
                              float scale, uint64_t key, float p) {
  (void)m;
  if (!model_workspace(a->cx, clrt_lora_backward_workspace_bytes(N, r), "lora backward"))
    clrt_lora_backward(dx, dA, dB, dxa, xd, dy, xa, A, B, N, K, O, r, scale, key, p, a->cx->ws, a->cx->ws_bytes);
}

const model_ops model_cpu_ops = {
    .name = "cpu", .decode_logits = cpu_decode_logits,
    .rmsnorm = clrt_rmsnorm_forward, .rmsnorm_backward = clrt_rmsnorm_backward,
    .rope = clrt_rope_forward, .rope_backward = clrt_rope_backward,
    .attention = cpu_attention, .attention_backward = cpu_attention_backward,
    .attention_backward_offset = cpu_attention_backward_offset,
    .attention_scratch = cpu_attention_scratch, .kv_write = cpu_kv_write,
    .swiglu = clrt_swiglu_forward, .swiglu_backward = clrt_swiglu_backward,
    .add = clrt_residual_forward, .embedding = clrt_embedding_forward,
    .embedding_backward = clrt_embedding_backward, .output = clrt_logsoftmax_gather_forward_lora,
    .output_backward = clrt_logsoftmax_gather_backward_lora, .gather_rows = cpu_gather_rows,
    .scatter_rows = cpu_scatter_rows, .lora_dropout = clrt_lora_dropout,
    .lora_forward = cpu_lora_forward, .lora_backward = cpu_lora_backward,
    .lora_xa = clrt_lora_xa, .lora_input_backward = clrt_lora_input_backward, .lora_embed_forward = clrt_lora_embed_forward,
    .lora_embed_backward = clrt_lora_embed_backward, .zero = cpu_zero, .upload = cpu_copy,
    .download = cpu_copy, .copy = cpu_copy, .sync = cpu_sync,
    .rmsnorm_unit = clrt_rmsnorm_unit_forward, .rmsnorm_unit_backward = clrt_rmsnorm_unit_backward,
    .geglu = clrt_geglu_forward, .geglu_backward = clrt_geglu_backward, .scale = clrt_scale_inplace,
    .attention_scaled = cpu_attention_scaled, .attention_scaled_backward = cpu_attention_scaled_backward,
    .output_softcap = clrt_logsoftmax_gather_softcap_forward,
    .output_softcap_backward = clrt_logsoftmax_gather_softcap_backward,
};
