/* decode.c — the KV cache behind generation: `slots` independent sequences of up to max_len
 * tokens, each remembering its length, over clrt_model_forward_cached (the training forward's
 * own layer code, so greedy decoding equals argmax over a full recompute).
 *
 * The cache holds, per layer, K and V as [slots, max_len, KV, D]. A decode step takes rows
 * from any slots — rows join and leave the batch as generation goes — and forward_cached
 * reads each row's own slot. Prompts are prefilled in chunks so activations stay bounded. */
#include "clrt.h"
#include "model_internal.h"

#include <stdlib.h>
#include <string.h>

enum { PREFILL_CHUNK = 256 };

struct clrt_decoder {
  clrt_model *m;
  clrt_context *x;              /* the context its steps run in (not owned) */
  int slots, max_len;
  clrt_storage *cache;          /* K and V of every layer */
  float **k, **v;               /* [L] views into cache */
  int32_t *len;                 /* [slots] tokens in each slot */
  int32_t *exact;               /* [slots] leading positions a fresh prefill reproduces bit for bit */
  int32_t *pos;                 /* [slots] scratch: positions of a step's rows */
  float *logits;                /* [slots, V] scratch for a step's rows */
};

clrt_decoder *clrt_decoder_new(clrt_model *m, int slots, int max_len) {
  return clrt_decoder_new_in(clrt_model_context(m), slots, max_len);
}

clrt_decoder *clrt_decoder_new_in(clrt_context *x, int slots, int max_len) {
  clrt_model *m = x->m;
  const clrt_model_config *c = &m->cfg;
  if (slots < 1 || max_len < 1) {
    clrt_set_error("decoder: slots (%d) and max_len (%d) must be positive", slots, max_len);
    return NULL;
  }
  clrt_decoder *d = calloc(1, sizeof *d);
  if (!d) goto oom;
  d->m = m;
  d->x = x;
  d->slots = slots;
  d->max_len = max_len;
  int L = c->num_hidden_layers;
  size_t per = (size_t)slots * max_len * c->num_key_value_heads * c->head_dim;
  size_t bytes = 2 * (size_t)L * per * sizeof(float);
  /* The cache lives with the model (on the GPU its out-of-memory message names the sizes). */
  if (!(d->cache = clrt_storage_new(bytes, clrt_model_device(m)))) {
    if (clrt_model_device(m) == CLRT_CPU)
      clrt_set_error("decoder: cannot allocate the KV cache: %zu MiB for %d slots x %d tokens",
                     bytes >> 20, slots, max_len);
    free(d);
    return NULL;
  }
  d->k = malloc(sizeof(float *) * (size_t)L);
  d->v = malloc(sizeof(float *) * (size_t)L);
  d->len = calloc((size_t)slots, sizeof *d->len);
  d->exact = calloc((size_t)slots, sizeof *d->exact);
  d->pos = calloc((size_t)slots, sizeof *d->pos);
  d->logits = malloc(sizeof(float) * (size_t)slots * c->vocab_size);
  if (!d->k || !d->v || !d->len || !d->exact || !d->pos || !d->logits) {
    clrt_decoder_free(d);
    goto oom;
  }
  for (int l = 0; l < L; l++) {
    d->k[l] = (float *)d->cache->data + (size_t)(2 * l) * per;
    d->v[l] = (float *)d->cache->data + (size_t)(2 * l + 1) * per;
  }
  return d;
oom:
  clrt_set_error("decoder: out of memory");
  return NULL;
}

void clrt_decoder_free(clrt_decoder *d) {
  if (!d) return;
  clrt_storage_release(d->cache);
  free(d->k);
  free(d->v);
  free(d->len);
  free(d->exact);
  free(d->pos);
  free(d->logits);
  free(d);
}

size_t clrt_decoder_bytes(const clrt_decoder *d) {
  return d->cache->bytes + sizeof(float) * (size_t)d->slots * d->m->cfg.vocab_size;
}

