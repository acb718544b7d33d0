/* ops_cuda.c — the model's ops on a CUDA device: the kernels of kernels/cuda over device
   memory, all launched in order on the one clrt stream (clrt_cuda_sync reports a failed launch
   at the end of a step). The only model file that knows CUDA. */
#include "model_internal.h"
#include "lora_math.h"

#ifdef CLRT_HAVE_CUDA
#include "core/cuda_context.h"
#include "cuda/cuda_kernels.h"

#include <stdlib.h>

/* ---- the device's formats: cuBLAS over the f32 params, or over the bf16 copy ---------------- */

static int cuda_linear(clrt_model *m, acts *a, float *y, const float *x, int64_t w, const float *b,
                       int64_t N, int K, int O) {
  (void)a;
  clrt_cuda_linear_forward(y, x, PW(m, w), b, N, K, O);
  return 1;
}

static int cuda_linear_backward(clrt_model *m, acts *a, float *dx, int64_t w, float *db,
                                const float *dy, const float *x, int64_t N, int K, int O, int acc) {
  (void)a;
  clrt_cuda_linear_backward(dx, GW(m, w), db, dy, x, PW(m, w), N, K, O, acc);
  return 1;
}

/* bf16 inputs and weights with fp32 accumulation (cublasGemmEx); dw stays the f32 master. */
static int cuda_linear_bf16(clrt_model *m, acts *a, float *y, const float *x, int64_t w,
                            const float *b, int64_t N, int K, int O) {
  clrt_cuda_f32_to_bf16(a->x16, x, N * K);
  clrt_cuda_linear_forward_bf16(y, a->x16, (const uint16_t *)m->wbf.s->data + w, b, N, K, O);
  return 1;
}

static int cuda_linear_backward_bf16(clrt_model *m, acts *a, float *dx, int64_t w, float *db,
                                     const float *dy, const float *x, int64_t N, int K, int O, int acc) {
  clrt_cuda_f32_to_bf16(a->x16, x, N * K);
  clrt_cuda_f32_to_bf16(a->dy16, dy, N * O);
  clrt_cuda_linear_backward_bf16(dx, GW(m, w), db, dy, a->dy16, a->x16,
                                 (const uint16_t *)m->wbf.s->data + w, N, K, O, acc);
  return 1;
}

/* Device formats are not the CPU's levels': every level lists the one set. */
static const linear_kernels cuda_f32 = {"cuda f32", cuda_linear, NULL, cuda_linear_backward},
                            cuda_bf16 = {"cuda bf16", cuda_linear_bf16, NULL, cuda_linear_backward_bf16};
static const weight_format cuda_f32_rows = {"cuda f32 rows [O, K] (the master weights)", 1, NULL, NULL,
                                            FORMAT_LEVELS(&cuda_f32, &cuda_f32)},
                           cuda_bf16_rows = {"cuda bf16 rows [O, K] (the whole params arena)", 1, NULL, NULL,
                                             FORMAT_LEVELS(&cuda_bf16, &cuda_bf16)};

const weight_format *model_cuda_format(int bf16) { return bf16 ? &cuda_bf16_rows : &cuda_f32_rows; }

/* The output layer stays f32 (also in bf16 mode); its B rows land in the arena, then one copy
   to the host for the sampler. */
static int cuda_decode_logits(clrt_model *m, acts *a, float *logits, const float *xn, int B) {
  int C = m->cfg.hidden_size, V = m->cfg.vocab_size;
  clrt_cuda_linear_forward(a->logits, xn, PW(m, m->head), NULL, B, C, V);
  model_lora_head_decode(m, a, a->logits, xn, B);
  return m->ops->download(logits, a->logits, sizeof(float) * (size_t)B * V);
}

static void cuda_attention(const clrt_model *m, acts *a, float *out, float *lse, const float *q,
                           const float *k, const float *v, const attn_args *s) {
  clrt_cuda_attention_forward(out, lse, q, k, v, s->B, s->T, s->H, s->KV, s->D, s->pos0,
                              s->kv_bstride, s->slot, s->window);
}

static void cuda_attention_backward(const clrt_model *m, acts *a, const layer_acts *A, int B, int T, int window) {
  const clrt_model_config *c = &m->cfg;
  clrt_cuda_attention_backward(a->dq, a->dk, a->dv, a->datt, A->q, A->k, A->v, A->att, A->lse, B, T,
                               c->num_attention_heads, c->num_key_value_heads, c->head_dim, window, a->attn);
}

static size_t cuda_attention_scratch(const clrt_model *m, int threads, int B, int T, int Tk) {
  (void)threads;
  return clrt_cuda_attention_scratch_floats(B, T, m->cfg.num_attention_heads);
}

static void cuda_zero(float *p, size_t n) { clrt_cuda_memset0(p, sizeof(float) * n); }
static int cuda_upload(void *dst, const void *src, size_t bytes) { return clrt_cuda_memcpy(dst, src, bytes, 0); }
static int cuda_copy(void *dst, const void *src, size_t bytes) { return clrt_cuda_memcpy(dst, src, bytes, 2); }
static int cuda_download(void *dst, const void *src, size_t bytes) {
  return clrt_cuda_sync() || clrt_cuda_memcpy(dst, src, bytes, 1) ? -1 : 0;
}

/* The packed head is the CPU kernels' (always NULL here). */
static void cuda_output(float *lp, float *lse, const float *x, const float *w, const float *wp, int fast,
                        const int32_t *target, int64_t N, int C, int V, float *scratch, int chunk,
                        const clrt_head_lora *hl) {
  (void)wp, (void)fast;
  clrt_cuda_logsoftmax_gather_forward_lora(lp, lse, x, w, target, N, C, V, scratch, chunk, hl);
}

