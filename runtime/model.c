/* model.c — the Llama-family transformer (Llama 2/3, Qwen2, Qwen3): parameter layout with
   Hugging Face names, loading and saving, and the forward/backward orchestration over the
   kernels in kernels/cpu. Memory is three arenas: parameters, gradients (allocated on first
   use) and activations (laid out per call from B and T, grown when a call needs more).

   One layer, as the kernels see it (N = B*T rows):
     xn = rmsnorm(x) ; q,k,v = xn W^T (+b) ; [qk-norm per head] ; rope(q, k)
     att = causal_gqa(q, k, v) ; xmid = x + att Wo^T (+b)
     xn = rmsnorm(xmid) ; h = silu(xn Wg^T) * (xn Wu^T) ; x' = xmid + h Wd^T
   Saved per layer for backward: xmid, q, k, v (after RoPE), att, the attention logsumexp,
   gate and up, the norms' rstd (and q/k before their norm for Qwen3). The normalised inputs
   and h are recomputed in backward instead of stored.

   Decode with a KV cache is clrt_model_forward_cached: the same layer_forward, run for the
   new positions only (pos0 per row), writing their keys/values into the caller's cache and
   attending over it. */
#include "model_internal.h"
#include "bf16.h"
#include "cpu/model_kernels.h"
#ifdef CLRT_HAVE_CUDA
#include "cuda/cuda_kernels.h"
#endif

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- per-kernel timing --------------------------------------------------------------- */

double clrt_kernel_seconds[CLRT_K_COUNT];
const char *const clrt_kernel_names[CLRT_K_COUNT] = {
    "embedding", "linear fwd", "linear bwd", "rmsnorm", "rope", "attention fwd",
    "attention bwd", "swiglu", "residual", "output fwd", "output bwd", "adamw", "other"};
static int prof_on = -1;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define PROF(k, stmt)                                      \
  do {                                                     \
    double t0_ = prof_on > 0 ? now() : 0;                  \
    stmt;                                                  \
    if (prof_on > 0) clrt_kernel_seconds[k] += now() - t0_; \
  } while (0)

/* Kernel dispatch: the CUDA twin (same signature, device pointers) when the model lives on the
   GPU, else the CPU kernel; on a CPU-only build this is the plain CPU call. */
#ifdef CLRT_HAVE_CUDA
#define ON_GPU(m) ((m)->device == CLRT_CUDA)
#define K(m, name, ...) (ON_GPU(m) ? clrt_cuda_##name(__VA_ARGS__) : clrt_##name(__VA_ARGS__))
#else
#define ON_GPU(m) 0
#define K(m, name, ...) clrt_##name(__VA_ARGS__)
#endif

/* Memory helpers that follow the model's device. */
static void zero_floats(const clrt_model *m, float *p, size_t n) {
#ifdef CLRT_HAVE_CUDA
  if (ON_GPU(m)) {
    clrt_cuda_memset0(p, sizeof(float) * n);
    return;
  }
#endif
  memset(p, 0, sizeof(float) * n);
}

/* Host -> the model's memory (a plain copy on the CPU). */
static int to_model(const clrt_model *m, void *dst, const void *src, size_t bytes) {
#ifdef CLRT_HAVE_CUDA
  if (ON_GPU(m)) return clrt_cuda_memcpy(dst, src, bytes, 0);
#endif
  memcpy(dst, src, bytes);
  return 0;
}

/* The model's memory -> host; waits for the device and reports a failed kernel first. */
static int from_model(const clrt_model *m, void *dst, const void *src, size_t bytes) {
#ifdef CLRT_HAVE_CUDA
  if (ON_GPU(m)) return clrt_cuda_sync() || clrt_cuda_memcpy(dst, src, bytes, 1) ? -1 : 0;
#endif
  memcpy(dst, src, bytes);
  return 0;
}

int clrt_profile_count(void) { return CLRT_K_COUNT; }
const char *clrt_profile_name(int i) { return i >= 0 && i < CLRT_K_COUNT ? clrt_kernel_names[i] : NULL; }
double clrt_profile_seconds(int i) { return i >= 0 && i < CLRT_K_COUNT ? clrt_kernel_seconds[i] : 0; }
void clrt_profile_reset(void) { memset(clrt_kernel_seconds, 0, sizeof clrt_kernel_seconds); }

/* ---- layout ------------------------------------------------------------------------------ */

static int64_t add_param(clrt_model *m, int cap, const char *name, int ndim, int64_t d0, int64_t d1) {
  if (m->np >= cap) return -1;
  clrt_param_info *p = &m->p[m->np++];
  snprintf(p->name, sizeof p->name, "%s", name);
  p->ndim = ndim;
  p->shape[0] = d0;
  p->shape[1] = ndim > 1 ? d1 : 0;
  p->numel = ndim > 1 ? d0 * d1 : d0;
  /* 16-float alignment keeps every tensor on its own cache lines. */
  p->offset = m->total;
  m->total += (p->numel + 15) & ~(int64_t)15;
  return p->offset;
}