int clrt_decoder_length(const clrt_decoder *d, int slot) {
  return slot >= 0 && slot < d->slots ? d->len[slot] : -1;
}

static int check_slot(const clrt_decoder *d, int slot, const char *op) {
  if (d->cache->device != clrt_model_device(d->m)) {
    clrt_set_error("decoder: %s: the KV cache is on %s but the model moved to %s (make a new decoder)",
                   op, d->cache->device ? "cuda" : "cpu", clrt_model_device(d->m) ? "cuda" : "cpu");
    return -1;
  }
  if (slot < 0 || slot >= d->slots) {
    clrt_set_error("decoder: %s: slot %d out of range (the decoder has %d)", op, slot, d->slots);
    return -1;
  }
  return 0;
}

int clrt_decoder_reset(clrt_decoder *d, int slot) {
  if (check_slot(d, slot, "reset")) return -1;
  d->len[slot] = d->exact[slot] = 0;
  return 0;
}

int clrt_decoder_copy_slot(clrt_decoder *d, int src, int dst) {
  if (check_slot(d, src, "copy_slot") || check_slot(d, dst, "copy_slot")) return -1;
  if (src == dst) return 0;
  const clrt_model_config *c = &d->m->cfg;
  size_t row = (size_t)c->num_key_value_heads * c->head_dim, stride = (size_t)d->max_len * row;
  size_t n = (size_t)d->len[src] * row * sizeof(float);
  const model_ops *op = d->m->ops;
  for (int l = 0; l < c->num_hidden_layers; l++)
    if (op->copy(d->k[l] + dst * stride, d->k[l] + src * stride, n) ||
        op->copy(d->v[l] + dst * stride, d->v[l] + src * stride, n))
      return -1;
  d->len[dst] = d->len[src];
  d->exact[dst] = d->exact[src];
  return 0;
}

int clrt_decoder_append(clrt_decoder *d, int slot, const int32_t *tokens, int T,
                        float *logits /* [slots, V] */) {
  if (check_slot(d, slot, "prefill")) return -1;
  if (T < 1) {
    clrt_set_error("decoder: prefill needs at least one token");
    return -1;
  }
  if (d->len[slot] + T > d->max_len) {
    clrt_set_error("decoder: slot %d holds %d tokens; %d more exceed its context of %d", slot,
                   d->len[slot], T, d->max_len);
    return -1;
  }
  int V = d->m->cfg.vocab_size;
  for (int t0 = 0; t0 < T; t0 += PREFILL_CHUNK) {
    int n = T - t0 < PREFILL_CHUNK ? T - t0 : PREFILL_CHUNK;
    int32_t pos0 = d->len[slot], s = slot;
    if (clrt_context_forward_cached(d->x, tokens + t0, 1, n, &pos0, &s, NULL, d->k, d->v,
                                  d->max_len, logits + (size_t)slot * V))
      return -1;
    if (d->exact[slot] == d->len[slot]) d->exact[slot] += n;
    d->len[slot] += n;
  }
  return 0;
}

/* Several prompts, each after what its slot holds, in one forward per chunk: the prompts that
   arrived together (a server's new requests) share the weight reads that a prefill each would
   repeat. Rows shorter than the chunk are padded after their end; the padding's keys and values
   land past the slot's length, where the next decode step overwrites them, and causal attention
   keeps them out of every real position. A row whose padding would run past the cache's end
   takes that chunk alone. Each row's logits come from its own last token. */
