/* model_internal.h — the model's private header: the model and its contexts (shared with
   optim.c, decode.c and flops.c), the activation arena, the weight formats and the ops table
   the layer code runs through (not for Lua). The files of runtime/model/, one job each:
     context.c    contexts: one computation's state over the shared model, the weights' version
                  it read, the epoch that voids them (the bottom layer: it calls no other model file)
     params.c     parameter layout with Hugging Face names, config checks, init, introspection,
                  the model's memory
     load_save.c  safetensors in and out
     arena.c      a context's activation arena and kernels' workspace, the model's RoPE tables
     weights.c    the packed and bf16 weight copies and the modes' rules
     format_f32.c, format_bf16.c  the weight formats (f32 rows and panels, bf16 rows and pairs)
                  and their products per CPU level
     ops_cpu.c    the CPU ops; ops_cuda.c the CUDA ones and formats (the only model file that knows CUDA)
     device.c     placement: moves between devices, choosing the ops for device and precision
                  (new models, set_matmul, set_base_dtype), and the one policy for which weight
                  format a computation's products read
     forward.c    the layer forward and the entry points logprobs and forward_cached
     backward.c   the layer backward and clrt_model_backward
     profile.c    per-kernel timing (CLRT_PROFILE=1)
     linear.c     the layer code's one call per product: the base product, then its adapter
     lora.c       LoRA adapters: their arena, names (PEFT's), init, merge, and the layer hooks
     base16.c     base_dtype=bf16: a frozen base's linear weights only in bf16, and their products
     quant8.c     quant=int8: generation's int8 copies of the linear weights, and their products
     shared_prefix.c  rows that share a leading context packed so that the context runs once */
#ifndef CLRT_MODEL_INTERNAL_H
#define CLRT_MODEL_INTERNAL_H
#include "clrt.h"
#include "cpu/cpu_level.h"
#include "cpu/model_kernels.h"

#include <pthread.h>

typedef struct clrt_param_info {
  char name[96];               /* Hugging Face name */
  int ndim;
  int64_t shape[2];
  int64_t offset, numel;       /* in floats, into the params (and grads, moments) arena */
  int loaded;                  /* set by clrt_model_load_safetensors */
  int in16;                    /* base_dtype=bf16: offset into the bf16 base (base16.c), not params */
} clrt_param_info;

/* Offsets (floats) of one layer's parameters; -1 when the architecture has none. */
typedef struct clrt_layer_offsets {
  int64_t ln1, wq, bq, wk, bk, wv, bv, wo, bo, qn, kn, ln2, wg, wu, wd;
  int64_t lpa, lpf;            /* Gemma 3: the norms of the attention's and the MLP's outputs */
} clrt_layer_offsets;

typedef struct model_ops model_ops;
typedef struct linear_kernels linear_kernels;
typedef struct weight_format weight_format;
typedef struct model_q8 model_q8;

/* One copy of the linear weights at the params' offsets, in its own storage (weights.c). Its
   format and that format's kernels at the CPU level in use are chosen when it is made; a
   later change of level (clrt_set_cpu_level) chooses the kernels again, not the layout. */
typedef struct weight_copy {
  clrt_storage *s;               /* NULL: not made */
  const weight_format *format;   /* its layout, how it is made, its kernels per level */
  const linear_kernels *kernels; /* format->kernels at `level`; NULL: none there (the master's) */
  int level;                     /* the CPU level the kernels were chosen at */
  uint64_t version;              /* the params->version it was made from (COPY_STALE: not current) */
} weight_copy;
typedef struct model_retired model_retired;

/* Rows that share their leading context (an RL group's responses to one prompt, a DPO pair)
   packed into one row of segments (shared_prefix.c): each group's context once, then each
   member's continuation, a "branch" whose queries see the context's keys before their own. */
typedef struct pack_seg {
  int start, len;              /* packed positions [start, start + len) */
  int prefix;                  /* a branch: the packed start of its context; -1: none */
  int plen;                    /* a branch: the context's length (its first position); 0: none */
} pack_seg;

typedef struct model_pack {
  int N;                       /* packed positions */
  int nseg, seg_cap, row_cap, tok_cap;
  pack_seg *seg;               /* [nseg], each context before its branches */
  int *pre, *plen, *br;        /* [B] each (one block of 4 B ints): a row's first segment's start and
                                  length, its branch's start (-1: none) */
  int32_t *tok;                /* [N] the packed tokens */
} model_pack;

/* LoRA: the linear layers an adapter can sit beside (bit t of model_lora.targets): the seven
   of every block, then the output layer and the embedding (one each, off by default). */
enum { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_NT };
enum { LORA_HEAD = LORA_NT, LORA_EMBED, LORA_NALL };

/* The adapters: their own params/grads arena (the optimizer's when they exist), the base is
   then frozen (no base gradients). y += scale (drop(x) A^T) B^T beside each target. */
typedef struct model_lora {
  int r;
  float alpha, scale, dropout;
  unsigned targets;
  int enabled;                 /* 0: the model runs as its base (the RL reference) */
  int np;
  clrt_param_info *p;          /* PEFT names */
  int64_t total;
  clrt_storage *params, *grads;
  int64_t (*ab)[LORA_NT][2];   /* [L]: offsets of A [r, in] and B [out, r]; -1 without */
  int64_t head[2];             /* lm_head: A [r, C], B [V, r]; -1 without */
  int64_t emb[2];              /* embed_tokens: A [r, V], B [C, r] (PEFT's Embedding); -1 without */
  /* Dropout masks of a training forward are hash(seed, step, layer, target); step counts
     kept forwards (saved with a checkpoint); the step a kept forward used is its context's
     (clrt_context.lora_step). */
  uint64_t seed, step;
} model_lora;