static int validate_config(const clrt_model_config *c) {
#define POS(f)                                                            \
  if (c->f <= 0) {                                                        \
    clrt_set_error("model: config.json: %s must be positive (got %d)", #f, c->f); \
    return -1;                                                            \
  }
  POS(vocab_size) POS(hidden_size) POS(intermediate_size) POS(num_hidden_layers)
  POS(num_attention_heads) POS(num_key_value_heads) POS(head_dim) POS(max_position_embeddings)
#undef POS
  if (c->num_attention_heads % c->num_key_value_heads) {
    clrt_set_error("model: config.json: num_attention_heads (%d) is not a multiple of "
                   "num_key_value_heads (%d)", c->num_attention_heads, c->num_key_value_heads);
    return -1;
  }
  if (c->head_dim % 2) {
    clrt_set_error("model: config.json: head_dim (%d) must be even for RoPE", c->head_dim);
    return -1;
  }
  if (!(c->rms_norm_eps > 0) || !(c->rope_theta > 0)) {
    clrt_set_error("model: config.json: rms_norm_eps and rope_theta must be positive");
    return -1;
  }
  if (c->rope_scaling < CLRT_ROPE_DEFAULT || c->rope_scaling > CLRT_ROPE_LLAMA3) {
    clrt_set_error("model: config.json: unknown rope_scaling kind %d", c->rope_scaling);
    return -1;
  }
  if (c->rope_scaling != CLRT_ROPE_DEFAULT && !(c->rope_factor > 0)) {
    clrt_set_error("model: config.json: rope_scaling.factor must be positive");
    return -1;
  }
  if (c->rope_scaling == CLRT_ROPE_LLAMA3 &&
      (!(c->rope_high_freq_factor > c->rope_low_freq_factor) || !(c->rope_low_freq_factor > 0) ||
       c->rope_original_max_position <= 0)) {
    clrt_set_error("model: config.json: llama3 rope_scaling needs high_freq_factor > "
                   "low_freq_factor > 0 and original_max_position_embeddings > 0");
    return -1;
  }
  return 0;
}

/* inv_freq[i] = theta^(-2i/D), then the config's scaling (transformers' rope_init functions). */
static void compute_inv_freq(const clrt_model_config *c, float *inv) {
  int D = c->head_dim, half = D / 2;
  for (int i = 0; i < half; i++) {
    /* computed in f32 like transformers: base ** (arange(0, D, 2).float() / D) */
    float e = (float)(2 * i) / (float)D;
    float f = (float)(1.0 / pow(c->rope_theta, (double)e));
    if (c->rope_scaling == CLRT_ROPE_LINEAR) f = f / (float)c->rope_factor;
    if (c->rope_scaling == CLRT_ROPE_LLAMA3) {
      double factor = c->rope_factor, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
      double old = c->rope_original_max_position;
      double lo_wavelen = old / lo, hi_wavelen = old / hi;
      double wavelen = 2 * M_PI / f;
      double g = f;
      if (wavelen > lo_wavelen) g = f / factor;
      else if (wavelen >= hi_wavelen) {   /* between: interpolate smoothly */
        double smooth = (old / wavelen - lo) / (hi - lo);
        g = (1 - smooth) * f / factor + smooth * f;
      }
      f = (float)g;
    }
    inv[i] = f;
  }
}

clrt_model *clrt_model_new(const clrt_model_config *cfg) {
  if (validate_config(cfg)) return NULL;
  clrt_model *m = calloc(1, sizeof *m);
  if (!m) goto oom;
  m->cfg = *cfg;
  m->pack_decode = 1;
  m->wbf_ver = m->wpk_ver = COPY_STALE;
  const clrt_model_config *c = &m->cfg;
  int L = c->num_hidden_layers, C = c->hidden_size, I = c->intermediate_size;
  int64_t HD = (int64_t)c->num_attention_heads * c->head_dim, KVD = (int64_t)c->num_key_value_heads * c->head_dim;
  int cap = 16 * L + 4;
  m->p = calloc((size_t)cap, sizeof *m->p);
  m->layer = calloc((size_t)L, sizeof *m->layer);
  m->inv_freq = calloc((size_t)c->head_dim / 2, sizeof(float));
  if (!m->p || !m->layer || !m->inv_freq) goto oom;
  char name[96];
  m->wte = add_param(m, cap, "model.embed_tokens.weight", 2, c->vocab_size, C);
  for (int l = 0; l < L; l++) {
    clrt_layer_offsets *o = &m->layer[l];
#define P(field, suffix, nd, a, b)                                       \
  snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);          \
  o->field = add_param(m, cap, name, nd, a, b);
    P(ln1, "input_layernorm.weight", 1, C, 0)
    P(wq, "self_attn.q_proj.weight", 2, HD, C)
    P(wk, "self_attn.k_proj.weight", 2, KVD, C)
    P(wv, "self_attn.v_proj.weight", 2, KVD, C)
    o->bq = o->bk = o->bv = o->bo = o->qn = o->kn = -1;
    if (c->qkv_bias) {
      P(bq, "self_attn.q_proj.bias", 1, HD, 0)
      P(bk, "self_attn.k_proj.bias", 1, KVD, 0)
      P(bv, "self_attn.v_proj.bias", 1, KVD, 0)
    }
    P(wo, "self_attn.o_proj.weight", 2, C, HD)
    if (c->o_bias) { P(bo, "self_attn.o_proj.bias", 1, C, 0) }
    if (c->qk_norm) {
      P(qn, "self_attn.q_norm.weight", 1, c->head_dim, 0)
      P(kn, "self_attn.k_norm.weight", 1, c->head_dim, 0)
    }
    P(ln2, "post_attention_layernorm.weight", 1, C, 0)
    P(wg, "mlp.gate_proj.weight", 2, I, C)
    P(wu, "mlp.up_proj.weight", 2, I, C)
    P(wd, "mlp.down_proj.weight", 2, C, I)
#undef P
  }
  m->norm = add_param(m, cap, "model.norm.weight", 1, C, 0);
  m->head = c->tie_word_embeddings ? m->wte : add_param(m, cap, "lm_head.weight", 2, c->vocab_size, C);
  m->params = clrt_storage_new(sizeof(float) * (size_t)m->total, CLRT_CPU);
  if (!m->params) {
    clrt_model_free(m);
    return NULL;
  }
  compute_inv_freq(c, m->inv_freq);
  if (prof_on < 0) {
    const char *e = getenv("CLRT_PROFILE");
    prof_on = e && *e && strcmp(e, "0") != 0;
  }
  return m;
oom:
  clrt_model_free(m);
  clrt_set_error("model: out of memory");
  return NULL;
}

void clrt_model_free(clrt_model *m) {
  if (!m) return;
  clrt_storage_release(m->params);
  clrt_storage_release(m->grads);
  clrt_storage_release(m->acts);
  free(m->p);
  free(m->layer);
  free(m->inv_freq);
  free(m->rope_cos);
  free(m->rope_sin);
  clrt_storage_release(m->rope_dev);
  clrt_storage_release(m->wbf);
  clrt_storage_release(m->wpk);
  free(m->hidx);
  free(m);
}

static float *PW(const clrt_model *m, int64_t off) { return off < 0 ? NULL : (float *)m->params->data + off; }
static float *GW(const clrt_model *m, int64_t off) { return off < 0 ? NULL : (float *)m->grads->data + off; }

static int ensure_grads(clrt_model *m) {
  if (m->grads) return 0;
  m->grads = clrt_storage_new(sizeof(float) * (size_t)m->total, m->device);
  return m->grads ? 0 : -1;
}

int clrt_model_init_random(clrt_model *m, uint64_t seed) {
  clrt_rng r;
  clrt_rng_seed(&r, seed);
  /* On the GPU the values are drawn on the host (the same stream as on the CPU) and copied. */
  float *w = ON_GPU(m) ? calloc((size_t)m->total, sizeof(float)) : m->params->data;
  if (!w) {
    clrt_set_error("model: out of host memory initialising %lld parameters", (long long)m->total);
    return -1;
  }
  double std = 0.02, proj_std = 0.02 / sqrt(2.0 * m->cfg.num_hidden_layers);
  for (int i = 0; i < m->np; i++) {
    clrt_param_info *p = &m->p[i];
    float *d = w + p->offset;
    const char *n = p->name;
    size_t len = strlen(n);
    int is_bias = len > 5 && strcmp(n + len - 5, ".bias") == 0;
    if (p->ndim == 1) {
      for (int64_t k = 0; k < p->numel; k++) d[k] = is_bias ? 0.0f : 1.0f;
      continue;
    }
    double s = (strstr(n, "o_proj") || strstr(n, "down_proj")) ? proj_std : std;
    for (int64_t k = 0; k < p->numel; k++) d[k] = (float)(s * clrt_rng_normal(&r));
  }
  clrt_model_params_changed(m);
  if (!ON_GPU(m)) return 0;
  int rc = to_model(m, m->params->data, w, sizeof(float) * (size_t)m->total);
  free(w);
  return rc;
}

/* ---- introspection ----------------------------------------------------------------------- */

int clrt_model_num_tensors(const clrt_model *m) { return m->np; }

const char *clrt_model_tensor_name(const clrt_model *m, int i) {
  if (i < 0 || i >= m->np) {
    clrt_set_error("model: tensor index %d out of range (%d tensors)", i, m->np);
    return NULL;
  }
  return m->p[i].name;
}

int clrt_model_tensor_is_matrix(const clrt_model *m, int i) {
  return i >= 0 && i < m->np && m->p[i].ndim == 2;
}

static clrt_tensor *view(clrt_storage *s, const clrt_param_info *p) {
  return clrt_tensor_over(s, CLRT_F32, p->ndim, p->shape, NULL, p->offset);
}