static int extend_many(clrt_decoder *d, int n, const int32_t *slots /* [n] */,
                       const int32_t *tokens /* prompts back to back */, const int32_t *lengths /* [n] */,
                       float *logits /* [slots, V] */, int from_empty) {
  if (check_slot(d, 0, "prefill")) return -1;
  if (n < 1 || n > d->slots) {
    clrt_set_error("decoder: prefill of %d prompts (1..%d)", n, d->slots);
    return -1;
  }
  int longest = 0;
  for (int i = 0; i < n; i++) {
    if (check_slot(d, slots[i], "prefill")) return -1;
    for (int j = 0; j < i; j++)
      if (slots[j] == slots[i]) {
        clrt_set_error("decoder: prefill: slot %d appears twice", slots[i]);
        return -1;
      }
    int held = from_empty ? 0 : d->len[slots[i]];
    if (lengths[i] < 1 || held + lengths[i] > d->max_len) {
      clrt_set_error("decoder: prefill: prompt %d has %d tokens after the %d its slot holds (1..%d in all)",
                     i + 1, lengths[i], held, d->max_len);
      return -1;
    }
    if (lengths[i] > longest) longest = lengths[i];
  }
  int V = d->m->cfg.vocab_size;
  int32_t *buf = malloc(sizeof(int32_t) * (size_t)n * PREFILL_CHUNK);
  int32_t *pos0 = malloc(sizeof(int32_t) * (size_t)n * 5);
  int64_t *start = malloc(sizeof(int64_t) * (size_t)n);
  if (!buf || !pos0 || !start) {
    free(buf), free(pos0), free(start);
    clrt_set_error("decoder: out of memory");
    return -1;
  }
  int32_t *rs = pos0 + n, *last = pos0 + 2 * n, *srow = pos0 + 3 * n, *alone = pos0 + 4 * n;
  int64_t at = 0;
  for (int i = 0; i < n; i++) {
    start[i] = at;
    at += lengths[i];
    if (from_empty) d->len[slots[i]] = d->exact[slots[i]] = 0;
  }
  int rc = 0;
  for (int t0 = 0; t0 < longest && rc == 0; t0 += PREFILL_CHUNK) {
    /* the rows with tokens left at t0, each with up to a chunk of them; those whose padding
       to the chunk's width would pass the cache's end go alone */
    int Tn = 0, nalone = 0;
    for (int i = 0; i < n; i++) {
      int k = lengths[i] - t0;
      if (k > PREFILL_CHUNK) k = PREFILL_CHUNK;
      if (k > Tn) Tn = k;
    }
    for (int pass = 0; pass <= nalone && rc == 0; pass++) {
      int B = 0, width = 0;
      for (int i = 0; i < n; i++) {
        int k = lengths[i] - t0;
        if (k <= 0) continue;
        if (k > PREFILL_CHUNK) k = PREFILL_CHUNK;
        int over = d->len[slots[i]] + Tn > d->max_len;
        if (pass == 0 && over) {
          alone[nalone++] = i;
          continue;
        }
        if (pass > 0 && i != alone[pass - 1]) continue;
        if (k > width) width = k;
        rs[B] = i;
        last[B++] = k - 1;
      }
      if (B == 0) continue;
      for (int b = 0; b < B; b++) {
        int i = rs[b], k = last[b] + 1;
        const int32_t *src = tokens + start[i] + t0;
        for (int t = 0; t < width; t++) buf[(int64_t)b * width + t] = src[t < k ? t : k - 1];
        pos0[b] = d->len[slots[i]];
        srow[b] = slots[i];
      }
      rc = clrt_context_forward_cached(d->x, buf, B, width, pos0, srow, last, d->k, d->v, d->max_len, d->logits);
      for (int b = 0; b < B && rc == 0; b++) {
        int i = rs[b], s = slots[i];
        if (d->exact[s] == d->len[s]) d->exact[s] += last[b] + 1;
        d->len[s] += last[b] + 1;
        if (lengths[i] - t0 <= PREFILL_CHUNK)   /* the row's last chunk: its next-token logits */
          memcpy(logits + (size_t)s * V, d->logits + (size_t)b * V, sizeof(float) * (size_t)V);
      }
    }
  }
  free(buf), free(pos0), free(start);
  return rc;
}

