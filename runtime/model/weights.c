/* weights.c — the weight copies beside the f32 master params and the modes' rules. Which
   weight format a computation's linear products read is device.c's policy
   (model_context_choose; the formats and their kernels: format_f32.c, format_bf16.c, base16.c,
   quant8.c, ops_cuda.c):
     CPU f32   f32 panels when the packed copy is current (decode makes it, logprobs remakes an
               existing one after the weights change and makes one for a small model:
               model_refresh_packed_logprobs), else f32 rows (the tiles past a decode step's
               rows, sgemm with set_decode_pack(false), row-wise when batch-invariant);
     CPU bf16  bf16 pairs where a matrix unit takes panels (with the transposed half: bf16
               backward too), else bf16 rows; bf16 base: its own panels; quant=int8 decode:
               int8 blocks; CUDA: cuBLAS in f32, or over the bf16 copy.
   Every copy remembers the params->version it was made from and is remade when the weights
   change (a move, an initialisation, a write through a view); an optimizer step refreshes a
   current copy in place instead, row panels right after it updates them (model_copy_rows),
   so no step repacks the whole model. */
#include "model_internal.h"
#include "bf16.h"

#include <stdlib.h>
#include <omp.h>
#include <string.h>

/* The bf16 pairs' second half: a block weight w [O, K] transposed into pairs of output rows
   (backward's dx; not the head, whose backward is the output layer's, in f32). */
static void make_transposed_pairs(void *dst, const float *w, int K, int O) { clrt_pack_pairs(dst, w, K, 1, O, K, O); }

/* Makes every linear weight of the params into its format's copy at dst, at the same offsets
   (elem: the copy's bytes per weight); head: the output layer's too. */
static void pack_linear_weights(const clrt_model *m, char *dst, size_t elem,
                                void (*make)(void *dst, const float *w, int K, int O), int head) {
  const clrt_model_config *c = &m->cfg;
  int C = c->hidden_size, I = c->intermediate_size, HD = c->num_attention_heads * c->head_dim,
      KVD = c->num_key_value_heads * c->head_dim;
  const float *src = m->params->data;
#define PACK(off, K, O) make(dst + (size_t)(off) * elem, src + (off), K, O)
  for (int l = 0; l < c->num_hidden_layers; l++) {
    const clrt_layer_offsets *o = &m->layer[l];
    PACK(o->wq, C, HD);
    PACK(o->wk, C, KVD);
    PACK(o->wv, C, KVD);
    PACK(o->wo, HD, C);
    PACK(o->wg, C, I);
    PACK(o->wu, C, I);
    PACK(o->wd, I, C);
  }
  if (head) PACK(m->head, C, c->vocab_size);
#undef PACK
}

/* The modes' rules, all here: which modes a model's weights and device let a change have. */
int model_mode_allows(const clrt_model *m, int change, const char *who) {
  const clrt_model_config *c = &m->cfg;
  int HD = c->num_attention_heads * c->head_dim;
  switch (change) {
  case MODE_F32_WEIGHTS:
    if (!m->base16) return 0;
    clrt_set_error("%s: the model's base is held in bf16 (base_dtype=bf16) and has no f32 weights; "
                   "load the base again for that", who);
    return -1;
  case MODE_BF16_BASE:
    if (!m->lora)
      clrt_set_error("%s: only a frozen base can drop its f32 weights; add LoRA adapters first "
                     "(train.lora.r > 0): a full fine-tune trains every weight in f32", who);
    else if (m->device != CLRT_CPU)
      clrt_set_error("%s: runs on the cpu only (the CUDA ops have no bf16 base yet); use base_dtype=f32 on cuda", who);
    else if (c->hidden_size % 2 || c->intermediate_size % 2 || HD % 2)
      clrt_set_error("%s: needs even hidden (%d), intermediate (%d) and heads x head_dim (%d) sizes (weights "
                     "in pairs of bf16)", who, c->hidden_size, c->intermediate_size, HD);
    else
      return 0;
    return -1;
  case MODE_ON_CUDA:
    if (c->gemma3)
      clrt_set_error("%s: Gemma3ForCausalLM runs on the cpu only (its (1 + w) norms, GELU-tanh MLP and "
                     "scaled, soft-capped attention have no CUDA kernels yet); use device=cpu", who);
    else if (m->base16)
      clrt_set_error("%s: a bf16 base (base_dtype=bf16) runs on the cpu only (the CUDA ops have no bf16 "
                     "base yet); use base_dtype=f32 on cuda", who);
    else
      return 0;
    return -1;
  }
  clrt_set_error("%s: unknown mode change %d", who, change);
  return -1;
}

