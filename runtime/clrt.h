/*
 * clrt.h — the one public interface of the clrt runtime.
 *
 * The binary embeds this file and Lua's FFI cdef()s it (lua/clrt/core/ffi.lua), so below the
 * include guard it holds only plain C declarations: lines starting with '#' are stripped
 * before the FFI sees them, and no macro may appear inside a declaration.
 *
 * Conventions: a function returns 0 (or a non-NULL pointer) on success; on failure it
 * returns a negative status (or NULL) and sets a message that clrt_last_error() returns.
 * Nothing aborts the process on bad input. Tensors are handles on the heap; free them
 * with clrt_tensor_free (Lua does it through ffi.gc).
 */
#ifndef CLRT_H
#define CLRT_H
#include <stddef.h>
#include <stdint.h>

/* ==== core: errors, version, interrupts (core/core.c) ==================================== */

const char *clrt_version(void);
const char *clrt_ffi_header(void);
const char *clrt_last_error(void);
void clrt_set_error(const char *fmt, ...);
void clrt_clear_error(void);
/* Ctrl-C sets this flag; long C operations poll it between steps and fail with "interrupted". */
int clrt_interrupted(void);
void clrt_set_interrupt(int on);
int clrt_num_threads(void);
void clrt_set_num_threads(int n);
/* The directory holding clrt's Lua files (installed share dir, or the source tree). */
const char *clrt_lua_dir(void);
/* CUDA devices visible to this build; 0 when built without CUDA or with no GPU. */
int clrt_cuda_device_count(void);


/* ==== tensors (core/tensor.c) ============================================================ */

enum { CLRT_MAX_DIMS = 8 };
typedef enum { CLRT_F32 = 0, CLRT_BF16 = 1, CLRT_I32 = 2 } clrt_dtype;
typedef enum { CLRT_CPU = 0, CLRT_CUDA = 1 } clrt_device;

/* Reference-counted memory shared by all views of it (an arena is one storage). */
typedef struct clrt_storage {
  void *data;
  size_t bytes;
  int refcount;
  int device;
  uint64_t version;   /* counts writes through the tensor API (clrt_storage_written) */
  uint64_t serial;    /* unique among the process's storages: tells a new arena from an old one */
} clrt_storage;

/* Every write through the tensor API bumps its storage's version, so copies derived from a
   storage (a model's bf16 and packed weights) can tell that they are stale. */
void clrt_storage_written(clrt_storage *s);

typedef struct clrt_tensor {
  clrt_storage *storage;
  int64_t offset;                    /* in elements from storage->data */
  int ndim;
  int dtype_id;                      /* clrt_dtype; named so Lua's t:dtype() method stays free */
  int device_id;                     /* clrt_device */
  int64_t dims[8];                   /* sizes; t:shape() in Lua */
  int64_t strides[8];                /* in elements */
} clrt_tensor;

size_t clrt_dtype_size(int dtype);
const char *clrt_dtype_name(int dtype);
clrt_storage *clrt_storage_new(size_t bytes, int device);
void clrt_storage_retain(clrt_storage *s);
void clrt_storage_release(clrt_storage *s);
/* Gives back the whole 2 MiB pages of host memory inside [a, b) (large storages sit on
   transparent huge pages, and a huge page given back only in part is freed under memory
   pressure only): they read zero again and become resident as they are written. Returns
   where it stopped (b rounded down to a page, or a when no whole page lies inside). */
const void *clrt_give_back_pages(const void *a, const void *b);

/* New contiguous tensor, zero-filled. */
clrt_tensor *clrt_tensor_new(int dtype, int ndim, const int64_t *shape, int device);
/* A view over storage (retains it); strides NULL means contiguous. */
clrt_tensor *clrt_tensor_over(clrt_storage *s, int dtype, int ndim, const int64_t *shape,
                              const int64_t *strides, int64_t offset);
void clrt_tensor_free(clrt_tensor *t);
int64_t clrt_tensor_numel(const clrt_tensor *t);
int clrt_tensor_is_contiguous(const clrt_tensor *t);
void *clrt_tensor_data(const clrt_tensor *t);   /* address of element 0 */
/* Views: share storage, copy nothing. */
clrt_tensor *clrt_tensor_reshape(const clrt_tensor *t, int ndim, const int64_t *shape);
clrt_tensor *clrt_tensor_narrow(const clrt_tensor *t, int dim, int64_t start, int64_t len);
clrt_tensor *clrt_tensor_transpose(const clrt_tensor *t, int d0, int d1);
/* Element access by flat logical index (row-major over the view), as double. */
double clrt_tensor_get(const clrt_tensor *t, int64_t index);
int clrt_tensor_set(clrt_tensor *t, int64_t index, double value);
/* Copies with dtype conversion and any strides; shapes must have equal numel. */
int clrt_tensor_copy_(clrt_tensor *dst, const clrt_tensor *src);
clrt_tensor *clrt_tensor_clone(const clrt_tensor *t);
clrt_tensor *clrt_tensor_to_dtype(const clrt_tensor *t, int dtype);
int clrt_tensor_fill_(clrt_tensor *t, double value);
/* Seeded RNG (xoshiro256**); the state lives with the caller. */
typedef struct clrt_rng { uint64_t s[4]; } clrt_rng;
void clrt_rng_seed(clrt_rng *r, uint64_t seed);
uint64_t clrt_rng_next(clrt_rng *r);
double clrt_rng_uniform(clrt_rng *r);          /* [0, 1) */
double clrt_rng_normal(clrt_rng *r);
int clrt_tensor_rand_(clrt_tensor *t, clrt_rng *r);   /* uniform [0, 1) */
int clrt_tensor_randn_(clrt_tensor *t, clrt_rng *r);  /* standard normal */


/* ==== tensor ops (core/tensor_ops.c) ===================================================== */
/* Elementwise ops broadcast like numpy. Result dtypes: the wider of the two (f32 > bf16 > i32;
   a number does not widen a tensor unless it is fractional and the tensor is i32); i32
   division gives f32; comparisons give f32 0/1. bf16 math runs in f32. In-place ops (name_)
   broadcast the second operand into the first and keep its dtype. Dimensions are 0-based. */
typedef enum {
  CLRT_OP_ADD = 0, CLRT_OP_SUB, CLRT_OP_MUL, CLRT_OP_DIV, CLRT_OP_POW, CLRT_OP_MAXIMUM,
  CLRT_OP_MINIMUM, CLRT_OP_EQ, CLRT_OP_NE, CLRT_OP_LT, CLRT_OP_LE, CLRT_OP_GT, CLRT_OP_GE,
  CLRT_OP_BINARY_COUNT
} clrt_binary_op;
typedef enum {
  CLRT_OP_NEG = 0, CLRT_OP_ABS, CLRT_OP_EXP, CLRT_OP_LOG, CLRT_OP_SQRT, CLRT_OP_TANH,
  CLRT_OP_SIGMOID, CLRT_OP_RELU, CLRT_OP_UNARY_COUNT
} clrt_unary_op;
typedef enum {
  CLRT_RED_SUM = 0, CLRT_RED_MEAN, CLRT_RED_MAX, CLRT_RED_MIN, CLRT_RED_ARGMAX, CLRT_RED_ARGMIN,
  CLRT_RED_COUNT
} clrt_reduce_op;
const char *clrt_binary_op_name(int op);
const char *clrt_unary_op_name(int op);
const char *clrt_reduce_op_name(int op);
/* a, b: any shapes that broadcast; result: the broadcast shape, contiguous. */
clrt_tensor *clrt_tensor_binary(int op, const clrt_tensor *a, const clrt_tensor *b);
/* a op s, or s op a when scalar_first is 1. */
clrt_tensor *clrt_tensor_binary_scalar(int op, const clrt_tensor *a, double s, int scalar_first);
/* a: [...]; b: broadcasts to a's shape. */
int clrt_tensor_binary_(int op, clrt_tensor *a, const clrt_tensor *b);
int clrt_tensor_binary_scalar_(int op, clrt_tensor *a, double s);
clrt_tensor *clrt_tensor_unary(int op, const clrt_tensor *a);
int clrt_tensor_unary_(int op, clrt_tensor *a);
/* cond nonzero picks a, else b; all three broadcast (cond: any dtype). */
clrt_tensor *clrt_tensor_where(const clrt_tensor *cond, const clrt_tensor *a, const clrt_tensor *b);
/* t: [...]; mask: broadcasts to t's shape, nonzero where value goes. */
int clrt_tensor_masked_fill_(clrt_tensor *t, const clrt_tensor *mask, double value);
/* a: [..., n, ...] -> [..., ...] (or [..., 1, ...] with keepdim), reducing dimension dim
   (0-based). sum/max/min keep the dtype (sums accumulate in double, i32 sums in int64 and
   wrap into int32), mean gives f32 for i32, argmax/argmin give i32 0-based positions. */