struct clrt_model {
  const model_ops *ops;        /* chosen by device.c for the device and precision */
  clrt_model_config cfg;
  int np;
  clrt_param_info *p;
  int64_t total;               /* floats in the params arena */
  clrt_layer_offsets *layer;
  int64_t wte, norm, head;     /* head == wte when tied */
  clrt_storage *params, *grads;   /* the master weights and their gradients (the optimizer's) */
  float *inv_freq;             /* [D/2] */
  /* Gemma 3's local layers: their own RoPE (rope_local_theta), host memory (CPU only). */
  float *inv_freq_local, *rope_cos_local, *rope_sin_local;
  float *rope_cos, *rope_sin;  /* [rope_len, D/2], times rope_scale */
  const float *rope_kc, *rope_ks;   /* the tables as the kernels read them (host or device) */
  /* longrope: the long factors' frequencies and tables (a call past original_max_position
     reads them: model_rope_choose), mirrored after the others in rope_dev. */
  float *inv_freq_long, *rope_cos_long, *rope_sin_long;
  const float *rope_kc_long, *rope_ks_long;
  float rope_scale;            /* yarn, longrope: the attention factor cos and sin carry (else 1) */
  int rope_len;
  model_retired *retired;      /* superseded RoPE tables: a running context may still read one */
  int share_prefix;            /* clrt_model_set_share_prefix (on by default) */
  /* Where the arenas live (clrt_device). On CUDA the RoPE tables are mirrored on the device
     (rope_dev: cos then sin). */
  int device;
  clrt_storage *rope_dev;
  /* bf16 matmuls (set_matmul("bf16")): the linear layers take bf16 copies of their inputs and
     read the bf16 copy wbf, accumulating in fp32. On CUDA the output layer stays fp32. */
  int bf16;
  /* The CPU's fast kernels (clrt_model_set_decode_pack, on by default): the packed copies
     (f32 panels, bf16 pairs) and the tiles; off, products run on sgemm over the master. */
  int pack_decode;
  /* Batch invariance (clrt_model_set_batch_invariant): every product and attention on the
     CPU forms a row's results in an order that depends on the weights' shapes only, never on
     how many rows share the step (the weight formats' kernels, ops_cpu.c's attention). */
  int batch_invariant;
  /* The copies of the linear weights beside the master params (weights.c), each in the
     format and with the kernels chosen when it was made:
       wpk  f32 panels (clrt_linear_pack), CPU, made by the first decode (or logprobs of a
            small model) while pack_decode is on;
       wbf  with bf16: bf16 pairs in panels where the CPU takes them (with a matrix unit also
            the transposed pairs that backward's dx reads: [2 total] uint16), else bf16 rows;
            on CUDA bf16 rows on the device. */
  weight_copy wpk, wbf;
  int64_t repacks;             /* whole-copy packs made (clrt_model_copy_repacks) */
  model_lora *lora;            /* NULL: no adapters, full training */
  /* base_dtype=bf16 (base16.c): the frozen linear weights of the blocks live only in b16, in
     clrt_linear_pack_bf16's panels; their offsets (layer[], p[].in16) index b16 in uint16s,
     the rest of the params (embeddings, norms, biases) stay f32 in params. */
  int base16;
  int base16_blank;   /* converted before any weight was in: clrt_model_load_safetensors fills it */
  clrt_storage *b16;
  model_q8 *q8;                 /* quant=int8 (quant8.c): generation's int8 weights, or NULL */
  /* The default context (context.c): what the model-level entry points (clrt_model_logprobs,
     clrt_model_backward, clrt_model_forward_cached, clrt_decoder_new) compute in. */
  clrt_context *ctx;
  /* Bumped by every change that invalidates every context's activations (a move, the bf16
     switch, adapters added or merged, the bf16 base): a context whose epoch differs drops
     its arena and its kept forward before its next call. */
  uint64_t epoch;
  /* Held while a context makes or refreshes the copies the weights' version and the call
     need (RoPE tables, packed / bf16 / int8 copies): several contexts may start at once. */
  pthread_mutex_t copies_lock;
};

/* One computation over a model (context.c): everything a forward, its backward or a decode
   step writes besides the gradients. The model is only read while a context runs (apart from
   the copies made under copies_lock before the first product), so contexts over one model
   run at the same time from different threads. Gradients stay the model's (the optimizer's):
   one context trains at a time. */
