/* tokenizer_pipeline.c — the configurable steps around BPE that tokenizer.json describes:
   the model kind (byte-level or SentencePiece-style), normalizers, the Metaspace
   pre-tokenizer and the decoder steps; applying normalizers to a section of text and the
   decoder's per-token steps to a token. */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static char *dup_bytes(const char *s, size_t n) {
  char *p = malloc(n + 1);
  if (p) { if (n) memcpy(p, s, n); p[n] = 0; }
  return p;
}

static int check_utf8(const char *s, size_t n, const char *what) {
  uint32_t cp;
  for (size_t i = 0; i < n;) {
    int k = tok_utf8_decode((const unsigned char *)s + i, n - i, &cp);
    if (!k) { clrt_set_error("tokenizer: %s is not valid UTF-8", what); return -1; }
    i += (size_t)k;
  }
  return 0;
}

int clrt_tokenizer_set_model(clrt_tokenizer *t, int byte_level, int byte_fallback, int fuse_unk, int32_t unk_id) {
  if (t->vocab.n) { clrt_set_error("tokenizer: the model kind must be set before the vocab"); return -1; }
  t->byte_level = byte_level != 0;
  t->byte_fallback = byte_fallback != 0;
  t->fuse_unk = fuse_unk != 0;
  t->unk_id = unk_id;
  if (!t->byte_level && !t->char_id) {
    t->char_id = malloc(65536 * sizeof *t->char_id);
    if (!t->char_id) { clrt_set_error("tokenizer: out of memory"); return -1; }
    for (int i = 0; i < 65536; i++) t->char_id[i] = -1;
  }
  return 0;
}

int clrt_tokenizer_add_normalizer(clrt_tokenizer *t, const char *kind, const char *a, size_t a_len,
                                  const char *b, size_t b_len, int left, int right) {
  static const char *const names[] = { "nfc", "nfd", "nfkc", "nfkd", "prepend", "replace", "strip" };
  int k = -1;
  for (int i = 0; i < (int)(sizeof names / sizeof *names); i++)
    if (strcmp(kind, names[i]) == 0) k = i;
  if (k < 0) { clrt_set_error("tokenizer: unknown normalizer step \"%s\"", kind); return -1; }
  if (t->n_norm == TOK_MAX_NORM) { clrt_set_error("tokenizer: more than %d normalizer steps", TOK_MAX_NORM); return -1; }
  if ((k == TOK_NORM_PREPEND || k == TOK_NORM_REPLACE) && check_utf8(a, a_len, "a normalizer's text")) return -1;
  if (k == TOK_NORM_REPLACE && a_len == 0) { clrt_set_error("tokenizer: Replace normalizer with an empty pattern"); return -1; }
  if (k == TOK_NORM_REPLACE && check_utf8(b, b_len, "a Replace normalizer's content")) return -1;
  tok_norm *n = &t->norm[t->n_norm];
  memset(n, 0, sizeof *n);
  n->kind = k;
  n->left = left; n->right = right;
  if (k == TOK_NORM_PREPEND || k == TOK_NORM_REPLACE) {
    n->a = dup_bytes(a, a_len);
    n->b = dup_bytes(k == TOK_NORM_REPLACE ? b : "", k == TOK_NORM_REPLACE ? b_len : 0);
    if (!n->a || !n->b) { free(n->a); free(n->b); clrt_set_error("tokenizer: out of memory"); return -1; }
    n->a_len = a_len; n->b_len = k == TOK_NORM_REPLACE ? b_len : 0;
  }
  t->n_norm++;
  return 0;
}

int clrt_tokenizer_set_metaspace(clrt_tokenizer *t, const char *replacement, size_t len, int prepend_scheme,
                                 int split) {
  uint32_t cp;
  if (len == 0 || len >= sizeof t->meta_rep || tok_utf8_decode((const unsigned char *)replacement, len, &cp) != (int)len) {
    clrt_set_error("tokenizer: Metaspace replacement must be one character");
    return -1;
  }
  if (t->n_stages) { clrt_set_error("tokenizer: Metaspace must come before any Split pre-tokenizer"); return -1; }
  if (prepend_scheme < 0 || prepend_scheme > 2) { clrt_set_error("tokenizer: bad Metaspace prepend_scheme %d", prepend_scheme); return -1; }
  memcpy(t->meta_rep, replacement, len);
  t->meta_len = (int)len;
  t->meta_prepend = prepend_scheme;
  t->meta_split = split != 0;
  return 0;
}