clrt_tensor *clrt_tensor_reduce(int op, const clrt_tensor *a, int dim, int keepdim);
/* Reduce everything to one number (i32 sums exact); argmax/argmin give the 0-based flat index. */
int clrt_tensor_reduce_all(int op, const clrt_tensor *a, double *out);
/* a: [...] -> same shape: softmax (log_softmax when use_log is 1) over dim, computed as
   exp(x - max) for stability. */
clrt_tensor *clrt_tensor_softmax(const clrt_tensor *a, int dim, int use_log);
/* a: [..., M, K] or [K]; b: [..., K, N] or [K] -> [..., M, N] (vector dims dropped).
   numpy matmul: 1-D operands are vectors, batch dimensions broadcast; OpenBLAS sgemm (bf16 and
   i32 go through f32; i32 results round and saturate). */
clrt_tensor *clrt_tensor_matmul(const clrt_tensor *a, const clrt_tensor *b);


/* ==== model: the Llama-family transformer (runtime/model/) =============================== */

/* The architecture's numbers. lua/clrt/model.lua fills it from config.json (and checks it);
   C trusts only what clrt_model_new validates again. */
typedef struct clrt_model_config {
  int vocab_size, hidden_size, intermediate_size, num_hidden_layers;
  int num_attention_heads, num_key_value_heads, head_dim, max_position_embeddings;
  float rms_norm_eps;
  double rope_theta;
  /* The leading dimensions of each head that RoPE rotates: head_dim x partial_rotary_factor
     (Phi-4-mini: 96 of 128), even; the rest pass unrotated, as transformers' partial rotary
     does. 0: the whole head. Every RoPE table and per-pair list below is rope_dim / 2 wide. */
  int rope_dim;
  int rope_scaling;                 /* CLRT_ROPE_* */
  double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
  int rope_original_max_position;   /* llama3, yarn, longrope: original_max_position_embeddings */
  /* yarn and longrope scale cos and sin by rope_attention_factor (0: transformers' default
     from rope_factor). yarn: rope_beta_fast/slow (0: 32 and 1), rope_yarn_truncate.
     longrope (su): pair i's frequency is divided by rope_short_factor[i] in a call whose
     positions stay within rope_original_max_position, by rope_long_factor[i] past it (rope_dim
     <= 512). dynamic: a call reaching past max_position_embeddings rotates with the NTK base
     grown for its length (transformers' dynamic_frequency_update). */
  double rope_attention_factor, rope_beta_fast, rope_beta_slow;
  int rope_yarn_truncate;
  float rope_short_factor[256], rope_long_factor[256];
  int tie_word_embeddings;
  /* has_padding_idx: the embedding lookup gives row padding_idx (pad_token_id) no gradient, as
     transformers' nn.Embedding(padding_idx=pad_token_id) does (a tied output layer's does). */
  int has_padding_idx, padding_idx;
  int qkv_bias;                     /* q/k/v projections carry biases (Qwen2; attention_bias) */
  int o_bias;                       /* o_proj carries a bias (Llama/Qwen3 attention_bias) */
  int qk_norm;                      /* per-head RMSNorm of q and k before RoPE (Qwen3) */
  /* config.json's sliding_window (0: none): position p attends keys p - sliding_window < j <= p
     (model_layer_window): every layer of Mistral and Phi-3, Gemma 3's local layers. Phi-3: q/k/v and gate/up live fused in one tensor each
     (qkv_proj, gate_up_proj), the layout and names of its checkpoints. */
  int sliding_window;
  int fused_qkv_gate_up;
  int max_batch, max_seq;           /* activation arena's first size; it grows past them */
  double keep_logits_mb;            /* backward reuses forward's logits when they fit (0: recompute) */
  /* Gemma 3 (gemma3 != 0; runtime/model/gemma3.c): norms scaled by (1 + w), a norm after
     attention and after the MLP, GELU-tanh gated MLP, embeddings times sqrt(hidden_size),
     scores times query_pre_attn_scalar^-1/2. Layer l is local unless (l + 1) is a multiple of
     sliding_window_pattern: it sees the last sliding_window positions and rotates with
     rope_local_theta (no scaling); global layers see all and use rope_theta and rope_scaling.
     final_logit_softcapping > 0: logits become cap tanh(logits / cap) (0: none), and
     attn_logit_softcapping the same for the scaled attention scores. */
  int gemma3;
  double query_pre_attn_scalar;
  int sliding_window_pattern;
  double rope_local_theta;
  double final_logit_softcapping, attn_logit_softcapping;
} clrt_model_config;
enum { CLRT_ROPE_DEFAULT = 0, CLRT_ROPE_LINEAR = 1, CLRT_ROPE_LLAMA3 = 2, CLRT_ROPE_YARN = 3,
       CLRT_ROPE_LONGROPE = 4, CLRT_ROPE_DYNAMIC = 5 };
enum { CLRT_ARENA_PARAMS = 0, CLRT_ARENA_GRADS = 1, CLRT_ARENA_ACTIVATIONS = 2, CLRT_ARENA_COUNT = 3 };

typedef struct clrt_model clrt_model;
/* Parameters start at zero: follow with clrt_model_init_random or clrt_model_load_safetensors. */
clrt_model *clrt_model_new(const clrt_model_config *cfg);
void clrt_model_free(clrt_model *m);
/* GPT-2 style: N(0, 0.02) matrices, N(0, 0.02/sqrt(2 layers)) for o_proj and down_proj,
   norms 1, biases 0. */
int clrt_model_init_random(clrt_model *m, uint64_t seed);
/* Reads every tensor of one safetensors file (F32/BF16/F16 on disk) into the parameters,
   checking names and shapes against the config; a tensor may be loaded only once. */
int clrt_model_load_safetensors(clrt_model *m, const char *path);
/* After the last file: fails naming the first parameter no file provided. */
int clrt_model_check_loaded(const clrt_model *m, const char *where);
int clrt_model_save_safetensors(const clrt_model *m, const char *path);
/* Parameters by index, with Hugging Face names (lm_head.weight only when untied). */
int clrt_model_num_tensors(const clrt_model *m);
const char *clrt_model_tensor_name(const clrt_model *m, int i);
int clrt_model_tensor_is_matrix(const clrt_model *m, int i);
clrt_tensor *clrt_model_param(clrt_model *m, int i);   /* a view into the params arena */
clrt_tensor *clrt_model_grad(clrt_model *m, int i);    /* allocates the grads arena on first use */
int64_t clrt_model_num_params(const clrt_model *m);
/* inv [rope_dim/2]: the inverse frequencies a call whose positions reach seq_len rotates with
   (longrope and dynamic depend on it; 0: the model's own tables), and *attention_factor the
   scale its cos and sin carry (yarn, longrope; else 1). */
