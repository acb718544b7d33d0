/* cuda_kernels.h — the CUDA kernels of the transformer, callable from C. Each has the
   signature of its CPU twin in kernels/cpu/model_kernels.h with the prefix clrt_cuda_ and
   device pointers; all run in order on the one clrt stream (clrt_cuda_stream()), so a step
   is a sequence of launches with no host synchronisation. Launch and cuBLAS failures are
   remembered (first one wins) until the runtime takes them (clrt_cuda_take_note) at the end
   of a step. Only built with CLRT_CUDA; include only under CLRT_HAVE_CUDA. */
#ifndef CLRT_CUDA_KERNELS_H
#define CLRT_CUDA_KERNELS_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- launch_context.cu: the stream and cuBLAS handle every kernel launches on ------------ */
/* Made and destroyed by the runtime (runtime/core/cuda_context.h: clrt_cuda_init,
   clrt_cuda_shutdown); -1 and a message in err when the stream or the handle cannot be made. */
int clrt_cuda_launch_context_create(char *err, size_t n);
void clrt_cuda_launch_context_destroy(void);
void *clrt_cuda_stream(void);                       /* cudaStream_t */
/* The first launch or cuBLAS failure since the last call ("cuda: <kernel>: <error>"), then
   cleared: 1 and the message in buf, or 0 when there was none. */
int clrt_cuda_take_note(char *buf, size_t n);

/* ---- elementwise.cu -------------------------------------------------------------------- */
void clrt_cuda_embedding_forward(float *out /* [N, C] */, const int32_t *tok /* [N] */,
                                 const float *wte /* [V, C] */, int64_t N, int C);
/* dwte += scatter; each thread owns a column and walks rows in order (deterministic, and the
   same summation order as the CPU). */
void clrt_cuda_embedding_backward(float *dwte /* [V, C] += */, const float *dout /* [N, C] */,
                                  const int32_t *tok /* [N] */, int64_t N, int C);
void clrt_cuda_swiglu_forward(float *h /* [n] */, const float *g, const float *u, int64_t n);
void clrt_cuda_swiglu_backward(float *dg /* [n] = */, float *du /* [n] = */, const float *dh,
                               const float *g, const float *u, int64_t n);
void clrt_cuda_residual_forward(float *out /* [n] */, const float *a, const float *b, int64_t n);
void clrt_cuda_residual_backward(float *da /* += or NULL */, float *db /* += or NULL */,
                                 const float *dout, int64_t n);
/* bf16 copies of f32 buffers (matmul inputs; round to nearest even as clrt_f32_to_bf16). */
void clrt_cuda_f32_to_bf16(uint16_t *out /* [n] */, const float *in /* [n] */, int64_t n);

/* Model plumbing: dst[i] = src[rowidx[i]] (gather), dst[rowidx[i]] = src[i] (scatter), and the
   KV-cache write of new rows: cache[slot[b]][pos0[b] + t] = k[b][t] (row = KV*D floats,
   bstride = cache_T * row). */
void clrt_cuda_gather_rows(float *dst /* [nv, C] */, const float *src /* [N, C] */,
                           const int32_t *rowidx /* [nv] */, int64_t nv, int C);
void clrt_cuda_scatter_rows(float *dst /* [N, C] */, const float *src /* [nv, C] */,
                            const int32_t *rowidx /* [nv] */, int64_t nv, int C);
void clrt_cuda_kv_write(float *kc, float *vc /* [slots, cache_T, row] */, const float *k,
                        const float *v /* [B, T, row] */, const int32_t *pos0 /* [B] */,
                        const int32_t *slot /* [B] or NULL */, int B, int T, int row, int64_t bstride);

/* ---- linear.cu (cuBLAS) ---------------------------------------------------------------- */
void clrt_cuda_linear_forward(float *y /* [N, O] */, const float *x /* [N, K] */,
                              const float *w /* [O, K] */, const float *b /* [O] or NULL */,
                              int64_t N, int K, int O);
void clrt_cuda_linear_backward(float *dx /* [N, K] or NULL */, float *dw /* [O, K] += */,
                               float *db /* [O] += or NULL */, const float *dy /* [N, O] */,
                               const float *x /* [N, K] */, const float *w /* [O, K] */,
                               int64_t N, int K, int O, int dx_accumulate);
