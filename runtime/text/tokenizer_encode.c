/* tokenizer_encode.c — text to ids: added-token split, normalizers, Metaspace and regex
   pre-tokenization (PCRE2 JIT), BPE merging over a heap of ranks (symbols are bytes for a
   byte-level model, characters with byte fallback for a SentencePiece-style one), with a
   per-thread piece cache. */
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
  int32_t *exp;                    /* [exp_cap] a piece's ids after byte fallback */
  size_t exp_cap;
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
  free(c->sym); free(c->prev); free(c->next); free(c->heap); free(c->buf); free(c->exp);
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

/* A piece's first symbols: its bytes (byte-level) or its characters (SentencePiece-style),
   where a character outside the vocab is -1 - its byte offset, an id no merge names. */
static int32_t first_symbols(const clrt_tokenizer *t, const unsigned char *u, size_t n, int32_t *sym) {
  if (t->byte_level) {
    for (size_t i = 0; i < n; i++) sym[i] = t->byte_id[u[i]];
    return (int32_t)n;
  }
  int32_t m = 0;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    int k = tok_utf8_decode(u + i, n - i, &cp);   /* the text was validated */
    int32_t id = -1;
    if (cp < 65536) id = t->char_id[cp];
    else if (!tok_strmap_get(&t->vocab, (const char *)u + i, (size_t)k, &id)) id = -1;
    sym[m++] = id >= 0 ? id : -1 - (int32_t)i;
    i += (size_t)k;
  }
  return m;
}

/* Short pieces (nearly all): the same rule as the heap below — lowest rank first, leftmost on
   ties — by scanning an array of pair ranks, which beats heap upkeep at this size. */
static int32_t bpe_small(const clrt_tokenizer *t, int32_t m, int32_t *sym) {
  int32_t rank[SMALL_PIECE], merged[SMALL_PIECE];
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

/* SentencePiece-style: a character left outside the vocab becomes its <0xNN> byte tokens
   (byte fallback, when the vocab has them all) or unk (consecutive unks fused when asked).
   Returns the ids to emit (ids itself when nothing needed expanding), *k their count. */
static const int32_t *expand_unknown(const clrt_tokenizer *t, tok_ctx *c, const unsigned char *u, size_t n,
                                     const int32_t *ids, size_t *k) {
  size_t m = *k, i;
  for (i = 0; i < m && ids[i] >= 0; i++) {}
  if (i == m) return ids;
  if (m * 4 > c->exp_cap) {
    size_t nc = m * 4 < 256 ? 256 : m * 4;
    int32_t *p = realloc(c->exp, nc * sizeof *p);
    if (!p) { clrt_set_error("tokenizer: out of memory"); return NULL; }
    c->exp = p; c->exp_cap = nc;
  }
  size_t o = 0;
  for (i = 0; i < m; i++) {
    if (ids[i] >= 0) { c->exp[o++] = ids[i]; continue; }
    size_t at = (size_t)(-1 - ids[i]);
    uint32_t cp;
    int len = tok_utf8_decode(u + at, n - at, &cp), all = t->byte_fallback;
    for (int b = 0; b < len && all; b++) all = t->fallback_id[u[at + b]] >= 0;
    if (all) {
      for (int b = 0; b < len; b++) c->exp[o++] = t->fallback_id[u[at + b]];
    } else if (t->unk_id < 0) {
      clrt_set_error("tokenizer: character U+%04X is not in the vocabulary, which has no byte fallback for it "
                     "and no unk token", (unsigned)cp);
      return NULL;
    } else if (!(t->fuse_unk && o > 0 && c->exp[o - 1] == t->unk_id)) {
      c->exp[o++] = t->unk_id;
    }
  }
  *k = o;
  return c->exp;
}

static int emit_piece(const clrt_tokenizer *t, tok_ctx *c, const char *s, size_t n, cache_slot *sl, uint64_t h,
                      const int32_t *ids, size_t k, int32_t **out, size_t *on, size_t *ocap) {
  if (!t->byte_level && !(ids = expand_unknown(t, c, (const unsigned char *)s, n, ids, &k))) return -1;
  if (sl) cache_put(c, sl, h, s, n, ids, k);
  return push_ids(out, on, ocap, ids, k);
}

/* Merge the lowest-ranked adjacent pair first, leftmost on ties: O(n log n) per piece. */
static int bpe_piece(const clrt_tokenizer *t, tok_ctx *c, const char *s, size_t n,
                     int32_t **out, size_t *on, size_t *ocap) {
  const unsigned char *u = (const unsigned char *)s;
  if (n == 1 && t->byte_level) return push_ids(out, on, ocap, &t->byte_id[u[0]], 1);
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
    int32_t k = bpe_small(t, first_symbols(t, u, n, c->small), c->small);
    return emit_piece(t, c, s, n, sl, h, c->small, (size_t)k, out, on, ocap);
  }
  if (reserve_symbols(c, n)) return -1;
  size_t m = (size_t)first_symbols(t, u, n, c->sym);
  for (size_t i = 0; i < m; i++) {
    c->prev[i] = (int32_t)i - 1;
    c->next[i] = i + 1 < m ? (int32_t)i + 1 : -1;
  }
  size_t hn = 0;
  for (size_t i = 0; i + 1 < m; i++) consider(t, c, &hn, (int32_t)i);
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
  return emit_piece(t, c, s, n, sl, h, c->prev, k, out, on, ocap);
}