int clrt_model_rope_inv_freq(const clrt_model *m, int seq_len, float *inv, double *attention_factor);
size_t clrt_model_memory(const clrt_model *m, int arena);
/* lp[b][t] = log p(tokens[b][t+1] | tokens[b][..t]) for t + 1 < lengths[b], else 0.
   tokens: [B, T] row-major; lengths: [B] or NULL (all T); lp: [B, T-1].
   keep != 0 keeps what clrt_model_backward needs. */
int clrt_model_logprobs(clrt_model *m, const int32_t *tokens, int B, int T,
                        const int32_t *lengths, float *lp, int keep);
/* clrt_model_logprobs that also writes hidden [B, T-1, C]: the final norm's output at each
   position with a target (what the output layer reads; a value head's input), 0 elsewhere. */
int clrt_model_logprobs_hidden(clrt_model *m, const int32_t *tokens, int B, int T,
                               const int32_t *lengths, float *lp, float *hidden, int keep);
/* clrt_model_logprobs_hidden where row b's first context[b] tokens are context only (a
   prompt): lp[b][t] is 0 for t + 1 < context[b] and the output layer skips those positions
   (the others' values are the same bits). context: [B] or NULL (none); hidden may be NULL. */
int clrt_model_logprobs_context(clrt_model *m, const int32_t *tokens, int B, int T, const int32_t *lengths,
                                const int32_t *context, float *lp, float *hidden, int keep);
/* dlogp: [B, T-1] of the last kept forward; accumulates into the gradients. */
int clrt_model_backward(clrt_model *m, const float *dlogp);
/* As clrt_model_backward, with dhidden [B, T-1, C] (or NULL): dL/d the hidden states that
   clrt_model_logprobs_hidden wrote, added where the output layer's gradient enters the norm. */
int clrt_model_backward_hidden(clrt_model *m, const float *dlogp, const float *dhidden);
int clrt_model_zero_grad(clrt_model *m);
/* Decode with a KV cache: runs tokens [B, Tn] at positions pos0[b] + t, writing each layer's
   new keys/values into kcache[l] / vcache[l] ([S, cache_T, KV, D] each, the caller's) at
   cache row slot[b] (slot NULL: row b; the caller keeps slots distinct and in range) and
   attending over positions 0 .. pos0[b] + t of that row. logits: [B, V], the next-token
   logits after position last[b] of each row (NULL: Tn - 1). Keeps nothing for backward. */
int clrt_model_forward_cached(clrt_model *m, const int32_t *tokens, int B, int Tn,
                              const int32_t *pos0, const int32_t *slot, const int32_t *last,
                              float *const *kcache, float *const *vcache, int cache_T,
                              float *logits);
/* -- contexts (model/context.c) --
   A context is one computation over a model: its activations, workspace, the kept forward
   for backward and the shared-prefix layout. The model (config, weights and their copies,
   adapters) is shared and only read while contexts run, so several contexts over one model
   may run at the same time, one per thread. The clrt_model_* entry points above compute in
   the model's own default context. Gradients are the model's: one context trains at a time.
   The optimizer step (and loads, moves, mode switches) must not run while a context does: a
   call that finds the weights changed under it (or a backward whose forward read other
   weights) fails with an error saying so rather than mix two versions. Free every context
   before its model. */
typedef struct clrt_context clrt_context;
clrt_context *clrt_context_new(clrt_model *m);
void clrt_context_free(clrt_context *x);
/* The model's default context (owned by the model). */
clrt_context *clrt_model_context(clrt_model *m);
/* clrt_model_logprobs_context, clrt_model_backward_hidden and clrt_model_forward_cached in x. */
int clrt_context_logprobs(clrt_context *x, const int32_t *tokens, int B, int T, const int32_t *lengths,
                          const int32_t *context, float *lp, float *hidden, int keep);
int clrt_context_backward(clrt_context *x, const float *dlogp, const float *dhidden);
int clrt_context_forward_cached(clrt_context *x, const int32_t *tokens, int B, int Tn,
                                const int32_t *pos0, const int32_t *slot, const int32_t *last,
                                float *const *kcache, float *const *vcache, int cache_T,
                                float *logits);
/* The weights' version the context's kept forward read (0 with none kept). */
uint64_t clrt_context_weights_version(const clrt_context *x);
/* -- LoRA adapters (model/lora.c) -- */
/* Adds adapters of rank r beside the targets (bits: q, k, v, o, gate, up, down projections,
   then lm_head and embed_tokens): y += alpha/r * (dropout(x) A^T) B^T, A [r, in] uniform in
   +-1/sqrt(in) from seed, B [out, r] zero; embed_tokens is PEFT's Embedding adapter (out =
   E[x] + alpha/r B A[:, x], A [r, vocab] zero, B [hidden, r] standard normal, no dropout). The base is frozen from then on (no gradients; the optimizer walks the adapters only).
   Dropout applies in kept (training) forwards only; its masks are a function of seed and the
   count of kept forwards (dropout_step, saved with a checkpoint for bit-identical resume). */
int clrt_model_lora_add(clrt_model *m, int r, float alpha, float dropout, unsigned targets, uint64_t seed);
/* on = 0: the model runs as its bare base (the RL reference) until switched on again. */
int clrt_model_lora_enable(clrt_model *m, int on);
int clrt_model_lora_enabled(const clrt_model *m);
int clrt_model_lora_num_tensors(const clrt_model *m);   /* 0 without adapters */
const char *clrt_model_lora_tensor_name(const clrt_model *m, int i);   /* PEFT's names */
clrt_tensor *clrt_model_lora_param(clrt_model *m, int i);
clrt_tensor *clrt_model_lora_grad(clrt_model *m, int i);
/* The dropout masks' state: which 0 the seed, 1 the count of kept forwards. */
uint64_t clrt_model_lora_dropout_state(const clrt_model *m, int which);
int clrt_model_lora_set_dropout_state(clrt_model *m, uint64_t seed, uint64_t step);
/* W += alpha/r B A into every target, then the adapters go (model on the cpu). A tied model
   with an lm_head or embed_tokens adapter is untied first (lm_head.weight of its own). */
int clrt_model_lora_merge(clrt_model *m);

/* -- placement and precision (model/device.c, model/weights.c, flops.c) -- */
/* A model's arenas move as a whole: params and grads are copied, activations rebuilt on
   use. Views taken before the move keep the old memory. Optimizers are created after the
   move (clrt_adamw_step refuses moments on another device). */
int clrt_model_to_device(clrt_model *m, int device);
int clrt_model_device(const clrt_model *m);
/* bf16 matmuls (bf16 mixed precision: fp32 master weights, optimizer, loss and norms). On
   cuda: the blocks' linear layers run bf16 x bf16 -> fp32 (cuBLAS GemmEx) from bf16 copies of
   fp32 master weights; the output layer and everything else stay fp32. On the CPU, with a
   matrix unit (AMX, else AVX512-BF16; clrt_matrix_unit): every product of the blocks' linear
   layers, forward (any number of rows, decode's output layer too) and both backward products
   (dx, dw), multiplies bf16-rounded inputs and bf16 copies of the weights with f32 sums; the
   copies are kept current by the optimizer step. Without one: decode-sized products over bf16
   copies widened to f32, the rest f32. Moving the model drops the copies. */