struct clrt_context {
  clrt_model *m;
  /* The RoPE tables this call and its backward read (model_rope_choose: the model's, its long
     ones, or dynamic NTK's own for this call's length, rope_dyn: host [rope_dyn_len, D/2] cos
     then sin, on the device in rope_dyn_dev). */
  const float *rope_c, *rope_s;
  float *rope_dyn;
  clrt_storage *rope_dyn_dev;
  int rope_dyn_len;
  /* The linear products of this call (model_context_choose, the policy, when it began): its
     format's kernels, and the f32 ones over the master weights that a declined product and
     the gradients fall back to. A kept forward's backward runs the forward's. */
  const weight_format *format;
  const linear_kernels *lin, *master;
  clrt_storage *acts;          /* the activation arena, on the model's device */
  uint64_t epoch;              /* the model's epoch the arena was made in */
  /* The last forward kept for backward: its caller's rows [B, T] (its activations' layout:
     model_kept_layout), the weights' version it read (model_weights_version). */
  int saved, B, T;
  uint64_t version;
  int packed;                  /* the last logprobs ran packed (pack holds its layout) */
  model_pack pack;
  int64_t nv;                  /* rows with a target */
  int threads;                 /* OpenMP threads the activation layout was made for */
  int32_t *hidx;               /* [hidx_cap]: rowidx of the last forward, then scratch */
  size_t hidx_cap;
  /* The kept forward's adapters: whether they ran, applied dropout, and its dropout step. */
  int lora_enabled, lora_dropout;
  uint64_t lora_step;
  /* The CPU kernels' workspace (host memory, arena.c), reserved by each entry point for its
     rows before any product (weights.c's model_workspace_bytes); step_failed: a product
     found it short, and the entry point returns the error set then. */
  void *ws;
  size_t ws_bytes;
  int step_failed;
  /* quant=int8: a product's input rows quantized ([rows, K4] q + 128, linear_int8.h; xs [rows]) */
  uint8_t *xq;
  float *xs;
  size_t xq_cap, xs_cap;
};

/* ---- contexts (context.c) -------------------------------------------------------------------- */

/* The sum of the weight arenas' write counts (params, the bf16 base, the adapters): every
   optimizer step, load or write through a view bumps it. */
uint64_t model_weights_version(const clrt_model *m);
/* At an entry point: binds x to the model's current epoch (dropping a stale arena and kept
   forward). */
void model_context_begin(clrt_context *x);
/* The formats x's products read in this call (decode: a forward_cached step), from the
   policy (device.c; under the copies' lock, once they are made). */
void model_context_choose(clrt_context *x, int decode);
/* At its end: 0 when the weights' version is still `started` (the one the call began with),
   else -1 with an error naming who: the call read two versions and its results are void. */
int model_context_check_version(const clrt_context *x, uint64_t started, const char *who);
/* Every context's kept forward is void (bumps m->epoch; the others notice at their next
   call, dropping an arena on another device); drop_arena: the default context's arena goes
   now (the others' when they next find it too small or elsewhere). */
void model_forget_contexts(clrt_model *m, int drop_arena);
/* The default context and the copies' lock (model_params_new), and their end (clrt_model_free). */
int model_context_init(clrt_model *m);
void model_context_fini(clrt_model *m);
/* What a context holds, released; the context stays usable. */
void model_context_release(clrt_context *x);
/* The superseded RoPE tables (arena.c), freed with the model. */
void model_retired_free(clrt_model *m);

#define COPY_STALE UINT64_MAX

/* ---- activations (arena.c) ----------------------------------------------------------------- */

typedef struct layer_acts {
  float *xmid, *rstd1, *rstd2, *q, *k, *v, *qpre, *kpre, *qrstd, *krstd, *att, *lse, *g, *u;
  float *lxa[LORA_NT];           /* LoRA: each adapter's x A^T [N, r] (NULL without) */
  float *ao, *aorstd, *mo, *morstd;   /* Gemma 3: attention and MLP outputs before their norms, rstd */
} layer_acts;

typedef struct acts {
  clrt_context *cx;              /* the computation these activations belong to */
  uint16_t *x16, *dy16;          /* bf16 copies of a linear layer's input / output gradient */
  float **res;                   /* [L+1] residual stream entering each layer (2 when not kept) */
  layer_acts *la;                /* [L] (1 when not kept) */
  float *xn, *tmp, *h;           /* forward scratch: [N, C], [N, C], [N, I] */
  float *dres, *dxn, *dxc, *dA, *datt, *dq, *dk, *dv, *dk2;   /* backward scratch */
  float *rstdf, *lsef, *lpv, *dlpv;   /* [N] */
  int32_t *tok, *target, *rowidx;     /* [N] */
  int32_t *pos0, *slot;               /* [B] kernel-side copies of the positions and slots */
  float *logits;                 /* [chunk, V] */
  float *attn;                   /* attention scratch */
  float *lxd, *ldxa;             /* LoRA scratch: a dropped input [N, widest], dxa [N, r] */
  float *lhxa, *lexa;            /* LoRA: the output layer's xa, the embedding's A[:, tok] [N, r] */
  int chunk, logits_kept;
  size_t floats;
} acts;

/* Lays out the activations for (B, T, keep) over base (NULL only counts), keys reaching Tk. */
void model_layout(const clrt_model *m, acts *a, char *base, int B, int T, int Tk, int keep);
/* Binds a to x's arena for (B, T, keep), growing the arena when it is too small. */
int model_bind_acts(clrt_context *x, acts *a, int B, int T, int Tk, int keep);
/* The RoPE tables for positions [0, P), on the model's device. */
int model_ensure_rope(clrt_model *m, int P);
int model_sync_rope(clrt_model *m);
/* Sets x->rope_c/rope_s to the tables of a call whose positions reach seq_len (after
   model_ensure_rope(m, seq_len)): what transformers' dynamic_rope_update picks for that call. */
