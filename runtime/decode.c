/* decode.c — KV-cache inference for the Llama-family model: prefill a prompt into a cache
 * slot, then decode one token at a time for many slots at once.
 *
 * The cache holds, per layer, K and V as [slots, max_len, KV, D]; a slot is one sequence and
 * remembers its length. Rows of a decode step may come from any slots (rows join and leave
 * the batch as generation goes), so the step gathers them by slot index. The math is the
 * training forward's, kernel for kernel, so greedy decoding equals argmax over a full
 * recompute (tests/lua/test_decode.lua). */
#include "clrt.h"
#include "cpu/decode_kernels.h"
#include "cpu/model_kernels.h"
#include "model_internal.h"

#include <stdlib.h>
#include <string.h>

struct clrt_decoder {
  clrt_model *m;
  int slots, max_len, rows;     /* rows: the most rows one forward pass takes */
  clrt_storage *cache;          /* K then V of every layer */
  int32_t *len;                 /* [slots] tokens in each slot */
  float *rope_cos, *rope_sin;   /* [max_len, D/2] */
  clrt_storage *scratch;
  float *x, *xn, *q, *k, *v, *qpre, *kpre, *rstd, *qrstd, *krstd, *att, *tmp, *g, *u, *h;
  float *logits, *attn;         /* [rows, V], attention scratch */
  int32_t *pos, *slot, *klen;   /* [rows] */
};

static float *P(const clrt_model *m, int64_t off) {
  return off < 0 ? NULL : (float *)m->params->data + off;
}

static size_t cache_floats_per_layer(const clrt_decoder *d) {
  const clrt_model_config *c = &d->m->cfg;
  return (size_t)d->slots * d->max_len * c->num_key_value_heads * c->head_dim;
}

static float *kcache(const clrt_decoder *d, int l) {
  return (float *)d->cache->data + (size_t)(2 * l) * cache_floats_per_layer(d);
}
static float *vcache(const clrt_decoder *d, int l) {
  return (float *)d->cache->data + (size_t)(2 * l + 1) * cache_floats_per_layer(d);
}

clrt_decoder *clrt_decoder_new(clrt_model *m, int slots, int max_len) {
  const clrt_model_config *c = &m->cfg;
  if (slots < 1 || max_len < 1) {
    clrt_set_error("decoder: slots (%d) and max_len (%d) must be positive", slots, max_len);
    return NULL;
  }
  clrt_decoder *d = calloc(1, sizeof *d);
  if (!d) goto oom;
  d->m = m;
  d->slots = slots;
  d->max_len = max_len;
  d->rows = slots > 128 ? slots : 128;   /* prefill runs in chunks of this many tokens */
  int C = c->hidden_size, I = c->intermediate_size, H = c->num_attention_heads,
      KV = c->num_key_value_heads, D = c->head_dim, V = c->vocab_size, R = d->rows;
  size_t cache_bytes = 2 * (size_t)c->num_hidden_layers * cache_floats_per_layer(d) * sizeof(float);
  if (!(d->cache = clrt_storage_new(cache_bytes, CLRT_CPU))) {
    clrt_set_error("decoder: cannot allocate the KV cache: %zu MiB for %d slots x %d tokens",
                   cache_bytes >> 20, slots, max_len);
    free(d);
    return NULL;
  }
  d->len = calloc((size_t)slots, sizeof *d->len);
  d->rope_cos = malloc(sizeof(float) * (size_t)max_len * (D / 2));
  d->rope_sin = malloc(sizeof(float) * (size_t)max_len * (D / 2));
  if (!d->len || !d->rope_cos || !d->rope_sin) goto oom_free;
  clrt_rope_table(d->rope_cos, d->rope_sin, m->inv_freq, max_len, D);

  size_t attn = clrt_attention_scratch_floats(R, max_len);
  size_t attn_dec = clrt_attention_decode_scratch_floats(max_len);
  if (attn_dec > attn) attn = attn_dec;
  size_t sizes[] = {(size_t)R * C, (size_t)R * C, (size_t)R * H * D, (size_t)R * KV * D,
                    (size_t)R * KV * D, (size_t)R * H * D, (size_t)R * KV * D, (size_t)R,
                    (size_t)R * H, (size_t)R * KV, (size_t)R * H * D, (size_t)R * C,
                    (size_t)R * I, (size_t)R * I, (size_t)R * I, (size_t)R * V, attn, (size_t)R,
                    (size_t)R, (size_t)R};
  float **dst[] = {&d->x, &d->xn, &d->q, &d->k, &d->v, &d->qpre, &d->kpre, &d->rstd,
                   &d->qrstd, &d->krstd, &d->att, &d->tmp, &d->g, &d->u, &d->h, &d->logits,
                   &d->attn, (float **)&d->pos, (float **)&d->slot, (float **)&d->klen};
  enum { NBUF = sizeof sizes / sizeof sizes[0] };
  size_t total = 0;
  for (int i = 0; i < NBUF; i++) total += (sizes[i] + 15) & ~(size_t)15;
  if (!(d->scratch = clrt_storage_new(total * sizeof(float), CLRT_CPU))) goto oom_free;
  float *p = d->scratch->data;
  for (int i = 0; i < NBUF; i++) {
    *dst[i] = p;
    p += (sizes[i] + 15) & ~(size_t)15;
  }
  return d;
oom_free:
  clrt_decoder_free(d);
oom:
  clrt_set_error("decoder: out of memory");
  return NULL;
}

