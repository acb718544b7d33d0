/* weights.c — the weight copies beside the fp32 master params and the one policy for which
   product a linear layer runs:
     CPU f32   the packed f32 copy (48-wide panels, clrt_linear_pack) when it is current and the
               CPU has the kernel — decode makes it, logprobs remakes an existing one after the
               weights change and makes one for a small model (model_refresh_packed_logprobs)
               — else, beyond decode-sized products, the same tiles packing w on the fly
               (gemm_strided.c: no second copy of a large model's weights for SFT or a
               reference model, ~1.3-1.7x sgemm here), else sgemm on the params; backward's dx = dy w and dw += dy^T x through the AVX-512 tiles that read
               w and x in place (gemm_strided.c, ~1.3-2.5x sgemm here) where the CPU has them,
               else sgemm; set_decode_pack(false) turns all of these off (sgemm throughout);
               batch-invariant (set_batch_invariant): the packed copy (row-invariant by
               itself) else clrt_linear_rowwise_forward for every number of rows;
     CPU bf16  few-row products (decode) over the bf16 copy (packed in bf16 pairs on a CPU with
               AVX512-BF16, else plain) with bf16-rounded inputs, else sgemm on the params;
               batch-invariant: every product over the bf16 copy;
     CUDA      cuBLAS in f32, or bf16 inputs with f32 accumulation (ops_cuda.c).
   Both copies remember the params->version they were made from and are remade when the
   weights change (an optimizer step, a move, an initialisation, a write through a view). */
#include "model_internal.h"
#include "bf16.h"

#include <stdlib.h>

/* Packs every linear weight of the params into dst at the same offsets: f32 panels
   (clrt_linear_pack) or bf16 ones (clrt_linear_pack_bf16, dst uint16). */
static void pack_linear_weights(const clrt_model *m, void *dst, int bf16) {
  const clrt_model_config *c = &m->cfg;
  int C = c->hidden_size, I = c->intermediate_size, HD = c->num_attention_heads * c->head_dim,
      KVD = c->num_key_value_heads * c->head_dim;
  const float *src = m->params->data;
#define PACK(off, K, O)                                                          \
  (bf16 ? clrt_linear_pack_bf16((uint16_t *)dst + (off), src + (off), K, O)      \
        : clrt_linear_pack((float *)dst + (off), src + (off), K, O))
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
  PACK(m->head, C, c->vocab_size);
#undef PACK
}

/* The packed copies of the linear weights, made on the first CPU forward (decode, logprobs) and remade when the
   weights change. Products of any number of rows run faster over them than over sgemm (see
   linear_packed.c), for a second copy of the weights in memory. */
int model_refresh_packed(clrt_model *m) {
  if (m->device != CLRT_CPU || m->bf16 || m->base16 || !m->pack_decode || !clrt_linear_packed_available()) return 0;
  if (!m->wpk) {
    if (!(m->wpk = clrt_storage_new(sizeof(float) * (size_t)m->total, CLRT_CPU))) {
      clrt_set_error("decode: no memory for the packed weights (%lld MiB; set_decode_pack(false) "
                     "decodes without them)", (long long)(sizeof(float) * (size_t)m->total >> 20));
      return -1;
    }
    m->wpk_ver = COPY_STALE;
  }
  if (m->wpk_ver == m->params->version) return 0;
  pack_linear_weights(m, m->wpk->data, 0);
  m->wpk_ver = m->params->version;
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
  if (!m->wpk && sizeof(float) * (double)m->total > max_mb * 1048576.0) return 0;
  return model_refresh_packed(m);
}

/* The packed copy of the weight at offset w, when it is current. */
const float *model_packed_weight(const clrt_model *m, int64_t w) {
  return m->wpk && m->wpk_ver == m->params->version ? (const float *)m->wpk->data + w : NULL;
}

int model_fast_kernels(const clrt_model *m) { return m->device == CLRT_CPU && m->pack_decode; }

/* The output layer's kernels (clrt_logsoftmax_gather_forward's fast bits): batch-invariant,
   its logits without the packed head run the product decode_logits runs. */