int model_rope_choose(clrt_context *x, int seq_len);
/* The config's inverse frequencies [D/2] for a call reaching seq_len (0: the model's own), and
   the factor its cos and sin carry (params.c). */
void model_rope_inv_freq(const clrt_model_config *c, int seq_len, float *inv);
double model_rope_attention_factor(const clrt_model_config *c);
/* Host staging for a step's integer inputs (x->hidx, grown on demand). */
int32_t *model_host_ints(clrt_context *x, size_t n);
/* Grows the kernels' workspace to `bytes` (an error naming `who` when it cannot) and clears
   step_failed: every entry point calls it before its first product. */
int model_reserve_workspace(clrt_context *x, size_t bytes, const char *who);
/* 0 when the workspace (x->ws, x->ws_bytes) holds `need` bytes; else -1, the error set and
   the step marked failed (the product is skipped). */
int model_workspace(clrt_context *x, size_t need, const char *who);

/* ---- the ops one device and precision run (ops_cpu.c, ops_cuda.c) -------------------------- */

/* One product of a linear layer: y = x W^T (+ b), W at offset w of the params; lora names
   the adapter that may sit beside it (LORA_Q ... LORA_DOWN), which model_linear applies. */
typedef struct lin_part {
  float *y;
  int64_t w;
  const float *b;
  int O;
  int lora;
} lin_part;

/* One attention call: q/out rows [B, T, H, D], keys/values with batch stride kv_bstride. */
typedef struct attn_args {
  int B, T, H, KV, D;
  int window;                    /* sliding window (model_layer_window), 0: none */
  const int32_t *pos0, *slot;    /* model memory, or NULL */
  int64_t kv_bstride;
} attn_args;

/* ---- weight formats (format_f32.c, format_bf16.c, base16.c, quant8.c, ops_cuda.c) ---------- */

/* One format's linear products at one CPU level (or on one device). A product names its
   weight by its offset w in the params (the format finds its copy at the same place). Each
   returns 1 when it ran the product (or failed the step through model_workspace), 0 when it
   declines (a shape or a size its kernel does not take, no memory for its scratch): the
   computation's f32 kernels over the master weights (its context's `master`) run it then. */
struct linear_kernels {
  const char *name;
  /* y [N, O] = x [N, K] W^T (+ b [O]) */
  int (*forward)(clrt_model *m, acts *a, float *y, const float *x, int64_t w, const float *b,
                 int64_t N, int K, int O);
  /* parts[i].y [N, O_i] = x [N, K] W_i^T (+ b_i), count <= 3 (q, k, v; gate, up) in one pass;
     NULL: one forward each */
  int (*forward_parts)(clrt_model *m, acts *a, const float *x, int64_t N, int K, const lin_part *parts,
                       int count);
  /* dx [N, K] (+)= dy [N, O] W, dW [O, K] += dy^T x [N, K], db [O] += sum dy; NULL: the
     master's (a format that does not train, or whose gradients are f32 anyway) */
  int (*backward)(clrt_model *m, acts *a, float *dx, int64_t w, float *db, const float *dy, const float *x,
                  int64_t N, int K, int O, int acc);
};

/* A weight format: the layout of the linear weights' copy (at the params' offsets, in its own
   storage), how it is made from the master weights, and its products per CPU level, looked up
   once per computation when its copies are current (model_context_choose), not per product.
   The master weights are a format too (f32 rows: make is NULL). Adding a CPU family is adding
   its kernel set to the formats' tables. */
struct weight_format {
  const char *name;              /* the layout, in words */
  int head;                      /* the copy holds the output layer's weight too (decode's logits) */
  /* a weight w [O, K] of the master into its copy at dst (the weight's own place), whole and
     rows [r0, r1) (the optimizer's in-place refresh); NULL: not made so */
  void (*make)(void *dst, const float *w, int K, int O);
  void (*make_rows)(void *dst, const float *w, int K, int O, int r0, int r1);
  const linear_kernels *kernels[CLRT_CPU_TOP + 1];   /* per level (cpu_level.h); NULL: not at that level */
};

/* A format's kernels[] at each level: its portable set and its vector set (the kernels of
   kernels/cpu pick their tiles for AVX2, AVX-VNNI, AVX-512 or NEON inside). */
#if defined(__aarch64__)
#define FORMAT_LEVELS(portable, simd) {[CLRT_CPU_PORTABLE] = (portable), [CLRT_CPU_NEON] = (simd)}
#else
#define FORMAT_LEVELS(portable, simd)                                              \
  {[CLRT_CPU_PORTABLE] = (portable), [CLRT_CPU_AVX2] = (simd), [CLRT_CPU_AVXVNNI] = (simd), \
   [CLRT_CPU_AVX512] = (simd)}
#endif

/* The CPU's formats. f32 rows has a kernel set per use: sgemm, the tiles that pack w on the fly
   (fast kernels), and batch-invariant row-wise products (each with the f32 backward of
   sgemm or the tiles). */