/* SentencePiece-style pieces are whole sections (no pre-tokenizer splits them); cutting
   before each ▁ whose predecessor no token joins to it (see find_sp_joins) keeps the result
   exact and makes pieces word-sized, so the piece cache works. */
static int bpe_sp_words(const clrt_tokenizer *t, tok_ctx *c, const char *s, size_t n,
                        int32_t **out, size_t *on, size_t *ocap) {
  const unsigned char *u = (const unsigned char *)s;
  size_t start = 0;
  uint32_t prev = 0x2581;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    int k = tok_utf8_decode(u + i, n - i, &cp);
    if (cp == 0x2581 && i > start && prev != 0x2581) {
      int joined = 0;
      for (int j = 0; j < t->n_sp_join; j++)
        if (t->sp_join[j] == prev) { joined = 1; break; }
      if (!joined) {
        if (bpe_piece(t, c, s + start, i - start, out, on, ocap)) return -1;
        start = i;
      }
    }
    prev = cp;
    i += (size_t)k;
  }
  return bpe_piece(t, c, s + start, n - start, out, on, ocap);
}

/* ---- pre-tokenization: each Split stage cuts a piece at its matches (behavior Isolated:
   matches and gaps are pieces; Removed: gaps only; MergedWithPrevious/Next: a match joins the
   gap before/after it); the last stage hands pieces to BPE. ---- */
static int split_stage(const clrt_tokenizer *t, tok_ctx *c, int k, const char *s, size_t n,
                       int32_t **out, size_t *on, size_t *ocap) {
  if (n == 0) return 0;
  if (k == t->n_stages)
    return t->sp_split && n > 3 ? bpe_sp_words(t, c, s, n, out, on, ocap) : bpe_piece(t, c, s, n, out, on, ocap);
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
    switch (t->behavior[k]) {
    case TOK_MERGED_PREV:
      if (split_stage(t, c, k + 1, s + pos, me - pos, out, on, ocap)) return -1;
      pos = me;
      break;
    case TOK_MERGED_NEXT:
      if (ms > pos && split_stage(t, c, k + 1, s + pos, ms - pos, out, on, ocap)) return -1;
      pos = ms;
      break;
    default:
      if (ms > pos && split_stage(t, c, k + 1, s + pos, ms - pos, out, on, ocap)) return -1;
      if (t->behavior[k] == TOK_ISOLATED && split_stage(t, c, k + 1, s + ms, me - ms, out, on, ocap)) return -1;
      pos = me;
    }
    from = me;
  }
  if (pos < n && split_stage(t, c, k + 1, s + pos, n - pos, out, on, ocap)) return -1;
  return 0;
}

