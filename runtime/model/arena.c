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
  a->attn = take(a, base, m->ops->attention_scratch(m, B, T, Tk));
}

/* The tables where the kernels read them: the host's, or a copy on the GPU (cos then sin),
   refreshed when they grow or move. */
int model_sync_rope(clrt_model *m) {
  clrt_storage_release(m->rope_dev);
  m->rope_dev = NULL;
  m->rope_kc = m->rope_cos;
  m->rope_ks = m->rope_sin;
  if (m->device == CLRT_CPU || m->rope_len == 0) return 0;
  size_t n = (size_t)m->rope_len * (size_t)(m->cfg.head_dim / 2);
  if (!(m->rope_dev = clrt_storage_new(2 * n * sizeof(float), m->device))) return -1;
  float *d = m->rope_dev->data;
  m->rope_kc = d;
  m->rope_ks = d + n;
  return m->ops->upload(d, m->rope_cos, n * sizeof(float)) || m->ops->upload(d + n, m->rope_sin, n * sizeof(float)) ? -1 : 0;
}

/* Gemma 3's local layers: their own tables (rope_local_theta), host memory. */
static int ensure_local_rope(clrt_model *m, int P) {
  if (!m->cfg.gemma3) return 0;
  int half = m->cfg.head_dim / 2;
  float *c = realloc(m->rope_cos_local, sizeof(float) * (size_t)P * half);
  if (c) m->rope_cos_local = c;
  float *s = realloc(m->rope_sin_local, sizeof(float) * (size_t)P * half);
  if (s) m->rope_sin_local = s;
  if (!c || !s) {
    clrt_set_error("model: out of memory for the local RoPE table of %d positions", P);
    return -1;
  }
  clrt_rope_table(m->rope_cos_local, m->rope_sin_local, m->inv_freq_local, P, m->cfg.head_dim);
  return 0;
}

int model_ensure_rope(clrt_model *m, int P) {
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
  if (ensure_local_rope(m, P)) return -1;
  m->rope_len = P;
  return model_sync_rope(m);
}

int model_bind_acts(clrt_model *m, acts *a, int B, int T, int Tk, int keep) {
  model_layout(m, a, NULL, B, T, Tk, keep);
  size_t need = a->floats * sizeof(float);
  if (!m->acts || m->acts->bytes < need) {
    size_t want = need;
    /* Geometric growth: decode steps raise Tk by one each, and a fresh (zeroed) arena per
       step cost a third of a batch-32 step. */
    if (m->acts && m->acts->bytes + m->acts->bytes / 2 > want) want = m->acts->bytes + m->acts->bytes / 2;
    if (m->cfg.max_batch > 0 && m->cfg.max_seq > 0) {
      /* The configured maximum is the first size; beyond it, grow to what the call needs. */
      int Tm = m->cfg.max_seq > Tk ? m->cfg.max_seq : Tk;
      model_layout(m, a, NULL, m->cfg.max_batch > B ? m->cfg.max_batch : B, Tm, Tm, 1);
      if (a->floats * sizeof(float) > want) want = a->floats * sizeof(float);
    }
    clrt_storage_release(m->acts);
    m->acts = NULL;
    m->saved = 0;
    if (!(m->acts = clrt_storage_new(want, m->device))) return -1;
  }
  model_layout(m, a, m->acts->data, B, T, Tk, keep);
  return 0;
}

/* The CPU kernels take their scratch from here (kernels allocate nothing): one host buffer
   per model, kept at its largest like the arena. */
int model_reserve_workspace(clrt_model *m, size_t bytes, const char *who) {
  m->step_failed = 0;
  if (bytes <= m->ws_bytes) return 0;
  free(m->ws);   /* nothing in it outlives a product: no copy */
  m->ws_bytes = 0;
  if (!(m->ws = malloc(bytes))) {
    clrt_set_error("%s: out of host memory for the kernels' workspace (%zu MiB)", who, bytes >> 20);
    return -1;
  }
  m->ws_bytes = bytes;
  return 0;
}

int model_workspace(clrt_model *m, size_t need, const char *who) {
  if (need <= m->ws_bytes) return 0;
  /* Unreachable while model_workspace_bytes covers every product: a product no longer covered
     fails its step rather than overrun or allocate. */
  if (!m->step_failed)
    clrt_set_error("%s: the kernels' workspace holds %zu bytes, the product needs %zu", who, m->ws_bytes, need);
  m->step_failed = 1;
  return -1;
}

/* Host staging for a step's integer inputs, built here and copied into the arena in one
   upload each (grown on demand; the forward's rowidx stays here for backward). */
int32_t *model_host_ints(clrt_model *m, size_t n) {
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