/* ---- the copies ------------------------------------------------------------------------------- */

int model_copy_current(const clrt_model *m, const weight_copy *c) {
  return c->s && c->format && c->version == m->params->version;
}

void model_copy_drop(weight_copy *c) {
  clrt_storage_release(c->s);
  *c = (weight_copy){.version = COPY_STALE};
}

const linear_kernels *model_format_kernels(const weight_format *f) {
  int level = clrt_cpu_level();
  return level >= 0 && level <= CLRT_CPU_TOP ? f->kernels[level] : NULL;
}

static void choose_kernels(weight_copy *c) {
  c->level = clrt_cpu_level();
  c->kernels = model_format_kernels(c->format);
}

void model_copy_made(const clrt_model *m, weight_copy *c, const weight_format *f) {
  c->format = f;
  c->version = m->params->version;
  choose_kernels(c);
}

const linear_kernels *model_copy_kernels(weight_copy *c) {
  if (c->level != clrt_cpu_level()) choose_kernels(c);
  return c->kernels;
}

/* The packed copies of the linear weights, made on the first CPU forward (decode, logprobs) and remade when the
   weights change. Products of any number of rows run faster over them than over sgemm (see
   linear_packed.c), for a second copy of the weights in memory. */
int model_refresh_packed(clrt_model *m) {
  if (m->device != CLRT_CPU || m->bf16 || m->base16 || !m->pack_decode || !clrt_linear_packed_available()) return 0;
  weight_copy *c = &m->wpk;
  if (!c->s) {
    if (!(c->s = clrt_storage_new(sizeof(float) * (size_t)m->total, CLRT_CPU))) {
      clrt_set_error("decode: no memory for the packed weights (%lld MiB; set_decode_pack(false) "
                     "decodes without them)", (long long)(sizeof(float) * (size_t)m->total >> 20));
      return -1;
    }
    c->version = COPY_STALE;
  }
  if (model_copy_current(m, c)) return 0;
  pack_linear_weights(m, c->s->data, sizeof(float), model_f32_panels.make, 1);
  m->repacks++;
  model_copy_made(m, c, &model_f32_panels);
  return 0;
}

/* In logprobs (training, scoring): an existing copy (a policy that decodes) is remade after the
   weights change, once per optimizer step rather than at the next decode; a small model gets
   one (up to 256 MiB: the packed forward runs 1.1-1.4x the on-the-fly one here); a larger
   model without one packs on the fly rather than holding a second copy of its weights
   (SFT, a reference model). CLRT_TRAIN_PACK_MAX_MB moves the bound (tests, benchmarks). */
int model_refresh_packed_logprobs(clrt_model *m) {
  const char *env = getenv("CLRT_TRAIN_PACK_MAX_MB");
  double max_mb = env && *env ? atof(env) : 256;
  if (!m->wpk.s && sizeof(float) * (double)m->total > max_mb * 1048576.0) return 0;
  return model_refresh_packed(m);
}

/* The packed copy of the weight at offset w, when it is current. */
const float *model_packed_weight(const clrt_model *m, int64_t w) {
  return model_copy_current(m, &m->wpk) ? (const float *)m->wpk.s->data + w : NULL;
}

