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


/* ==== optimizer ========================================================================== */


/* ==== safetensors and Hugging Face files ================================================= */


/* ==== tokenizer ========================================================================== */


/* ==== generation ========================================================================= */

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

/* A JSON grammar is a table of schema nodes built by the clrt_json_* builder calls (Lua's
   clrt.json_constraint parses the schema), then finished; a byte-level pushdown automaton runs
   over it. A vocab is a trie over the token byte strings, built once per tokenizer; fill_mask
   walks it from a row's state and allows exactly the tokens whose bytes keep the output a
   prefix of a valid value (and the stop ids once the value is complete). */
enum {
  CLRT_JSON_ANY = 0,        /* any JSON value */
  CLRT_JSON_STRING = 1,     /* lo/hi: minLength/maxLength in code points (hi < 0: none) */
  CLRT_JSON_NUMBER = 2,     /* lo/hi: minimum/maximum, per flags */
  CLRT_JSON_INTEGER = 3,
  CLRT_JSON_ENUM = 4,       /* literals: the values' JSON bytes (strings, numbers, true...) */
  CLRT_JSON_OBJECT = 5,     /* properties in the order they must appear */
  CLRT_JSON_MAP = 6,        /* any keys; values: child 0, or any value without a child */
  CLRT_JSON_ARRAY = 7,      /* items: child 0 (any value without); lo/hi: minItems/maxItems */
  CLRT_JSON_ANYOF = 8,      /* children: alternatives whose first bytes differ */
  CLRT_JSON_HAS_MIN = 1, CLRT_JSON_HAS_MAX = 2, CLRT_JSON_EXCL_MIN = 4, CLRT_JSON_EXCL_MAX = 8
};
typedef struct clrt_json_grammar clrt_json_grammar;
typedef struct clrt_json_state clrt_json_state;
typedef struct clrt_json_vocab clrt_json_vocab;
/* max_ws: most whitespace bytes allowed in one gap between JSON tokens. */
clrt_json_grammar *clrt_json_grammar_new(int max_ws);
void clrt_json_grammar_free(clrt_json_grammar *g);
/* Returns the new node's index, or -1. */
int clrt_json_node(clrt_json_grammar *g, int kind, double lo, double hi, int flags);
int clrt_json_add_child(clrt_json_grammar *g, int node, int child);
int clrt_json_add_literal(clrt_json_grammar *g, int node, const char *json, size_t len);
/* key_json: the key as a JSON string, quotes included. */
int clrt_json_add_property(clrt_json_grammar *g, int node, const char *key_json, size_t len,
                           int child, int required);
/* Checks the grammar (depth, distinct anyOf alternatives, bounds) and fixes its root. */
int clrt_json_grammar_finish(clrt_json_grammar *g, int root);
clrt_json_state *clrt_json_state_new(const clrt_json_grammar *g);
void clrt_json_state_free(clrt_json_state *s);
void clrt_json_state_copy(clrt_json_state *dst, const clrt_json_state *src);
/* Feed bytes; 0 if every byte was accepted (the state advanced), -1 otherwise (unchanged). */
int clrt_json_state_advance(clrt_json_state *s, const uint8_t *bytes, size_t len);
/* 1 when the bytes so far are a complete value (it may still go on, like a number). */
int clrt_json_state_complete(const clrt_json_state *s);
/* bytes: all token strings end to end; offsets: [V + 1]; a token with no bytes is never allowed
   (special tokens, ids the tokenizer lacks). */
clrt_json_vocab *clrt_json_vocab_new(const uint8_t *bytes, const int64_t *offsets, int V);
void clrt_json_vocab_free(clrt_json_vocab *v);
int clrt_json_vocab_size(const clrt_json_vocab *v);
/* mask: [V] out, 1 = allowed; stop ids are allowed when the value is complete. Returns the
   number of allowed tokens, or -1. */
int clrt_json_fill_mask(clrt_json_vocab *v, const clrt_json_state *s, const int32_t *stop_ids,
                        int n_stop, uint8_t *mask);


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