int clrt_decoder_prefill_many(clrt_decoder *d, int n, const int32_t *slots /* [n] */,
                              const int32_t *tokens /* prompts back to back */,
                              const int32_t *lengths /* [n] */, float *logits /* [slots, V] */) {
  return extend_many(d, n, slots, tokens, lengths, logits, 1);
}

int clrt_decoder_extend_many(clrt_decoder *d, int n, const int32_t *slots /* [n] */,
                             const int32_t *tokens /* prompts back to back */,
                             const int32_t *lengths /* [n] */, float *logits /* [slots, V] */) {
  return extend_many(d, n, slots, tokens, lengths, logits, 0);
}

int clrt_decoder_decode(clrt_decoder *d, int n, const int32_t *slots /* [n] */,
                        const int32_t *tokens /* [n] */, float *logits /* [slots, V] */) {
  if (check_slot(d, 0, "decode")) return -1;
  if (n < 1 || n > d->slots) {
    clrt_set_error("decoder: decode of %d rows (1..%d)", n, d->slots);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    int s = slots[i];
    if (check_slot(d, s, "decode")) return -1;
    if (d->len[s] == 0) {
      clrt_set_error("decoder: decode: slot %d is empty (prefill it first)", s);
      return -1;
    }
    if (d->len[s] >= d->max_len) {
      clrt_set_error("decoder: decode: slot %d is full (%d tokens)", s, d->max_len);
      return -1;
    }
    for (int j = 0; j < i; j++)
      if (slots[j] == s) {
        clrt_set_error("decoder: decode: slot %d appears twice in one step", s);
        return -1;
      }
    d->pos[i] = d->len[s];
  }
  int V = d->m->cfg.vocab_size;
  if (clrt_context_forward_cached(d->x, tokens, n, 1, d->pos, slots, NULL, d->k, d->v, d->max_len,
                                d->logits))
    return -1;
  for (int i = 0; i < n; i++) {
    /* one row takes linear_packed.c's one-row products, summed in another order than a
       prefill's: its position is not exact */
    if (n > 1 && d->exact[slots[i]] == d->len[slots[i]]) d->exact[slots[i]]++;
    d->len[slots[i]]++;
    memcpy(logits + (size_t)slots[i] * V, d->logits + (size_t)i * V, sizeof(float) * (size_t)V);
  }
  return 0;
}

int clrt_decoder_exact_length(const clrt_decoder *d, int slot) {
  if (slot < 0 || slot >= d->slots) return -1;
  return clrt_model_kv_reusable(d->m) ? d->exact[slot] : 0;
}

/* ---- the prefix cache's blocks ------------------------------------------------------------ */

struct clrt_kv_blocks {
  clrt_storage *data;   /* [blocks][L][2][bt][KV * D] */
  int bt, blocks, L;
  size_t row;           /* floats of one position in one layer's K (or V) */
};

size_t clrt_kv_block_bytes(const clrt_model *m, int block_tokens) {
  const clrt_model_config *c = &m->cfg;
  return 2 * (size_t)c->num_hidden_layers * block_tokens * c->num_key_value_heads * c->head_dim * sizeof(float);
}

clrt_kv_blocks *clrt_kv_blocks_new(clrt_model *m, int block_tokens, int blocks) {
  if (block_tokens < 1 || blocks < 1) {
    clrt_set_error("prefix cache: block_tokens (%d) and blocks (%d) must be positive", block_tokens, blocks);
    return NULL;
  }
  clrt_kv_blocks *b = calloc(1, sizeof *b);
  if (!b) {
    clrt_set_error("prefix cache: out of memory");
    return NULL;
  }
  size_t bytes = clrt_kv_block_bytes(m, block_tokens) * (size_t)blocks;
  if (!(b->data = clrt_storage_new(bytes, clrt_model_device(m)))) {
    if (clrt_model_device(m) == CLRT_CPU)
      clrt_set_error("prefix cache: cannot allocate %zu MiB for %d blocks of %d tokens", bytes >> 20, blocks,
                     block_tokens);
    free(b);
    return NULL;
  }
  b->bt = block_tokens;
  b->blocks = blocks;
  b->L = m->cfg.num_hidden_layers;
  b->row = (size_t)m->cfg.num_key_value_heads * m->cfg.head_dim;
  return b;
}

