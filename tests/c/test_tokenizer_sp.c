/* test_tokenizer_sp.c — the SentencePiece-style tokenizer (characters as symbols, byte
   fallback, Prepend/Replace normalizers, Metaspace, Split behaviors, the Replace/ByteFallback/
   Fuse/Strip decoders) against a naive model: random texts over a small alphabet with random
   merges (some of which join a letter to ▁, so cutting pieces at ▁ must not change the result)
   must encode like "normalize, cut, merge the lowest-ranked pair leftmost first, spell unknown
   characters as <0xNN>" and decode back. Also the C API's errors for the new steps. Runs under
   ASan/UBSan in scripts/test.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "clrt.h"

enum { NMERGE = 60, FIRST_CHAR = 257, MAXTOK = 400, MAXSYM = 1024 };

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next_rand(void) {
  rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
  return (uint32_t)(rng >> 11);
}

#define META "\xe2\x96\x81"
static const char *const chars[] = { "a", "b", "c", META, "\xc3\xa9" };   /* ids FIRST_CHAR.. */
enum { NCHAR = 5 };
static char tok_str[MAXTOK][96];
static int ntok, merge_a[NMERGE], merge_b[NMERGE], merge_r[NMERGE];

static int char_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

/* naive BPE over the characters of s[0..n): -1 - offset for a character outside the vocab */
static int naive_piece(const char *s, int n, int *out) {
  int m = 0;
  for (int i = 0; i < n;) {
    int k = char_len((unsigned char)s[i]), id = -1 - i;
    for (int c = 0; c < NCHAR; c++)
      if ((int)strlen(chars[c]) == k && !memcmp(chars[c], s + i, (size_t)k)) id = FIRST_CHAR + c;
    out[m++] = id;
    i += k;
  }
  for (;;) {
    int best = -1, best_rank = NMERGE;
    for (int i = 0; i + 1 < m; i++)
      for (int r = 0; r < best_rank; r++)
        if (merge_a[r] == out[i] && merge_b[r] == out[i + 1]) { best = i; best_rank = r; break; }
    if (best < 0) break;
    out[best] = merge_r[best_rank];
    memmove(out + best + 1, out + best + 2, (size_t)(m - best - 2) * sizeof *out);
    m--;
  }
  /* byte fallback: <0xNN> is id 1 + NN */
  int o = 0, tmp[MAXSYM];
  for (int i = 0; i < m; i++) {
    if (out[i] >= 0) { tmp[o++] = out[i]; continue; }
    int at = -1 - out[i], k = char_len((unsigned char)s[at]);
    for (int b = 0; b < k; b++) tmp[o++] = 1 + (unsigned char)s[at + b];
  }
  memcpy(out, tmp, (size_t)o * sizeof *out);
  return o;
}

/* The normalized text: ' ' -> ▁ and a ▁ in front (mode 1, Metaspace "always": only when it
   does not start with one already). */
static int normalize(int mode, const char *text, char *norm) {
  int n = 0;
  for (const char *p = text; *p; p++) {
    if (*p == ' ') { memcpy(norm + n, META, 3); n += 3; } else norm[n++] = *p;
  }
  if (mode != 1 || memcmp(norm, META, 3) != 0) {
    memmove(norm + 3, norm, (size_t)n);
    memcpy(norm, META, 3);
    n += 3;
  }
  return n;
}

/* mode 0: Prepend ▁ + Replace ' ' -> ▁ (whole section one piece); 1: Metaspace (always, split);
   2..4: the normalizers, then Split on "b" MergedWithPrevious / MergedWithNext / Removed */
static int naive(int mode, const char *text, int *out) {
  char norm[2048];
  int n = normalize(mode, text, norm), o = 0, start = 0;
  for (int i = 0; i < n; i++) {
    if (mode == 1 && i > start && !memcmp(norm + i, META, 3)) { o += naive_piece(norm + start, i - start, out + o); start = i; }
    else if (mode == 2 && norm[i] == 'b') { o += naive_piece(norm + start, i + 1 - start, out + o); start = i + 1; }
    else if (mode == 3 && norm[i] == 'b' && i > start) { o += naive_piece(norm + start, i - start, out + o); start = i; }
    else if (mode == 4 && norm[i] == 'b') { if (i > start) o += naive_piece(norm + start, i - start, out + o); start = i + 1; }
  }
  if (start < n) o += naive_piece(norm + start, n - start, out + o);
  return o;
}