int clrt_tokenizer_add_decoder(clrt_tokenizer *t, const char *kind, const char *a, size_t a_len,
                               const char *b, size_t b_len, int start, int stop) {
  int is_replace = strcmp(kind, "replace") == 0, is_meta = strcmp(kind, "metaspace") == 0;
  if (strcmp(kind, "byte_level") == 0) {
    if (t->n_dec) { clrt_set_error("tokenizer: a ByteLevel decoder must be the only decoder step"); return -1; }
    t->dec_byte_level = 1;
  } else if (t->dec_byte_level) {
    clrt_set_error("tokenizer: decoder step %s after a ByteLevel decoder is not supported", kind);
    return -1;
  } else if (is_replace || is_meta) {
    if (t->dec_byte_fallback || t->dec_fused) {
      clrt_set_error("tokenizer: a %s decoder after ByteFallback or Fuse is not supported", kind);
      return -1;
    }
    if (t->n_dec_replace == TOK_MAX_DEC_REPLACE) { clrt_set_error("tokenizer: more than %d Replace decoders", TOK_MAX_DEC_REPLACE); return -1; }
    if (a_len == 0 || check_utf8(a, a_len, "a Replace decoder's pattern")) {
      if (a_len == 0) clrt_set_error("tokenizer: %s decoder with an empty pattern", kind);
      return -1;
    }
    const char *to = is_meta ? " " : b;
    size_t to_len = is_meta ? 1 : b_len;
    if (check_utf8(to, to_len, "a Replace decoder's content")) return -1;
    int i = t->n_dec_replace;
    t->dec_from[i] = dup_bytes(a, a_len);
    t->dec_to[i] = dup_bytes(to, to_len);
    if (!t->dec_from[i] || !t->dec_to[i]) { clrt_set_error("tokenizer: out of memory"); return -1; }
    t->dec_from_len[i] = a_len; t->dec_to_len[i] = to_len;
    t->n_dec_replace++;
    if (is_meta && start) {      /* the first token's leading space goes: one space off the text */
      if (t->strip_start || t->strip_stop) { clrt_set_error("tokenizer: a Metaspace decoder together with Strip is not supported"); return -1; }
      t->strip_char = ' ';
      t->strip_start = 1;
    }
  } else if (strcmp(kind, "byte_fallback") == 0) {
    if (t->dec_fused) { clrt_set_error("tokenizer: a ByteFallback decoder after Fuse is not supported"); return -1; }
    t->dec_byte_fallback = 1;
  } else if (strcmp(kind, "fuse") == 0) {
    t->dec_fused = 1;
  } else if (strcmp(kind, "strip") == 0) {
    /* before Fuse it would act on every token; the files we know put it after */
    if (!t->dec_fused) { clrt_set_error("tokenizer: a Strip decoder before Fuse is not supported"); return -1; }
    if (a_len != 1 || (unsigned char)a[0] >= 0x80) { clrt_set_error("tokenizer: Strip decoder content must be one ASCII character"); return -1; }
    if (start < 0 || stop < 0 || t->strip_start || t->strip_stop) {
      clrt_set_error("tokenizer: bad or repeated Strip decoder (start %d, stop %d)", start, stop);
      return -1;
    }
    t->strip_char = a[0];
    t->strip_start = start;
    t->strip_stop = stop;
  } else {
    clrt_set_error("tokenizer: unknown decoder step \"%s\"", kind);
    return -1;
  }
  t->n_dec++;
  return 0;
}

int clrt_tokenizer_decode_strip(const clrt_tokenizer *t, char *ch, int *start, int *stop) {
  *ch = t->strip_char;
  *start = t->strip_start;
  *stop = t->strip_stop;
  return 0;
}

void tok_pipeline_free(clrt_tokenizer *t) {
  for (int i = 0; i < t->n_norm; i++) { free(t->norm[i].a); free(t->norm[i].b); }
  for (int i = 0; i < t->n_dec_replace; i++) { free(t->dec_from[i]); free(t->dec_to[i]); }
  if (t->id_text)
    for (int32_t i = 0; i < t->n_ids; i++) free(t->id_text[i]);
  free(t->id_text); free(t->id_text_len);
  free(t->char_id); free(t->sp_join);
}

/* ---- applying the steps ---- */

/* s with every (non-overlapping, leftmost) from replaced by to; malloc'd. */
static char *replace_all(const char *s, size_t n, const char *from, size_t fl, const char *to, size_t tl, size_t *out_len) {
  size_t hits = 0;
  for (size_t i = 0; i + fl <= n;) {
    if (memcmp(s + i, from, fl) == 0) { hits++; i += fl; } else i++;
  }
  size_t m = n - hits * fl + hits * tl;
  char *o = malloc(m + 1);
  if (!o) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n;) {
    if (i + fl <= n && memcmp(s + i, from, fl) == 0) { memcpy(o + k, to, tl); k += tl; i += fl; }
    else o[k++] = s[i++];
  }
  o[k] = 0;
  *out_len = k;
  return o;
}