void clrt_kv_blocks_free(clrt_kv_blocks *b) {
  if (!b) return;
  clrt_storage_release(b->data);
  free(b);
}

/* K (kv 0) or V (kv 1) of layer l in block id. */
static float *block_at(const clrt_kv_blocks *b, int id, int l, int kv) {
  return (float *)b->data->data + (((size_t)id * b->L + l) * 2 + kv) * b->bt * b->row;
}

static int check_blocks(const clrt_decoder *d, const clrt_kv_blocks *b, int count, const int32_t *ids,
                        const char *op) {
  if (!b || b->L != d->m->cfg.num_hidden_layers ||
      b->row != (size_t)d->m->cfg.num_key_value_heads * d->m->cfg.head_dim) {
    clrt_set_error("decoder: %s: the blocks belong to a model of another shape", op);
    return -1;
  }
  if (b->data->device != clrt_model_device(d->m)) {
    clrt_set_error("decoder: %s: the blocks are on another device than the model (make new ones)", op);
    return -1;
  }
  for (int i = 0; i < count; i++)
    if (ids[i] < 0 || ids[i] >= b->blocks) {
      clrt_set_error("decoder: %s: block %d out of range (%d blocks)", op, ids[i], b->blocks);
      return -1;
    }
  return 0;
}

int clrt_decoder_save_blocks(clrt_decoder *d, int slot, int first, int count, const int32_t *ids,
                             clrt_kv_blocks *b) {
  if (check_slot(d, slot, "save_blocks") || check_blocks(d, b, count, ids, "save_blocks")) return -1;
  if (first < 0 || count < 0 || (int64_t)(first + count) * b->bt > d->exact[slot]) {
    clrt_set_error("decoder: save_blocks: blocks [%d, %d) of %d tokens pass the %d exact positions of slot %d",
                   first, first + count, b->bt, d->exact[slot], slot);
    return -1;
  }
  size_t stride = (size_t)d->max_len * b->row, n = (size_t)b->bt * b->row * sizeof(float);
  const model_ops *op = d->m->ops;
  for (int i = 0; i < count; i++) {
    size_t at = slot * stride + (size_t)(first + i) * b->bt * b->row;
    for (int l = 0; l < b->L; l++)
      if (op->copy(block_at(b, ids[i], l, 0), d->k[l] + at, n) || op->copy(block_at(b, ids[i], l, 1), d->v[l] + at, n))
        return -1;
  }
  return 0;
}

int clrt_decoder_load_blocks(clrt_decoder *d, int slot, int count, const int32_t *ids, clrt_kv_blocks *b) {
  if (check_slot(d, slot, "load_blocks") || check_blocks(d, b, count, ids, "load_blocks")) return -1;
  if (count < 0 || (int64_t)count * b->bt > d->max_len) {
    clrt_set_error("decoder: load_blocks: %d blocks of %d tokens exceed the context of %d", count, b->bt, d->max_len);
    return -1;
  }
  size_t stride = (size_t)d->max_len * b->row, n = (size_t)b->bt * b->row * sizeof(float);
  const model_ops *op = d->m->ops;
  for (int i = 0; i < count; i++) {
    size_t at = slot * stride + (size_t)i * b->bt * b->row;
    for (int l = 0; l < b->L; l++)
      if (op->copy(d->k[l] + at, block_at(b, ids[i], l, 0), n) || op->copy(d->v[l] + at, block_at(b, ids[i], l, 1), n))
        return -1;
  }
  d->len[slot] = d->exact[slot] = count * b->bt;
  return 0;
}