static clrt_tokenizer *build(int mode) {
  clrt_tokenizer *t = clrt_tokenizer_new();
  CHECK(clrt_tokenizer_set_model(t, 0, 1, 1, 0) == 0);
  CHECK(clrt_tokenizer_add_vocab(t, "<unk>", 5, 0) == 0);
  for (int b = 0; b < 256; b++) {
    char s[8];
    snprintf(s, sizeof s, "<0x%02X>", b);
    CHECK(clrt_tokenizer_add_vocab(t, s, 6, 1 + b) == 0);
  }
  for (int i = FIRST_CHAR; i < ntok; i++) CHECK(clrt_tokenizer_add_vocab(t, tok_str[i], strlen(tok_str[i]), i) == 0);
  for (int k = 0; k < NMERGE; k++) {
    const char *a = tok_str[merge_a[k]], *b = tok_str[merge_b[k]];
    CHECK(clrt_tokenizer_add_merge(t, a, strlen(a), b, strlen(b)) == 0);
  }
  if (mode == 1) {
    CHECK(clrt_tokenizer_set_metaspace(t, META, 3, 2, 1) == 0);
  } else {
    CHECK(clrt_tokenizer_add_normalizer(t, "prepend", META, 3, NULL, 0, 0, 0) == 0);
    CHECK(clrt_tokenizer_add_normalizer(t, "replace", " ", 1, META, 3, 0, 0) == 0);
  }
  if (mode >= 2) CHECK(clrt_tokenizer_add_split_behavior(t, "b", 1, mode == 2 ? 2 : mode == 3 ? 3 : 1) == 0);
  CHECK(clrt_tokenizer_add_decoder(t, "replace", META, 3, " ", 1, 0, 0) == 0);
  CHECK(clrt_tokenizer_add_decoder(t, "byte_fallback", NULL, 0, NULL, 0, 0, 0) == 0);
  CHECK(clrt_tokenizer_add_decoder(t, "fuse", NULL, 0, NULL, 0, 0, 0) == 0);
  CHECK(clrt_tokenizer_add_decoder(t, "strip", " ", 1, NULL, 0, 1, 0) == 0);
  CHECK(clrt_tokenizer_finish(t) == 0);
  return t;
}

