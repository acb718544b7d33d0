/* tokenizer_encode.c — text to ids: added-token split, NFC, regex pre-tokenization (PCRE2 JIT)
   and byte-level BPE merging over a heap of ranks, with a per-thread piece cache. */
#include "tokenizer_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

enum { CACHE_SLOTS = 1 << 17, CACHE_MAX_ENTRIES = 1 << 16, CACHE_MAX_PIECE = 128, SMALL_PIECE = 48 };

typedef struct { uint64_t key; int32_t left, right, merged; } heap_item;  /* key = rank << 32 | pos */

typedef struct {
  uint64_t hash;      /* 0 = empty */
  uint32_t key_off, key_len, ids_off, ids_n;
} cache_slot;

struct tok_ctx {
  pcre2_match_data *md;
  pcre2_match_context *mctx;
  pcre2_jit_stack *jstack;
  cache_slot *cache;
  uint32_t cache_n;
  char *ckeys;
  size_t ckeys_len, ckeys_cap;
  int32_t *cids;
  size_t cids_len, cids_cap;
  int32_t *sym, *prev, *next;      /* [sym_cap] BPE symbols of one piece */
  heap_item *heap;                 /* [sym_cap] */
  size_t sym_cap;
  int32_t small[SMALL_PIECE];      /* ids of a short piece */
  char *buf;                       /* prefix-space scratch */
  size_t buf_cap;
};

tok_ctx *tok_ctx_new(const clrt_tokenizer *t) {
  tok_ctx *c = calloc(1, sizeof *c);
  if (!c) goto oom;
  c->md = pcre2_match_data_create(4, NULL);
  c->mctx = pcre2_match_context_create(NULL);
  c->jstack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
  c->cache = calloc(CACHE_SLOTS, sizeof *c->cache);
  if (!c->md || !c->mctx || !c->jstack || !c->cache) goto oom;
  pcre2_jit_stack_assign(c->mctx, NULL, c->jstack);
  return c;
oom:
  tok_ctx_free(c);
  clrt_set_error("tokenizer: out of memory creating an encoding context");
  return NULL;
}

void tok_ctx_free(tok_ctx *c) {
  if (!c) return;
  if (c->md) pcre2_match_data_free(c->md);
  if (c->mctx) pcre2_match_context_free(c->mctx);
  if (c->jstack) pcre2_jit_stack_free(c->jstack);
  free(c->cache); free(c->ckeys); free(c->cids);
  free(c->sym); free(c->prev); free(c->next); free(c->heap); free(c->buf);
  free(c);
}

/* ---- output ---- */
static int push_ids(int32_t **out, size_t *n, size_t *cap, const int32_t *ids, size_t k) {
  if (*n + k > *cap) {
    size_t nc = *cap ? *cap * 2 : 256;
    while (nc < *n + k) nc *= 2;
    int32_t *p = realloc(*out, nc * sizeof *p);
    if (!p) { clrt_set_error("tokenizer: out of memory for %zu ids", *n + k); return -1; }
    *out = p;
    *cap = nc;
  }
  memcpy(*out + *n, ids, k * sizeof *ids);
  *n += k;
  return 0;
}

/* ---- piece cache: a piece seen before costs one hash probe ---- */
static cache_slot *cache_find(tok_ctx *c, const char *s, size_t n, uint64_t h) {
  uint32_t i = (uint32_t)h & (CACHE_SLOTS - 1);
  for (;;) {
    cache_slot *sl = &c->cache[i];
    if (!sl->hash) return sl;
    if (sl->hash == h && sl->key_len == n && memcmp(c->ckeys + sl->key_off, s, n) == 0) return sl;
    i = (i + 1) & (CACHE_SLOTS - 1);
  }
}

