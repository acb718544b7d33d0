/* tokenizer.c — the BPE tokenizer object (byte-level or SentencePiece-style): building it
   from parsed tokenizer.json parts (lua/clrt/tokenizer.lua does the parsing), encode, batch
   encode, decode. */
#include "tokenizer_internal.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

clrt_tokenizer *clrt_tokenizer_new(void) {
  clrt_tokenizer *t = calloc(1, sizeof *t);
  if (!t) { clrt_set_error("tokenizer: out of memory"); return NULL; }
  for (int i = 0; i < 256; i++) t->byte_id[i] = t->fallback_id[i] = -1;
  t->byte_level = 1;
  t->unk_id = -1;
  return t;
}

void clrt_tokenizer_free(clrt_tokenizer *t) {
  if (!t) return;
  tok_strmap_free(&t->vocab);
  tok_pairmap_free(&t->merges);
  if (t->id_bytes)
    for (int32_t i = 0; i < t->n_ids; i++) free(t->id_bytes[i]);
  free(t->id_bytes); free(t->id_len); free(t->id_special);
  for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
  free(t->added);
  for (int i = 0; i < t->n_stages; i++) pcre2_code_free(t->stage[i]);
  free(t->trie);
  tok_ctx_free(t->ctx);
  for (int i = 0; i < t->n_pool; i++) tok_ctx_free(t->pool[i]);
  free(t->pool);
  free(t->out); free(t->dec);
  tok_pipeline_free(t);
  free(t);
}

static int ensure_ids(clrt_tokenizer *t, int32_t id) {
  if (id < t->n_ids) return 0;
  int32_t nc = t->n_ids ? t->n_ids : 1024;
  while (nc <= id) nc *= 2;
  char **b = realloc(t->id_bytes, (size_t)nc * sizeof *b);
  if (b) t->id_bytes = b;
  uint32_t *l = realloc(t->id_len, (size_t)nc * sizeof *l);
  if (l) t->id_len = l;
  uint8_t *s = realloc(t->id_special, (size_t)nc);
  if (s) t->id_special = s;
  if (!b || !l || !s) { clrt_set_error("tokenizer: out of memory for id %d", id); return -1; }
  if (!t->byte_level) {
    char **tx = realloc(t->id_text, (size_t)nc * sizeof *tx);
    if (tx) t->id_text = tx;
    uint32_t *tl = realloc(t->id_text_len, (size_t)nc * sizeof *tl);
    if (tl) t->id_text_len = tl;
    if (!tx || !tl) { clrt_set_error("tokenizer: out of memory for id %d", id); return -1; }
    for (int32_t i = t->n_ids; i < nc; i++) { tx[i] = NULL; tl[i] = 0; }
  }
  for (int32_t i = t->n_ids; i < nc; i++) { b[i] = NULL; l[i] = 0; s[i] = 0; }
  t->n_ids = nc;
  return 0;
}

/* Byte-level form (every byte spelled as one code point) -> raw bytes. -1 if a character is
   outside the alphabet. out needs len bytes. */
static int64_t from_byte_level(const char *s, size_t len, char *out) {
  size_t i = 0, o = 0;
  while (i < len) {
    uint32_t cp;
    int k = tok_utf8_decode((const unsigned char *)s + i, len - i, &cp);
    int b = k ? tok_cp_to_byte(cp) : -1;
    if (b < 0) return -1;
    out[o++] = (char)b;
    i += (size_t)k;
  }
  return (int64_t)o;
}

static int set_id_bytes(clrt_tokenizer *t, int32_t id, const char *raw, size_t n) {
  char *p = malloc(n + 1);
  if (!p) { clrt_set_error("tokenizer: out of memory"); return -1; }
  memcpy(p, raw, n);
  p[n] = 0;
  free(t->id_bytes[id]);
  t->id_bytes[id] = p;
  t->id_len[id] = (uint32_t)n;
  return 0;
}

static int set_id_text(clrt_tokenizer *t, int32_t id, const char *s, size_t n) {
  char *p = malloc(n + 1);
  if (!p) { clrt_set_error("tokenizer: out of memory"); return -1; }
  memcpy(p, s, n);
  p[n] = 0;
  free(t->id_text[id]);
  t->id_text[id] = p;
  t->id_text_len[id] = (uint32_t)n;
  return 0;
}

