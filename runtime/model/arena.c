/* arena.c — the activation arena, laid out per call from B and T (grown when a call needs
   more; the configured max_batch x max_seq is its first size), the RoPE tables, the host
   staging of a step's integer inputs and the CPU kernels' workspace. */
#include "model_internal.h"

#include <stdlib.h>
#include <string.h>

static float *take(acts *a, char *base, size_t n) {
  float *p = base ? (float *)base + a->floats : NULL;
  a->floats += (n + 15) & ~(size_t)15;
  return p;
}

/* The widest input of a LoRA target linear (the dropout scratch's row). */
static size_t lora_widest(const clrt_model *m) {
  const clrt_model_config *c = &m->cfg;
  size_t w = (size_t)c->hidden_size, hd = (size_t)c->num_attention_heads * c->head_dim;
  if (hd > w) w = hd;
  if ((size_t)c->intermediate_size > w) w = (size_t)c->intermediate_size;
  return w;
}

/* res and la must have room for L+1 and L entries. */
void model_layout(const clrt_model *m, acts *a, char *base, int B, int T, int Tk, int keep) {
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
    if (c->gemma3) {
      la->ao = take(a, base, N * C);
      la->aorstd = take(a, base, N);
      la->mo = take(a, base, N * C);
      la->morstd = take(a, base, N);
    }
    if (m->lora)
      for (int t = 0; t < LORA_NT; t++)
        if (m->lora->ab[0][t][0] >= 0) la->lxa[t] = take(a, base, N * (size_t)m->lora->r);
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
  if (m->ops->bf16_scratch) {
    size_t widest = (size_t)C > HD ? (size_t)C : HD;
    if ((size_t)I > widest) widest = (size_t)I;
    a->x16 = (uint16_t *)take(a, base, (N * widest + 1) / 2);
    a->dy16 = (uint16_t *)take(a, base, (N * widest + 1) / 2);
  }
  a->lxd = a->ldxa = a->lhxa = a->lexa = NULL;
  if (m->lora) {
    if (m->lora->head[0] >= 0) a->lhxa = take(a, base, N * (size_t)m->lora->r);
    if (m->lora->emb[0] >= 0) a->lexa = take(a, base, N * (size_t)m->lora->r);
    if (m->lora->dropout > 0 && keep) a->lxd = take(a, base, N * lora_widest(m));
    if (keep) a->ldxa = take(a, base, N * (size_t)m->lora->r);
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
  a->logits = take(a, base, (size_t)(m->ops->logits_staged && chunk < B ? B : chunk) * V);
  a->attn = take(a, base, m->ops->attention_scratch(m, a->cx->threads, B, T, Tk));
}

/* A table superseded while contexts may still read it: kept until the model is freed (the
   tables grow geometrically, so these take at most as much as the current ones). */
struct model_retired {
  void *host[4];
  clrt_storage *dev;
  model_retired *next;
};

static int retire(clrt_model *m, void *cos_t, void *sin_t, void *cos_local, void *sin_local, clrt_storage *dev) {
  if (!cos_t && !sin_t && !cos_local && !sin_local && !dev) return 0;
  model_retired *r = malloc(sizeof *r);
  if (!r) {
    clrt_set_error("model: out of host memory growing the RoPE tables");
    return -1;
  }
  *r = (model_retired){{cos_t, sin_t, cos_local, sin_local}, dev, m->retired};
  m->retired = r;
  return 0;
}

void model_retired_free(clrt_model *m) {
  while (m->retired) {
    model_retired *r = m->retired;
    for (int i = 0; i < 4; i++) free(r->host[i]);
    clrt_storage_release(r->dev);
    m->retired = r->next;
    free(r);
  }
}

/* The tables where the kernels read them: the host's, or a copy on the GPU (cos then sin,
   then longrope's long cos and sin), refreshed when they grow or move. */
int model_sync_rope(clrt_model *m) {
  if (retire(m, NULL, NULL, NULL, NULL, m->rope_dev)) return -1;
  m->rope_dev = NULL;
  m->rope_kc = m->rope_cos;
  m->rope_ks = m->rope_sin;
  m->rope_kc_long = m->rope_cos_long;
  m->rope_ks_long = m->rope_sin_long;
  if (m->device == CLRT_CPU || m->rope_len == 0) return 0;
  size_t n = (size_t)m->rope_len * (size_t)(m->cfg.rope_dim / 2);
  int sets = m->rope_cos_long ? 2 : 1;
  if (!(m->rope_dev = clrt_storage_new(2 * (size_t)sets * n * sizeof(float), m->device))) return -1;
  float *d = m->rope_dev->data;
  if (m->ops->upload(d, m->rope_cos, n * sizeof(float)) || m->ops->upload(d + n, m->rope_sin, n * sizeof(float)))
    return -1;
  if (sets == 2 && (m->ops->upload(d + 2 * n, m->rope_cos_long, n * sizeof(float)) ||
                    m->ops->upload(d + 3 * n, m->rope_sin_long, n * sizeof(float))))
    return -1;
  m->rope_kc = d;
  m->rope_ks = d + n;
  if (sets == 2) {
    m->rope_kc_long = d + 2 * n;
    m->rope_ks_long = d + 3 * n;
  }
  return 0;
}

/* A cos and a sin table [P, R/2] at the given frequencies, each times scale (yarn and
   longrope's attention factor, in f32 as transformers' cos() * attention_scaling); NULL and
   the error set when out of memory. */
static int rope_tables(float **cos_t, float **sin_t, const float *inv_freq, int P, int R, float scale) {
  size_t n = (size_t)P * (size_t)(R / 2);
  *cos_t = malloc(sizeof(float) * n);
  *sin_t = malloc(sizeof(float) * n);
  if (!*cos_t || !*sin_t) {
    free(*cos_t);
    free(*sin_t);
    clrt_set_error("model: out of memory for the RoPE tables of %d positions", P);
    return -1;
  }
  clrt_rope_table(*cos_t, *sin_t, inv_freq, P, R);
  if (scale != 1.0f)
    for (size_t i = 0; i < n; i++) {
      (*cos_t)[i] *= scale;
      (*sin_t)[i] *= scale;
    }
  return 0;
}

/* New tables replace the old ones whole, never in place: a context on another thread may be
   reading the old ones, which hold the same values at the positions both cover. Gemma 3's
   local layers have their own (rope_local_theta), host memory; longrope has a second set
   (its long factors). */
int model_ensure_rope(clrt_model *m, int P) {
  if (P <= m->rope_len) return 0;
  if (P < 2 * m->rope_len) P = 2 * m->rope_len;   /* decode asks one position more per step */
  int D = m->cfg.rope_dim;
  float *c, *s, *c2 = NULL, *s2 = NULL;
  const float *inv2 = m->cfg.gemma3 ? m->inv_freq_local : m->inv_freq_long;
  if (rope_tables(&c, &s, m->inv_freq, P, D, m->rope_scale)) return -1;
  if (inv2 && rope_tables(&c2, &s2, inv2, P, D, m->cfg.gemma3 ? 1.0f : m->rope_scale)) {
    free(c);
    free(s);
    return -1;
  }
  if (retire(m, m->rope_cos, m->rope_sin, m->cfg.gemma3 ? m->rope_cos_local : m->rope_cos_long,
             m->cfg.gemma3 ? m->rope_sin_local : m->rope_sin_long, NULL)) {
    free(c), free(s), free(c2), free(s2);
    return -1;
  }
  m->rope_cos = c;
  m->rope_sin = s;
  if (m->cfg.gemma3) {
    m->rope_cos_local = c2;
    m->rope_sin_local = s2;
  } else {
    m->rope_cos_long = c2;
    m->rope_sin_long = s2;
  }
  m->rope_len = P;
  return model_sync_rope(m);
}

/* transformers picks a call's frequencies by its length (max position + 1): longrope's long
   factors past original_max_position_embeddings, dynamic NTK's base grown for that length
   past max_position_embeddings (remade for each such call: a decode step past it pays
   [seq_len, rope_dim/2] sines and cosines). Cached keys keep the rotation they were written with,
   as in transformers' generate. */
int model_rope_choose(clrt_context *x, int seq_len) {
  clrt_model *m = x->m;
  const clrt_model_config *c = &m->cfg;
  x->rope_c = m->rope_kc;
  x->rope_s = m->rope_ks;
  if (c->rope_scaling == CLRT_ROPE_LONGROPE && seq_len > c->rope_original_max_position) {
    x->rope_c = m->rope_kc_long;
    x->rope_s = m->rope_ks_long;
    return 0;
  }
  if (c->rope_scaling != CLRT_ROPE_DYNAMIC || seq_len <= c->max_position_embeddings) return 0;
  int D = c->rope_dim;
  size_t n = (size_t)seq_len * (size_t)(D / 2);
  if (x->rope_dyn_len != seq_len || (m->device != CLRT_CPU && (!x->rope_dyn_dev || x->rope_dyn_dev->device != m->device))) {
    float inv[256], *ct, *st;
    if (D / 2 > 256) {
      clrt_set_error("model: dynamic RoPE rotates up to 512 dimensions of a head (got %d)", D);
      return -1;
    }
    model_rope_inv_freq(c, seq_len, inv);
    if (rope_tables(&ct, &st, inv, seq_len, D, 1.0f)) return -1;
    float *both = realloc(x->rope_dyn, 2 * n * sizeof(float));
    if (!both) {
      free(ct), free(st);
      clrt_set_error("model: out of memory for the dynamic RoPE tables of %d positions", seq_len);
      return -1;
    }
    memcpy(both, ct, n * sizeof(float));
    memcpy(both + n, st, n * sizeof(float));
    free(ct), free(st);
    x->rope_dyn = both;
    x->rope_dyn_len = 0;
    clrt_storage_release(x->rope_dyn_dev);
    x->rope_dyn_dev = NULL;
    if (m->device != CLRT_CPU) {
      if (!(x->rope_dyn_dev = clrt_storage_new(2 * n * sizeof(float), m->device))) return -1;
      if (m->ops->upload(x->rope_dyn_dev->data, both, 2 * n * sizeof(float))) return -1;
    }
    x->rope_dyn_len = seq_len;
  }
  const float *t = m->device != CLRT_CPU ? (const float *)x->rope_dyn_dev->data : x->rope_dyn;
  x->rope_c = t;
  x->rope_s = t + n;
  return 0;
}

int model_bind_acts(clrt_context *x, acts *a, int B, int T, int Tk, int keep) {
  const clrt_model *m = x->m;
  a->cx = x;
  model_layout(m, a, NULL, B, T, Tk, keep);
  size_t need = a->floats * sizeof(float);
  if (!x->acts || x->acts->bytes < need) {
    size_t want = need;
    /* Geometric growth: decode steps raise Tk by one each, and a fresh (zeroed) arena per
       step cost a third of a batch-32 step. */
    if (x->acts && x->acts->bytes + x->acts->bytes / 2 > want) want = x->acts->bytes + x->acts->bytes / 2;
    if (m->cfg.max_batch > 0 && m->cfg.max_seq > 0) {
      /* The configured maximum is the first size; beyond it, grow to what the call needs. */
      int Tm = m->cfg.max_seq > Tk ? m->cfg.max_seq : Tk;
      model_layout(m, a, NULL, m->cfg.max_batch > B ? m->cfg.max_batch : B, Tm, Tm, 1);
      if (a->floats * sizeof(float) > want) want = a->floats * sizeof(float);
    }
    clrt_storage_release(x->acts);
    x->acts = NULL;
    x->saved = 0;
    if (!(x->acts = clrt_storage_new(want, m->device))) return -1;
  }
  model_layout(m, a, x->acts->data, B, T, Tk, keep);
  return 0;
}

/* The CPU kernels take their scratch from here (kernels allocate nothing): one host buffer
   per context, kept at its largest like the arena. */
int model_reserve_workspace(clrt_context *x, size_t bytes, const char *who) {
  x->step_failed = 0;
  if (bytes <= x->ws_bytes) return 0;
  free(x->ws);   /* nothing in it outlives a product: no copy */
  x->ws_bytes = 0;
  if (!(x->ws = malloc(bytes))) {
    clrt_set_error("%s: out of host memory for the kernels' workspace (%zu MiB)", who, bytes >> 20);
    return -1;
  }
  x->ws_bytes = bytes;
  return 0;
}

int model_workspace(clrt_context *x, size_t need, const char *who) {
  if (need <= x->ws_bytes) return 0;
  /* Unreachable while model_workspace_bytes covers every product: a product no longer covered
     fails its step rather than overrun or allocate. */
  if (!x->step_failed)
    clrt_set_error("%s: the kernels' workspace holds %zu bytes, the product needs %zu", who, x->ws_bytes, need);
  x->step_failed = 1;
  return -1;
}

/* Host staging for a step's integer inputs, built here and copied into the arena in one
   upload each (grown on demand; the forward's rowidx stays here for backward). */
int32_t *model_host_ints(clrt_context *x, size_t n) {
  if (n > x->hidx_cap) {
    int32_t *p = realloc(x->hidx, sizeof(int32_t) * n);
    if (!p) {
      clrt_set_error("model: out of host memory staging %zu indices", n);
      return NULL;
    }
    x->hidx = p;
    x->hidx_cap = n;
  }
  return x->hidx;
}