static void cache_put(tok_ctx *c, cache_slot *sl, uint64_t h, const char *s, size_t n,
                      const int32_t *ids, size_t k) {
  if (c->cache_n >= CACHE_MAX_ENTRIES) return;    /* full: keep what we have (no thrash) */
  if (c->ckeys_len + n > c->ckeys_cap) {
    size_t nc = c->ckeys_cap ? c->ckeys_cap * 2 : 1 << 20;
    char *p = realloc(c->ckeys, nc);
    if (!p) return;
    c->ckeys = p; c->ckeys_cap = nc;
  }
  if (c->cids_len + k > c->cids_cap) {
    size_t nc = c->cids_cap ? c->cids_cap * 2 : 1 << 18;
    int32_t *p = realloc(c->cids, nc * sizeof *p);
    if (!p) return;
    c->cids = p; c->cids_cap = nc;
  }
  memcpy(c->ckeys + c->ckeys_len, s, n);
  memcpy(c->cids + c->cids_len, ids, k * sizeof *ids);
  sl->hash = h ? h : 1;
  sl->key_off = (uint32_t)c->ckeys_len; sl->key_len = (uint32_t)n;
  sl->ids_off = (uint32_t)c->cids_len; sl->ids_n = (uint32_t)k;
  c->ckeys_len += n; c->cids_len += k;
  c->cache_n++;
}

/* ---- BPE over one piece ---- */
static void heap_push(heap_item *h, size_t *n, heap_item it) {
  size_t i = (*n)++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (h[p].key <= it.key) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = it;
}

static heap_item heap_pop(heap_item *h, size_t *n) {
  heap_item top = h[0], last = h[--(*n)];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    uint64_t mk = last.key;
    if (l < *n && h[l].key < mk) { m = l; mk = h[l].key; }
    if (r < *n && h[r].key < mk) m = r;
    if (m == i) break;
    h[i] = h[m];
    i = m;
  }
  if (*n) h[i] = last;
  return top;
}

static int reserve_symbols(tok_ctx *c, size_t n) {
  if (n <= c->sym_cap) return 0;
  size_t nc = c->sym_cap ? c->sym_cap : 256;
  while (nc < n) nc *= 2;
  int32_t *a = realloc(c->sym, nc * sizeof *a);
  if (a) c->sym = a;
  int32_t *b = realloc(c->prev, nc * sizeof *b);
  if (b) c->prev = b;
  int32_t *d = realloc(c->next, nc * sizeof *d);
  if (d) c->next = d;
  heap_item *h = realloc(c->heap, nc * 2 * sizeof *h);
  if (h) c->heap = h;
  if (!a || !b || !d || !h) { clrt_set_error("tokenizer: out of memory for a piece of %zu bytes", n); return -1; }
  c->sym_cap = nc;
  return 0;
}

static inline void consider(const clrt_tokenizer *t, tok_ctx *c, size_t *hn, int32_t pos) {
  int32_t nx = c->next[pos], rank, merged;
  if (nx < 0) return;
  if (!tok_pairmap_get(&t->merges, c->sym[pos], c->sym[nx], &rank, &merged)) return;
  heap_item it = { ((uint64_t)(uint32_t)rank << 32) | (uint32_t)pos, c->sym[pos], c->sym[nx], merged };
  heap_push(c->heap, hn, it);
}

/* Short pieces (nearly all): the same rule as the heap below — lowest rank first, leftmost on
   ties — by scanning an array of pair ranks, which beats heap upkeep at this size. */
static int32_t bpe_small(const clrt_tokenizer *t, const unsigned char *u, size_t n, int32_t *sym) {
  int32_t rank[SMALL_PIECE], merged[SMALL_PIECE];
  int32_t m = (int32_t)n;
  for (int32_t i = 0; i < m; i++) sym[i] = t->byte_id[u[i]];
  for (int32_t i = 0; i + 1 < m; i++)
    if (!tok_pairmap_get(&t->merges, sym[i], sym[i + 1], &rank[i], &merged[i])) rank[i] = INT32_MAX;
  while (m > 1) {
    int32_t best = 0;
    for (int32_t i = 1; i + 1 < m; i++)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == INT32_MAX) break;
    sym[best] = merged[best];
    for (int32_t i = best + 1; i + 1 < m; i++) { sym[i] = sym[i + 1]; rank[i] = rank[i + 1]; merged[i] = merged[i + 1]; }
    m--;
    if (best + 1 < m && !tok_pairmap_get(&t->merges, sym[best], sym[best + 1], &rank[best], &merged[best]))
      rank[best] = INT32_MAX;
    if (best > 0 && !tok_pairmap_get(&t->merges, sym[best - 1], sym[best], &rank[best - 1], &merged[best - 1]))
      rank[best - 1] = INT32_MAX;
  }
  return m;
}