enum { F32_BLAS, F32_TILES, F32_BLAS_INVARIANT, F32_TILES_INVARIANT, F32_ROWS_SETS };
extern const weight_format model_f32_rows[F32_ROWS_SETS];
extern const weight_format model_f32_panels;           /* clrt_linear_pack's 48-wide panels (wpk) */
extern const weight_format model_bf16_rows, model_bf16_rows_invariant;   /* plain bf16 (wbf) */
extern const weight_format model_bf16_pairs;           /* clrt_linear_pack_bf16's panels of pairs (wbf) */
extern const weight_format model_bf16_pairs_t;         /* the same, and the transposed pairs for dx */
extern const weight_format model_bf16_base;            /* base_dtype=bf16's panels (b16), no f32 master */
extern const weight_format model_int8_blocks;          /* quant=int8's blocks with scales (q8) */
/* The CUDA formats (cuBLAS over f32 params, or the bf16 copy); NULL when built without CUDA. */
const weight_format *model_cuda_format(int bf16);
/* The policy is model_context_choose (context.c's section above, device.c). */
/* The format's kernel set at this process's CPU level. */
const linear_kernels *model_format_kernels(const weight_format *f);

/* Everything the layer code runs besides the linear products (those are the weight formats').
   Element ops take the kernels' own arguments (model memory). */
struct model_ops {
  const char *name;
  /* The decode step's logits [B, V] into host memory. */
  int (*decode_logits)(clrt_model *m, acts *a, float *logits, const float *xn, int B);
  void (*rmsnorm)(float *out, float *rstd, const float *x, const float *w, int64_t N, int C, float eps);
  void (*rmsnorm_backward)(float *dx, float *dw, const float *dout, const float *x, const float *w,
                           const float *rstd, int64_t N, int C);
  void (*rope)(float *x, const float *cos_t, const float *sin_t, const int32_t *pos0, int B, int T,
               int nh, int D, int R);
  void (*rope_backward)(float *dx, const float *cos_t, const float *sin_t, const int32_t *pos0,
                        int B, int T, int nh, int D, int R);
  void (*attention)(const clrt_model *m, acts *a, float *out, float *lse, const float *q,
                    const float *k, const float *v, const attn_args *s);
  void (*attention_backward)(const clrt_model *m, acts *a, const layer_acts *A, int B, int T, int window);
  /* One row's queries at positions p0 .. p0 + Tq - 1 over keys 0 .. p0 + Tq - 1 (a packed
     branch; NULL: no packing on this device). dk, dv cover every key. */
  void (*attention_backward_offset)(const clrt_model *m, acts *a, float *dq, float *dk, float *dv,
                                    const float *dout, const float *q, const float *k, const float *v,
                                    const float *out, const float *lse, int Tq, int p0, int window);
  size_t (*attention_scratch)(const clrt_model *m, int threads, int B, int T, int Tk);
  void (*kv_write)(float *kc, float *vc, const float *k, const float *v, const int32_t *pos0,
                   const int32_t *slot, int B, int T, int row, int64_t bstride);
  void (*swiglu)(float *h, const float *g, const float *u, int64_t n);
  void (*swiglu_backward)(float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n);
  void (*add)(float *out, const float *a, const float *b, int64_t n);
  void (*embedding)(float *out, const int32_t *tok, const float *wte, int64_t N, int C);
  void (*embedding_backward)(float *dwte, const float *dout, const int32_t *tok, int64_t N, int C);
  /* wp: the head packed for the CPU's kernels (model_packed_weight), or NULL; hl: its LoRA
     adapter (lora_math.h), or NULL */
  void (*output)(float *lp, float *lse, const float *x, const float *w, const float *wp, int fast,
                 const int32_t *target, int64_t N, int C, int V, float *scratch, int chunk,
                 const struct clrt_head_lora *hl);
  void (*output_backward)(float *dx, float *dw, const float *dlp, const float *x, const float *w,
                          const float *wp, int fast, const int32_t *target, const float *lse, int64_t N, int C, int V,
                          float *scratch, int chunk, int logits_ready, const struct clrt_head_lora *hl);
  /* LoRA adapters (kernels/cpu/lora.c's contracts) */
  void (*lora_dropout)(float *out, const float *x, int64_t n, uint64_t key, float p);
  void (*lora_forward)(clrt_model *m, acts *a, float *y, float *xa, const float *xd, const float *A, const float *B,
                       int64_t N, int K, int O, int r, float scale);
  void (*lora_backward)(clrt_model *m, acts *a, float *dx, float *dA, float *dB, float *dxa, float *xd, const float *dy,
                        const float *xa, const float *A, const float *B, int64_t N, int K, int O,
                        int r, float scale, uint64_t key, float p);
  void (*lora_xa)(float *xa, const float *xd, const float *A, int64_t N, int K, int r);
  void (*lora_input_backward)(float *dx, float *dA, const float *dxa, float *xd, const float *A, int64_t N,
                              int K, int r, uint64_t key, float p);
  void (*lora_embed_forward)(float *y, float *ea, const int32_t *tok, const float *A, const float *B,
                             int64_t N, int V, int C, int r, float scale);
  void (*lora_embed_backward)(float *dA, float *dB, float *dea, const float *dy, const float *ea,
                              const int32_t *tok, const float *B, int64_t N, int V, int C, int r, float scale);
  void (*gather_rows)(float *dst, const float *src, const int32_t *rowidx, int64_t nv, int C);
  /* dst[rowidx[i]] += src[i]; rows may repeat on the CPU (packed rows), never on CUDA */
  void (*scatter_rows)(float *dst, const float *src, const int32_t *rowidx, int64_t nv, int C);
  /* memory: zero, host -> model, model -> host (waits and reports a failed kernel), model ->
     model (queued in order with the kernels), end of step */
  void (*zero)(float *p, size_t n);
  int (*upload)(void *dst, const void *src, size_t bytes);
  int (*download)(void *dst, const void *src, size_t bytes);
  int (*copy)(void *dst, const void *src, size_t bytes);
  int (*sync)(void);
  /* The whole bf16 weight copy in one conversion (NULL: weights.c packs or converts on the host). */
  void (*to_bf16)(uint16_t *dst, const float *src, int64_t n);
  /* Gemma 3 (CPU only; NULL in the CUDA table): (1 + w) norms, GELU-tanh gate, a scale, and
     attention as above (s->window, window) with its own score scale and soft cap (0: none). */
  void (*rmsnorm_unit)(float *out, float *rstd, const float *x, const float *w, int64_t N, int C, float eps);
  void (*rmsnorm_unit_backward)(float *dx, float *dw, const float *dout, const float *x, const float *w,
                                const float *rstd, int64_t N, int C);
  void (*geglu)(float *h, const float *g, const float *u, int64_t n);
  void (*geglu_backward)(float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n);
  void (*scale)(float *x, float s, int64_t n);
  void (*attention_scaled)(const clrt_model *m, acts *a, float *out, float *lse, const float *q,
                           const float *k, const float *v, const attn_args *s, float scale, float cap);
  void (*attention_scaled_backward)(const clrt_model *m, acts *a, const layer_acts *A, int B, int T,
                                    int window, float scale, float cap);
  /* the output op over soft-capped logits (final_logit_softcapping) */
  void (*output_softcap)(float *lp, float *lse, const float *x, const float *w, const float *wp, int fast,
                         const int32_t *target, int64_t N, int C, int V, float *scratch, int chunk,
                         const struct clrt_head_lora *hl, float cap);
  void (*output_softcap_backward)(float *dx, float *dw, const float *dlp, const float *x, const float *w,
                                  const float *wp, int fast, const int32_t *target, const float *lse, int64_t N, int C,
                                  int V, float *scratch, int chunk, int logits_ready, const struct clrt_head_lora *hl,
                                  float cap);
  /* AdamW where the arenas are device memory (NULL: optim.c's host loop). adamw_table: the
     tensor table the fused step walks, made once per optimizer (NULL and the error set when
     it cannot be); adamw_step: norm, clip and update in one go, the norm back (the update
     skipped when it is not finite; -1: a failed launch or copy). */
  clrt_storage *(*adamw_table)(const clrt_param_info *p, int np, const uint8_t *decay);
  int (*adamw_step)(clrt_storage *table, int np, float *P, float *M1, float *M2, const float *G, int64_t total,
                    float lr, float beta1, float beta2, float eps, float weight_decay, float grad_clip,
                    float bc1, float bc2_sqrt, double *norm);
  int bf16_scratch;              /* the arena holds x16/dy16 */
  int logits_staged;             /* decode logits land in the arena before the copy to the host */
};