/* A SentencePiece-style token is its own text; one-character tokens and <0xNN> byte tokens
   are also indexed for building a piece's first symbols. */
static int add_text_vocab(clrt_tokenizer *t, const char *token, size_t len, int32_t id) {
  uint32_t cp;
  for (size_t i = 0; i < len;) {
    int k = tok_utf8_decode((const unsigned char *)token + i, len - i, &cp);
    if (!k) { clrt_set_error("tokenizer: vocab token %d is not valid UTF-8", id); return -1; }
    i += (size_t)k;
  }
  if (len == 0) { clrt_set_error("tokenizer: vocab has an empty token (id %d)", id); return -1; }
  if (ensure_ids(t, id) || set_id_bytes(t, id, token, len) || set_id_text(t, id, token, len)) return -1;
  if (tok_strmap_put(&t->vocab, token, len, id)) { clrt_set_error("tokenizer: out of memory"); return -1; }
  if (tok_utf8_decode((const unsigned char *)token, len, &cp) == (int)len && cp < 65536) t->char_id[cp] = id;
  /* byte fallback looks up <0xNN> with upper-case hex, as Hugging Face spells it */
  if (len == 6 && memcmp(token, "<0x", 3) == 0 && token[5] == '>') {
    const char *hex = "0123456789ABCDEF";
    const char *hi = memchr(hex, token[3], 16), *lo = memchr(hex, token[4], 16);
    if (hi && lo && token[3] && token[4]) t->fallback_id[(hi - hex) * 16 + (lo - hex)] = id;
  }
  return 0;
}

int clrt_tokenizer_add_vocab(clrt_tokenizer *t, const char *token, size_t len, int32_t id) {
  if (id < 0) { clrt_set_error("tokenizer: vocab token %.*s has negative id %d", (int)len, token, id); return -1; }
  if (!t->byte_level) return add_text_vocab(t, token, len, id);
  char stackbuf[256], *raw = len <= sizeof stackbuf ? stackbuf : malloc(len);
  if (!raw) { clrt_set_error("tokenizer: out of memory"); return -1; }
  int64_t n = from_byte_level(token, len, raw);
  int rc = -1;
  if (n < 0) {
    /* A token outside the alphabet (DeepSeek V3 keeps its special tokens in the vocab) is
       its own text: BPE over bytes never builds it, an added token with that text names it. */
    if (ensure_ids(t, id) == 0 && set_id_bytes(t, id, token, len) == 0) {
      if (tok_strmap_put(&t->vocab, token, len, id)) clrt_set_error("tokenizer: out of memory");
      else rc = 0;
    }
  } else if (n == 0) {
    clrt_set_error("tokenizer: vocab has an empty token (id %d)", id);
  } else if (ensure_ids(t, id) == 0 && set_id_bytes(t, id, raw, (size_t)n) == 0) {
    if (tok_strmap_put(&t->vocab, raw, (size_t)n, id)) clrt_set_error("tokenizer: out of memory");
    else {
      if (n == 1) t->byte_id[(unsigned char)raw[0]] = id;
      rc = 0;
    }
  }
  if (raw != stackbuf) free(raw);
  return rc;
}

/* A vocab token as tokenizer.json spells it -> id (byte-level spelling for a byte-level model,
   where a token outside the alphabet is its own text). */
static int lookup_byte_level(const clrt_tokenizer *t, const char *s, size_t len, int32_t *id) {
  if (!t->byte_level) return tok_strmap_get(&t->vocab, s, len, id);
  char stackbuf[256], *raw = len <= sizeof stackbuf ? stackbuf : malloc(len);
  if (!raw) return 0;
  int64_t n = from_byte_level(s, len, raw);
  int ok = n > 0 ? tok_strmap_get(&t->vocab, raw, (size_t)n, id) : n < 0 && tok_strmap_get(&t->vocab, s, len, id);
  if (raw != stackbuf) free(raw);
  return ok;
}