int main(void) {
  /* random merges over the characters and earlier merges; the first ones join a letter to ▁ */
  for (int c = 0; c < NCHAR; c++) strcpy(tok_str[FIRST_CHAR + c], chars[c]);
  ntok = FIRST_CHAR + NCHAR;
  for (int k = 0; k < NMERGE;) {
    int a = FIRST_CHAR + (int)(next_rand() % (uint32_t)(ntok - FIRST_CHAR));
    int b = FIRST_CHAR + (int)(next_rand() % (uint32_t)(ntok - FIRST_CHAR));
    if (k == 0) { a = FIRST_CHAR; b = FIRST_CHAR + 3; }          /* "a▁" */
    if (k == 1) { a = FIRST_CHAR + 3; b = FIRST_CHAR + 3; }      /* "▁▁" */
    if (strlen(tok_str[a]) + strlen(tok_str[b]) >= 90) continue;
    int dup = 0;
    for (int j = 0; j < k; j++) dup |= merge_a[j] == a && merge_b[j] == b;
    if (dup) continue;
    char cat[96];
    snprintf(cat, sizeof cat, "%s%s", tok_str[a], tok_str[b]);
    int r = -1;
    for (int j = FIRST_CHAR; j < ntok; j++) if (!strcmp(tok_str[j], cat)) r = j;
    if (r < 0) { r = ntok++; strcpy(tok_str[r], cat); }
    merge_a[k] = a; merge_b[k] = b; merge_r[k] = r;
    k++;
  }
  static const char *const units[] = { "a", "b", "c", " ", " ", "\xc3\xa9", META, "\xf0\x9f\x98\x80", "  " };
  for (int mode = 0; mode <= 4; mode++) {
    clrt_tokenizer *t = build(mode);
    int bad = 0, bad_dec = 0;
    for (int it = 0; it < 600; it++) {
      char text[400];
      int n = 0, len = 1 + (int)(next_rand() % 60);
      for (int u = 0; u < len; u++) {
        const char *s = units[next_rand() % (sizeof units / sizeof *units)];
        memcpy(text + n, s, strlen(s));
        n += (int)strlen(s);
      }
      text[n] = 0;
      int want[MAXSYM];
      int nw = naive(mode, text, want);
      int64_t got_n = 0;
      const int32_t *got = clrt_tokenizer_encode(t, text, (size_t)n, 0, &got_n);
      int same = got && got_n == nw;
      for (int i = 0; same && i < nw; i++) same = got[i] == want[i];
      if (!same && bad++ < 3) fprintf(stderr, "mode %d: encode differs on \"%s\" (%lld vs %d ids)\n", mode, text, (long long)got_n, nw);
      if (!got || mode == 4) continue;                  /* Removed drops text: no round trip */
      int32_t copy[MAXSYM];
      memcpy(copy, got, (size_t)got_n * sizeof *copy);
      size_t dl = 0;
      const char *back = clrt_tokenizer_decode(t, copy, got_n, 0, &dl);
      /* decode gives the normalized text with ▁ read as a space, less its first space */
      char norm[2048], expect[2048];
      int nn = normalize(mode, text, norm), e = 0;
      for (int i = 0; i < nn;) {
        if (i + 3 <= nn && !memcmp(norm + i, META, 3)) { expect[e++] = ' '; i += 3; } else expect[e++] = norm[i++];
      }
      int off = expect[0] == ' ';
      if (!back || dl != (size_t)(e - off) || memcmp(back, expect + off, dl)) {
        if (bad_dec++ < 3) fprintf(stderr, "mode %d: decode of \"%s\" gave \"%.*s\"\n", mode, text, (int)dl, back ? back : "");
      }
    }
    CHECK(bad == 0);
    CHECK(bad_dec == 0);
    clrt_tokenizer_free(t);
  }

  /* a character outside the vocab, no byte fallback, no unk: a clear error */
  clrt_tokenizer *t = clrt_tokenizer_new();
  CHECK(clrt_tokenizer_set_model(t, 0, 0, 0, -1) == 0);
  CHECK(clrt_tokenizer_add_vocab(t, "a", 1, 0) == 0);
  CHECK(clrt_tokenizer_add_decoder(t, "fuse", NULL, 0, NULL, 0, 0, 0) == 0);
  CHECK(clrt_tokenizer_add_decoder(t, "replace", "x", 1, "y", 1, 0, 0) != 0);
  CHECK_ERROR("after ByteFallback or Fuse");
  CHECK(clrt_tokenizer_finish(t) == 0);
  int64_t n = 0;
  CHECK(clrt_tokenizer_encode(t, "ab", 2, 0, &n) == NULL);
  CHECK_ERROR("U+0062 is not in the vocabulary");
  CHECK(clrt_tokenizer_set_model(t, 1, 0, 0, -1) != 0);
  CHECK_ERROR("before the vocab");
  clrt_tokenizer_free(t);

  t = clrt_tokenizer_new();
  CHECK(clrt_tokenizer_set_model(t, 0, 1, 0, -1) == 0);
  CHECK(clrt_tokenizer_add_normalizer(t, "lowercase", NULL, 0, NULL, 0, 0, 0) != 0);
  CHECK_ERROR("unknown normalizer step \"lowercase\"");
  CHECK(clrt_tokenizer_add_decoder(t, "strip", " ", 1, NULL, 0, 1, 0) != 0);
  CHECK_ERROR("Strip decoder before Fuse");
  CHECK(clrt_tokenizer_add_decoder(t, "wordpiece", NULL, 0, NULL, 0, 0, 0) != 0);
  CHECK_ERROR("unknown decoder step");
  CHECK(clrt_tokenizer_add_split(t, "x", 1) == 0);
  CHECK(clrt_tokenizer_set_metaspace(t, META, 3, 1, 0) != 0);
  CHECK_ERROR("before any Split");
  CHECK(clrt_tokenizer_add_vocab(t, "a", 1, 0) == 0);
  CHECK(clrt_tokenizer_finish(t) != 0);
  CHECK_ERROR("needs a decoder");
  clrt_tokenizer_free(t);

  /* byte-level: a vocab token outside the alphabet is its own text (DeepSeek V3's specials) */
  t = clrt_tokenizer_new();
  CHECK(clrt_tokenizer_add_vocab(t, "<\xef\xbd\x9c>", 5, 300) == 0);
  size_t bl = 0;
  const char *bytes = clrt_tokenizer_token_bytes(t, 300, &bl);
  CHECK(bytes && bl == 5 && !memcmp(bytes, "<\xef\xbd\x9c>", 5));
  CHECK(clrt_tokenizer_id(t, "<\xef\xbd\x9c>", 5) == 300);
  clrt_tokenizer_free(t);
  return check_summary();
}