extern const model_ops model_cpu_ops;
/* The CUDA ops (with or without the bf16 scratch); NULL when built without CUDA. */
const model_ops *model_cuda_ops(int bf16);
/* device.c: picks m->ops for m->device and m->bf16 (the linear products: the weight formats). */
void model_choose_ops(clrt_model *m);

/* ---- the layer code (forward.c, backward.c; Gemma 3's in gemma3.c) ------------------------------ */

/* What every layer of one forward shares. */
typedef struct fwd_step {
  int B, T;                         /* rows, and new positions per row */
  int keep;                         /* keep each layer's activations for backward */
  const int32_t *pos0, *slot;       /* model memory: each row's first position and cache slot */
  float *const *kcache, *const *vcache;   /* [L] caches [slots, cache_T, KV, D], or NULL */
  int cache_T;
  const model_pack *pack;           /* B = 1 row of packed segments, or NULL */
} fwd_step;

/* ---- rows that share a prefix (shared_prefix.c) ---------------------------------------------- */

/* 1 when the model packs rows with a shared context (set_share_prefix, a device op for it, not
   Gemma 3's layers). */
int model_pack_wanted(const clrt_model *m);
/* Groups rows [B, T] (lengths, context: each row's leading context tokens) by identical
   context and packs them into x->pack; 1 when some context is shared by two rows or more (the
   forward then runs packed), 0 when none is (x->pack unused), -1 on error. */
int model_pack_plan(clrt_context *x, const int32_t *tokens, int B, int T, const int32_t *lengths,
                    const int32_t *context);
/* Row b's position t in the packed row. */
int64_t model_pack_index(const model_pack *pk, int b, int t);
/* The workspace a step over N layout rows reserves: its products', and with pk the packed
   attention's gathered keys and values, whichever is more. */
size_t model_step_workspace_bytes(const clrt_model *m, int64_t N, const model_pack *pk);
/* The last logprobs' activation layout: [1, pack.N] when it ran packed, else its [B, T]. */
void model_kept_layout(const clrt_context *x, int *B, int *T);
/* RoPE over q [N, H, D] and k [N, KV, D] at each segment's positions (backward: the inverse). */
void model_pack_rope(const clrt_context *x, const model_pack *pk, float *q, float *k, int backward);
/* The packed attention: out [N, H, D], lse [N, H] by segment ([H, len] each; NULL: not kept). */
void model_pack_attention(clrt_model *m, acts *a, const model_pack *pk, float *out, float *lse,
                          const float *q, const float *k, const float *v, int window);