void clrt_decoder_free(clrt_decoder *d) {
  if (!d) return;
  clrt_storage_release(d->cache);
  clrt_storage_release(d->scratch);
  free(d->len);
  free(d->rope_cos);
  free(d->rope_sin);
  free(d);
}

size_t clrt_decoder_bytes(const clrt_decoder *d) {
  return d->cache->bytes + d->scratch->bytes;
}

int clrt_decoder_length(const clrt_decoder *d, int slot) {
  return slot >= 0 && slot < d->slots ? d->len[slot] : -1;
}

static int check_slot(const clrt_decoder *d, int slot, const char *op) {
  if (slot < 0 || slot >= d->slots) {
    clrt_set_error("decoder: %s: slot %d out of range (the decoder has %d)", op, slot, d->slots);
    return -1;
  }
  return 0;
}

int clrt_decoder_reset(clrt_decoder *d, int slot) {
  if (check_slot(d, slot, "reset")) return -1;
  d->len[slot] = 0;
  return 0;
}

int clrt_decoder_copy_slot(clrt_decoder *d, int src, int dst) {
  if (check_slot(d, src, "copy_slot") || check_slot(d, dst, "copy_slot")) return -1;
  if (src == dst) return 0;
  const clrt_model_config *c = &d->m->cfg;
  size_t row = (size_t)c->num_key_value_heads * c->head_dim, n = (size_t)d->len[src] * row;
  size_t stride = (size_t)d->max_len * row;
  for (int l = 0; l < c->num_hidden_layers; l++) {
    memcpy(kcache(d, l) + dst * stride, kcache(d, l) + src * stride, n * sizeof(float));
    memcpy(vcache(d, l) + dst * stride, vcache(d, l) + src * stride, n * sizeof(float));
  }
  d->len[dst] = d->len[src];
  return 0;
}

/* n rows through every layer. Prefill (one_slot >= 0): the rows are consecutive positions
   of that slot, from its current length on. Decode (one_slot < 0): row i is the next token
   of slot d->slot[i]. d->x holds the embedded rows on entry and the final hidden on exit. */