int clrt_tokenizer_add_merge(clrt_tokenizer *t, const char *left, size_t left_len, const char *right,
                             size_t right_len) {
  int32_t a, b, m;
  if (!lookup_byte_level(t, left, left_len, &a)) {
    clrt_set_error("tokenizer: merge %d names \"%.*s\", which is not in the vocab", t->n_merges, (int)left_len, left);
    return -1;
  }
  if (!lookup_byte_level(t, right, right_len, &b)) {
    clrt_set_error("tokenizer: merge %d names \"%.*s\", which is not in the vocab", t->n_merges, (int)right_len, right);
    return -1;
  }
  size_t la = t->id_len[a], lb = t->id_len[b];
  char *cat = malloc(la + lb);
  if (!cat) { clrt_set_error("tokenizer: out of memory"); return -1; }
  memcpy(cat, t->id_bytes[a], la);
  memcpy(cat + la, t->id_bytes[b], lb);
  int found = tok_strmap_get(&t->vocab, cat, la + lb, &m);
  free(cat);
  if (!found) {
    clrt_set_error("tokenizer: merge %d (\"%.*s\" \"%.*s\") makes a token that is not in the vocab", t->n_merges,
                   (int)left_len, left, (int)right_len, right);
    return -1;
  }
  int rc = tok_pairmap_put(&t->merges, a, b, t->n_merges, m);
  if (rc < 0) { clrt_set_error("tokenizer: out of memory"); return -1; }
  t->n_merges++;
  return 0;
}

int clrt_tokenizer_add_added(clrt_tokenizer *t, const char *content, size_t len, int32_t id, int special,
                             int lstrip, int rstrip, int normalized) {
  return clrt_tokenizer_add_added_word(t, content, len, id, special, lstrip, rstrip, normalized, 0);
}

int clrt_tokenizer_add_added_word(clrt_tokenizer *t, const char *content, size_t len, int32_t id, int special,
                                  int lstrip, int rstrip, int normalized, int single_word) {
  if (len == 0) { clrt_set_error("tokenizer: added token %d has empty content", id); return -1; }
  if (id < 0) { clrt_set_error("tokenizer: added token \"%.*s\" has negative id", (int)len, content); return -1; }
  uint32_t cp;
  for (size_t i = 0; i < len;) {
    int k = tok_utf8_decode((const unsigned char *)content + i, len - i, &cp);
    if (!k) { clrt_set_error("tokenizer: added token %d is not valid UTF-8", id); return -1; }
    i += (size_t)k;
  }
  if (t->n_added == t->added_cap) {
    int nc = t->added_cap ? t->added_cap * 2 : 64;
    tok_added *p = realloc(t->added, (size_t)nc * sizeof *p);
    if (!p) { clrt_set_error("tokenizer: out of memory"); return -1; }
    t->added = p;
    t->added_cap = nc;
  }
  tok_added *a = &t->added[t->n_added];
  a->content = malloc(len + 1);
  if (!a->content || ensure_ids(t, id)) { free(a->content); clrt_set_error("tokenizer: out of memory"); return -1; }
  memcpy(a->content, content, len);
  a->content[len] = 0;
  a->len = len; a->id = id; a->special = special; a->lstrip = lstrip; a->rstrip = rstrip;
  a->normalized = normalized; a->single_word = single_word;
  t->n_added++;
  t->added_first[(unsigned char)content[0]] = 1;
  t->id_special[id] = special ? 2 : 1;
  if (!t->byte_level) return set_id_bytes(t, id, content, len) || set_id_text(t, id, content, len) ? -1 : 0;
  /* Decoding spells an added token through the byte-level decoder like Hugging Face does:
     its characters map back to bytes when all are in the alphabet, else its text stays. */
  char *raw = malloc(len);
  if (!raw) { clrt_set_error("tokenizer: out of memory"); return -1; }
  int64_t n = from_byte_level(content, len, raw);
  int rc = n > 0 ? set_id_bytes(t, id, raw, (size_t)n) : set_id_bytes(t, id, content, len);
  free(raw);
  return rc;
}

int clrt_tokenizer_add_split(clrt_tokenizer *t, const char *regex, size_t len) {
  return clrt_tokenizer_add_split_behavior(t, regex, len, TOK_ISOLATED);
}