/* Its backward into a->dq, a->dk, a->dv from a->datt. */
void model_pack_attention_backward(clrt_model *m, acts *a, const model_pack *pk, const layer_acts *A, int window);

/* Gemma 3's layer: x [N, C] -> out [N, C] (forward), and a->dres from dL/dout to dL/dx. */
void gemma3_layer_forward(clrt_model *m, acts *a, const fwd_step *s, int l, const float *x, float *out);
void gemma3_layer_backward(clrt_model *m, acts *a, int l, const float *x, int B, int T);
/* The final norm (and its backward) as the architecture has it: w or (1 + w). */
void model_final_norm(const clrt_model *m, float *out, float *rstd, const float *x, int64_t N);
void model_final_norm_backward(const clrt_model *m, float *dx, const float *dout, const float *x,
                               const float *rstd, int64_t N);
/* Gemma 3: the embedding rows times sqrt(hidden_size) (no-op for the others). */
void model_embed_scale(const clrt_model *m, float *x, int64_t N);
/* Gemma 3's final_logit_softcapping on a decode step's logits [B, V] (host memory; no-op
   without it). */
void model_softcap_logits(const clrt_model *m, float *logits, int B);

/* ---- weights (weights.c) --------------------------------------------------------------------- */

/* A copy is current when made from the params' version now; dropping frees it; a made copy
   takes its format and that format's kernels at the CPU level in use. */
int model_copy_current(const clrt_model *m, const weight_copy *c);
void model_copy_drop(weight_copy *c);
void model_copy_made(const clrt_model *m, weight_copy *c, const weight_format *f);
/* The copy's kernels at the CPU level in use (chosen again only after a level change). */
const linear_kernels *model_copy_kernels(weight_copy *c);
/* The packed f32 copy (CPU decode) and the bf16 copy follow the params' version. */
int model_refresh_packed(clrt_model *m);
/* logprobs' share of that policy: which models read a packed copy in training and scoring. */
int model_refresh_packed_logprobs(clrt_model *m);
int model_refresh_bf16(clrt_model *m);
/* The optimizer step keeps the copies current itself (no repack per step): before the update,
   which copies are current (0: none to keep); per linear weight param (its offset), K and O
   (0 when it is no linear weight); after updating rows [r0, r1) of one, those rows into each
   kept copy; after the step, the kept copies marked current for the new version. */
int model_copies_to_keep(const clrt_model *m);
int model_linear_dims(const clrt_model *m, int64_t off, int *K, int *O);
void model_copy_rows(clrt_model *m, int keep, int64_t off, int K, int O, int r0, int r1);
void model_copies_kept(clrt_model *m, int keep);
/* The packed copy of the weight at offset w when it is current, else NULL. */
const float *model_packed_weight(const clrt_model *m, int64_t w);
/* 1 when the CPU's AVX-512 training kernels are wanted (set_decode_pack, on by default). */
int model_fast_kernels(const clrt_model *m);
/* The modes' rules (the product policy's other half): 0 when the model's mode lets `who`
   make the change, else -1 with an error naming who and why. MODE_F32_WEIGHTS: read or write
   the f32 linear weights (load, save, init, merge, bf16 copies of them); MODE_BF16_BASE:
   drop them for a bf16 base; MODE_ON_CUDA: move to a CUDA device. */
enum { MODE_F32_WEIGHTS, MODE_BF16_BASE, MODE_ON_CUDA };
int model_mode_allows(const clrt_model *m, int change, const char *who);
/* The output layer's kernel bits (CLRT_OUT_FAST, CLRT_OUT_ROWWISE when batch-invariant). */
int model_output_kernels(const clrt_model *m);
/* The most workspace any CPU product (base or adapter) of up to N rows takes in the model's
   mode, whatever batch invariance or packing it runs (those switch without a new step). */
size_t model_workspace_bytes(const clrt_model *m, int64_t N);
/* ---- the bf16 base (base16.c) and int8 copies (quant8.c) --------------------------------------- */

/* A block linear weight p [rows, K] (f32 src) into bf16 panels at dst, a fused tensor's row
   blocks each on their own (model_param_row_blocks). */
void model_base16_pack(const clrt_model *m, const clrt_param_info *p, uint16_t *dst, const float *src);
/* Drops the blocks' f32 linear weights for bf16 panels (clrt_model_set_base_bf16, device.c,
   then picks the ops). */
int model_base16_convert(clrt_model *m);
/* quant=int8 (quant8.c): clrt_model_forward_cached's products read the int8 blocks remade by
   model_q8_refresh when the params change; everything else stays f32. */
int model_q8_active(const clrt_model *m);
int model_q8_refresh(clrt_model *m);
void model_q8_free(model_q8 *q);
/* The optimizer step's in-place refresh of current int8 copies (optim.c, beside weights.c's). */
int model_q8_current(const clrt_model *m);
void model_q8_copy_rows(clrt_model *m, int64_t off, int K, int O, int r0, int r1);
void model_q8_kept(clrt_model *m);

/* ---- parameters (params.c) ------------------------------------------------------------------- */

static inline float *PW(const clrt_model *m, int64_t off) { return off < 0 ? NULL : (float *)m->params->data + off; }
/* The base's gradient: none when adapters freeze it. */
static inline float *GW(const clrt_model *m, int64_t off) { return off < 0 || m->lora ? NULL : (float *)m->grads->data + off; }
int model_ensure_grads(clrt_model *m);
/* A model on the CPU with its parameter layout and no ops yet (clrt_model_new, device.c,
   picks them). */