int model_fast_kernels(const clrt_model *m) { return m->device == CLRT_CPU && m->pack_decode; }

/* The output layer's kernels (clrt_logsoftmax_gather_forward's fast bits): batch-invariant,
   its logits without the packed head run the product decode_logits runs. */
int model_output_kernels(const clrt_model *m) {
  return (model_fast_kernels(m) ? CLRT_OUT_FAST : 0) |
         (m->device == CLRT_CPU && m->batch_invariant ? CLRT_OUT_ROWWISE : 0);
}

static size_t larger(size_t a, size_t b) { return a > b ? a : b; }

size_t model_workspace_bytes(const clrt_model *m, int64_t N) {
  if (m->device != CLRT_CPU || N < 1) return 0;
  const clrt_model_config *c = &m->cfg;
  int C = c->hidden_size, I = c->intermediate_size, HD = c->num_attention_heads * c->head_dim,
      KVD = c->num_key_value_heads * c->head_dim;
  /* the blocks' seven linear shapes (LORA_Q .. LORA_DOWN's order), then the head's */
  const int K[LORA_NT + 1] = {C, C, C, HD, C, C, I, C}, O[LORA_NT + 1] = {HD, KVD, KVD, C, I, I, C, c->vocab_size};
  const model_lora *lo = m->lora;
  size_t need = 0;
  for (int i = 0; i <= LORA_NT; i++) {
    if (m->bf16)   /* the head too: decode's logits run the bf16 product */
      need = larger(need, larger(clrt_linear_packed_bf16_workspace_bytes(N, K[i]),
                                 larger(clrt_linear_skinny_bf16_workspace_bytes(N, K[i]),
                                        clrt_linear_rowwise_bf16_workspace_bytes(N, K[i]))));
    else if (m->base16 && i < LORA_NT)   /* the head stays f32 */
      need = larger(need, larger(clrt_linear_bf16_workspace_bytes(N, K[i], O[i], 1),
                                 clrt_linear_bf16_backward_dx_workspace_bytes(K[i], O[i])));
    if (lo && (i < LORA_NT || lo->head[0] >= 0))
      need = larger(need, larger(clrt_lora_forward_workspace_bytes(K[i], O[i], lo->r),
                                 clrt_lora_backward_workspace_bytes(N, lo->r)));
  }
  return need;
}

/* The bf16 weight copies follow the fp32 master weights (after an optimizer step, a move,
   an initialisation, a write through a params view). */
int model_refresh_bf16(clrt_model *m) {
  weight_copy *c = &m->wbf;
  if (!m->bf16 || model_copy_current(m, c)) return 0;
  /* dropped with the arena it was made from (LoRA untying the head): one plain copy's room */
  if (!c->s && !(c->s = clrt_storage_new(sizeof(uint16_t) * (size_t)m->total, m->device))) return -1;
  if (m->ops->to_bf16) {   /* the device converts the whole arena */
    m->ops->to_bf16(c->s->data, m->params->data, m->total);
    /* plain bf16 rows on the device, which its own format's products read (cuBLAS; the
       policy's, model_cuda_format): no CPU kernels */
    c->format = &model_bf16_rows;
    c->version = m->params->version;
    c->kernels = NULL;
    return 0;
  }
  const float *src = m->params->data;
  uint16_t *dst = c->s->data;
  const clrt_model_config *cfg = &m->cfg;
  int C = cfg->hidden_size, I = cfg->intermediate_size, HD = cfg->num_attention_heads * cfg->head_dim;
  /* CPU decode reads only the linear weights of wbf: in panels, they are all it needs. */
  if (m->pack_decode && clrt_linear_packed_bf16_available() && C % 2 == 0 && I % 2 == 0 && HD % 2 == 0) {
    pack_linear_weights(m, (char *)dst, sizeof(uint16_t), model_bf16_pairs.make, 1);
    m->repacks++;
    /* room for the transposed half was made by set_matmul where a matrix unit runs backward */
    int t = c->s->bytes == sizeof(uint16_t) * 2 * (size_t)m->total && clrt_matrix_unit() != CLRT_UNIT_F32;
    if (t) pack_linear_weights(m, (char *)(dst + m->total), sizeof(uint16_t), make_transposed_pairs, 0);
    model_copy_made(m, c, t ? &model_bf16_pairs_t : &model_bf16_pairs);
    return 0;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m->total; i++) dst[i] = clrt_f32_to_bf16(src[i]);
  /* no panels: the backward runs in f32 */
  model_copy_made(m, c, m->batch_invariant ? &model_bf16_rows_invariant : &model_bf16_rows);
  return 0;
}