int clrt_tokenizer_add_split_behavior(clrt_tokenizer *t, const char *regex, size_t len, int behavior) {
  if (behavior < TOK_ISOLATED || behavior > TOK_MERGED_NEXT) {
    clrt_set_error("tokenizer: unknown Split behavior %d", behavior);
    return -1;
  }
  if (t->n_stages == TOK_MAX_STAGES) { clrt_set_error("tokenizer: more than %d pre-tokenizer stages", TOK_MAX_STAGES); return -1; }
  char what[64];
  snprintf(what, sizeof what, "tokenizer: pre-tokenizer %d", t->n_stages);
  pcre2_code *re = tok_compile_regex(regex, len, what);
  if (!re) return -1;
  size_t jit_size = 0;
  t->jit[t->n_stages] = pcre2_pattern_info(re, PCRE2_INFO_JITSIZE, &jit_size) == 0 && jit_size > 0;
  t->behavior[t->n_stages] = behavior;
  t->stage[t->n_stages++] = re;
  return 0;
}

/* nfc: an NFC normalizer step (for callers that predate clrt_tokenizer_add_normalizer). */
int clrt_tokenizer_set_flags(clrt_tokenizer *t, int nfc, int ignore_merges, int add_prefix_space) {
  if (nfc && !t->nfc && clrt_tokenizer_add_normalizer(t, "nfc", NULL, 0, NULL, 0, 0, 0)) return -1;
  t->nfc = nfc; t->ignore_merges = ignore_merges; t->add_prefix_space = add_prefix_space;
  return 0;
}

int clrt_tokenizer_set_template(clrt_tokenizer *t, const int32_t *prefix, int n_prefix, const int32_t *suffix,
                                int n_suffix) {
  if (n_prefix < 0 || n_prefix > 8 || n_suffix < 0 || n_suffix > 8) {
    clrt_set_error("tokenizer: post-processor template adds %d + %d tokens (at most 8 each)", n_prefix, n_suffix);
    return -1;
  }
  for (int i = 0; i < n_prefix; i++) t->prefix[i] = prefix[i];
  for (int i = 0; i < n_suffix; i++) t->suffix[i] = suffix[i];
  t->n_prefix = n_prefix; t->n_suffix = n_suffix;
  return 0;
}