static size_t strip_white(const char *s, size_t n, int left, int right, size_t *from) {
  const unsigned char *u = (const unsigned char *)s;
  size_t a = 0, b = n;
  uint32_t cp;
  int k;
  while (left && a < b && (k = tok_utf8_decode(u + a, b - a, &cp)) && tok_is_white_space(cp)) a += (size_t)k;
  while (right && b > a) {
    size_t c = b - 1;
    while (c > a && (u[c] & 0xC0) == 0x80) c--;
    if (!tok_utf8_decode(u + c, b - c, &cp) || !tok_is_white_space(cp)) break;
    b = c;
  }
  *from = a;
  return b - a;
}

char *tok_normalize(const clrt_tokenizer *t, const char *s, size_t n, size_t *out_len) {
  /* cur is the caller's text until a step changes it (NFC on ASCII text copies nothing) */
  char *cur = (char *)s;
  int owned = 0;
  for (int i = 0; i < t->n_norm; i++) {
    const tok_norm *st = &t->norm[i];
    char *next = NULL;
    size_t m = 0;
    switch (st->kind) {
    case TOK_NORM_NFC: case TOK_NORM_NFD: case TOK_NORM_NFKC: case TOK_NORM_NFKD: {
      /* ASCII is stable under every form; below U+0300 (lead byte < 0xCC) NFC changes nothing
         and cannot compose with what precedes it */
      int limit = st->kind == TOK_NORM_NFC ? 0xCC : 0x80, need = 0;
      for (size_t j = 0; j < n; j++)
        if ((unsigned char)cur[j] >= limit) { need = 1; break; }
      if (!need) continue;
      int flags = UTF8PROC_STABLE;
      flags |= st->kind == TOK_NORM_NFC || st->kind == TOK_NORM_NFKC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
      if (st->kind == TOK_NORM_NFKC || st->kind == TOK_NORM_NFKD) flags |= UTF8PROC_COMPAT;
      utf8proc_uint8_t *r = NULL;
      utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)cur, (utf8proc_ssize_t)n, &r, (utf8proc_option_t)flags);
      if (k < 0) {
        if (owned) free(cur);
        clrt_set_error("tokenizer: Unicode normalization failed: %s", utf8proc_errmsg(k));
        return NULL;
      }
      next = (char *)r;
      m = (size_t)k;
      break;
    }
    case TOK_NORM_PREPEND:
      if (n == 0) continue;                 /* Hugging Face prepends to non-empty text only */
      next = malloc(st->a_len + n + 1);
      if (next) {
        memcpy(next, st->a, st->a_len);
        memcpy(next + st->a_len, cur, n);
        m = st->a_len + n;
        next[m] = 0;
      }
      break;
    case TOK_NORM_REPLACE:
      next = replace_all(cur, n, st->a, st->a_len, st->b, st->b_len, &m);
      break;
    case TOK_NORM_STRIP: {
      size_t from;
      m = strip_white(cur, n, st->left, st->right, &from);
      next = dup_bytes(cur + from, m);
      break;
    }
    }
    if (!next) {
      if (owned) free(cur);
      clrt_set_error("tokenizer: out of memory normalizing %zu bytes", n);
      return NULL;
    }
    if (owned) free(cur);
    cur = next;
    owned = 1;
    n = m;
  }
  *out_len = n;
  return cur;
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/* The decoder's per-token steps: the Replace (and Metaspace) steps, then ByteFallback turns
   a <0xNN> token into its byte. What runs after Fuse (Strip) acts on the whole text in
   clrt_tokenizer_decode. */
char *tok_decode_token(const clrt_tokenizer *t, const char *s, size_t n, size_t *out_len) {
  char *cur = dup_bytes(s, n);
  if (!cur) return NULL;
  for (int i = 0; i < t->n_dec_replace; i++) {
    size_t m;
    char *next = replace_all(cur, n, t->dec_from[i], t->dec_from_len[i], t->dec_to[i], t->dec_to_len[i], &m);
    free(cur);
    if (!next) return NULL;
    cur = next;
    n = m;
  }
  if (t->dec_byte_fallback && n == 6 && memcmp(cur, "<0x", 3) == 0 && cur[5] == '>') {
    int hi = hex_digit(cur[3]), lo = hex_digit(cur[4]);
    if (hi >= 0 && lo >= 0) {
      cur[0] = (char)(hi * 16 + lo);
      n = 1;
    }
  }
  *out_len = n;
  return cur;
}