/* Merge the lowest-ranked adjacent pair first, leftmost on ties: O(n log n) per piece. */
static int bpe_piece(const clrt_tokenizer *t, tok_ctx *c, const char *s, size_t n,
                     int32_t **out, size_t *on, size_t *ocap) {
  const unsigned char *u = (const unsigned char *)s;
  if (n == 1) return push_ids(out, on, ocap, &t->byte_id[u[0]], 1);
  int32_t whole;
  if (t->ignore_merges && tok_strmap_get(&t->vocab, s, n, &whole)) return push_ids(out, on, ocap, &whole, 1);
  uint64_t h = 0;
  cache_slot *sl = NULL;
  if (n <= CACHE_MAX_PIECE) {
    h = tok_hash(s, n);
    h = h ? h : 1;
    sl = cache_find(c, s, n, h);
    if (sl->hash) return push_ids(out, on, ocap, c->cids + sl->ids_off, sl->ids_n);
  }
  if (n <= SMALL_PIECE) {
    int32_t k = bpe_small(t, u, n, c->small);
    if (sl) cache_put(c, sl, h, s, n, c->small, (size_t)k);
    return push_ids(out, on, ocap, c->small, (size_t)k);
  }
  if (reserve_symbols(c, n)) return -1;
  for (size_t i = 0; i < n; i++) {
    c->sym[i] = t->byte_id[u[i]];
    c->prev[i] = (int32_t)i - 1;
    c->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
  }
  size_t hn = 0;
  for (size_t i = 0; i + 1 < n; i++) consider(t, c, &hn, (int32_t)i);
  while (hn) {
    heap_item it = heap_pop(c->heap, &hn);
    int32_t pos = (int32_t)(uint32_t)it.key, nx = c->next[pos];
    if (c->sym[pos] != it.left || nx < 0 || c->sym[nx] != it.right) continue;   /* stale */
    c->sym[pos] = it.merged;
    c->sym[nx] = -1;
    c->next[pos] = c->next[nx];
    if (c->next[nx] >= 0) c->prev[c->next[nx]] = pos;
    if (c->prev[pos] >= 0) consider(t, c, &hn, c->prev[pos]);
    consider(t, c, &hn, pos);
  }
  size_t k = 0;
  for (int32_t i = 0; i >= 0; i = c->next[i]) c->prev[k++] = c->sym[i];   /* reuse prev[] as output */
  if (sl) cache_put(c, sl, h, s, n, c->prev, k);
  return push_ids(out, on, ocap, c->prev, k);
}

/* ---- pre-tokenization: each Split stage (behavior Isolated) cuts a piece into its matches
   and the gaps between them; the last stage hands pieces to BPE. ---- */
static int split_stage(const clrt_tokenizer *t, tok_ctx *c, int k, const char *s, size_t n,
                       int32_t **out, size_t *on, size_t *ocap) {
  if (n == 0) return 0;
  if (k == t->n_stages) return bpe_piece(t, c, s, n, out, on, ocap);
  pcre2_code *re = t->stage[k];
  size_t pos = 0, from = 0;
  while (from <= n) {
    /* the input was validated once, so the JIT entry point (no checks) is safe */
    int rc = t->jit[k] ? pcre2_jit_match(re, (PCRE2_SPTR)s, n, from, 0, c->md, c->mctx)
                       : pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[160];
      pcre2_get_error_message(rc, msg, sizeof msg);
      clrt_set_error("tokenizer: pre-tokenizer regex %d failed at byte %zu of a %zu-byte piece: %s", k, from, n,
                     (const char *)msg);
      return -1;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
    size_t ms = ov[0], me = ov[1];
    if (me == ms) {          /* empty match: no piece; step one character */
      if (ms >= n) break;
      from = ms + 1;
      while (from < n && ((unsigned char)s[from] & 0xC0) == 0x80) from++;
      continue;
    }
    if (ms > pos && split_stage(t, c, k + 1, s + pos, ms - pos, out, on, ocap)) return -1;
    if (split_stage(t, c, k + 1, s + ms, me - ms, out, on, ocap)) return -1;
    pos = from = me;
  }
  if (pos < n && split_stage(t, c, k + 1, s + pos, n - pos, out, on, ocap)) return -1;
  return 0;
}

