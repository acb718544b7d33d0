/* bpe_train.c — learn byte-level BPE merges from text: count distinct pieces (after NFC and
   the split regex), then repeatedly merge the most frequent adjacent pair, updating only the words that
   contain it (an index from pair to words) and a max-heap with lazy deletion. */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

typedef struct { int32_t *sym; int32_t n; int64_t count; int32_t seen; } word;
typedef struct { int32_t a, b; int64_t count; int32_t *words; int32_t nw, cw; int64_t dirty; } pair_stat;
typedef struct { int64_t count; int32_t a, b; } hitem;

typedef struct {
  word *w; int64_t nw, cw;
  pair_stat *p; int64_t np, cp;
  tok_pairmap index;          /* (a, b) -> pair_stat index in .merged */
  hitem *h; int64_t nh, ch;
  char **tok; uint32_t *tlen; int32_t ntok, ctok;
  tok_strmap tokmap;          /* token bytes -> id */
  int64_t *dirty; int64_t ndirty, cdirty;   /* pairs whose count changed in this step */
  int64_t stamp;
  int oom;
} trainer;

static int hbetter(hitem x, hitem y) {   /* x before y: more frequent, then smaller ids */
  if (x.count != y.count) return x.count > y.count;
  if (x.a != y.a) return x.a < y.a;
  return x.b < y.b;
}

static void hpush(trainer *T, hitem it) {
  if (T->nh == T->ch) {
    int64_t nc = T->ch ? T->ch * 2 : 4096;
    hitem *p = realloc(T->h, (size_t)nc * sizeof *p);
    if (!p) { T->oom = 1; return; }
    T->h = p; T->ch = nc;
  }
  int64_t i = T->nh++;
  while (i > 0) {
    int64_t q = (i - 1) / 2;
    if (!hbetter(it, T->h[q])) break;
    T->h[i] = T->h[q];
    i = q;
  }
  T->h[i] = it;
}

static hitem hpop(trainer *T) {
  hitem top = T->h[0], last = T->h[--T->nh];
  int64_t i = 0;
  for (;;) {
    int64_t l = 2 * i + 1, r = l + 1, m = -1;
    hitem best = last;
    if (l < T->nh && hbetter(T->h[l], best)) { m = l; best = T->h[l]; }
    if (r < T->nh && hbetter(T->h[r], best)) m = r;
    if (m < 0) break;
    T->h[i] = T->h[m];
    i = m;
  }
  if (T->nh) T->h[i] = last;
  return top;
}

static pair_stat *get_pair(trainer *T, int32_t a, int32_t b, int create) {
  int32_t rank, idx;
  if (tok_pairmap_get(&T->index, a, b, &rank, &idx)) return &T->p[idx];
  if (!create) return NULL;
  if (T->np == T->cp) {
    int64_t nc = T->cp ? T->cp * 2 : 4096;
    pair_stat *p = realloc(T->p, (size_t)nc * sizeof *p);
    if (!p) { T->oom = 1; return NULL; }
    T->p = p; T->cp = nc;
  }
  pair_stat *s = &T->p[T->np];
  memset(s, 0, sizeof *s);
  s->a = a; s->b = b;
  if (tok_pairmap_put(&T->index, a, b, 0, (int32_t)T->np) < 0) { T->oom = 1; return NULL; }
  T->np++;
  return s;
}

/* Add (sign=+1) or remove (sign=-1) the adjacent pairs of word wi. */
static void count_pairs(trainer *T, int32_t wi, int sign, int record) {
  word *w = &T->w[wi];
  for (int32_t i = 0; i + 1 < w->n; i++) {
    pair_stat *s = get_pair(T, w->sym[i], w->sym[i + 1], sign > 0);
    if (!s) continue;
    s->count += sign * w->count;
    if (sign > 0) {
      if (record && (s->nw == 0 || s->words[s->nw - 1] != wi)) {
        if (s->nw == s->cw) {
          int32_t nc = s->cw ? s->cw * 2 : 4;
          int32_t *p = realloc(s->words, (size_t)nc * sizeof *p);
          if (!p) { T->oom = 1; return; }
          s->words = p; s->cw = nc;
        }
        s->words[s->nw++] = wi;
      }
    }
    /* a changed pair re-enters the heap once per step (flush_dirty); older entries go stale */
    if (s->dirty != T->stamp) {
      s->dirty = T->stamp;
      if (T->ndirty == T->cdirty) {
        int64_t nc = T->cdirty ? T->cdirty * 2 : 4096;
        int64_t *p = realloc(T->dirty, (size_t)nc * sizeof *p);
        if (!p) { T->oom = 1; return; }
        T->dirty = p; T->cdirty = nc;
      }
      T->dirty[T->ndirty++] = s - T->p;
    }
  }
}