int clrt_model_set_matmul_bf16(clrt_model *m, int on);
/* The unit bf16 products run on in this process: "amx-bf16", "avx512-bf16", "fma-bf16" (AVX2
   FMAs summing as vdpbf16ps does) or "f32" (none); and the best this CPU offers at its level.
   clrt_set_matrix_unit caps it ("f32", "fma-bf16", "avx512-bf16", "amx-bf16"; as
   CLRT_MATRIX_UNIT does); -1 on an unknown name. Set it before making bf16
   copies: copies made under another cap are remade by set_matmul. */
/* How many times the model packed a whole weight copy (packed f32 or bf16 panels): once
   when a copy is first made; an optimizer step refreshes current copies in place instead. */
int64_t clrt_model_copy_repacks(const clrt_model *m);
/* What the model's last computation (in its default context) ran its linear products on, by
   name (static strings): which 0 its weight format, 1 that format's kernel set at the CPU
   level in use, 2 the f32 set over the master weights a declined product and the gradients
   fall back to; NULL before any computation or for another `which`. */
const char *clrt_model_products(const clrt_model *m, int which);
const char *clrt_matrix_unit_active(void);
const char *clrt_matrix_unit_available(void);
/* The CPU kernels in use, one line: "kernels avx2 (this CPU: avx2; ...), bf16 products
   fma-bf16, int8 portable" (cpu_paths.c). clrt_set_cpu_level caps the level for this process
   as CLRT_CPU does ("portable", "avx2", "avxvnni", "avx512"), before any model is made; -1 on
   an unknown name. */
const char *clrt_cpu_paths(void);
int clrt_set_cpu_level(const char *name);
int clrt_set_matrix_unit(const char *name);
/* The measured peak of a unit ("f32": AVX-512 FMA; "avx512-bf16"; "amx-bf16") over `threads`
   threads, operands in registers (~0.3 s): GFLOP/s, 0 when the CPU lacks it, -1 on bad
   arguments. What benchmarks compare their rate with. */
double clrt_matrix_unit_peak_gflops(const char *name, int threads);
/* Decoding on the CPU in f32 (AVX-512) reads a copy of the linear weights packed in panels
   (and so does any forward while that copy is current), made on the first decode, refreshed
   in place by optimizer steps and remade after other changes to the weights: faster products
   for the memory of a second copy of the weights.
   On by default; off frees the copy. */
int clrt_model_set_decode_pack(clrt_model *m, int on);
/* Batch invariance on the CPU: a row's logits are the same bits whatever rows share its
   forward (decode steps of any size, prefills alone or together, at any position) and a
   prefilled position gets a decode step's bits. Products never switch kernel with the
   number of rows, attention runs each query alone (slower prefill and training attention,
   docs/reproducibility.md). Off by default; the CUDA tables ignore it. */
int clrt_model_set_batch_invariant(clrt_model *m, int on);
int clrt_model_batch_invariant(const clrt_model *m);
/* Shared prefixes: clrt_model_logprobs_context runs a context that two rows or more share
   (identical leading tokens, the same context length: an RL group's prompt, a DPO pair's)
   once, forward and backward, and each row's continuation after it. The same log-probs (the
   same bits on a batch-invariant model) and gradients within rounding, for a fraction of the
   work. On by default (CPU; the CUDA tables run rows as they are). */
int clrt_model_set_share_prefix(clrt_model *m, int on);
int clrt_model_share_prefix(const clrt_model *m);
/* The positions the last logprobs ran through the layers: B x T as called, fewer when it
   packed shared contexts (0 before any). */
int64_t clrt_model_logprobs_positions(const clrt_model *m);
/* train.base_dtype=bf16 (CPU, a model with LoRA adapters): the frozen base's blocks' linear
   weights are kept only in bf16 (packed panels) and their f32 copy is freed; products
   accumulate in f32. Embeddings, head, norms and biases stay f32. One way: the base can no
   longer be loaded into, saved, merged or moved (load it again for that). */
int clrt_model_set_base_bf16(clrt_model *m);
int clrt_model_base_bf16(const clrt_model *m);
/* quant=int8 (CPU): generation (clrt_model_forward_cached: prefill and decode) reads int8
   copies of every linear weight, the output layer's included (per-output-channel symmetric
   scales), and quantizes each product's input rows to int8 on the fly; int32 sums, f32 out.
   Training, scoring and backward keep the f32 master weights; the copies follow them after
   they change (an optimizer step refreshes them in place). Off frees the copies; moving the model drops them. clrt_int8_kernel: the
   path the model's products take ("avx512-vnni", "avx-vnni", "portable": the best this CPU
   runs, or CLRT_INT8_KERNEL's when set and available when quant was turned on; m NULL: the
   best). */
int clrt_model_set_quant_int8(clrt_model *m, int on);
int clrt_model_quant_int8(const clrt_model *m);
const char *clrt_int8_kernel(const clrt_model *m);
/* The bf16 and packed copies follow writes through the tensor API (params views, the
   optimizers, loading); after writing the parameters' memory any other way, call this. */
void clrt_model_params_changed(clrt_model *m);
/* FLOPs of one training step (forward + backward) over B rows of T tokens: 6 per parameter
   per token for the matmuls plus causal attention's 6 * L * T^2 * H * D per row (the
   estimate PaLM's MFU uses, with the causal half). */
double clrt_model_train_flops(const clrt_model *m, int B, int T);
/* Per-kernel wall time, accumulated while CLRT_PROFILE=1 is set in the environment. */
int clrt_profile_count(void);
const char *clrt_profile_name(int i);
double clrt_profile_seconds(int i);
void clrt_profile_reset(void);
/* Timing on (as CLRT_PROFILE=1 sets it) or off: two clock reads per kernel call. */
void clrt_profile_enable(int on);
/* On a GPU, kernels run asynchronously and the per-kernel times above are launch times; with
   on = 1 each timed kernel is waited for before and after (accurate, but slower steps). */
void clrt_profile_sync(int on);


/* ==== optimizer: AdamW over a model's parameters (model/optim.c) ========================= */

/* AdamW over all of a model's parameters (over its LoRA adapters only when it has them at
   creation); the moments live in one arena each. */
typedef struct clrt_adamw clrt_adamw;
/* decay[i] != 0: tensor i gets weight decay (default in Lua: matrices, not norms/biases). */
clrt_adamw *clrt_adamw_new(clrt_model *m, const uint8_t *decay);
void clrt_adamw_free(clrt_adamw *o);
/* Clips the global gradient norm to grad_clip (<= 0: no clipping), then one fused AdamW
   update with bias correction and decoupled weight decay. *grad_norm: the norm before
   clipping. */
int clrt_adamw_step(clrt_adamw *o, float lr, float beta1, float beta2, float eps,
                    float weight_decay, float grad_clip, double *grad_norm);
/* The same update over the parameter arena's elements [lo, hi) only, with the gradient norm
   the caller found (data parallelism's sharded step: each rank its slice, clrt_dist_slice).
   Host memory only. */
int clrt_adamw_step_range(clrt_adamw *o, int64_t lo, int64_t hi, double grad_norm, float lr, float beta1,
                          float beta2, float eps, float weight_decay, float grad_clip);
/* After a gather (a checkpoint's save or load) every rank holds both moments whole; a rank
   of the sharded step reads only its slice [lo, hi) until the next gather, so the rest is
   given back (whole 2 MiB pages: reads zero). Host memory only. */