/* bf16 inputs, fp32 accumulation and output (cublasGemmEx, CUBLAS_COMPUTE_32F): the same
   products with x, w (and dy for backward) given as bf16 copies; dw stays an fp32 master
   gradient (+=). */
/* ---- lora.cu: the LoRA adapter ops of kernels/cpu/lora.c, same arguments --------------- */
void clrt_cuda_lora_dropout(float *out, const float *x, int64_t n, uint64_t key, float p);
void clrt_cuda_lora_forward(float *y, float *xa, const float *xd, const float *A, const float *B,
                            int64_t N, int K, int O, int r, float scale);
void clrt_cuda_lora_backward(float *dx, float *dA, float *dB, float *dxa, float *xd, const float *dy,
                             const float *xa, const float *A, const float *B, int64_t N, int K,
                             int O, int r, float scale, uint64_t key, float p);
void clrt_cuda_lora_xa(float *xa, const float *xd, const float *A, int64_t N, int K, int r);
void clrt_cuda_lora_input_backward(float *dx, float *dA, const float *dxa, float *xd, const float *A, int64_t N,
                                   int K, int r, uint64_t key, float p);
void clrt_cuda_lora_embed_forward(float *y, float *ea, const int32_t *tok, const float *A, const float *B,
                                  int64_t N, int V, int C, int r, float scale);
void clrt_cuda_lora_embed_backward(float *dA, float *dB, float *dea, const float *dy, const float *ea,
                                   const int32_t *tok, const float *B, int64_t N, int V, int C, int r, float scale);
/* The output layer's adapter inside the fused log-softmax (lora_math.h's clrt_head_lora, a
   host struct of device pointers): z [rows, V] += its share of rows n0 ..; backward from dz. */
struct clrt_head_lora;
void clrt_cuda_lora_head_block(float *z, const struct clrt_head_lora *hl, int64_t n0, int rows, int V);
void clrt_cuda_lora_head_block_backward(const float *dz, const struct clrt_head_lora *hl, int64_t n0, int rows,
                                        int V);
void clrt_cuda_linear_forward_bf16(float *y /* [N, O] */, const uint16_t *x /* [N, K] */,
                                   const uint16_t *w /* [O, K] */, const float *b /* [O] or NULL */,
                                   int64_t N, int K, int O);
void clrt_cuda_linear_backward_bf16(float *dx /* [N, K] or NULL */, float *dw /* [O, K] += */,
                                    float *db /* [O] += or NULL */, const float *dy /* [N, O] f32 */,
                                    const uint16_t *dy16 /* [N, O] */, const uint16_t *x /* [N, K] */,
                                    const uint16_t *w /* [O, K] */, int64_t N, int K, int O,
                                    int dx_accumulate);

/* ---- rmsnorm.cu ------------------------------------------------------------------------- */
void clrt_cuda_rmsnorm_forward(float *out /* [N, C] */, float *rstd /* [N] */,
                               const float *x /* [N, C] */, const float *w /* [C] */, int64_t N,
                               int C, float eps);
void clrt_cuda_rmsnorm_backward(float *dx /* [N, C] += */, float *dw /* [C] += */,
                                const float *dout /* [N, C] */, const float *x /* [N, C] */,
                                const float *w /* [C] */, const float *rstd /* [N] */, int64_t N,
                                int C);

/* ---- rope.cu (cos/sin tables on the device, built on the host by clrt_rope_table) ------ */
void clrt_cuda_rope_forward(float *x /* [B, T, nh, D] */, const float *cos_t /* [P, R/2] */, const float *sin_t /* [P, R/2] */,
                            const int32_t *pos0 /* [B] or NULL */, int B, int T, int nh, int D, int R);
void clrt_cuda_rope_backward(float *dx /* [B, T, nh, D] */, const float *cos_t /* [P, R/2] */, const float *sin_t /* [P, R/2] */,
                             const int32_t *pos0 /* [B] or NULL */, int B, int T, int nh, int D, int R);

/* ---- attention.cu: causal GQA, online softmax, no [T, T] matrix -------------------------- */
/* As clrt_attention_forward (pos0, kv_bstride, kv_row: device arrays or NULL; window as
   there). D <= 256. */