int clrt_model_set_decode_pack(clrt_model *m, int on) {
  if (m->pack_decode != (on != 0)) m->wbf.version = COPY_STALE;   /* bf16 copies change layout */
  m->pack_decode = on != 0;
  if (!on) model_copy_drop(&m->wpk);
  return 0;
}


/* forward_cached's products go through the packed f32 copy for any number of rows, each row
   summed in the same order (linear_packed.c's tiles), and its attention runs every query as a
   decode row (ops_cpu.c; Gemma 3's scaled, soft-capped one too): a position's keys and values
   do not depend on how the tokens were chunked. bf16 products switch kernels by row count, and
   other devices promise nothing. quant=int8's products (quant8.c) quantize each row on its own
   and sum exact integers, so they never depend on the rows beside them either. */
int clrt_model_kv_reusable(const clrt_model *m) {
  if (m->device != CLRT_CPU || m->base16 || !clrt_linear_packed_available()) return 0;
  /* q8: quant=int8 (quant8.c). bf16 products are row-count independent only when batch
     invariant (the bf16 copy at every row count, not sgemm past 32 rows). */
  return m->q8 != NULL || (!m->bf16 && m->pack_decode) || (m->bf16 && m->batch_invariant);
}

void clrt_model_weights_stamp(const clrt_model *m, uint64_t out[8]) {
  const clrt_storage *lp = m->lora ? m->lora->params : NULL;
  out[0] = m->params->serial;
  out[1] = m->params->version;
  out[2] = m->b16 ? m->b16->serial : 0;
  out[3] = m->b16 ? m->b16->version : 0;
  out[4] = lp ? lp->serial : 0;
  out[5] = lp ? lp->version : 0;
  out[6] = (uint64_t)(m->lora && m->lora->enabled) | (uint64_t)m->bf16 << 1 | (uint64_t)m->base16 << 2 |
           (uint64_t)m->pack_decode << 3 | (uint64_t)m->batch_invariant << 4 | (uint64_t)(m->q8 != NULL) << 5 |
           (uint64_t)m->device << 8;
  out[7] = (uint64_t)(uintptr_t)m;
}

int clrt_model_set_batch_invariant(clrt_model *m, int on) {
  m->batch_invariant = on != 0;
  /* bf16 rows keep their layout; their kernels differ (row-wise when invariant) */
  if (m->wbf.format == &model_bf16_rows || m->wbf.format == &model_bf16_rows_invariant)
    model_copy_made(m, &m->wbf, m->batch_invariant ? &model_bf16_rows_invariant : &model_bf16_rows);
  return 0;
}

int clrt_model_batch_invariant(const clrt_model *m) { return m->batch_invariant; }

int64_t clrt_model_copy_repacks(const clrt_model *m) { return m->repacks; }

const char *clrt_matrix_unit_active(void) { return clrt_matrix_unit_name(clrt_matrix_unit()); }
const char *clrt_matrix_unit_available(void) { return clrt_matrix_unit_name(clrt_matrix_unit_best()); }

/* Every thread of the team runs the unit's register-only loop at once, long enough (~0.3 s)
   to time: the aggregate GFLOP/s. */