int clrt_adamw_keep_slice(clrt_adamw *o, int64_t lo, int64_t hi);
int64_t clrt_adamw_numel(clrt_adamw *o);   /* floats in the arena (moments and parameters alike) */
int64_t clrt_adamw_get_step(const clrt_adamw *o);
void clrt_adamw_set_step(clrt_adamw *o, int64_t step);
/* which: 0 first moment (exp_avg), 1 second (exp_avg_sq); views shaped like parameter i. */
clrt_tensor *clrt_adamw_moment(clrt_adamw *o, int which, int i);
size_t clrt_adamw_memory(const clrt_adamw *o);


/* ==== safetensors (formats/safetensors.c) ================================================ */

/* A memory-mapped safetensors file whose header has been checked against its size. */
typedef struct clrt_safetensors clrt_safetensors;
clrt_safetensors *clrt_safetensors_open(const char *path);
/* The same over a file image in memory (not copied: keep it alive until close). */
clrt_safetensors *clrt_safetensors_open_memory(const void *data, size_t len, const char *name);
void clrt_safetensors_close(clrt_safetensors *st);
const char *clrt_safetensors_path(const clrt_safetensors *st);
int clrt_safetensors_count(const clrt_safetensors *st);
const char *clrt_safetensors_name(const clrt_safetensors *st, int i);   /* sorted by name */
int clrt_safetensors_find(const clrt_safetensors *st, const char *name); /* index or -1 */
const char *clrt_safetensors_dtype(const clrt_safetensors *st, int i);  /* "F32", "BF16", ... */
int clrt_safetensors_ndim(const clrt_safetensors *st, int i);
int64_t clrt_safetensors_dim(const clrt_safetensors *st, int i, int d);
const char *clrt_safetensors_metadata(const clrt_safetensors *st, const char *key);
/* F32/BF16/F16/F64 on disk -> f32; numel must match. */
int clrt_safetensors_read_f32(const clrt_safetensors *st, int i, float *dst, int64_t numel);
/* A new tensor: f32 for float dtypes, i32 for I32/I64. */
clrt_tensor *clrt_safetensors_tensor(const clrt_safetensors *st, int i);
/* Writes contiguous f32/bf16/i32 tensors (temporary name, fsync, rename). */
int clrt_safetensors_write(const char *path, int n, const char *const *names,
                           const clrt_tensor *const *tensors, int nmeta,
                           const char *const *meta_keys, const char *const *meta_values);

/* ==== files: the run folder's steps without a shell (core/files.c) ======================= */

/* 0: nothing there, 1: a file (or anything not a folder), 2: a folder. */
int clrt_path_kind(const char *path);
/* mkdir -p: every missing folder of path (0755). */
int clrt_mkdir_p(const char *path);
/* fsync a file or folder by its path. */
int clrt_fsync_path(const char *path);
/* rename(2), then fsync the target's folder so the new name survives a crash. */
int clrt_rename(const char *from, const char *to);
/* rm -r without following symbolic links; a missing path is not an error. */
int clrt_remove_tree(const char *path);
/* Append bytes with write(2) (O_APPEND), every short write continued, every error reported. */
int clrt_file_append(const char *path, const char *data, size_t len);
/* The one atomic write: the bytes go to a temporary sibling (path.tmp.PID), are fsync'd,
   then renamed over path, so a crash never leaves half a file under the real name. */
int clrt_file_write_atomic(const char *path, const char *data, size_t len);
/* The same over n pieces written back to back (safetensors: length, header, tensors). */
int clrt_file_write_parts_atomic(const char *path, int n, const void *const *parts,
                                 const size_t *lens);
/* Copy a file's bytes to a new file and fsync it. */
int clrt_file_copy(const char *from, const char *to);
/* A folder's entry names, one per line; free with clrt_free_string. */
char *clrt_list_dir(const char *path);
void clrt_free_string(char *s);
/* The target of a symbolic link (free with clrt_free_string); NULL when path is not one. */
char *clrt_read_link(const char *path);
/* A new folder $TMPDIR/prefix.XXXXXX (mode 0700; /tmp without TMPDIR); free with
   clrt_free_string. */
char *clrt_temp_dir(const char *prefix);


/* ==== child processes for the scheduler (core/proc.c) ==================================== */

/* One descriptor of a spawned child: fd opened on path (read-only when write is 0, else
   created or truncated, mode 0600), or, with path NULL, a copy of the child's descriptor
   same_as set by an earlier entry. Descriptors 0..2 not given are /dev/null; every other
   descriptor of this process is closed in the child. */
typedef struct {
  int fd;
  const char *path;
  int write;
  int same_as;
} clrt_proc_redirect;
/* A child: pidfd is -1 where the kernel has none (then poll on a short period); done,
   exit_code and term_signal are set once it is reaped. */
typedef struct {
  int pid;
  int pidfd;
  int done;
  int exit_code;
  int term_signal;
} clrt_proc;
/* Start argv[0] (searched on this process's PATH) with exactly the environment envp (NULL
   terminated, like argv), in cwd (NULL: this folder), in a session of its own. */
int clrt_proc_spawn(const char *const *argv, const char *const *envp, const char *cwd,
                    const clrt_proc_redirect *redirects, int n_redirects, clrt_proc *out);
/* Reap the child if it has ended: 1 ended (fields set), 0 still running, -1 error. block
   waits for the end. */
int clrt_proc_poll(clrt_proc *p, int block);
/* Send sig to the child's process group (the child alone if the group is gone). */
int clrt_proc_kill(clrt_proc *p, int sig);
/* poll(2) for readability of n descriptors (pidfds) up to timeout_ms: how many are ready. */
int clrt_proc_wait_fds(const int *fds, int n, int timeout_ms);
int clrt_cpu_count(void);   /* processors online */
int clrt_effective_uid(void);


/* ==== tokenizer (text/tokenizer*.c, text/bpe_train.c) ==================================== */

/* A BPE tokenizer (Hugging Face tokenizer.json semantics), byte-level (GPT-2 alphabet) or
   SentencePiece-style (tokens are their own text, byte fallback). Lua's clrt.tokenizer parses
   the file and builds it with these calls: vocab tokens and merges are given as in the file
   (byte-level spelling for a byte-level model), added tokens as plain text. */
typedef struct clrt_tokenizer clrt_tokenizer;
clrt_tokenizer *clrt_tokenizer_new(void);
void clrt_tokenizer_free(clrt_tokenizer *t);
/* Before any vocab: byte_level = 0 makes a SentencePiece-style model (symbols are characters;
   with byte_fallback a character outside the vocab becomes its <0xNN> tokens, else unk, runs
   of unk fused into one when fuse_unk). Default: byte-level. */
int clrt_tokenizer_set_model(clrt_tokenizer *t, int byte_level, int byte_fallback, int fuse_unk, int32_t unk_id);
/* Normalizer steps, applied in order to the text between added tokens. kind: "nfc", "nfd",
   "nfkc", "nfkd", "prepend" (a), "replace" (literal a -> b), "strip" (left, right). */
int clrt_tokenizer_add_normalizer(clrt_tokenizer *t, const char *kind, const char *a, size_t a_len,
                                  const char *b, size_t b_len, int left, int right);
/* Metaspace pre-tokenizer (must come before any split): ' ' -> replacement; prepend_scheme
   0 never, 1 first (only the text's first section), 2 always; split: cut before each
   replacement character. */
int clrt_tokenizer_set_metaspace(clrt_tokenizer *t, const char *replacement, size_t len, int prepend_scheme,
                                 int split);
/* Decoder steps in order. kind: "replace" (a -> b on each token), "byte_fallback", "fuse",
   "strip" (a: one character; start/stop: how many to cut), "metaspace" (a: replacement;
   start: drop the first token's leading space), "byte_level". */