clrt_model *model_params_new(const clrt_model_config *cfg);
void model_lora_free(model_lora *lo);
/* A tensor over one parameter's place in an arena (params, grads). */
clrt_tensor *model_param_view(clrt_storage *s, const clrt_param_info *p);

/* ---- the layer code's products (linear.c) ------------------------------------------------------ */

/* parts[i].y [N, O_i] = x [N, K] W_i^T (+ b_i) (+ its adapter): one call per product (or per
   group of products over the same input), whatever copy, device or adapter runs underneath.
   A: the layer's kept activations; keep: a training forward. */
void model_linear(clrt_model *m, acts *a, layer_acts *A, int l, int keep, const float *x, int64_t N,
                  int K, const lin_part *parts, int count);
/* A decode step's logits [B, V] = xn [B, C] head^T through the format when it holds the head,
   else the master's (no adapter: model_lora_head_decode adds it). */
void model_linear_head(clrt_model *m, acts *a, float *logits, const float *xn, int64_t B);
/* dx [N, K] (+)= dy [N, O] W, the weight's (and bias's) gradients, and the adapter's. */
void model_linear_backward(clrt_model *m, acts *a, const layer_acts *A, int l, int target, float *dx,
                           int64_t w, float *db, const float *dy, const float *x, int64_t N, int K,
                           int O, int acc);

/* ---- LoRA (lora.c) ---------------------------------------------------------------------------- */
/* Before a forward: notes whether the adapters run, and for a kept one its dropout step. */
void model_lora_begin(clrt_context *x, int keep);
/* y [N, O] += the adapter of (layer l, target t) over x [N, K]; no-op without one. keep: a
   training forward (dropout on, xa kept in A->lxa). */
void model_lora_forward(clrt_model *m, acts *a, layer_acts *A, int l, int t, float *y, const float *x,
                        int64_t N, int K, int O, int keep);
/* The adapter's gradients and dx [N, K] += its input gradient, for dy [N, O]. */
void model_lora_backward(clrt_model *m, acts *a, const layer_acts *A, int l, int t, float *dx,
                         const float *dy, const float *x, int64_t N, int K, int O);
/* The embedding's adapter: y [N, C] (the embedded tokens a->tok) += its share; backward: its
   gradients from dy = dL/dy. */
void model_lora_embed_forward(clrt_model *m, acts *a, float *y, int64_t N);
void model_lora_embed_backward(clrt_model *m, acts *a, const float *dy, int64_t N);
/* The output layer's adapter for the fused output op over xn [nv, C]: fills *hl (xa computed,
   dropout in a kept forward) and returns it, or NULL without an active one. */
const struct clrt_head_lora *model_lora_head_forward(clrt_model *m, acts *a, struct clrt_head_lora *hl,
                                                     const float *xn, int64_t nv, int keep);
/* Backward: *hl for output_backward (the forward's xa, dxa and dB to fill), or NULL; after
   it, model_lora_head_backward_end adds dA and dx [nv, C] += the adapter's input gradient. */
const struct clrt_head_lora *model_lora_head_backward(clrt_model *m, acts *a, struct clrt_head_lora *hl);
void model_lora_head_backward_end(clrt_model *m, acts *a, float *dx, const float *xn, int64_t nv);
/* A decode step's logits [B, V] (model memory) += the output adapter's share over xn [B, C]. */
void model_lora_head_decode(clrt_model *m, acts *a, float *logits, const float *xn, int B);
/* The parameter set an optimizer walks: the adapters' when lora, else the model's. */
typedef struct param_set {
  clrt_storage *params, *grads;
  int np;
  const clrt_param_info *p;
  int64_t total;
} param_set;
param_set model_param_set(clrt_model *m, int lora);

/* ---- architecture variants (params.c) -------------------------------------------------------- */

/* The attention window of layer l (0: the whole causal prefix). */
int model_layer_window(const clrt_model *m, int l);
/* The row blocks a parameter holds, each its own linear weight: 3 for a fused qkv_proj (q,
   k, v rows), 2 for a fused gate_up_proj, else 1 (the whole tensor); rows[i] their heights. */
int model_param_row_blocks(const clrt_model *m, const clrt_param_info *p, int64_t rows[3]);

/* ---- per-kernel timing (profile.c) ------------------------------------------------------------ */

extern int model_prof_on;   /* -1 until the first model reads CLRT_PROFILE */
/* The device's wait (set by the CUDA ops table), used around each timed kernel while
   clrt_profile_sync(1) is on: without it a GPU kernel's time is its launch's. */
extern int (*model_prof_sync)(void);
extern int model_prof_syncing;
double model_now(void);
static inline void model_prof_wait(void) {
  if (model_prof_syncing && model_prof_sync) model_prof_sync();
}
#define PROF(k, stmt)                                                  \
  do {                                                                 \
    if (model_prof_on > 0) model_prof_wait();                          \
    double t0_ = model_prof_on > 0 ? model_now() : 0;                   \
    stmt;                                                              \
    if (model_prof_on > 0) {                                           \
      model_prof_wait();                                               \
      clrt_kernel_seconds[k] += model_now() - t0_;                     \
    }                                                                  \
  } while (0)

#endif