int model_output_kernels(const clrt_model *m) {
  return (model_fast_kernels(m) ? CLRT_OUT_FAST : 0) |
         (m->device == CLRT_CPU && m->batch_invariant ? CLRT_OUT_ROWWISE : 0);
}

/* A linear layer on the CPU in f32: over the packed copy when current, else the same tiles
   packing w on the fly (more than a decode step's rows: fewer reread the weights once per
   row tile), else sgemm (or the skinny kernel, linear.c). */
void model_cpu_linear(clrt_model *m, acts *a, float *y, const float *x, int64_t w, const float *b,
                      int64_t N, int Kd, int O) {
  const float *wp = model_packed_weight(m, w);
  if (wp && clrt_linear_packed_forward(y, x, wp, b, N, Kd, O)) return;
  if (m->batch_invariant) {   /* no kernel switch at a number of rows */
    clrt_linear_rowwise_forward(y, x, PW(m, w), b, N, Kd, O);
    return;
  }
  if (model_fast_kernels(m) && N > CLRT_SKINNY_MAX_ROWS && clrt_linear_forward_strided(y, x, PW(m, w), b, N, Kd, O))
    return;
  clrt_linear_forward(y, x, PW(m, w), b, N, Kd, O);
}

/* The backward of a linear layer on the CPU (f32 and bf16 tables alike: gradients are f32). */
void model_cpu_linear_backward(clrt_model *m, acts *a, float *dx, int64_t w, float *db, const float *dy,
                               const float *x, int64_t N, int K, int O, int acc) {
  (void)a;
  if (model_fast_kernels(m) && clrt_linear_backward_strided(dx, GW(m, w), db, dy, x, PW(m, w), N, K, O, acc)) return;
  clrt_linear_backward(dx, GW(m, w), db, dy, x, PW(m, w), N, K, O, acc);
}

/* Products of the same x (q, k, v; gate, up) over the packed copy: one parallel pass for all
   of them (see linear_packed.c); otherwise one product each. */
void model_cpu_linear_parts(clrt_model *m, acts *a, const float *x, int64_t N, int Kd,
                            const lin_part *parts, int count) {
  clrt_packed_part packed[3] = {{0}};
  int ok = count <= 3;
  for (int i = 0; ok && i < count; i++) {
    const float *wp = model_packed_weight(m, parts[i].w);
    packed[i] = (clrt_packed_part){parts[i].y, wp, parts[i].b, parts[i].O};
    ok = wp != NULL;
  }
  if (ok && clrt_linear_packed_forward_parts(x, N, Kd, packed, count)) return;
  for (int i = 0; i < count; i++) model_cpu_linear(m, a, parts[i].y, x, parts[i].w, parts[i].b, N, Kd, parts[i].O);
}

/* In bf16 mode: the few-row products of decode over the bf16 copy (bf16-rounded inputs, f32
   accumulation); larger products stay sgemm on the f32 weights. */
void model_cpu_linear_bf16(clrt_model *m, acts *a, float *y, const float *x, int64_t w,
                           const float *b, int64_t N, int Kd, int O) {
  const uint16_t *w16 = (const uint16_t *)m->wbf->data + w;
  clrt_packed_part part = {y, w16, b, O};
  if (m->batch_invariant && (m->wbf_packed ? clrt_linear_packed_bf16_forward_rows(x, N, Kd, &part, 1)
                                           : clrt_linear_rowwise_forward_bf16(y, x, w16, b, N, Kd, O)))
    return;   /* every row count over the bf16 copy: no switch to the f32 weights */
  if (m->wbf_packed ? clrt_linear_packed_bf16_forward_parts(x, N, Kd, &part, 1)
                    : clrt_linear_skinny_forward_bf16(y, x, w16, b, N, Kd, O))
    return;
  model_cpu_linear(m, a, y, x, w, b, N, Kd, O);
}