int clrt_tokenizer_add_decoder(clrt_tokenizer *t, const char *kind, const char *a, size_t a_len,
                               const char *b, size_t b_len, int start, int stop);
int clrt_tokenizer_add_vocab(clrt_tokenizer *t, const char *token, size_t len, int32_t id);
/* Merges rank in the order they are added (first = merged first). */
int clrt_tokenizer_add_merge(clrt_tokenizer *t, const char *left, size_t left_len, const char *right,
                             size_t right_len);
int clrt_tokenizer_add_added(clrt_tokenizer *t, const char *content, size_t len, int32_t id, int special,
                             int lstrip, int rstrip, int normalized);
/* The same; single_word: the token is only matched where no word character (letter, mark,
   digit, connector) touches it on either side, as Hugging Face does. */
int clrt_tokenizer_add_added_word(clrt_tokenizer *t, const char *content, size_t len, int32_t id, int special,
                                  int lstrip, int rstrip, int normalized, int single_word);
/* One Split pre-tokenizer stage (behavior Isolated), applied in the order added; the pattern
   has Hugging Face (Oniguruma) meaning. */
int clrt_tokenizer_add_split(clrt_tokenizer *t, const char *regex, size_t len);
/* The same with a Split behavior: 0 Isolated, 1 Removed, 2 MergedWithPrevious, 3 MergedWithNext. */
int clrt_tokenizer_add_split_behavior(clrt_tokenizer *t, const char *regex, size_t len, int behavior);
int clrt_tokenizer_set_flags(clrt_tokenizer *t, int nfc, int ignore_merges, int add_prefix_space);
/* Ids the post-processor puts around a sequence when special tokens are added (BOS/EOS). */
int clrt_tokenizer_set_template(clrt_tokenizer *t, const int32_t *prefix, int n_prefix, const int32_t *suffix,
                                int n_suffix);
int clrt_tokenizer_finish(clrt_tokenizer *t);
/* text must be UTF-8. The ids stay valid until the next encode call on t; *n is their count. */
const int32_t *clrt_tokenizer_encode(clrt_tokenizer *t, const char *text, size_t len, int add_special, int64_t *n);
/* All cores (one encoding context per thread, kept for the next call; not reentrant for the
   same t); returns ids of all texts back to back (free with clrt_tokenizer_free_ids),
   text i owning [offsets[i], offsets[i+1]). offsets: [n + 1]. */
int32_t *clrt_tokenizer_encode_batch(clrt_tokenizer *t, const char *const *texts, const size_t *lens,
                                     int64_t n, int add_special, int64_t *offsets);
void clrt_tokenizer_free_ids(int32_t *ids);
/* The raw bytes of the ids (may end inside a UTF-8 character); valid until the next decode. */
const char *clrt_tokenizer_decode(clrt_tokenizer *t, const int32_t *ids, int64_t n, int skip_special, size_t *len);
/* What the id contributes to decoded text (the decoder's per-token steps applied). */
const char *clrt_tokenizer_token_bytes(const clrt_tokenizer *t, int32_t id, size_t *len);
/* A SentencePiece-style token's text as in tokenizer.json; NULL for a byte-level model. */
const char *clrt_tokenizer_token_text(const clrt_tokenizer *t, int32_t id, size_t *len);
/* How many leading/trailing copies of ch the decoder's Strip removes from the decoded text. */
int clrt_tokenizer_decode_strip(const clrt_tokenizer *t, char *ch, int *start, int *stop);
int32_t clrt_tokenizer_vocab_size(const clrt_tokenizer *t);
/* 0: model token, 1: added token, 2: special added token. */
int clrt_tokenizer_is_added(const clrt_tokenizer *t, int32_t id);
int32_t clrt_tokenizer_id(const clrt_tokenizer *t, const char *token, size_t len);
size_t clrt_utf8_complete_prefix(const char *s, size_t n);
/* out: [3 * n] bytes; returns the length written. */
size_t clrt_utf8_lossy(const char *in, size_t n, char *out);

/* Byte-level BPE training (text/bpe_train.c). texts: [n] UTF-8 strings, each put in NFC and cut into
   pieces by split_regex; learns merges (most frequent adjacent pair first, ties to the smaller
   ids) until there are vocab_size tokens or no pair occurs min_frequency times. Byte b is id b;
   each merge makes id 256, 257, ... unless its token already exists. On success returns the
   number of merges and sets *merges to [3 * count] ids (left, right, result); free it with
   clrt_tokenizer_free_ids. */
int64_t clrt_bpe_train(const char *const *texts, const size_t *lens, int64_t n, const char *split_regex,
                       size_t regex_len, int32_t vocab_size, int32_t min_frequency, int32_t **merges);


/* ==== generation: the KV-cache decoder (model/decode.c) ================================== */

/* A KV cache of `slots` independent sequences of up to max_len tokens over a model. Logits
   are written to row `slot` of a [slots, V] buffer. */
typedef struct clrt_decoder clrt_decoder;
clrt_decoder *clrt_decoder_new(clrt_model *m, int slots, int max_len);
/* A decoder whose steps run in context x (clrt_decoder_new: the model's default context). */
clrt_decoder *clrt_decoder_new_in(clrt_context *x, int slots, int max_len);
void clrt_decoder_free(clrt_decoder *d);
size_t clrt_decoder_bytes(const clrt_decoder *d);
int clrt_decoder_length(const clrt_decoder *d, int slot);
int clrt_decoder_reset(clrt_decoder *d, int slot);
int clrt_decoder_copy_slot(clrt_decoder *d, int src, int dst);
/* Runs T tokens after what the slot holds; logits of the last one. */
int clrt_decoder_append(clrt_decoder *d, int slot, const int32_t *tokens, int T, float *logits);
/* n prompts (back to back in tokens, lengths[i] each) into n distinct slots, emptied first, in
   one batched forward per chunk; logits of each prompt's last token at its slot's row. */
int clrt_decoder_prefill_many(clrt_decoder *d, int n, const int32_t *slots, const int32_t *tokens,
                              const int32_t *lengths, float *logits);
/* One token for each of n distinct slots. */
int clrt_decoder_decode(clrt_decoder *d, int n, const int32_t *slots, const int32_t *tokens,
                        float *logits);
/* Like prefill_many, but each prompt goes after what its slot already holds (a prefix loaded
   from the prefix cache, or nothing). */
int clrt_decoder_extend_many(clrt_decoder *d, int n, const int32_t *slots, const int32_t *tokens,
                             const int32_t *lengths, float *logits);
/* How many leading positions of the slot hold keys and values that a prefill of its tokens from
   position 0 reproduces bit for bit (0 where the model cannot promise it, clrt_model_kv_reusable):
   prefills and decode steps of several rows keep it growing; a one-row decode step (its products
   sum in another order) stops it. Only these positions may go into the prefix cache. */
int clrt_decoder_exact_length(const clrt_decoder *d, int slot);

/* The prefix cache's storage: `blocks` blocks, each the keys and values of `block_tokens`
   consecutive positions in every layer, on the model's device. clrt.gen.prefix_cache keeps the
   tree that says which tokens each block holds. */
typedef struct clrt_kv_blocks clrt_kv_blocks;
clrt_kv_blocks *clrt_kv_blocks_new(clrt_model *m, int block_tokens, int blocks);
void clrt_kv_blocks_free(clrt_kv_blocks *b);
/* Bytes of one block of block_tokens positions for this model. */
size_t clrt_kv_block_bytes(const clrt_model *m, int block_tokens);
/* Positions [first * bt, (first + count) * bt) of the slot into blocks ids[0..count); they must
   lie within the slot's exact length. */