static void cuda_output_backward(float *dx, float *dw, const float *dlp, const float *x, const float *w,
                                 const float *wp, int fast, const int32_t *target, const float *lse, int64_t N,
                                 int C, int V, float *scratch, int chunk, int logits_ready, const clrt_head_lora *hl) {
  (void)wp, (void)fast;
  clrt_cuda_logsoftmax_gather_backward_lora(dx, dw, dlp, x, w, target, lse, N, C, V, scratch, chunk, logits_ready,
                                            hl);
}

/* The adapters' kernels need no host workspace here. */
static void cuda_lora_forward(clrt_model *m, acts *a, float *y, float *xa, const float *xd, const float *A,
                              const float *B, int64_t N, int K, int O, int r, float scale) {
  (void)m, (void)a;
  clrt_cuda_lora_forward(y, xa, xd, A, B, N, K, O, r, scale);
}

static void cuda_lora_backward(clrt_model *m, acts *a, float *dx, float *dA, float *dB, float *dxa, float *xd,
                               const float *dy, const float *xa, const float *A, const float *B, int64_t N, int K, int O, int r,
                               float scale, uint64_t key, float p) {
  (void)m, (void)a;
  clrt_cuda_lora_backward(dx, dA, dB, dxa, xd, dy, xa, A, B, N, K, O, r, scale, key, p);
}

/* AdamW's tensor table: the segments [np], then (16-byte aligned) the norm's partials and
   the norm, uploaded once per optimizer. */
static size_t adamw_segs_bytes(int np) { return (sizeof(clrt_cuda_adamw_seg) * (size_t)np + 15) & ~(size_t)15; }

static clrt_storage *cuda_adamw_table(const clrt_param_info *p, int np, const uint8_t *decay) {
  size_t segb = sizeof(clrt_cuda_adamw_seg) * (size_t)np;
  size_t extra = sizeof(double) * ((size_t)clrt_cuda_adamw_partials() + 1);
  clrt_cuda_adamw_seg *segs = malloc(segb);
  if (!segs) {
    clrt_set_error("adamw: out of memory");
    return NULL;
  }
  for (int i = 0; i < np; i++) segs[i] = (clrt_cuda_adamw_seg){p[i].offset, p[i].numel, decay[i]};
  clrt_storage *t = clrt_storage_new(adamw_segs_bytes(np) + extra, CLRT_CUDA);
  if (t && clrt_cuda_memcpy(t->data, segs, segb, 0)) {
    clrt_storage_release(t);
    t = NULL;
  }
  free(segs);
  return t;
}

static int cuda_adamw_step(clrt_storage *table, int np, float *P, float *M1, float *M2, const float *G,
                           int64_t total, float lr, float beta1, float beta2, float eps, float weight_decay,
                           float grad_clip, float bc1, float bc2_sqrt, double *norm) {
  double *partial = (double *)((char *)table->data + adamw_segs_bytes(np)),
         *norm_dev = partial + clrt_cuda_adamw_partials();
  clrt_cuda_adamw_step(P, M1, M2, G, total, table->data, np, partial, norm_dev, lr, beta1, beta2, eps,
                       weight_decay, grad_clip, bc1, bc2_sqrt);
  return clrt_cuda_sync() || clrt_cuda_memcpy(norm, norm_dev, sizeof *norm, 1) ? -1 : 0;
}

#define CUDA_OPS(to16, bf16, label)                                                                \
  {                                                                                               \
    .name = label, .decode_logits = cuda_decode_logits, .rmsnorm = clrt_cuda_rmsnorm_forward,                    \
    .rmsnorm_backward = clrt_cuda_rmsnorm_backward, .rope = clrt_cuda_rope_forward,               \
    .rope_backward = clrt_cuda_rope_backward, .attention = cuda_attention,                        \
    .attention_backward = cuda_attention_backward, .attention_scratch = cuda_attention_scratch,   \
    .kv_write = clrt_cuda_kv_write, .swiglu = clrt_cuda_swiglu_forward,                           \
    .swiglu_backward = clrt_cuda_swiglu_backward, .add = clrt_cuda_residual_forward,              \
    .embedding = clrt_cuda_embedding_forward, .embedding_backward = clrt_cuda_embedding_backward, \
    .output = cuda_output, .output_backward = cuda_output_backward,                               \
    .gather_rows = clrt_cuda_gather_rows, .scatter_rows = clrt_cuda_scatter_rows,                 \
    .lora_dropout = clrt_cuda_lora_dropout, .lora_forward = cuda_lora_forward,                    \
    .lora_backward = cuda_lora_backward, .lora_xa = clrt_cuda_lora_xa,                             \
    .lora_input_backward = clrt_cuda_lora_input_backward,                                         \
    .lora_embed_forward = clrt_cuda_lora_embed_forward,                                           \
    .lora_embed_backward = clrt_cuda_lora_embed_backward,                                         \
    .zero = cuda_zero, .upload = cuda_upload, .download = cuda_download, .copy = cuda_copy,        \
    .sync = clrt_cuda_sync, .adamw_table = cuda_adamw_table, .adamw_step = cuda_adamw_step,       \
    .to_bf16 = to16, .bf16_scratch = bf16, .logits_staged = 1,                            \
  }

static const model_ops cuda_ops = CUDA_OPS(NULL, 0, "cuda f32");
static const model_ops cuda_bf16_ops = CUDA_OPS(clrt_cuda_f32_to_bf16, 1, "cuda bf16");

const model_ops *model_cuda_ops(int bf16) {
  model_prof_sync = clrt_cuda_sync;
  return bf16 ? &cuda_bf16_ops : &cuda_ops;
}

#else

const model_ops *model_cuda_ops(int bf16) { return NULL; }
const weight_format *model_cuda_format(int bf16) { return NULL; }

#endif