static int encode_section(const clrt_tokenizer *t, tok_ctx *c, const char *s, size_t n,
                          int32_t **out, size_t *on, size_t *ocap) {
  if (n == 0) return 0;
  utf8proc_uint8_t *nfc = NULL;
  if (t->nfc) {
    /* Every code point below U+0300 is NFC-stable and (lead byte < 0xCC) cannot compose with
       what precedes it, so ASCII/Latin text skips the normalizer. */
    int need = 0;
    for (size_t i = 0; i < n; i++)
      if ((unsigned char)s[i] >= 0xCC) { need = 1; break; }
    if (need) {
      utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &nfc,
                                        UTF8PROC_STABLE | UTF8PROC_COMPOSE);
      if (m < 0) {
        clrt_set_error("tokenizer: NFC normalization failed: %s", utf8proc_errmsg(m));
        return -1;
      }
      s = (const char *)nfc;
      n = (size_t)m;
    }
  }
  int rc;
  if (t->add_prefix_space && s[0] != ' ') {
    if (n + 1 > c->buf_cap) {
      size_t nc = (n + 1) * 2;
      char *p = realloc(c->buf, nc);
      if (!p) { free(nfc); clrt_set_error("tokenizer: out of memory"); return -1; }
      c->buf = p; c->buf_cap = nc;
    }
    c->buf[0] = ' ';
    memcpy(c->buf + 1, s, n);
    rc = split_stage(t, c, 0, c->buf, n + 1, out, on, ocap);
  } else {
    rc = split_stage(t, c, 0, s, n, out, on, ocap);
  }
  free(nfc);
  return rc;
}

/* Length in bytes of the longest added token at s (0 if none): walk the trie. */
static size_t match_added(const clrt_tokenizer *t, const unsigned char *s, size_t n, int *which) {
  size_t best = 0;
  int32_t node = 0;
  for (size_t i = 0; i < n; i++) {
    int32_t c = t->trie[node].child;
    while (c >= 0 && t->trie[c].byte != s[i]) c = t->trie[c].sibling;
    if (c < 0) break;
    node = c;
    if (t->trie[node].token >= 0) { best = i + 1; *which = t->trie[node].token; }
  }
  return best;
}

static size_t valid_utf8_prefix(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n) {
      uint64_t w;
      memcpy(&w, s + i, 8);
      if (!(w & 0x8080808080808080ull)) { i += 8; continue; }
    }
    uint32_t cp;
    int k = tok_utf8_decode(s + i, n - i, &cp);
    if (!k) return i;
    i += (size_t)k;
  }
  return n;
}

int tok_encode(const clrt_tokenizer *t, tok_ctx *c, const char *text, size_t len, int add_special,
               int32_t **out, size_t *n, size_t *cap) {
  const unsigned char *u = (const unsigned char *)text;
  size_t bad = valid_utf8_prefix(u, len);
  if (bad != len) {
    clrt_set_error("tokenizer: input is not valid UTF-8 at byte %zu (0x%02x)", bad, u[bad]);
    return -1;
  }
  if (add_special && t->n_prefix && push_ids(out, n, cap, t->prefix, (size_t)t->n_prefix)) return -1;
  size_t start = 0, i = 0;
  while (i < len) {
    int which = -1;
    size_t m = t->added_first[u[i]] ? match_added(t, u + i, len - i, &which) : 0;
    if (!m) { i++; continue; }
    const tok_added *a = &t->added[which];
    size_t sec_end = i, next = i + m;
    if (a->lstrip) {
      while (sec_end > start) {
        size_t b = sec_end - 1;
        while (b > start && (u[b] & 0xC0) == 0x80) b--;
        uint32_t cp;
        if (!tok_utf8_decode(u + b, sec_end - b, &cp) || !tok_is_white_space(cp)) break;
        sec_end = b;
      }
    }
    if (a->rstrip) {
      uint32_t cp;
      int k;
      while (next < len && (k = tok_utf8_decode(u + next, len - next, &cp)) && tok_is_white_space(cp)) next += (size_t)k;
    }
    if (encode_section(t, c, text + start, sec_end - start, out, n, cap)) return -1;
    if (push_ids(out, n, cap, &a->id, 1)) return -1;
    start = i = next;
  }
  if (encode_section(t, c, text + start, len - start, out, n, cap)) return -1;
  if (add_special && t->n_suffix && push_ids(out, n, cap, t->suffix, (size_t)t->n_suffix)) return -1;
  return 0;
}