int clrt_decoder_save_blocks(clrt_decoder *d, int slot, int first, int count, const int32_t *ids,
                             clrt_kv_blocks *b);
/* Blocks ids[0..count) into the slot's positions [0, count * bt): the slot then holds (and its
   exact length is) count * bt tokens. */
int clrt_decoder_load_blocks(clrt_decoder *d, int slot, int count, const int32_t *ids,
                             clrt_kv_blocks *b);
/* 1 when forward_cached computes a position's keys and values the same bits however the tokens
   were chunked (CPU f32 over the packed weights, or quant=int8, with AVX-512); else cached blocks could differ
   from a fresh prefill, and the prefix cache stays off. */
int clrt_model_kv_reusable(const clrt_model *m);
/* What the keys and values depend on besides the tokens: the weights' arenas and their write
   counts, the adapters and whether they are on, the precision (quant=int8 included) and the device. Blocks computed
   under another stamp are never served (an optimizer step, a load, an adapter change all
   change it). */
void clrt_model_weights_stamp(const clrt_model *m, uint64_t out[8]);


/* ==== sampling on the CPU (model/sample.c over kernels/cpu/sample.c) ===================== */

typedef struct clrt_sample_params {
  float temperature;                  /* 0: greedy */
  int top_k;                          /* 0: off */
  float top_p;                        /* 1: off */
} clrt_sample_params;
/* One token per row from temperature/top-k/top-p; logprobs under the sampled distribution.
   uniforms: one U[0,1) draw per row (the caller's seeded streams); allowed: NULL or a 0/1 mask. */
int clrt_sample(const float *logits, int B, int V, const clrt_sample_params *params,
                const double *uniforms, const uint8_t *allowed, int32_t *tokens,
                float *logprobs);
/* The model's own log-probabilities (softmax of the raw logits, temperature 1, no mask, as
   OpenAI's logprobs report them): of token `chosen` into *chosen_lp, and the k (0..64) most
   likely tokens, best first (ties: smaller id), into ids/lps. */
int clrt_top_logprobs(const float *logits, int V, int32_t chosen, int k, int32_t *ids, float *lps,
                      float *chosen_lp);


/* ==== constrained decoding (text/json_grammar.c) ========================================= */

/* A JSON grammar is a table of schema nodes built by the clrt_jschema_* builder calls (Lua's
   clrt.gen.json_constraint parses the schema), then finished; a byte-level pushdown automaton runs
   over it. A vocab is a trie over the token byte strings, built once per tokenizer; fill_mask
   walks it from a row's state and allows exactly the tokens whose bytes keep the output a
   prefix of a valid value (and the stop ids once the value is complete). */
enum {
  CLRT_JSCHEMA_ANY = 0,        /* any JSON value */
  CLRT_JSCHEMA_STRING = 1,     /* lo/hi: minLength/maxLength in code points (hi < 0: none) */
  CLRT_JSCHEMA_NUMBER = 2,     /* lo/hi: minimum/maximum, per flags (|bound| <= 2^53) */
  CLRT_JSCHEMA_INTEGER = 3,
  CLRT_JSCHEMA_ENUM = 4,       /* literals: the values' JSON bytes (strings, numbers, true...) */
  CLRT_JSCHEMA_OBJECT = 5,     /* properties in the order they must appear */
  CLRT_JSCHEMA_MAP = 6,        /* any keys; values: child 0, or any value without a child */
  CLRT_JSCHEMA_ARRAY = 7,      /* items: child 0 (any value without); lo/hi: minItems/maxItems */
  CLRT_JSCHEMA_ANYOF = 8,      /* children: alternatives whose first bytes differ */
  CLRT_JSCHEMA_HAS_MIN = 1, CLRT_JSCHEMA_HAS_MAX = 2, CLRT_JSCHEMA_EXCL_MIN = 4, CLRT_JSCHEMA_EXCL_MAX = 8
};
typedef struct clrt_jschema clrt_jschema;
typedef struct clrt_jschema_state clrt_jschema_state;
typedef struct clrt_jschema_vocab clrt_jschema_vocab;
/* max_ws: 1 allows one optional space or newline in each gap between JSON tokens, 0 compact
   output only (never more: runs of whitespace would eat the reply's token budget). */
clrt_jschema *clrt_jschema_new(int max_ws);
void clrt_jschema_free(clrt_jschema *g);
/* Returns the new node's index, or -1. */
int clrt_jschema_node(clrt_jschema *g, int kind, double lo, double hi, int flags);
int clrt_jschema_add_child(clrt_jschema *g, int node, int child);
int clrt_jschema_add_literal(clrt_jschema *g, int node, const char *json, size_t len);
/* key_json: the key as a JSON string, quotes included. */
int clrt_jschema_add_property(clrt_jschema *g, int node, const char *key_json, size_t len,
                           int child, int required);
/* Checks the grammar (depth, distinct anyOf alternatives, bounds) and fixes its root. */
int clrt_jschema_finish(clrt_jschema *g, int root);
/* After a failed finish: the node whose check failed (so a caller can name its place in the
   schema), or -1. */
int clrt_jschema_error_node(const clrt_jschema *g);
clrt_jschema_state *clrt_jschema_state_new(const clrt_jschema *g);
void clrt_jschema_state_free(clrt_jschema_state *s);
void clrt_jschema_state_copy(clrt_jschema_state *dst, const clrt_jschema_state *src);
/* Feed bytes; 0 if every byte was accepted (the state advanced), -1 otherwise (unchanged). */
int clrt_jschema_state_advance(clrt_jschema_state *s, const uint8_t *bytes, size_t len);
/* 1 when the bytes so far are a complete value (it may still go on, like a number). */
int clrt_jschema_state_complete(const clrt_jschema_state *s);
/* bytes: all token strings end to end; offsets: [V + 1]; a token with no bytes is never allowed
   (special tokens, ids the tokenizer lacks). */
clrt_jschema_vocab *clrt_jschema_vocab_new(const uint8_t *bytes, const int64_t *offsets, int V);
void clrt_jschema_vocab_free(clrt_jschema_vocab *v);
int clrt_jschema_vocab_size(const clrt_jschema_vocab *v);
/* mask: [V] out, 1 = allowed; stop ids are allowed when the value is complete. Returns the
   number of allowed tokens, or -1. */
int clrt_jschema_fill_mask(clrt_jschema_vocab *v, const clrt_jschema_state *s, const int32_t *stop_ids,
                        int n_stop, uint8_t *mask);


/* ==== HTTP client (net/http.c) =========================================================== */
/* One event loop over libcurl's multi interface: submit requests, then
   poll; many are in flight at once on one thread, with keep-alive connection reuse and TLS
   verification always on. Retries and JSON are the Lua side's job (lua/clrt/llm.lua). */
typedef struct clrt_http clrt_http;
typedef struct clrt_http_result {
  int64_t id;
  int status;              /* HTTP status; 0 when no response arrived */
  int error_code;          /* 0, or libcurl's CURLcode (connection refused, timeout, ...) */
  int timed_out;           /* 1 when the request ran past its timeout */
  double retry_after;      /* seconds asked by a Retry-After header; -1 when absent */
  double elapsed;          /* seconds from submit to completion */
  const char *error;       /* "" on success; otherwise what went wrong (never a header) */
  const char *body;        /* [body_len] bytes, NUL-terminated */
  size_t body_len;
  const char *headers;     /* [headers_len] raw header lines of the final response */
  size_t headers_len;
} clrt_http_result;
/* max_connections: cap on open connections (0 = no cap; callers limit in-flight requests). */
clrt_http *clrt_http_new(int max_connections);
void clrt_http_free(clrt_http *h);
void clrt_http_set_max_body(clrt_http *h, size_t bytes);   /* default 64 MiB */
/* headers: "Name: value" lines joined by '\n' (NULL for none). The body is copied. ca_file:
   a PEM bundle of CAs to trust instead of the system's (NULL: the system's); certificates are
   verified either way. Returns the request's id (> 0), or -1 with an error for bad arguments. */