static void forward_rows(clrt_decoder *d, int n, int one_slot) {
  clrt_model *m = d->m;
  const clrt_model_config *c = &m->cfg;
  int C = c->hidden_size, I = c->intermediate_size, H = c->num_attention_heads,
      KV = c->num_key_value_heads, D = c->head_dim;
  float eps = c->rms_norm_eps;
  size_t row = (size_t)KV * D, stride = (size_t)d->max_len * row;
  for (int i = 0; i < n; i++) {
    int s = one_slot >= 0 ? one_slot : d->slot[i];
    d->pos[i] = one_slot >= 0 ? d->len[s] + i : d->len[s];
    d->klen[i] = d->pos[i] + 1;
  }
  for (int l = 0; l < c->num_hidden_layers; l++) {
    const clrt_layer_offsets *o = &m->layer[l];
    clrt_rmsnorm_forward(d->xn, d->rstd, d->x, P(m, o->ln1), n, C, eps);
    float *qd = c->qk_norm ? d->qpre : d->q, *kd = c->qk_norm ? d->kpre : d->k;
    clrt_linear_forward(qd, d->xn, P(m, o->wq), P(m, o->bq), n, C, H * D);
    clrt_linear_forward(kd, d->xn, P(m, o->wk), P(m, o->bk), n, C, KV * D);
    clrt_linear_forward(d->v, d->xn, P(m, o->wv), P(m, o->bv), n, C, KV * D);
    if (c->qk_norm) {
      clrt_rmsnorm_forward(d->q, d->qrstd, d->qpre, P(m, o->qn), (int64_t)n * H, D, eps);
      clrt_rmsnorm_forward(d->k, d->krstd, d->kpre, P(m, o->kn), (int64_t)n * KV, D, eps);
    }
    /* Each row at its own position: B = n rows of T = 1 (prefill positions are consecutive,
       which the same call expresses). */
    clrt_rope_forward(d->q, d->rope_cos, d->rope_sin, d->pos, n, 1, H, D);
    clrt_rope_forward(d->k, d->rope_cos, d->rope_sin, d->pos, n, 1, KV, D);
    float *kc = kcache(d, l), *vc = vcache(d, l);
    for (int i = 0; i < n; i++) {
      int s = one_slot >= 0 ? one_slot : d->slot[i];
      memcpy(kc + s * stride + (size_t)d->pos[i] * row, d->k + (size_t)i * row, row * sizeof(float));
      memcpy(vc + s * stride + (size_t)d->pos[i] * row, d->v + (size_t)i * row, row * sizeof(float));
    }
    if (one_slot >= 0) {
      int32_t p0 = d->pos[0];
      clrt_attention_forward(d->att, NULL, d->q, kc + one_slot * stride, vc + one_slot * stride,
                             1, n, H, KV, D, &p0, (int64_t)stride, d->attn);
    } else {
      int32_t *slot_of = d->slot;
      clrt_attention_decode(d->att, d->q, kc, vc, slot_of, d->klen, n, H, KV, D, d->max_len,
                            d->attn);
    }
    clrt_linear_forward(d->tmp, d->att, P(m, o->wo), P(m, o->bo), n, H * D, C);
    clrt_residual_forward(d->x, d->x, d->tmp, (int64_t)n * C);
    clrt_rmsnorm_forward(d->xn, d->rstd, d->x, P(m, o->ln2), n, C, eps);
    clrt_linear_forward(d->g, d->xn, P(m, o->wg), NULL, n, C, I);
    clrt_linear_forward(d->u, d->xn, P(m, o->wu), NULL, n, C, I);
    clrt_swiglu_forward(d->h, d->g, d->u, (int64_t)n * I);
    clrt_linear_forward(d->tmp, d->h, P(m, o->wd), NULL, n, I, C);
    clrt_residual_forward(d->x, d->x, d->tmp, (int64_t)n * C);
  }
  for (int i = 0; i < n; i++) d->len[one_slot >= 0 ? one_slot : d->slot[i]]++;
}

