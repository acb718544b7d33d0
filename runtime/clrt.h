/*
 * clrt.h — the one public interface of the clrt runtime.
 *
 * The binary embeds this file and Lua's FFI cdef()s it (lua/clrt/ffi.lua), so below the
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

/* ==== core: errors, version, interrupts ================================================ */

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


/* ==== tensors ============================================================================ */

enum { CLRT_MAX_DIMS = 8 };
typedef enum { CLRT_F32 = 0, CLRT_BF16 = 1, CLRT_I32 = 2 } clrt_dtype;
typedef enum { CLRT_CPU = 0, CLRT_CUDA = 1 } clrt_device;

/* Reference-counted memory shared by all views of it (an arena is one storage). */
typedef struct clrt_storage {
  void *data;
  size_t bytes;
  int refcount;
  int device;
} clrt_storage;

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


/* ==== tensor ops ========================================================================= */


/* ==== model: the Llama-family transformer ================================================ */

/* The architecture's numbers. lua/clrt/model.lua fills it from config.json (and checks it);
   C trusts only what clrt_model_new validates again. */
typedef struct clrt_model_config {
  int vocab_size, hidden_size, intermediate_size, num_hidden_layers;
  int num_attention_heads, num_key_value_heads, head_dim, max_position_embeddings;
  float rms_norm_eps;
  double rope_theta;
  int rope_scaling;                 /* CLRT_ROPE_* */
  double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
  int rope_original_max_position;   /* llama3: original_max_position_embeddings */
  int tie_word_embeddings;
  int qkv_bias;                     /* q/k/v projections carry biases (Qwen2; attention_bias) */
  int o_bias;                       /* o_proj carries a bias (Llama/Qwen3 attention_bias) */
  int qk_norm;                      /* per-head RMSNorm of q and k before RoPE (Qwen3) */
  int max_batch, max_seq;           /* activation arena's first size; it grows past them */
} clrt_model_config;
enum { CLRT_ROPE_DEFAULT = 0, CLRT_ROPE_LINEAR = 1, CLRT_ROPE_LLAMA3 = 2 };
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
size_t clrt_model_memory(const clrt_model *m, int arena);
/* lp[b][t] = log p(tokens[b][t+1] | tokens[b][..t]) for t + 1 < lengths[b], else 0.
   tokens: [B, T] row-major; lengths: [B] or NULL (all T); lp: [B, T-1].
   keep != 0 keeps what clrt_model_backward needs. */
int clrt_model_logprobs(clrt_model *m, const int32_t *tokens, int B, int T,
                        const int32_t *lengths, float *lp, int keep);
/* dlogp: [B, T-1] of the last kept forward; accumulates into the gradients. */
int clrt_model_backward(clrt_model *m, const float *dlogp);
int clrt_model_zero_grad(clrt_model *m);
/* Per-kernel wall time, accumulated while CLRT_PROFILE=1 is set in the environment. */
int clrt_profile_count(void);
const char *clrt_profile_name(int i);
double clrt_profile_seconds(int i);
void clrt_profile_reset(void);


/* ==== optimizer ========================================================================== */

/* AdamW over all of a model's parameters; the moments live in one arena each. */
typedef struct clrt_adamw clrt_adamw;
/* decay[i] != 0: tensor i gets weight decay (default in Lua: matrices, not norms/biases). */
clrt_adamw *clrt_adamw_new(clrt_model *m, const uint8_t *decay);
void clrt_adamw_free(clrt_adamw *o);
/* Clips the global gradient norm to grad_clip (<= 0: no clipping), then one fused AdamW
   update with bias correction and decoupled weight decay. *grad_norm: the norm before
   clipping. */
int clrt_adamw_step(clrt_adamw *o, float lr, float beta1, float beta2, float eps,
                    float weight_decay, float grad_clip, double *grad_norm);
int64_t clrt_adamw_get_step(const clrt_adamw *o);
void clrt_adamw_set_step(clrt_adamw *o, int64_t step);
/* which: 0 first moment (exp_avg), 1 second (exp_avg_sq); views shaped like parameter i. */
clrt_tensor *clrt_adamw_moment(clrt_adamw *o, int which, int i);
size_t clrt_adamw_memory(const clrt_adamw *o);


/* ==== safetensors and Hugging Face files ================================================= */

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
/* Any small file (config.json, trainer state) the same way: temporary name, fsync, rename. */
int clrt_file_write_atomic(const char *path, const char *data, size_t len);


/* ==== tokenizer ========================================================================== */


/* ==== generation ========================================================================= */

/* A KV cache of `slots` independent sequences of up to max_len tokens over a model. Logits
   are written to row `slot` of a [slots, V] buffer. */
typedef struct clrt_decoder clrt_decoder;
clrt_decoder *clrt_decoder_new(clrt_model *m, int slots, int max_len);
void clrt_decoder_free(clrt_decoder *d);
size_t clrt_decoder_bytes(const clrt_decoder *d);
int clrt_decoder_length(const clrt_decoder *d, int slot);
int clrt_decoder_reset(clrt_decoder *d, int slot);
int clrt_decoder_copy_slot(clrt_decoder *d, int src, int dst);
/* Runs T tokens after what the slot holds; logits of the last one. */
int clrt_decoder_append(clrt_decoder *d, int slot, const int32_t *tokens, int T, float *logits);
/* One token for each of n distinct slots. */
int clrt_decoder_decode(clrt_decoder *d, int n, const int32_t *slots, const int32_t *tokens,
                        float *logits);

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


/* ==== constrained decoding =============================================================== */


/* ==== HTTP client ======================================================================== */


/* ==== server ============================================================================= */

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
clrt_server *clrt_server_start(const char *host, int port, size_t max_body);
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
/* Terminal input for interactive commands: a readline line (free with clrt_free), or NULL
   at end of input; the history file is shared across sessions. */
char *clrt_readline(const char *prompt);
void clrt_free(void *p);
int clrt_history_load(const char *path);
int clrt_history_save(const char *path);


/* ==== CUDA =============================================================================== */


#endif /* CLRT_H */