/* A byte trie over the added tokens' contents (later duplicates win, like a map). */
static int build_trie(clrt_tokenizer *t) {
  size_t cap = 1;
  for (int i = 0; i < t->n_added; i++) cap += t->added[i].len;
  free(t->trie);
  t->trie = malloc(cap * sizeof *t->trie);
  if (!t->trie) { clrt_set_error("tokenizer: out of memory"); return -1; }
  t->trie[0] = (tok_trie_node){ -1, -1, -1, 0 };
  t->n_trie = 1;
  for (int i = 0; i < t->n_added; i++) {
    int32_t node = 0;
    for (size_t j = 0; j < t->added[i].len; j++) {
      uint8_t b = (uint8_t)t->added[i].content[j];
      int32_t c = t->trie[node].child;
      while (c >= 0 && t->trie[c].byte != b) c = t->trie[c].sibling;
      if (c < 0) {
        c = t->n_trie++;
        t->trie[c] = (tok_trie_node){ -1, t->trie[node].child, -1, b };
        t->trie[node].child = c;
      }
      node = c;
    }
    t->trie[node].token = i;
  }
  return 0;
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* Cutting a SentencePiece-style piece before a ▁ that follows character c gives the same BPE
   result as the whole piece unless a merge could join across the cut, i.e. unless some
   token holds c directly followed by ▁ (▁ itself is never cut from a preceding ▁: runs stay
   whole). Collect those c. */
static int find_sp_joins(clrt_tokenizer *t) {
  size_t cap = 16, n = 0;
  uint32_t *set = malloc(cap * sizeof *set);
  if (!set) { clrt_set_error("tokenizer: out of memory"); return -1; }
  for (int32_t id = 0; id < t->n_ids; id++) {
    const unsigned char *s = (const unsigned char *)t->id_text[id];
    if (!s || t->id_special[id]) continue;
    size_t len = t->id_text_len[id];
    uint32_t prev = 0, cp;
    for (size_t i = 0; i < len;) {
      int k = tok_utf8_decode(s + i, len - i, &cp);
      if (!k) break;
      if (cp == 0x2581 && i > 0 && prev != 0x2581) {
        if (n == cap) {
          uint32_t *p = realloc(set, (cap *= 2) * sizeof *set);
          if (!p) { free(set); clrt_set_error("tokenizer: out of memory"); return -1; }
          set = p;
        }
        set[n++] = prev;
      }
      prev = cp;
      i += (size_t)k;
    }
  }
  qsort(set, n, sizeof *set, cmp_u32);
  size_t u = 0;
  for (size_t i = 0; i < n; i++)
    if (u == 0 || set[u - 1] != set[i]) set[u++] = set[i];
  free(t->sp_join);
  t->sp_join = set;
  t->n_sp_join = (int)u;
  t->sp_split = !t->ignore_merges && !t->meta_split;
  return 0;
}

/* What each token contributes to decoded text: the decoder's per-token steps over its text. */
static int finish_text_model(clrt_tokenizer *t) {
  if (!t->n_dec) { clrt_set_error("tokenizer: a SentencePiece-style tokenizer needs a decoder"); return -1; }
  if (t->dec_byte_level) { clrt_set_error("tokenizer: a ByteLevel decoder does not fit a SentencePiece-style model"); return -1; }
  if (t->unk_id >= 0 && (t->unk_id >= t->n_ids || !t->id_bytes[t->unk_id])) {
    clrt_set_error("tokenizer: the unk token (id %d) is not in the vocab", t->unk_id);
    return -1;
  }
  for (int32_t id = 0; id < t->n_ids; id++) {
    if (!t->id_text[id]) continue;
    size_t m;
    char *d = tok_decode_token(t, t->id_text[id], t->id_text_len[id], &m);
    if (!d) { clrt_set_error("tokenizer: out of memory"); return -1; }
    free(t->id_bytes[id]);
    t->id_bytes[id] = d;
    t->id_len[id] = (uint32_t)m;
  }
  return find_sp_joins(t);
}

int clrt_tokenizer_finish(clrt_tokenizer *t) {
  if (t->byte_level) {
    for (int b = 0; b < 256; b++)
      if (t->byte_id[b] < 0) {
        clrt_set_error("tokenizer: the vocab has no token for byte 0x%02x; a byte-level BPE needs all 256", b);
        return -1;
      }
    if (t->n_dec_replace || t->dec_byte_fallback || t->strip_start || t->strip_stop) {
      clrt_set_error("tokenizer: Replace/ByteFallback/Strip decoders do not fit a byte-level model");
      return -1;
    }
    if (t->meta_len) { clrt_set_error("tokenizer: a Metaspace pre-tokenizer does not fit a byte-level model"); return -1; }
  } else if (finish_text_model(t)) {
    return -1;
  }
  for (int i = 0; i < t->n_prefix; i++)
    if (t->prefix[i] < 0 || t->prefix[i] >= t->n_ids || !t->id_bytes[t->prefix[i]]) {
      clrt_set_error("tokenizer: post-processor adds unknown id %d", t->prefix[i]);
      return -1;
    }
  for (int i = 0; i < t->n_suffix; i++)
    if (t->suffix[i] < 0 || t->suffix[i] >= t->n_ids || !t->id_bytes[t->suffix[i]]) {
      clrt_set_error("tokenizer: post-processor adds unknown id %d", t->suffix[i]);
      return -1;
    }
  if (build_trie(t)) return -1;
  if (!t->ctx && !(t->ctx = tok_ctx_new(t))) return -1;
  t->finished = 1;
  return 0;
}

static int check_finished(const clrt_tokenizer *t) {
  if (!t || !t->finished) { clrt_set_error("tokenizer: not built (call clrt_tokenizer_finish)"); return -1; }
  return 0;
}

const int32_t *clrt_tokenizer_encode(clrt_tokenizer *t, const char *text, size_t len, int add_special, int64_t *n) {
  if (check_finished(t)) return NULL;
  size_t k = 0;
  if (tok_encode(t, t->ctx, text, len, add_special, &t->out, &k, &t->out_cap)) return NULL;
  if (!t->out && !(t->out = malloc(sizeof *t->out * (t->out_cap = 16)))) {
    clrt_set_error("tokenizer: out of memory");
    return NULL;
  }
  *n = (int64_t)k;
  return t->out;
}

/* Texts are spread over the OpenMP threads; each thread has its own context (regex match
   data, piece cache). offsets[i]..offsets[i+1] are text i's ids in the result. */
int32_t *clrt_tokenizer_encode_batch(clrt_tokenizer *t, const char *const *texts, const size_t *lens,
                                     int64_t n, int add_special, int64_t *offsets) {
  if (check_finished(t)) return NULL;
  /* per-thread contexts persist across calls so their piece caches stay warm */
  int want = omp_get_max_threads();
  if (want > t->n_pool) {
    tok_ctx **p = realloc(t->pool, (size_t)want * sizeof *p);
    if (!p) { clrt_set_error("tokenizer: out of memory"); return NULL; }
    for (int i = t->n_pool; i < want; i++) p[i] = NULL;
    t->pool = p;
    t->n_pool = want;
  }
  /* Each thread appends its texts' ids to its own buffer; start[i]/owner[i] say where text i
     landed, and one pass at the end lays them out in order. */
  int nthreads = omp_get_max_threads();
  int32_t **bufs = calloc((size_t)nthreads, sizeof *bufs);
  size_t *used = calloc((size_t)nthreads, sizeof *used), *caps = calloc((size_t)nthreads, sizeof *caps);
  size_t *start = malloc(((size_t)n + 1) * sizeof *start), *count = malloc(((size_t)n + 1) * sizeof *count);
  int *owner = malloc(((size_t)n + 1) * sizeof *owner);
  int failed = 0;
  char err[512] = {0};
  if (!bufs || !used || !caps || !start || !count || !owner) {
    free(bufs); free(used); free(caps); free(start); free(count); free(owner);
    clrt_set_error("tokenizer: out of memory");
    return NULL;
  }
#pragma omp parallel num_threads(nthreads)
  {
    int me = omp_get_thread_num();
    tok_ctx *c = t->pool[me] ? t->pool[me] : (t->pool[me] = tok_ctx_new(t));
    if (!c) {
#pragma omp critical(clrt_tok_err)
      { if (!failed) snprintf(err, sizeof err, "%s", clrt_last_error()); failed = 1; }
    }
#pragma omp for schedule(dynamic, 64)
    for (int64_t i = 0; i < n; i++) {
      if (!c || failed) continue;
      size_t before = used[me];
      if (tok_encode(t, c, texts[i], lens[i], add_special, &bufs[me], &used[me], &caps[me])) {
#pragma omp critical(clrt_tok_err)
        { if (!failed) snprintf(err, sizeof err, "text %lld: %s", (long long)i + 1, clrt_last_error()); failed = 1; }
        continue;
      }
      start[i] = before;
      count[i] = used[me] - before;
      owner[i] = me;
    }
  }
  int32_t *flat = NULL;
  if (!failed) {
    size_t total = 0;
    for (int i = 0; i < nthreads; i++) total += used[i];
    flat = malloc((total ? total : 1) * sizeof *flat);
    if (!flat) { failed = 1; snprintf(err, sizeof err, "tokenizer: out of memory for %zu ids", total); }
    else {
      size_t o = 0;
      for (int64_t i = 0; i < n; i++) {
        offsets[i] = (int64_t)o;
        if (count[i]) memcpy(flat + o, bufs[owner[i]] + start[i], count[i] * sizeof *flat);
        o += count[i];
      }
      offsets[n] = (int64_t)o;
    }
  }
  for (int i = 0; i < nthreads; i++) free(bufs[i]);
  free(bufs); free(used); free(caps); free(start); free(count); free(owner);
  if (failed) clrt_set_error("%s", err);
  return flat;
}

void clrt_tokenizer_free_ids(int32_t *ids) { free(ids); }

const char *clrt_tokenizer_decode(clrt_tokenizer *t, const int32_t *ids, int64_t n, int skip_special, size_t *len) {
  if (check_finished(t)) return NULL;
  size_t o = 0;
  for (int64_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    if (id < 0 || id >= t->n_ids || !t->id_bytes[id]) {
      clrt_set_error("tokenizer: decode: id %d at position %lld is not in the vocabulary (size %d)", id,
                     (long long)i, clrt_tokenizer_vocab_size(t));
      return NULL;
    }
    if (skip_special && t->id_special[id] == 2) continue;
    size_t k = t->id_len[id];
    if (o + k + 1 > t->dec_cap) {
      size_t nc = t->dec_cap ? t->dec_cap * 2 : 1024;
      while (nc < o + k + 1) nc *= 2;
      char *p = realloc(t->dec, nc);
      if (!p) { clrt_set_error("tokenizer: out of memory"); return NULL; }
      t->dec = p; t->dec_cap = nc;
    }
    memcpy(t->dec + o, t->id_bytes[id], k);
    o += k;
  }
  if (!t->dec && !(t->dec = malloc(t->dec_cap = 16))) { clrt_set_error("tokenizer: out of memory"); return NULL; }
  /* the decoder's Strip, after Fuse: on the whole text */
  size_t from = 0;
  for (int i = 0; i < t->strip_start && from < o && t->dec[from] == t->strip_char; i++) from++;
  for (int i = 0; i < t->strip_stop && o > from && t->dec[o - 1] == t->strip_char; i++) o--;
  if (from) memmove(t->dec, t->dec + from, o - from);
  o -= from;
  t->dec[o] = 0;
  *len = o;
  return t->dec;
}

const char *clrt_tokenizer_token_bytes(const clrt_tokenizer *t, int32_t id, size_t *len) {
  if (!t || id < 0 || id >= t->n_ids || !t->id_bytes[id]) {
    clrt_set_error("tokenizer: id %d is not in the vocabulary", id);
    return NULL;
  }
  *len = t->id_len[id];
  return t->id_bytes[id];
}

const char *clrt_tokenizer_token_text(const clrt_tokenizer *t, int32_t id, size_t *len) {
  if (!t || t->byte_level || id < 0 || id >= t->n_ids || !t->id_text[id]) return NULL;
  *len = t->id_text_len[id];
  return t->id_text[id];
}

int32_t clrt_tokenizer_vocab_size(const clrt_tokenizer *t) {
  int32_t n = 0;
  for (int32_t i = 0; i < t->n_ids; i++)
    if (t->id_bytes[i]) n = i + 1;
  return n;
}

int clrt_tokenizer_is_added(const clrt_tokenizer *t, int32_t id) {
  if (id < 0 || id >= t->n_ids) return 0;
  return t->id_special[id];
}

/* An added token's content, or a vocab token spelled in byte-level form. -1 if neither. */
int32_t clrt_tokenizer_id(const clrt_tokenizer *t, const char *token, size_t len) {
  for (int i = 0; i < t->n_added; i++)
    if (t->added[i].len == len && memcmp(t->added[i].content, token, len) == 0) return t->added[i].id;
  int32_t id;
  return lookup_byte_level(t, token, len, &id) ? id : -1;
}

/* The longest prefix of s that does not end inside a UTF-8 character that may still be
   completed by more bytes (invalid bytes count as complete: they decode to U+FFFD). */
size_t clrt_utf8_complete_prefix(const char *s, size_t n) {
  for (size_t back = 1; back <= 4 && back <= n; back++) {
    unsigned char c = (unsigned char)s[n - back];
    if ((c & 0xC0) == 0x80) continue;           /* continuation byte: keep looking for the lead */
    size_t need = c >= 0xF0 && c < 0xF5 ? 4 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 1;
    return back < need ? n - back : n;
  }
  return n;
}

/* Replace invalid UTF-8 with U+FFFD, one per maximal invalid subpart (as Rust's
   from_utf8_lossy and WHATWG's TextDecoder do). out needs 3*n bytes. */
size_t clrt_utf8_lossy(const char *in, size_t n, char *out) {
  const unsigned char *s = (const unsigned char *)in;
  size_t i = 0, o = 0;
  while (i < n) {
    uint32_t cp;
    int k = tok_utf8_decode(s + i, n - i, &cp);
    if (k) { memcpy(out + o, s + i, (size_t)k); o += (size_t)k; i += (size_t)k; continue; }
    /* length of the maximal subpart: a valid lead followed by the valid continuations it allows */
    unsigned c = s[i];
    size_t len = 1;
    unsigned lo = 0x80, hi = 0xBF, need = 0;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) { need = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    for (unsigned j = 0; j < need && i + len < n; j++) {
      unsigned d = s[i + len];
      if (d < lo || d > hi) break;
      len++;
      lo = 0x80; hi = 0xBF;
    }
    out[o++] = (char)0xEF; out[o++] = (char)0xBF; out[o++] = (char)0xBD;
    i += len;
  }
  return o;
}