double clrt_matrix_unit_peak_gflops(const char *name, int threads) {
  int unit = -1;
  for (int u = CLRT_UNIT_F32; u <= CLRT_UNIT_AMX; u++)
    if (name && !strcmp(name, clrt_matrix_unit_name(u))) unit = u;
  if (unit < 0 || threads < 1) {
    clrt_set_error("matrix unit peak: unit '%s' (f32, fma-bf16, avx512-bf16, amx-bf16), threads %d", name ? name : "(null)", threads);
    return -1;
  }
  int64_t iters = 20000;
  for (;;) {
    double t0 = omp_get_wtime(), flops = 0;
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    flops += (double)clrt_unit_peak_flops(unit, iters);
    double dt = omp_get_wtime() - t0;
    if (flops == 0) return 0;
    if (dt > 0.25 || iters > ((int64_t)1 << 40)) return flops / dt / 1e9;
    iters = dt > 0.01 ? (int64_t)(iters * 0.3 / dt) : iters * 16;
  }
}

int clrt_set_matrix_unit(const char *name) {
  for (int u = CLRT_UNIT_F32; u <= CLRT_UNIT_AMX; u++)
    if (name && !strcmp(name, clrt_matrix_unit_name(u))) {
      clrt_matrix_unit_cap(u);
      return 0;
    }
  clrt_set_error("matrix unit '%s' (f32, fma-bf16, avx512-bf16, amx-bf16)", name ? name : "(null)");
  return -1;
}

/* The copies an optimizer step refreshes row by row (bit flags): the packed f32 copy and the
   bf16 panels (with their transposed half), each only when current before the step — a stale
   one is remade whole when next needed, as before (quant=int8's copies: optim.c, quant8.c). */
enum { KEEP_F32 = 1, KEEP_BF16 = 2 };

int model_copies_to_keep(const clrt_model *m) {
  if (m->device != CLRT_CPU || m->base16) return 0;
  int keep = 0;
  if (model_copy_current(m, &m->wpk)) keep |= KEEP_F32;
  if (m->bf16 && model_copy_current(m, &m->wbf) && m->wbf.format->make_rows) keep |= KEEP_BF16;
  return keep;
}

int model_linear_dims(const clrt_model *m, int64_t off, int *K, int *O) {
  const clrt_model_config *c = &m->cfg;
  int C = c->hidden_size, I = c->intermediate_size, HD = c->num_attention_heads * c->head_dim,
      KVD = c->num_key_value_heads * c->head_dim;
  for (int l = 0; l < c->num_hidden_layers; l++) {
    const clrt_layer_offsets *o = &m->layer[l];
    const int64_t w[7] = {o->wq, o->wk, o->wv, o->wo, o->wg, o->wu, o->wd};
    const int k[7] = {C, C, C, HD, C, C, I}, n[7] = {HD, KVD, KVD, C, I, I, C};
    for (int i = 0; i < 7; i++)
      if (w[i] == off) {
        *K = k[i], *O = n[i];
        return 1;
      }
  }
  if (off == m->head) {
    *K = C, *O = c->vocab_size;
    return 1;
  }
  return 0;
}

void model_copy_rows(clrt_model *m, int keep, int64_t off, int K, int O, int r0, int r1) {
  const float *w = (const float *)m->params->data + off;
  if (keep & KEEP_F32) m->wpk.format->make_rows((float *)m->wpk.s->data + off, w, K, O, r0, r1);
  if (keep & KEEP_BF16) {
    uint16_t *d = m->wbf.s->data;
    m->wbf.format->make_rows(d + off, w, K, O, r0, r1);
    if (m->wbf.format == &model_bf16_pairs_t && off != m->head) clrt_pack_rows_bf16_t(d + m->total + off, w, K, O, r0, r1);
  }
}

void model_copies_kept(clrt_model *m, int keep) {
  if (keep & KEEP_F32) m->wpk.version = m->params->version;
  if (keep & KEEP_BF16) m->wbf.version = m->params->version;
}