clrt_tensor *clrt_model_param(clrt_model *m, int i) {
  if (!clrt_model_tensor_name(m, i)) return NULL;
  return view(m->params, &m->p[i]);
}

clrt_tensor *clrt_model_grad(clrt_model *m, int i) {
  if (!clrt_model_tensor_name(m, i) || ensure_grads(m)) return NULL;
  return view(m->grads, &m->p[i]);
}

int64_t clrt_model_num_params(const clrt_model *m) {
  int64_t n = 0;
  for (int i = 0; i < m->np; i++) n += m->p[i].numel;
  return n;
}

size_t clrt_model_memory(const clrt_model *m, int arena) {
  switch (arena) {
    case CLRT_ARENA_PARAMS:   /* with the bf16 and packed copies made from them */
      return (m->params ? m->params->bytes : 0) + (m->wbf ? m->wbf->bytes : 0) + (m->wpk ? m->wpk->bytes : 0);
    case CLRT_ARENA_GRADS: return m->grads ? m->grads->bytes : 0;
    case CLRT_ARENA_ACTIVATIONS:
      return (m->acts ? m->acts->bytes : 0) +
             2 * sizeof(float) * (size_t)m->rope_len * (size_t)(m->cfg.head_dim / 2);
    default: return 0;
  }
}

int clrt_model_zero_grad(clrt_model *m) {
  if (ensure_grads(m)) return -1;
  zero_floats(m, m->grads->data, m->grads->bytes / sizeof(float));
  return 0;
}

/* ---- loading and saving ------------------------------------------------------------------ */