static void flush_dirty(trainer *T) {
  for (int64_t i = 0; i < T->ndirty; i++) {
    pair_stat *s = &T->p[T->dirty[i]];
    if (s->count > 0) {
      hitem it = { s->count, s->a, s->b };
      hpush(T, it);
    }
  }
  T->ndirty = 0;
  T->stamp++;
}

static int add_token(trainer *T, const char *bytes, uint32_t len) {
  if (T->ntok == T->ctok) {
    int32_t nc = T->ctok ? T->ctok * 2 : 1024;
    char **p = realloc(T->tok, (size_t)nc * sizeof *p);
    if (p) T->tok = p;
    uint32_t *l = realloc(T->tlen, (size_t)nc * sizeof *l);
    if (l) T->tlen = l;
    if (!p || !l) return -1;
    T->ctok = nc;
  }
  char *c = malloc(len ? len : 1);
  if (!c) return -1;
  memcpy(c, bytes, len);
  T->tok[T->ntok] = c; T->tlen[T->ntok] = len;
  if (tok_strmap_put(&T->tokmap, bytes, len, T->ntok)) return -1;
  return T->ntok++;
}

static void trainer_free(trainer *T) {
  for (int64_t i = 0; i < T->nw; i++) free(T->w[i].sym);
  free(T->w);
  for (int64_t i = 0; i < T->np; i++) free(T->p[i].words);
  free(T->p);
  tok_pairmap_free(&T->index);
  free(T->h);
  free(T->dirty);
  for (int32_t i = 0; i < T->ntok; i++) free(T->tok[i]);
  free(T->tok); free(T->tlen);
  tok_strmap_free(&T->tokmap);
}

static int add_word(trainer *T, tok_strmap *seen, const unsigned char *s, size_t a, size_t b) {
  if (b <= a) return 0;
  int32_t wi;
  if (tok_strmap_get(seen, (const char *)s + a, b - a, &wi)) { T->w[wi].count++; return 0; }
  if (T->nw == T->cw) {
    int64_t nc = T->cw ? T->cw * 2 : 4096;
    word *p = realloc(T->w, (size_t)nc * sizeof *p);
    if (!p) return -1;
    T->w = p; T->cw = nc;
  }
  word *w = &T->w[T->nw];
  w->sym = malloc((b - a) * sizeof *w->sym);
  if (!w->sym) return -1;
  for (size_t j = a; j < b; j++) w->sym[j - a] = s[j];
  w->n = (int32_t)(b - a); w->count = 1; w->seen = -1;
  T->nw++;
  return tok_strmap_put(seen, (const char *)s + a, b - a, (int32_t)(T->nw - 1));
}

/* Cut every text into pieces (matches and the gaps between them, as a Split pre-tokenizer
   with behavior Isolated does) and count each distinct piece once, as a word. */