int64_t clrt_http_submit(clrt_http *h, const char *method, const char *url, const char *headers,
                         const char *body, size_t body_len, double timeout_s, const char *ca_file);
/* Drive transfers, waiting up to timeout_ms when none has finished (sleeping that long when
   none is in flight). Returns how many finished results are waiting, or -1. */
int clrt_http_poll(clrt_http *h, int timeout_ms);
/* The same, also returning when one of n descriptors (pidfds of clrt_proc children) is
   readable, so one wait serves transfers and child processes. */
int clrt_http_poll_fds(clrt_http *h, int timeout_ms, const int *fds, int n);
/* Pop one finished result into *out (1), or return 0 when none waits. The pointers in *out
   stay valid until the next clrt_http_next, clrt_http_cancel or clrt_http_free. */
int clrt_http_next(clrt_http *h, clrt_http_result *out);
/* Abort a request in flight or drop its unread result; it produces no result. */
int clrt_http_cancel(clrt_http *h, int64_t id);
int clrt_http_in_flight(const clrt_http *h);
double clrt_http_now(void);   /* monotonic seconds */


/* ==== HTTP server of `clrt serve` (net/server.c) ========================================= */

/* An HTTP server whose requests are answered by the engine loop that calls clrt_server_next.
   Strings in the info stay valid until the next clrt_server_next call. */
typedef struct clrt_server clrt_server;
typedef struct clrt_server_request_info {
  int64_t id;
  const char *method;
  const char *path;
  const char *authorization;          /* the Authorization header, or NULL */
  const char *body;                   /* NUL-terminated */
  size_t body_len;
} clrt_server_request_info;
/* What one client may hold: a zero field takes the default given. */
typedef struct clrt_server_limits {
  size_t max_body;          /* bytes of one request body (default 1 MiB) */
  int header_timeout_s;     /* a connection that has not sent its first request head by then is closed (10) */
  int idle_timeout_s;       /* a connection silent that long is closed (60) */
  int max_connections;      /* open connections; a request beyond them gets a 503 (256) */
  int max_per_client;       /* open connections from one IP address; more are refused (32) */
} clrt_server_limits;
clrt_server *clrt_server_start(const char *host, int port, const clrt_server_limits *limits);
int clrt_server_port(const clrt_server *s);
/* 1 with a new request in *out, 0 when none arrived within timeout_ms. */
int clrt_server_next(clrt_server *s, int timeout_ms, clrt_server_request_info *out);
int clrt_server_respond(clrt_server *s, int64_t id, int status, const char *content_type,
                        const char *body, size_t len);
int clrt_server_stream_begin(clrt_server *s, int64_t id, int status, const char *content_type);
/* 0 sent, 1 the client disconnected (stop generating for it), -1 error. */
int clrt_server_stream_write(clrt_server *s, int64_t id, const char *data, size_t len);
int clrt_server_stream_end(clrt_server *s, int64_t id);
int clrt_server_is_open(clrt_server *s, int64_t id);
void clrt_server_stop(clrt_server *s);


/* ==== terminal: the CLI's line input (cli/terminal.c, in the executable only) ============ */

/* Terminal input for interactive commands: a readline line (free with clrt_free), or NULL
   at end of input; the history file is shared across sessions. */
char *clrt_readline(const char *prompt);
void clrt_free(void *p);
int clrt_history_load(const char *path);
int clrt_history_save(const char *path);


/* ==== distributed: ranks over MPI, the all-reduce over NCCL on CUDA (net/dist.c) ========= */

/* Without MPI in the build, or started without a launcher (mpirun, srun, or CLRT_DIST=1 set),
   the process is rank 0 of 1 and every collective returns at once. */
enum { CLRT_DIST_SUM = 0, CLRT_DIST_MAX = 1, CLRT_DIST_MIN = 2 };
enum { CLRT_DIST_F32 = 0, CLRT_DIST_F64 = 1, CLRT_DIST_BYTES = 2 };
int clrt_dist_available(void);      /* 1 when built with MPI */
int clrt_dist_init(void);           /* MPI_Init_thread when a launcher started this process */
int clrt_dist_finalize(void);
int clrt_dist_rank(void);
int clrt_dist_size(void);
int clrt_dist_local_rank(void);     /* the rank among those on this machine: its GPU */
/* In place over every rank: sum, max or min of count f32 or f64 values. device CLRT_CUDA:
   the buffer is device memory, reduced by NCCL. */
int clrt_dist_all_reduce(void *data, int64_t count, int dtype, int op, int device);
/* count values (f32, f64 or bytes) of host memory from rank root to every rank. */
int clrt_dist_broadcast(void *data, int64_t count, int dtype, int root);
int clrt_dist_barrier(void);
/* The sharded optimizer step (ZeRO-1) over host f32 buffers of count values: rank r owns the
   slice [lo, hi) of clrt_dist_slice(count, r) (contiguous, in rank order, whole cache lines).
   reduce_scatter: afterwards this rank's slice holds the sum over ranks (the rest of data is
   left as it was) and *sum_sq the sum of squares of that slice. all_gather: every rank's slice
   from its owner to every rank. One rank: no-ops (sum_sq over the whole buffer). */
void clrt_dist_slice(int64_t count, int rank, int64_t *lo, int64_t *hi);
int clrt_dist_reduce_scatter(float *data, int64_t count, double *sum_sq);
int clrt_dist_all_gather(float *data, int64_t count);
/* Ends every rank of the job (MPI_Abort), or this process alone when it is the only one. */
void clrt_dist_abort(int code);
/* A 64-bit hash of bytes (host or device memory), to compare parameters across ranks. */
uint64_t clrt_dist_checksum(const void *data, size_t bytes, int device);


/* ==== CUDA: device memory and tensors (core/cuda_tensor.c; the peak in model/flops.c) ==== */
/* Device memory for clrt_storage_new(bytes, CLRT_CUDA) (zeroed; out of memory names the size
   requested and the free memory) and its release; errors when built without CUDA. */
clrt_storage *clrt_cuda_storage_new(size_t bytes);
void clrt_cuda_storage_free(void *data);
/* A contiguous copy of t on `device` (CLRT_CPU or CLRT_CUDA), same dtype. */
clrt_tensor *clrt_tensor_to_device(const clrt_tensor *t, int device);
/* bytes between host and device: kind 0 host -> device, 1 device -> host, 2 device -> device
   (copy_ on a cuda tensor, core/tensor.c, checks the tensors first). */
int clrt_cuda_copy_bytes(void *dst, const void *src, size_t bytes, int kind);
/* Why clrt_cuda_device_count() is 0 ("no CUDA device", "...: CUDA driver version is
   insufficient ...", "built without CUDA"), or the device count. */
const char *clrt_cuda_status(void);
/* The GPU's name, or "" with an error when none. */
const char *clrt_cuda_device_name_str(void);
/* Dense bf16 peak of the GPU in TFLOP/s from its name (H100 / H200 989, A100 312, ...),
   CLRT_PEAK_TFLOPS overriding it; 0 when unknown or no GPU. */
double clrt_cuda_peak_tflops(void);


#endif /* CLRT_H */