/* Logits of the given rows of d->x into out rows (one per row index in `rows`). */
static void head_rows(clrt_decoder *d, int n, const int *rows, float *const *out) {
  clrt_model *m = d->m;
  const clrt_model_config *c = &m->cfg;
  int C = c->hidden_size, V = c->vocab_size;
  for (int i = 0; i < n; i++)
    memcpy(d->tmp + (size_t)i * C, d->x + (size_t)rows[i] * C, sizeof(float) * (size_t)C);
  clrt_rmsnorm_forward(d->xn, d->rstd, d->tmp, P(m, m->norm), n, C, c->rms_norm_eps);
  clrt_linear_forward(d->logits, d->xn, P(m, m->head), NULL, n, C, V);
  for (int i = 0; i < n; i++) memcpy(out[i], d->logits + (size_t)i * V, sizeof(float) * (size_t)V);
}

static int check_tokens(const clrt_decoder *d, const int32_t *tokens, int n, const char *op) {
  int V = d->m->cfg.vocab_size;
  for (int i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= V) {
      clrt_set_error("decoder: %s: token %d at %d is outside the vocabulary of %d", op,
                     tokens[i], i, V);
      return -1;
    }
  return 0;
}

int clrt_decoder_append(clrt_decoder *d, int slot, const int32_t *tokens, int T,
                        float *logits /* [slots, V] */) {
  if (check_slot(d, slot, "prefill") || check_tokens(d, tokens, T, "prefill")) return -1;
  if (T < 1) {
    clrt_set_error("decoder: prefill needs at least one token");
    return -1;
  }
  if (d->len[slot] + T > d->max_len) {
    clrt_set_error("decoder: slot %d holds %d tokens; %d more exceed its context of %d", slot,
                   d->len[slot], T, d->max_len);
    return -1;
  }
  const clrt_model_config *c = &d->m->cfg;
  for (int t0 = 0; t0 < T; t0 += d->rows) {
    if (clrt_interrupted()) {
      clrt_set_error("interrupted");
      return -1;
    }
    int n = T - t0 < d->rows ? T - t0 : d->rows;
    clrt_embedding_forward(d->x, tokens + t0, P(d->m, d->m->wte), n, c->hidden_size);
    forward_rows(d, n, slot);
    if (t0 + n == T) {
      int last = n - 1;
      float *out = logits + (size_t)slot * c->vocab_size;
      head_rows(d, 1, &last, &out);
    }
  }
  return 0;
}

int clrt_decoder_decode(clrt_decoder *d, int n, const int32_t *slots /* [n] */,
                        const int32_t *tokens /* [n] */, float *logits /* [slots, V] */) {
  if (n < 1 || n > d->slots) {
    clrt_set_error("decoder: decode of %d rows (1..%d)", n, d->slots);
    return -1;
  }
  if (check_tokens(d, tokens, n, "decode")) return -1;
  for (int i = 0; i < n; i++) {
    if (check_slot(d, slots[i], "decode")) return -1;
    if (d->len[slots[i]] == 0) {
      clrt_set_error("decoder: decode: slot %d is empty (prefill it first)", slots[i]);
      return -1;
    }
    if (d->len[slots[i]] >= d->max_len) {
      clrt_set_error("decoder: decode: slot %d is full (%d tokens)", slots[i], d->max_len);
      return -1;
    }
    for (int j = 0; j < i; j++)
      if (slots[j] == slots[i]) {
        clrt_set_error("decoder: decode: slot %d appears twice in one step", slots[i]);
        return -1;
      }
    d->slot[i] = slots[i];
  }
  const clrt_model_config *c = &d->m->cfg;
  clrt_embedding_forward(d->x, tokens, P(d->m, d->m->wte), n, c->hidden_size);
  forward_rows(d, n, -1);
  int rows[1024];
  float *outs[1024];
  for (int i0 = 0; i0 < n; i0 += 1024) {
    int k = n - i0 < 1024 ? n - i0 : 1024;
    for (int i = 0; i < k; i++) {
      rows[i] = i0 + i;
      outs[i] = logits + (size_t)slots[i0 + i] * c->vocab_size;
    }
    head_rows(d, k, rows, outs);
  }
  return 0;
}