static int collect_words(trainer *T, const char *const *texts, const size_t *lens, int64_t n, pcre2_code *re) {
  tok_strmap seen = {0};
  pcre2_match_data *md = pcre2_match_data_create(4, NULL);
  if (!md) { clrt_set_error("train tokenizer: out of memory"); return -1; }
  int rc = 0;
  for (int64_t t = 0; t < n && !rc; t++) {
    const unsigned char *s = (const unsigned char *)texts[t];
    size_t len = lens[t];
    for (size_t i = 0; i < len;) {
      uint32_t cp;
      int k = tok_utf8_decode(s + i, len - i, &cp);
      if (!k) {
        clrt_set_error("train tokenizer: text %lld is not valid UTF-8 at byte %zu", (long long)t + 1, i);
        rc = -1;
        break;
      }
      i += (size_t)k;
    }
    if (rc) break;
    /* the tokenizer it makes normalizes to NFC before splitting, so train on NFC text */
    utf8proc_uint8_t *nfc = NULL;
    for (size_t i = 0; i < len; i++)
      if (s[i] >= 0xCC) {
        utf8proc_ssize_t m = utf8proc_map(s, (utf8proc_ssize_t)len, &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (m < 0) {
          clrt_set_error("train tokenizer: NFC of text %lld failed: %s", (long long)t + 1, utf8proc_errmsg(m));
          rc = -1;
        } else {
          s = nfc;
          len = (size_t)m;
        }
        break;
      }
    size_t from = 0, pos = 0;
    while (!rc) {
      int m = from < len ? pcre2_match(re, s, len, from, PCRE2_NO_UTF_CHECK, md, NULL) : PCRE2_ERROR_NOMATCH;
      size_t ms = len, me = len;
      if (m >= 0) {
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        ms = ov[0]; me = ov[1];
        if (me == ms) {            /* empty match: no piece; step one character */
          from = ms + 1;
          while (from < len && (s[from] & 0xC0) == 0x80) from++;
          continue;
        }
      } else if (m != PCRE2_ERROR_NOMATCH) {
        clrt_set_error("train tokenizer: split regex failed on text %lld (PCRE2 error %d)", (long long)t + 1, m);
        rc = -1;
        break;
      }
      if (add_word(T, &seen, s, pos, ms) || add_word(T, &seen, s, ms, me)) {
        clrt_set_error("train tokenizer: out of memory");
        rc = -1;
      }
      if (m < 0) break;
      pos = from = me;
    }
    free(nfc);
  }
  pcre2_match_data_free(md);
  tok_strmap_free(&seen);
  return rc;
}

int64_t clrt_bpe_train(const char *const *texts, const size_t *lens, int64_t n, const char *split_regex,
                       size_t regex_len, int32_t vocab_size, int32_t min_frequency, int32_t **merges) {
  *merges = NULL;
  if (vocab_size < 256) {
    clrt_set_error("train tokenizer: vocab_size %d is below 256 (the byte alphabet)", vocab_size);
    return -1;
  }
  if (min_frequency < 1) min_frequency = 1;
  pcre2_code *re = tok_compile_regex(split_regex, regex_len, "train tokenizer: split regex");
  if (!re) return -1;
  trainer T;
  memset(&T, 0, sizeof T);
  int64_t nm = 0, cm = 0;
  int32_t *out = NULL;
  int rc = collect_words(&T, texts, lens, n, re);
  pcre2_code_free(re);
  for (int b = 0; !rc && b < 256; b++) {
    char c = (char)b;
    if (add_token(&T, &c, 1) < 0) { clrt_set_error("train tokenizer: out of memory"); rc = -1; }
  }
  T.stamp = 1;
  for (int64_t i = 0; !rc && i < T.nw; i++) count_pairs(&T, (int32_t)i, +1, 1);
  flush_dirty(&T);
  while (!rc && T.ntok < vocab_size && T.nh > 0) {
    if (T.oom) { clrt_set_error("train tokenizer: out of memory"); rc = -1; break; }
    if (clrt_interrupted()) { clrt_set_error("train tokenizer: interrupted"); rc = -1; break; }
    hitem it = hpop(&T);
    pair_stat *ps = get_pair(&T, it.a, it.b, 0);
    if (!ps || ps->count != it.count) continue;     /* stale entry */
    if (it.count < min_frequency) break;
    /* the token this merge makes (an existing one if another merge already spelled it) */
    int32_t a = it.a, b = it.b, m;
    uint32_t la = T.tlen[a], lb = T.tlen[b];
    char *cat = malloc(la + lb);
    if (!cat) { clrt_set_error("train tokenizer: out of memory"); rc = -1; break; }
    memcpy(cat, T.tok[a], la);
    memcpy(cat + la, T.tok[b], lb);
    if (!tok_strmap_get(&T.tokmap, cat, la + lb, &m)) m = add_token(&T, cat, la + lb);
    free(cat);
    if (m < 0) { clrt_set_error("train tokenizer: out of memory"); rc = -1; break; }
    if (nm == cm) {
      cm = cm ? cm * 2 : 1024;
      int32_t *p = realloc(out, (size_t)cm * 3 * sizeof *p);
      if (!p) { clrt_set_error("train tokenizer: out of memory"); rc = -1; break; }
      out = p;
    }
    out[3 * nm] = a; out[3 * nm + 1] = b; out[3 * nm + 2] = m;
    nm++;
    /* Rewrite each word holding the pair; its pair counts come out and go back in. The word
       list is copied because count_pairs may grow this pair's own list. */
    int32_t nw = ps->nw;
    int32_t *ws = malloc((size_t)(nw ? nw : 1) * sizeof *ws);
    if (!ws) { clrt_set_error("train tokenizer: out of memory"); rc = -1; break; }
    memcpy(ws, ps->words, (size_t)nw * sizeof *ws);
    ps->nw = 0;
    for (int32_t k = 0; k < nw; k++) {
      word *w = &T.w[ws[k]];
      if (w->seen == (int32_t)nm) continue;
      w->seen = (int32_t)nm;
      int has = 0;
      for (int32_t i = 0; i + 1 < w->n; i++)
        if (w->sym[i] == a && w->sym[i + 1] == b) { has = 1; break; }
      if (!has) continue;
      count_pairs(&T, ws[k], -1, 0);
      int32_t o = 0;
      for (int32_t i = 0; i < w->n; i++) {
        if (i + 1 < w->n && w->sym[i] == a && w->sym[i + 1] == b) { w->sym[o++] = m; i++; }
        else w->sym[o++] = w->sym[i];
      }
      w->n = o;
      count_pairs(&T, ws[k], +1, 1);
    }
    free(ws);
    flush_dirty(&T);
  }
  trainer_free(&T);
  if (rc) { free(out); return -1; }
  *merges = out ? out : malloc(sizeof *out);
  return nm;
}