void clrt_cuda_attention_forward(float *out /* [B, Tq, H, D] */, float *lse /* [B, H, Tq] or NULL */,
                                 const float *q /* [B, Tq, H, D] */, const float *k, const float *v,
                                 int B, int Tq, int H, int KV, int D,
                                 const int32_t *pos0 /* [B] or NULL */, int64_t kv_bstride,
                                 const int32_t *kv_row /* [B] or NULL */, int window);
size_t clrt_cuda_attention_scratch_floats(int B, int T, int H);
/* Training only. dq =, dk =, dv =; scratch: clrt_cuda_attention_scratch_floats floats. */
void clrt_cuda_attention_backward(float *dq /* [B, T, H, D] */, float *dk /* [B, T, KV, D] */,
                                  float *dv /* [B, T, KV, D] */, const float *dout /* [B, T, H, D] */,
                                  const float *q, const float *k, const float *v,
                                  const float *out /* [B, T, H, D] */, const float *lse /* [B, H, T] */,
                                  int B, int T, int H, int KV, int D, int window, float *scratch);

/* ---- logsoftmax_gather.cu --------------------------------------------------------------- */
void clrt_cuda_logsoftmax_gather_forward(float *lp /* [N] */, float *lse /* [N] or NULL */,
                                         const float *x /* [N, C] */, const float *w /* [V, C] */,
                                         const int32_t *target /* [N] */, int64_t N, int C, int V,
                                         float *scratch /* [chunk, V] */, int chunk);
void clrt_cuda_logsoftmax_gather_backward(float *dx /* [N, C] = */, float *dw /* [V, C] += */,
                                          const float *dlp /* [N] */, const float *x /* [N, C] */,
                                          const float *w /* [V, C] */, const int32_t *target /* [N] */,
                                          const float *lse /* [N] */, int64_t N, int C, int V,
                                          float *scratch /* [chunk, V] */, int chunk, int logits_ready);
/* The same with a LoRA adapter beside the output layer (NULL: none). */
void clrt_cuda_logsoftmax_gather_forward_lora(float *lp, float *lse, const float *x, const float *w,
                                              const int32_t *target, int64_t N, int C, int V, float *scratch,
                                              int chunk, const struct clrt_head_lora *hl);
void clrt_cuda_logsoftmax_gather_backward_lora(float *dx, float *dw, const float *dlp, const float *x,
                                               const float *w, const int32_t *target, const float *lse, int64_t N,
                                               int C, int V, float *scratch, int chunk, int logits_ready,
                                               const struct clrt_head_lora *hl);

/* ---- adamw.cu ----------------------------------------------------------------------------- */
/* One tensor of the arena: offset/numel in floats, decay 0/1. */
typedef struct clrt_cuda_adamw_seg {
  int64_t offset, numel;
  int decay;
} clrt_cuda_adamw_seg;
/* Global gradient norm into *norm_dev (device double), then the update of every segment
   with the clip scale computed on the device; skipped on the device when the norm is not
   finite (the caller reads the norm afterwards and reports it). segs: device array [nseg];
   partial: device scratch of clrt_cuda_adamw_partials() doubles. */
int clrt_cuda_adamw_partials(void);
void clrt_cuda_adamw_step(float *P, float *M1, float *M2, const float *G, int64_t total,
                          const clrt_cuda_adamw_seg *segs, int nseg, double *partial,
                          double *norm_dev, float lr, float beta1, float beta2, float eps,
                          float weight_decay, float grad_clip, float bc1, float bc2_sqrt);

/* ---- sample.c semantics on the device ----------------------------------------------------- */
/* One block per row; the parameters as clrt_sample_params (temperature, top_k, top_p) in three
   device arrays; uniforms: device [B]; allowed: device [B, V] 0/1 or NULL. Token -1 (and
   logprob -inf) marks a row with no allowed token. */
void clrt_cuda_sample(const float *logits /* [B, V] */, int B, int V, const float *temperature,
                      const int32_t *top_k, const float *top_p, const double *uniforms,
                      const uint8_t *allowed, int32_t *tokens /* [B] */, float *logprobs /* [B] */);

#ifdef __cplusplus
}
#endif
#endif