void model_cpu_linear_parts_bf16(clrt_model *m, acts *a, const float *x, int64_t N, int Kd,
                                 const lin_part *parts, int count) {
  clrt_packed_part packed[3] = {{0}};
  if (m->wbf_packed && count <= 3) {
    for (int i = 0; i < count; i++)
      packed[i] = (clrt_packed_part){parts[i].y, (const uint16_t *)m->wbf->data + parts[i].w,
                                     parts[i].b, parts[i].O};
    if (m->batch_invariant ? clrt_linear_packed_bf16_forward_rows(x, N, Kd, packed, count)
                           : clrt_linear_packed_bf16_forward_parts(x, N, Kd, packed, count))
      return;
  }
  for (int i = 0; i < count; i++)
    model_cpu_linear_bf16(m, a, parts[i].y, x, parts[i].w, parts[i].b, N, Kd, parts[i].O);
}

/* The bf16 weight copies follow the fp32 master weights (after an optimizer step, a move,
   an initialisation, a write through a params view). */
void model_refresh_bf16(clrt_model *m) {
  if (!m->bf16 || m->wbf_ver == m->params->version) return;
  m->wbf_ver = m->params->version;
  if (m->ops->to_bf16) {   /* the device converts the whole arena */
    m->wbf_packed = 0;
    m->ops->to_bf16(m->wbf->data, m->params->data, m->total);
    return;
  }
  const float *src = m->params->data;
  uint16_t *dst = m->wbf->data;
  const clrt_model_config *c = &m->cfg;
  int C = c->hidden_size, I = c->intermediate_size, HD = c->num_attention_heads * c->head_dim;
  m->wbf_packed = m->pack_decode && clrt_linear_packed_bf16_available() && C % 2 == 0 && I % 2 == 0 &&
                  HD % 2 == 0;
  /* CPU decode reads only the linear weights of wbf: packed, they are all it needs. */
  if (m->wbf_packed) {
    pack_linear_weights(m, dst, 1);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m->total; i++) dst[i] = clrt_f32_to_bf16(src[i]);
}

int clrt_model_set_matmul_bf16(clrt_model *m, int on) {
  if (on && model_refuse_base16(m, "set_matmul(\"bf16\")")) return -1;
  if (!on) {
    clrt_storage_release(m->wbf);
    m->wbf = NULL;
    m->bf16 = 0;
    model_choose_ops(m);
    return 0;
  }
  if (!m->wbf && !(m->wbf = clrt_storage_new(sizeof(uint16_t) * (size_t)m->total, m->device))) return -1;
  /* bf16 decode reads the bf16 copies: the packed f32 ones would only take memory. */
  clrt_storage_release(m->wpk);
  m->wpk = NULL;
  /* The activation layout gains the bf16 scratch: rebuild it on the next call. */
  clrt_storage_release(m->acts);
  m->acts = NULL;
  m->saved = 0;
  m->bf16 = 1;
  m->wbf_ver = COPY_STALE;
  model_choose_ops(m);
  return 0;
}

int clrt_model_set_decode_pack(clrt_model *m, int on) {
  if (m->pack_decode != (on != 0)) m->wbf_ver = COPY_STALE;   /* bf16 copies change layout */
  m->pack_decode = on != 0;
  if (!on) {
    clrt_storage_release(m->wpk);
    m->wpk = NULL;
  }
  return 0;
}

void clrt_model_params_changed(clrt_model *m) { clrt_storage_written(m->params); }

/* forward_cached's products go through the packed f32 copy for any number of rows, each row
   summed in the same order (linear_packed.c's tiles), and its attention runs every query as a
   decode row (ops_cpu.c): a position's keys and values do not depend on how the tokens were
   chunked. bf16 products switch kernels by row count, and other devices promise nothing. */
int clrt_model_kv_reusable(const clrt_model *m) {
  return m->device == CLRT_CPU && !m->bf16 && !m->base16 && m->pack_decode && clrt_linear_packed_available();
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
           (uint64_t)m->pack_decode << 3 | (uint64_t)m->batch_invariant << 4 | (uint64_t)m->device << 8;
  out[7] = (uint64_t)(uintptr_t)m;
}

int clrt_model_set_batch_invariant(clrt_model *m, int on) {
  m->batch_invariant = on != 0;
  return 0;
}

int clrt_model_batch_invariant(const clrt_model *m) { return m->batch_invariant; }