static int find_param(const clrt_model *m, const char *name) {
  for (int i = 0; i < m->np; i++)
    if (strcmp(m->p[i].name, name) == 0) return i;
  return -1;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < ndim && k < n; d++)
    k += (size_t)snprintf(buf + k, n - k, d ? ", %lld" : "%lld", (long long)shape[d]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

int clrt_model_load_safetensors(clrt_model *m, const char *path) {
  if (ON_GPU(m)) {
    clrt_set_error("safetensors %s: load the model on the cpu, then move it with to(\"cuda\")", path);
    return -1;
  }
  clrt_safetensors *st = clrt_safetensors_open(path);
  if (!st) return -1;
  int n = clrt_safetensors_count(st), rc = -1;
  for (int i = 0; i < n; i++) {
    const char *name = clrt_safetensors_name(st, i);
    int j = find_param(m, name);
    if (j < 0) {
      size_t len = strlen(name);
      /* Tied checkpoints sometimes also store the head; old Llama ones store inv_freq. */
      if ((m->cfg.tie_word_embeddings && strcmp(name, "lm_head.weight") == 0) ||
          (len > 19 && strcmp(name + len - 19, "rotary_emb.inv_freq") == 0))
        continue;
      clrt_set_error("safetensors %s: unexpected tensor '%s': not a parameter of this model "
                     "(does config.json match the checkpoint?)", path, name);
      goto done;
    }
    clrt_param_info *p = &m->p[j];
    if (p->loaded) {
      clrt_set_error("safetensors %s: tensor '%s' was already loaded from another file", path, name);
      goto done;
    }
    int nd = clrt_safetensors_ndim(st, i);
    int64_t shape[CLRT_MAX_DIMS];
    for (int d = 0; d < nd; d++) shape[d] = clrt_safetensors_dim(st, i, d);
    int same = nd == p->ndim;
    for (int d = 0; same && d < nd; d++) same = shape[d] == p->shape[d];
    if (!same) {
      char have[128], want[128];
      shape_str(have, sizeof have, nd, shape);
      shape_str(want, sizeof want, p->ndim, p->shape);
      clrt_set_error("safetensors %s: tensor '%s' has shape %s but config.json implies %s", path,
                     name, have, want);
      goto done;
    }
    if (clrt_safetensors_read_f32(st, i, PW(m, p->offset), p->numel)) goto done;
    p->loaded = 1;
  }
  clrt_model_params_changed(m);
  rc = 0;
done:
  clrt_safetensors_close(st);
  return rc;
}

int clrt_model_check_loaded(const clrt_model *m, const char *where) {
  for (int i = 0; i < m->np; i++)
    if (!m->p[i].loaded) {
      clrt_set_error("model %s: tensor '%s' is missing from the checkpoint", where, m->p[i].name);
      return -1;
    }
  return 0;
}

int clrt_model_save_safetensors(const clrt_model *m, const char *path) {
  const char **names = calloc((size_t)m->np, sizeof *names);
  const clrt_tensor **ts = calloc((size_t)m->np, sizeof *ts);
  int rc = -1, made = 0;
  clrt_storage *src = m->params, *host = NULL;
  if (!names || !ts) {
    clrt_set_error("model: out of memory saving %s", path);
    goto done;
  }
  if (ON_GPU(m)) {   /* one copy of the arena to the host, written from there */
    if (!(host = clrt_storage_new(m->params->bytes, CLRT_CPU)) ||
        from_model(m, host->data, m->params->data, m->params->bytes))
      goto done;
    src = host;
  }
  for (; made < m->np; made++) {
    names[made] = m->p[made].name;
    if (!(ts[made] = view(src, &m->p[made]))) goto done;
  }
  const char *mk[1] = {"format"}, *mv[1] = {"pt"};
  rc = clrt_safetensors_write(path, m->np, names, ts, 1, mk, mv);
done:
  for (int i = 0; i < made; i++) clrt_tensor_free((clrt_tensor *)ts[i]);
  clrt_storage_release(host);
  free(names);
  free(ts);
  return rc;
}

/* ---- activations --------------------------------------------------------------------------- */

typedef struct layer_acts {
  float *xmid, *rstd1, *rstd2, *q, *k, *v, *qpre, *kpre, *qrstd, *krstd, *att, *lse, *g, *u;
} layer_acts;

typedef struct acts {
  uint16_t *x16, *dy16;          /* bf16 copies of a linear layer's input / output gradient */
  float **res;                   /* [L+1] residual stream entering each layer (2 when not kept) */
  layer_acts *la;                /* [L] (1 when not kept) */
  float *xn, *tmp, *h;           /* forward scratch: [N, C], [N, C], [N, I] */
  float *dres, *dxn, *dxc, *dA, *datt, *dq, *dk, *dv, *dk2;   /* backward scratch */
  float *rstdf, *lsef, *lpv, *dlpv;   /* [N] */
  int32_t *tok, *target, *rowidx;     /* [N] */
  int32_t *pos0, *slot;               /* [B] kernel-side copies (used on the GPU) */
  float *logits;                 /* [chunk, V] */
  float *attn;                   /* attention scratch */
  int chunk, logits_kept;
  size_t floats;
} acts;

static float *take(acts *a, char *base, size_t n) {
  float *p = base ? (float *)base + a->floats : NULL;
  a->floats += (n + 15) & ~(size_t)15;
  return p;
}

/* Lays out the activations for (B, T, keep) over base, with keys reaching Tk positions;
   base NULL only counts. res and la must have room for L+1 and L entries. */
static void layout(const clrt_model *m, acts *a, char *base, int B, int T, int Tk, int keep) {
  const clrt_model_config *c = &m->cfg;
  int L = c->num_hidden_layers, C = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
  int H = c->num_attention_heads, KV = c->num_key_value_heads, D = c->head_dim;
  size_t N = (size_t)B * T, HD = (size_t)H * D, KVD = (size_t)KV * D;
  a->floats = 0;
  int nres = keep ? L + 1 : 2, nla = keep ? L : 1;
  for (int i = 0; i < nres; i++) a->res[i] = take(a, base, N * C);
  for (int i = 0; i < nla; i++) {
    layer_acts *la = &a->la[i];
    memset(la, 0, sizeof *la);
    la->xmid = take(a, base, N * C);
    la->rstd1 = take(a, base, N);
    la->rstd2 = take(a, base, N);
    la->q = take(a, base, N * HD);
    la->k = take(a, base, N * KVD);
    la->v = take(a, base, N * KVD);
    if (c->qk_norm) {
      la->qpre = take(a, base, N * HD);
      la->kpre = take(a, base, N * KVD);
      la->qrstd = take(a, base, N * H);
      la->krstd = take(a, base, N * KV);
    }
    la->att = take(a, base, N * HD);
    la->lse = take(a, base, N * H);
    la->g = take(a, base, N * I);
    la->u = take(a, base, N * I);
  }
  a->xn = take(a, base, N * C);
  a->tmp = take(a, base, N * C);
  a->h = take(a, base, N * I);
  if (keep) {
    a->dres = take(a, base, N * C);
    a->dxn = take(a, base, N * C);
    a->dxc = take(a, base, N * C);
    a->dA = take(a, base, N * I);
    a->datt = take(a, base, N * HD);
    a->dq = take(a, base, N * HD);
    a->dk = take(a, base, N * KVD);
    a->dv = take(a, base, N * KVD);
    a->dk2 = c->qk_norm ? take(a, base, N * KVD) : NULL;
  }
  a->rstdf = take(a, base, N);
  a->lsef = take(a, base, N);
  a->lpv = take(a, base, N);
  a->dlpv = take(a, base, N);
  a->tok = (int32_t *)take(a, base, N);
  a->target = (int32_t *)take(a, base, N);
  a->rowidx = (int32_t *)take(a, base, N);
  if (ON_GPU(m) && m->bf16) {
    size_t widest = (size_t)C > HD ? (size_t)C : HD;
    if ((size_t)I > widest) widest = (size_t)I;
    a->x16 = (uint16_t *)take(a, base, (N * widest + 1) / 2);
    a->dy16 = (uint16_t *)take(a, base, (N * widest + 1) / 2);
  }
  a->pos0 = (int32_t *)take(a, base, (size_t)B);
  a->slot = (int32_t *)take(a, base, (size_t)B);
  /* Logit rows per chunk: enough for sgemm to run well, few enough to stay ~16 MB. When a
     kept forward's logits fit in keep_logits_mb, all of them stay for backward (one copy,
     never the log-softmax beside it), which saves backward one of its three matmuls. */
  int chunk = (int)((4u << 20) / (unsigned)V);
  chunk = chunk < 16 ? 16 : chunk > 256 ? 256 : chunk;
  a->logits_kept = keep && (double)N * V * sizeof(float) <= c->keep_logits_mb * 1048576.0;
  if ((size_t)chunk > N || a->logits_kept) chunk = (int)N;
  a->chunk = chunk;
  /* On the GPU a decode step's B rows of logits land here before the copy to the host. */
  a->logits = take(a, base, (size_t)(ON_GPU(m) && chunk < B ? B : chunk) * V);
#ifdef CLRT_HAVE_CUDA
  if (ON_GPU(m)) {
    a->attn = take(a, base, clrt_cuda_attention_scratch_floats(B, T, H));
    return;
  }
#endif
  a->attn = take(a, base, clrt_attention_scratch_floats(T, Tk, m->threads));
}

/* The GPU's copy of the RoPE tables (cos then sin), refreshed when they grow or move. */
static int sync_rope(clrt_model *m) {
  clrt_storage_release(m->rope_dev);
  m->rope_dev = NULL;
  if (!ON_GPU(m) || m->rope_len == 0) return 0;
  size_t n = (size_t)m->rope_len * (size_t)(m->cfg.head_dim / 2);
  if (!(m->rope_dev = clrt_storage_new(2 * n * sizeof(float), CLRT_CUDA))) return -1;
  float *d = m->rope_dev->data;
  return to_model(m, d, m->rope_cos, n * sizeof(float)) || to_model(m, d + n, m->rope_sin, n * sizeof(float)) ? -1 : 0;
}

/* The tables as the kernels see them. */
static const float *rope_c(const clrt_model *m) { return ON_GPU(m) ? (const float *)m->rope_dev->data : m->rope_cos; }
static const float *rope_s(const clrt_model *m) {
  return ON_GPU(m) ? (const float *)m->rope_dev->data + (size_t)m->rope_len * (size_t)(m->cfg.head_dim / 2)
                   : m->rope_sin;
}

static int ensure_rope(clrt_model *m, int P) {
  if (P <= m->rope_len) return 0;
  int half = m->cfg.head_dim / 2;
  float *c = realloc(m->rope_cos, sizeof(float) * (size_t)P * half);
  if (c) m->rope_cos = c;
  float *s = realloc(m->rope_sin, sizeof(float) * (size_t)P * half);
  if (s) m->rope_sin = s;
  if (!c || !s) {
    clrt_set_error("model: out of memory for the RoPE table of %d positions", P);
    return -1;
  }
  clrt_rope_table(m->rope_cos, m->rope_sin, m->inv_freq, P, m->cfg.head_dim);
  m->rope_len = P;
  return sync_rope(m);
}

/* Binds a to the arena for (B, T, keep), growing the arena when it is too small. */
static int bind_acts(clrt_model *m, acts *a, int B, int T, int Tk, int keep) {
  layout(m, a, NULL, B, T, Tk, keep);
  size_t need = a->floats * sizeof(float);
  if (!m->acts || m->acts->bytes < need) {
    size_t want = need;
    /* Geometric growth: decode steps raise Tk by one each, and a fresh (zeroed) arena per
       step cost a third of a batch-32 step. */
    if (m->acts && m->acts->bytes + m->acts->bytes / 2 > want) want = m->acts->bytes + m->acts->bytes / 2;
    if (m->cfg.max_batch > 0 && m->cfg.max_seq > 0) {
      /* The configured maximum is the first size; beyond it, grow to what the call needs. */
      int Tm = m->cfg.max_seq > Tk ? m->cfg.max_seq : Tk;
      layout(m, a, NULL, m->cfg.max_batch > B ? m->cfg.max_batch : B, Tm, Tm, 1);
      if (a->floats * sizeof(float) > want) want = a->floats * sizeof(float);
    }
    clrt_storage_release(m->acts);
    m->acts = NULL;
    m->saved = 0;
    if (!(m->acts = clrt_storage_new(want, m->device))) return -1;
  }
  layout(m, a, m->acts->data, B, T, Tk, keep);
  return 0;
}

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

/* The packed copies of the linear weights, made on the first CPU decode and remade when the
   weights change. Products of any number of rows run faster over them than over sgemm (see
   linear_packed.c), for a second copy of the weights in memory. */
static int refresh_packed(clrt_model *m) {
  if (ON_GPU(m) || m->bf16 || !m->pack_decode || !clrt_linear_packed_available()) return 0;
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

/* The packed copy of the weight at offset w, when it is current. */
static const float *packed_weight(const clrt_model *m, int64_t w) {
  return m->wpk && m->wpk_ver == m->params->version ? (const float *)m->wpk->data + w : NULL;
}

/* A linear layer of the blocks: fp32 on the CPU or CUDA, or bf16 inputs with fp32
   accumulation (cublasGemmEx) when the model's matmuls are bf16. On the CPU, bf16 means the
   few-row products of decode steps use bf16 weight copies and bf16-rounded inputs (f32
   accumulation); larger products stay sgemm on the fp32 weights. w is the weight's offset. */
static void lin_f(clrt_model *m, acts *a, float *y, const float *x, int64_t w, const float *b,
                  int64_t N, int Kd, int O) {
  if (m->bf16 && !ON_GPU(m)) {
    const uint16_t *w16 = (const uint16_t *)m->wbf->data + w;
    clrt_packed_part part = {y, w16, b, O};
    if (m->wbf_packed ? clrt_linear_packed_bf16_forward_parts(x, N, Kd, &part, 1)
                      : clrt_linear_skinny_forward_bf16(y, x, w16, b, N, Kd, O))
      return;
  }
  const float *wp = packed_weight(m, w);
  if (wp && clrt_linear_packed_forward(y, x, wp, b, N, Kd, O)) return;
#ifdef CLRT_HAVE_CUDA
  if (ON_GPU(m) && m->bf16) {
    clrt_cuda_f32_to_bf16(a->x16, x, N * Kd);
    clrt_cuda_linear_forward_bf16(y, a->x16, (const uint16_t *)m->wbf->data + w, b, N, Kd, O);
    return;
  }
#endif
  (void)a;
  K(m, linear_forward, y, x, PW(m, w), b, N, Kd, O);
}

/* Products of the same x (q, k, v; gate, up): over packed weights (the f32 copy, or in bf16
   mode the bf16 copies when packed), one parallel pass for all of them (see linear_packed.c);
   otherwise one lin_f each. */
typedef struct {
  float *y;
  int64_t w;
  const float *b;
  int O;
} lin_part;

static void lin_f_parts(clrt_model *m, acts *a, const float *x, int64_t N, int Kd, const lin_part *parts,
                        int count) {
  clrt_packed_part packed[3];
  int bf16 = m->bf16 && !ON_GPU(m) && m->wbf_packed, ok = count <= 3 && (bf16 || !m->bf16);
  for (int i = 0; ok && i < count; i++) {
    const void *wp = bf16 ? (const void *)((const uint16_t *)m->wbf->data + parts[i].w)
                          : (const void *)packed_weight(m, parts[i].w);
    packed[i] = (clrt_packed_part){parts[i].y, wp, parts[i].b, parts[i].O};
    ok = wp != NULL;
  }
  if (ok && (bf16 ? clrt_linear_packed_bf16_forward_parts(x, N, Kd, packed, count)
                  : clrt_linear_packed_forward_parts(x, N, Kd, packed, count)))
    return;
  for (int i = 0; i < count; i++) lin_f(m, a, parts[i].y, x, parts[i].w, parts[i].b, N, Kd, parts[i].O);
}

static void lin_b(clrt_model *m, acts *a, float *dx, int64_t w, float *db, const float *dy,
                  const float *x, int64_t N, int Kd, int O, int acc) {
#ifdef CLRT_HAVE_CUDA
  if (ON_GPU(m) && m->bf16) {
    clrt_cuda_f32_to_bf16(a->x16, x, N * Kd);
    clrt_cuda_f32_to_bf16(a->dy16, dy, N * O);
    clrt_cuda_linear_backward_bf16(dx, GW(m, w), db, dy, a->dy16, a->x16,
                                   (const uint16_t *)m->wbf->data + w, N, Kd, O, acc);
    return;
  }
#endif
  (void)a;
  K(m, linear_backward, dx, GW(m, w), db, dy, x, PW(m, w), N, Kd, O, acc);
}

/* The bf16 weight copies follow the fp32 master weights (after an optimizer step, a move,
   an initialisation, a write through a params view). */
static void refresh_bf16(clrt_model *m) {
  if (!m->bf16 || m->wbf_ver == m->params->version) return;
  m->wbf_ver = m->params->version;
#ifdef CLRT_HAVE_CUDA
  if (ON_GPU(m)) {
    m->wbf_packed = 0;
    clrt_cuda_f32_to_bf16(m->wbf->data, m->params->data, m->total);
    return;
  }
#endif
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

/* One transformer layer over N = B*T rows at positions pos0[b] + t. x: [N, C] in; out: [N, C].
   With a cache (kc, vc: [B, cache_T, KV, D]), the new keys/values are written into it at their
   positions and attention reads every cached position up to each query's own. */
static void layer_forward(clrt_model *m, int l, layer_acts *A, acts *a, const float *x, float *out,
                          int B, int T, const int32_t *pos0, int keep, float *kc, float *vc,
                          int cache_T, const int32_t *slot) {
  const clrt_model_config *c = &m->cfg;
  const clrt_layer_offsets *o = &m->layer[l];
  int C = c->hidden_size, I = c->intermediate_size, H = c->num_attention_heads,
      KV = c->num_key_value_heads, D = c->head_dim;
  int64_t N = (int64_t)B * T;
  float eps = c->rms_norm_eps;
  PROF(CLRT_K_RMSNORM, K(m, rmsnorm_forward, a->xn, A->rstd1, x, PW(m, o->ln1), N, C, eps));
  float *qd = c->qk_norm ? A->qpre : A->q, *kd = c->qk_norm ? A->kpre : A->k;
  lin_part qkv[3] = {{qd, o->wq, PW(m, o->bq), H * D}, {kd, o->wk, PW(m, o->bk), KV * D},
                     {A->v, o->wv, PW(m, o->bv), KV * D}};
  PROF(CLRT_K_LINEAR_F, lin_f_parts(m, a, a->xn, N, C, qkv, 3));
  if (c->qk_norm)
    PROF(CLRT_K_RMSNORM, {
      K(m, rmsnorm_forward, A->q, A->qrstd, A->qpre, PW(m, o->qn), N * H, D, eps);
      K(m, rmsnorm_forward, A->k, A->krstd, A->kpre, PW(m, o->kn), N * KV, D, eps);
    });
  PROF(CLRT_K_ROPE, {
    K(m, rope_forward, A->q, rope_c(m), rope_s(m), pos0, B, T, H, D);
    K(m, rope_forward, A->k, rope_c(m), rope_s(m), pos0, B, T, KV, D);
  });
  const float *keys = A->k, *vals = A->v;
  int64_t kv_bstride = (int64_t)T * KV * D;
  if (kc && ON_GPU(m)) {
    kv_bstride = (int64_t)cache_T * KV * D;
#ifdef CLRT_HAVE_CUDA
    clrt_cuda_kv_write(kc, vc, A->k, A->v, pos0, slot, B, T, KV * D, kv_bstride);
#endif
    keys = kc;
    vals = vc;
  } else if (kc) {
    size_t row = sizeof(float) * (size_t)KV * D;
    kv_bstride = (int64_t)cache_T * KV * D;
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++) {
        int64_t dst = (slot ? slot[b] : b) * kv_bstride + (int64_t)(pos0[b] + t) * KV * D,
                src = ((int64_t)b * T + t) * KV * D;
        memcpy(kc + dst, A->k + src, row);
        memcpy(vc + dst, A->v + src, row);
      }
    keys = kc;
    vals = vc;
  }
#ifdef CLRT_HAVE_CUDA
  if (ON_GPU(m))
    clrt_cuda_attention_forward(A->att, keep ? A->lse : NULL, A->q, keys, vals, B, T, H, KV, D, pos0,
                                kv_bstride, kc ? slot : NULL);
  else
#endif
  PROF(CLRT_K_ATTN_F, clrt_attention_forward(A->att, keep ? A->lse : NULL, A->q, keys, vals, B, T,
                                             H, KV, D, pos0, kv_bstride, kc ? slot : NULL, a->attn, m->threads));
  PROF(CLRT_K_LINEAR_F, lin_f(m, a, a->tmp, A->att, o->wo, PW(m, o->bo), N, H * D, C));
  PROF(CLRT_K_RESIDUAL, K(m, residual_forward, A->xmid, x, a->tmp, N * C));
  PROF(CLRT_K_RMSNORM, K(m, rmsnorm_forward, a->xn, A->rstd2, A->xmid, PW(m, o->ln2), N, C, eps));
  lin_part gate_up[2] = {{A->g, o->wg, NULL, I}, {A->u, o->wu, NULL, I}};
  PROF(CLRT_K_LINEAR_F, lin_f_parts(m, a, a->xn, N, C, gate_up, 2));
  PROF(CLRT_K_SWIGLU, K(m, swiglu_forward, a->h, A->g, A->u, N * I));
  PROF(CLRT_K_LINEAR_F, lin_f(m, a, a->tmp, a->h, o->wd, NULL, N, I, C));
  PROF(CLRT_K_RESIDUAL, K(m, residual_forward, out, A->xmid, a->tmp, N * C));
}

static void layer_backward(clrt_model *m, int l, layer_acts *A, acts *a, const float *x, int B, int T) {
  const clrt_model_config *c = &m->cfg;
  const clrt_layer_offsets *o = &m->layer[l];
  int C = c->hidden_size, I = c->intermediate_size, H = c->num_attention_heads,
      KV = c->num_key_value_heads, D = c->head_dim;
  int64_t N = (int64_t)B * T;
  float eps = c->rms_norm_eps;
  /* MLP: x' = xmid + (silu(g) * u) Wd^T; a->dres holds dL/dx' and becomes dL/dxmid. */
  PROF(CLRT_K_RMSNORM, K(m, rmsnorm_forward, a->xn, A->rstd2, A->xmid, PW(m, o->ln2), N, C, eps));
  PROF(CLRT_K_SWIGLU, K(m, swiglu_forward, a->h, A->g, A->u, N * I));
  PROF(CLRT_K_LINEAR_B, lin_b(m, a, a->dA, o->wd, NULL, a->dres, a->h, N, I, C, 0));
  float *du = a->h;   /* h is spent: its buffer takes du */
  PROF(CLRT_K_SWIGLU, K(m, swiglu_backward, a->dA, du, a->dA, A->g, A->u, N * I));
  PROF(CLRT_K_LINEAR_B, {
    lin_b(m, a, a->dxn, o->wg, NULL, a->dA, a->xn, N, C, I, 0);
    lin_b(m, a, a->dxn, o->wu, NULL, du, a->xn, N, C, I, 1);
  });
  PROF(CLRT_K_RMSNORM, K(m, rmsnorm_backward, a->dres, GW(m, o->ln2), a->dxn, A->xmid, PW(m, o->ln2), A->rstd2, N, C));
  /* Attention: xmid = x + att Wo^T; the residual passes dres to x unchanged. */
  PROF(CLRT_K_LINEAR_B, lin_b(m, a, a->datt, o->wo, GW(m, o->bo), a->dres, A->att, N, H * D, C, 0));
#ifdef CLRT_HAVE_CUDA
  if (ON_GPU(m))
    clrt_cuda_attention_backward(a->dq, a->dk, a->dv, a->datt, A->q, A->k, A->v, A->att, A->lse, B, T,
                                 H, KV, D, a->attn);
  else
#endif
  PROF(CLRT_K_ATTN_B, clrt_attention_backward(a->dq, a->dk, a->dv, a->datt, A->q, A->k, A->v, A->att,
                                              A->lse, B, T, H, KV, D, a->attn, m->threads));
  PROF(CLRT_K_ROPE, {
    K(m, rope_backward, a->dq, rope_c(m), rope_s(m), NULL, B, T, H, D);
    K(m, rope_backward, a->dk, rope_c(m), rope_s(m), NULL, B, T, KV, D);
  });
  float *dq = a->dq, *dk = a->dk;
  if (c->qk_norm) {
    /* datt is spent: it takes dL/dq before the norm; dk2 takes dL/dk before it. */
    zero_floats(m, a->datt, (size_t)(N * H * D));
    zero_floats(m, a->dk2, (size_t)(N * KV * D));
    PROF(CLRT_K_RMSNORM, {
      K(m, rmsnorm_backward, a->datt, GW(m, o->qn), a->dq, A->qpre, PW(m, o->qn), A->qrstd, N * H, D);
      K(m, rmsnorm_backward, a->dk2, GW(m, o->kn), a->dk, A->kpre, PW(m, o->kn), A->krstd, N * KV, D);
    });
    dq = a->datt;
    dk = a->dk2;
  }
  PROF(CLRT_K_RMSNORM, K(m, rmsnorm_forward, a->xn, A->rstd1, x, PW(m, o->ln1), N, C, eps));
  PROF(CLRT_K_LINEAR_B, {
    lin_b(m, a, a->dxn, o->wq, GW(m, o->bq), dq, a->xn, N, C, H * D, 0);
    lin_b(m, a, a->dxn, o->wk, GW(m, o->bk), dk, a->xn, N, C, KV * D, 1);
    lin_b(m, a, a->dxn, o->wv, GW(m, o->bv), a->dv, a->xn, N, C, KV * D, 1);
  });
  PROF(CLRT_K_RMSNORM, K(m, rmsnorm_backward, a->dres, GW(m, o->ln1), a->dxn, x, PW(m, o->ln1), A->rstd1, N, C));
}

/* Gathers the rows with a target (rowidx) of src [N, C] into dst [nv, C]. */
static void gather_rows(const clrt_model *m, float *dst, const float *src, const int32_t *rowidx,
                        int64_t nv, int C) {
#ifdef CLRT_HAVE_CUDA
  if (ON_GPU(m)) {
    clrt_cuda_gather_rows(dst, src, rowidx, nv, C);
    return;
  }
#endif
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < nv; i++)
    memcpy(dst + i * C, src + (int64_t)rowidx[i] * C, sizeof(float) * (size_t)C);
}

/* Host staging for the integer inputs of a GPU step (grown on demand; on the CPU the arena
   itself is host memory and this is unused). */
static int32_t *host_ints(clrt_model *m, size_t n) {
  if (n > m->hidx_cap) {
    int32_t *p = realloc(m->hidx, sizeof(int32_t) * n);
    if (!p) {
      clrt_set_error("model: out of host memory staging %zu indices", n);
      return NULL;
    }
    m->hidx = p;
    m->hidx_cap = n;
  }
  return m->hidx;
}

int clrt_model_logprobs(clrt_model *m, const int32_t *tokens, int B, int T,
                        const int32_t *lengths, float *lp, int keep) {
  const clrt_model_config *c = &m->cfg;
  int L = c->num_hidden_layers, C = c->hidden_size, V = c->vocab_size;
  if (B <= 0 || T <= 0) {
    clrt_set_error("logprobs: empty batch [%d, %d]", B, T);
    return -1;
  }
  for (int b = 0; b < B; b++) {
    int len = lengths ? lengths[b] : T;
    if (len < 1 || len > T) {
      clrt_set_error("logprobs: length %d of row %d is outside [1, %d]", len, b + 1, T);
      return -1;
    }
    for (int t = 0; t < len; t++) {
      int32_t id = tokens[(int64_t)b * T + t];
      if (id < 0 || id >= V) {
        clrt_set_error("logprobs: token %d at row %d, position %d is outside the vocabulary [0, %d)",
                       id, b + 1, t + 1, V);
        return -1;
      }
    }
  }
  if (ensure_rope(m, T)) return -1;
  refresh_bf16(m);
  /* The attention scratch has one slice per thread; backward keeps this forward's count even
     if the thread setting changes in between. */
  m->threads = omp_get_max_threads();
  float *res[L + 1];
  layer_acts la[L];
  acts a = {.res = res, .la = la};
  double t0 = prof_on > 0 ? now() : 0;
  if (bind_acts(m, &a, B, T, T, keep)) return -1;
  int64_t N = (int64_t)B * T, nv = 0;
  int32_t *tok = a.tok, *rowidx = a.rowidx, *target = a.target;
  if (ON_GPU(m)) {   /* built on the host, then one copy each; rowidx stays for backward */
    if (!(rowidx = host_ints(m, 3 * (size_t)N))) return -1;
    tok = rowidx + N;
    target = rowidx + 2 * N;
  }
  for (int b = 0; b < B; b++) {
    int len = lengths ? lengths[b] : T;
    for (int t = 0; t < T; t++) {
      tok[(int64_t)b * T + t] = t < len ? tokens[(int64_t)b * T + t] : 0;   /* padding: any id */
      if (t + 1 < len) {
        rowidx[nv] = (int32_t)((int64_t)b * T + t);
        target[nv] = tokens[(int64_t)b * T + t + 1];
        nv++;
      }
    }
  }
  if (ON_GPU(m) && (to_model(m, a.tok, tok, sizeof(int32_t) * (size_t)N) ||
                    to_model(m, a.rowidx, rowidx, sizeof(int32_t) * (size_t)nv) ||
                    to_model(m, a.target, target, sizeof(int32_t) * (size_t)nv)))
    return -1;
  if (prof_on > 0) clrt_kernel_seconds[CLRT_K_OTHER] += now() - t0;
  PROF(CLRT_K_EMBED, K(m, embedding_forward, a.res[0], a.tok, PW(m, m->wte), N, C));
  for (int l = 0; l < L; l++) {
    if (clrt_interrupted()) {
      clrt_set_error("logprobs: interrupted");
      return -1;
    }
    float *x = keep ? a.res[l] : a.res[l % 2], *out = keep ? a.res[l + 1] : a.res[(l + 1) % 2];
    layer_forward(m, l, keep ? &a.la[l] : &a.la[0], &a, x, out, B, T, NULL, keep, NULL, NULL, 0, NULL);
  }
  float *xl = keep ? a.res[L] : a.res[L % 2];
  PROF(CLRT_K_OTHER, gather_rows(m, a.tmp, xl, a.rowidx, nv, C));
  PROF(CLRT_K_RMSNORM, K(m, rmsnorm_forward, a.xn, a.rstdf, a.tmp, PW(m, m->norm), nv, C, c->rms_norm_eps));
  PROF(CLRT_K_OUT_F, K(m, logsoftmax_gather_forward, a.lpv, a.lsef, a.xn, PW(m, m->head), a.target,
                                                    nv, C, V, a.logits, a.chunk));
  memset(lp, 0, sizeof(float) * (size_t)B * (size_t)(T - 1));
  const float *lpv = a.lpv;
  float *hlp = NULL;
  if (ON_GPU(m)) {   /* the step's one copy back: nv log-probabilities */
    if (!(hlp = malloc(sizeof(float) * (size_t)(nv ? nv : 1)))) {
      clrt_set_error("logprobs: out of host memory");
      return -1;
    }
    if (from_model(m, hlp, a.lpv, sizeof(float) * (size_t)nv)) {
      free(hlp);
      return -1;
    }
    lpv = hlp;
  }
  for (int64_t i = 0; i < nv; i++) {
    int64_t r = rowidx[i], b = r / T, t = r % T;
    lp[b * (T - 1) + t] = lpv[i];
  }
  free(hlp);
  m->saved = keep;
  m->B = B;
  m->T = T;
  m->nv = nv;
  return 0;
}

int clrt_model_backward(clrt_model *m, const float *dlogp) {
  if (!m->saved) {
    clrt_set_error("backward: no forward pass was kept for it (call logprobs with grad = true first)");
    return -1;
  }
  if (ensure_grads(m)) return -1;
  const clrt_model_config *c = &m->cfg;
  int L = c->num_hidden_layers, C = c->hidden_size, V = c->vocab_size, B = m->B, T = m->T;
  int64_t N = (int64_t)B * T, nv = m->nv;
  float *res[L + 1];
  layer_acts la[L];
  acts a = {.res = res, .la = la};
  layout(m, &a, m->acts->data, B, T, T, 1);
  const int32_t *rowidx = ON_GPU(m) ? m->hidx : a.rowidx;   /* forward's, on the host */
  float *dlpv = a.dlpv;
  if (ON_GPU(m) && !(dlpv = malloc(sizeof(float) * (size_t)(nv ? nv : 1)))) {
    clrt_set_error("backward: out of host memory");
    return -1;
  }
  for (int64_t i = 0; i < nv; i++) {
    int64_t r = rowidx[i], b = r / T, t = r % T;
    dlpv[i] = dlogp[b * (T - 1) + t];
  }
  if (ON_GPU(m)) {
    int rc = to_model(m, a.dlpv, dlpv, sizeof(float) * (size_t)nv);
    free(dlpv);
    if (rc) return -1;
  }
  /* Output layer and final norm over the rows with a target (compacted, as in forward). */
  PROF(CLRT_K_OTHER, gather_rows(m, a.tmp, a.res[L], a.rowidx, nv, C));
  PROF(CLRT_K_RMSNORM, K(m, rmsnorm_forward, a.xn, a.rstdf, a.tmp, PW(m, m->norm), nv, C, c->rms_norm_eps));
  PROF(CLRT_K_OUT_B, K(m, logsoftmax_gather_backward, a.dxn, GW(m, m->head), a.dlpv, a.xn, PW(m, m->head),
                                                     a.target, a.lsef, nv, C, V, a.logits, a.chunk,
                                                     a.logits_kept));
  zero_floats(m, a.dxc, (size_t)(nv * C));
  PROF(CLRT_K_RMSNORM, K(m, rmsnorm_backward, a.dxc, GW(m, m->norm), a.dxn, a.tmp, PW(m, m->norm), a.rstdf, nv, C));
  zero_floats(m, a.dres, (size_t)(N * C));
#ifdef CLRT_HAVE_CUDA
  if (ON_GPU(m)) clrt_cuda_scatter_rows(a.dres, a.dxc, a.rowidx, nv, C);
  else
#endif
  for (int64_t i = 0; i < nv; i++)
    memcpy(a.dres + (int64_t)a.rowidx[i] * C, a.dxc + i * C, sizeof(float) * (size_t)C);
  for (int l = L - 1; l >= 0; l--) {
    if (clrt_interrupted()) {
      clrt_set_error("backward: interrupted");
      return -1;
    }
    layer_backward(m, l, &a.la[l], &a, a.res[l], B, T);
  }
  PROF(CLRT_K_EMBED, K(m, embedding_backward, GW(m, m->wte), a.dres, a.tok, N, C));
#ifdef CLRT_HAVE_CUDA
  if (ON_GPU(m)) return clrt_cuda_sync();   /* the end of the step: report any kernel failure */
#endif
  return 0;
}

int clrt_model_forward_cached(clrt_model *m, const int32_t *tokens, int B, int Tn,
                              const int32_t *pos0, const int32_t *slot, const int32_t *last,
                              float *const *kcache, float *const *vcache, int cache_T,
                              float *logits) {
  const clrt_model_config *c = &m->cfg;
  int L = c->num_hidden_layers, C = c->hidden_size, V = c->vocab_size;
  if (B <= 0 || Tn <= 0 || !pos0 || !kcache || !vcache) {
    clrt_set_error("forward_cached: need B, Tn > 0 [%d, %d], positions and caches", B, Tn);
    return -1;
  }
  int Tk = 0;
  for (int b = 0; b < B; b++) {
    if (pos0[b] < 0 || pos0[b] + Tn > cache_T) {
      clrt_set_error("forward_cached: row %d writes positions [%d, %d) outside the cache's %d",
                     b + 1, pos0[b], pos0[b] + Tn, cache_T);
      return -1;
    }
    if (last && (last[b] < 0 || last[b] >= Tn)) {
      clrt_set_error("forward_cached: last position %d of row %d is outside [0, %d)", last[b], b + 1, Tn);
      return -1;
    }
    if (pos0[b] + Tn > Tk) Tk = pos0[b] + Tn;
    for (int t = 0; t < Tn; t++) {
      int32_t id = tokens[(int64_t)b * Tn + t];
      if (id < 0 || id >= V) {
        clrt_set_error("forward_cached: token %d at row %d, position %d is outside the vocabulary [0, %d)",
                       id, b + 1, t + 1, V);
        return -1;
      }
    }
  }
  if (ensure_rope(m, Tk) || refresh_packed(m)) return -1;
  refresh_bf16(m);
  m->threads = omp_get_max_threads();
  float *res[L + 1];
  layer_acts la[L];
  acts a = {.res = res, .la = la};
  if (bind_acts(m, &a, B, Tn, Tk, 0)) return -1;
  m->saved = 0;
  int64_t N = (int64_t)B * Tn;
  if (to_model(m, a.tok, tokens, sizeof(int32_t) * (size_t)N)) return -1;
  /* Kernels read positions and slots from the model's memory. */
  const int32_t *kpos = pos0, *kslot = slot;
  if (ON_GPU(m)) {
    if (to_model(m, a.pos0, pos0, sizeof(int32_t) * (size_t)B) ||
        (slot && to_model(m, a.slot, slot, sizeof(int32_t) * (size_t)B)))
      return -1;
    kpos = a.pos0;
    kslot = slot ? a.slot : NULL;
  }
  PROF(CLRT_K_EMBED, K(m, embedding_forward, a.res[0], a.tok, PW(m, m->wte), N, C));
  for (int l = 0; l < L; l++) {
    if (clrt_interrupted()) {
      clrt_set_error("forward_cached: interrupted");
      return -1;
    }
    layer_forward(m, l, &a.la[0], &a, a.res[l % 2], a.res[(l + 1) % 2], B, Tn, kpos, 0,
                  kcache[l], vcache[l], cache_T, kslot);
  }
  int32_t *rowidx = ON_GPU(m) ? host_ints(m, (size_t)B) : a.rowidx;
  if (!rowidx) return -1;
  for (int b = 0; b < B; b++) rowidx[b] = b * Tn + (last ? last[b] : Tn - 1);
  if (ON_GPU(m) && to_model(m, a.rowidx, rowidx, sizeof(int32_t) * (size_t)B)) return -1;
  PROF(CLRT_K_OTHER, gather_rows(m, a.tmp, a.res[L % 2], a.rowidx, B, C));
  PROF(CLRT_K_RMSNORM, K(m, rmsnorm_forward, a.xn, a.rstdf, a.tmp, PW(m, m->norm), B, C, c->rms_norm_eps));
  float *out = ON_GPU(m) ? a.logits : logits;
  /* On the CPU the output layer goes through lin_f like the blocks' layers (a bf16 model's
     decode reads its bf16 copy, an f32 one its packed copy); on CUDA it stays fp32. */
  PROF(CLRT_K_OUT_F, {
    if (ON_GPU(m)) K(m, linear_forward, out, a.xn, PW(m, m->head), NULL, B, C, V);
    else lin_f(m, &a, out, a.xn, m->head, NULL, B, C, V);
  });
  if (ON_GPU(m)) return from_model(m, logits, out, sizeof(float) * (size_t)B * V);   /* for the sampler */
  return 0;
}

/* ---- devices ------------------------------------------------------------------------------ */

/* A copy of s on `device`, or NULL with the allocator's message. */
static clrt_storage *copy_storage(const clrt_storage *s, int device) {
  clrt_storage *n = clrt_storage_new(s->bytes, device);
  if (!n) return NULL;
#ifdef CLRT_HAVE_CUDA
  int kind = s->device == CLRT_CPU ? (device == CLRT_CPU ? -1 : 0) : device == CLRT_CPU ? 1 : 2;
  if (kind >= 0) {
    if (clrt_cuda_memcpy(n->data, s->data, s->bytes, kind)) {
      clrt_storage_release(n);
      return NULL;
    }
    return n;
  }
#endif
  memcpy(n->data, s->data, s->bytes);
  return n;
}

int clrt_model_device(const clrt_model *m) { return m->device; }

int clrt_model_to_device(clrt_model *m, int device) {
  if (device != CLRT_CPU && device != CLRT_CUDA) {
    clrt_set_error("model: unknown device %d (cpu, cuda)", device);
    return -1;
  }
  if (device == m->device) return 0;
  /* Both copies first, so running out of memory leaves the model whole where it was. */
  clrt_storage *np = copy_storage(m->params, device), *ng = NULL;
  if (!np) return -1;
  if (m->grads && !(ng = copy_storage(m->grads, device))) {
    clrt_storage_release(np);
    return -1;
  }
  clrt_storage_release(m->params);
  clrt_storage_release(m->grads);
  m->params = np;
  m->grads = ng;
  /* Activations are rebuilt on the new device by the next call. */
  clrt_storage_release(m->acts);
  m->acts = NULL;
  m->saved = 0;
  m->device = device;
  /* The bf16 and packed copies live beside the weights: a move drops them (set_matmul again;
     the packed copy is remade by the next CPU decode). */
  clrt_storage_release(m->wbf);
  m->wbf = NULL;
  m->bf16 = 0;
  clrt_storage_release(m->wpk);
  m->wpk = NULL;
  return sync_rope(m);
}

int clrt_model_set_matmul_bf16(clrt_model *m, int on) {
  if (!on) {
    clrt_storage_release(m->wbf);
    m->wbf = NULL;
    m->bf16 = 0;
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