/* Metaspace: ' ' becomes the replacement, which is also put in front when the scheme asks
   (first: only for the section at the very start of the text); with split, a piece starts
   at each replacement character. */
static int metaspace(const clrt_tokenizer *t, tok_ctx *c, const char *s, size_t n, int first,
                     int32_t **out, size_t *on, size_t *ocap) {
  size_t spaces = 0, r = (size_t)t->meta_len;
  for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
  int prepend = (t->meta_prepend == 2 || (t->meta_prepend == 1 && first)) &&
                s[0] != ' ' && !(n >= r && memcmp(s, t->meta_rep, r) == 0);
  size_t m = n + spaces * (r - 1) + (prepend ? r : 0), o = 0;
  char *buf = malloc(m + 1);
  if (!buf) { clrt_set_error("tokenizer: out of memory"); return -1; }
  if (prepend) { memcpy(buf, t->meta_rep, r); o = r; }
  for (size_t i = 0; i < n; i++) {
    if (s[i] == ' ') { memcpy(buf + o, t->meta_rep, r); o += r; }
    else buf[o++] = s[i];
  }
  int rc = 0;
  if (!t->meta_split) {
    rc = split_stage(t, c, 0, buf, m, out, on, ocap);
  } else {
    size_t start = 0;
    for (size_t i = 1; i + r <= m && rc == 0; i++)
      if (memcmp(buf + i, t->meta_rep, r) == 0) {
        rc = split_stage(t, c, 0, buf + start, i - start, out, on, ocap);
        start = i;
      }
    if (rc == 0) rc = split_stage(t, c, 0, buf + start, m - start, out, on, ocap);
  }
  free(buf);
  return rc;
}

/* One section of text between added tokens; first: it starts the text. */
static int encode_section(const clrt_tokenizer *t, tok_ctx *c, const char *s, size_t n, int first,
                          int32_t **out, size_t *on, size_t *ocap) {
  if (n == 0) return 0;
  char *norm = NULL;
  if (t->n_norm) {
    const char *r = tok_normalize(t, s, n, &n);
    if (!r) return -1;
    if (r != s) norm = (char *)r;
    s = r;
    if (n == 0) { free(norm); return 0; }
  }
  int rc;
  if (t->meta_len) {
    rc = metaspace(t, c, s, n, first, out, on, ocap);
  } else if (t->add_prefix_space && s[0] != ' ') {
    if (n + 1 > c->buf_cap) {
      size_t nc = (n + 1) * 2;
      char *p = realloc(c->buf, nc);
      if (!p) { free(norm); clrt_set_error("tokenizer: out of memory"); return -1; }
      c->buf = p; c->buf_cap = nc;
    }
    c->buf[0] = ' ';
    memcpy(c->buf + 1, s, n);
    rc = split_stage(t, c, 0, c->buf, n + 1, out, on, ocap);
  } else {
    rc = split_stage(t, c, 0, s, n, out, on, ocap);
  }
  free(norm);
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

static int word_char(uint32_t cp) {
  utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
  return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ND) || k == UTF8PROC_CATEGORY_PC;
}

/* No word character right before [from, to) nor right after it. */
static int single_word_at(const unsigned char *u, size_t len, size_t from, size_t to) {
  uint32_t cp;
  if (from > 0) {
    size_t b = from - 1;
    while (b > 0 && (u[b] & 0xC0) == 0x80) b--;
    if (tok_utf8_decode(u + b, from - b, &cp) && word_char(cp)) return 0;
  }
  if (to < len && tok_utf8_decode(u + to, len - to, &cp) && word_char(cp)) return 0;
  return 1;
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
    if (a->single_word && !single_word_at(u, len, i, i + m)) { i += m; continue; }
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
    if (encode_section(t, c, text + start, sec_end - start, start == 0, out, n, cap)) return -1;
    if (push_ids(out, n, cap, &a->id, 1)) return -1;
    start = i = next;
  }
  if (encode_section(t, c, text + start, len - start, start == 0, out, n, cap)) return -1;
  if (add_special && t->n_suffix && push_ids(out, n, cap, t->suffix, (size_t)t->n_suffix)) return -1;
  return 0;
}
