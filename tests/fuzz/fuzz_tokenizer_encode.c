/* fuzz_tokenizer_encode.c — arbitrary bytes through the tokenizer built with the C API (no
   files): encode must succeed on valid UTF-8 (and decode back to the input when there is no
   normalizer or stripping) or fail cleanly on invalid UTF-8; the UTF-8 helpers and the BPE
   trainer must never crash either. Three SentencePiece-style tokenizers (byte fallback,
   Prepend/Replace/NFKC/Strip normalizers, Metaspace, Split behaviors, single_word added
   tokens, unk fusing, the Replace/ByteFallback/Fuse/Strip decoders) take the same bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clrt.h"

static const char *GPT4 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* byte b spelled in the byte-level alphabet, as UTF-8 */
static size_t spell(int b, char *out) {
  int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  unsigned cp = (unsigned)b;
  if (!printable) {
    unsigned k = 256;
    for (int i = 0; i < b; i++)
      if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || i >= 174)) k++;
    cp = k;
  }
  if (cp < 0x80) { out[0] = (char)cp; return 1; }
  out[0] = (char)(0xC0 | (cp >> 6));
  out[1] = (char)(0x80 | (cp & 0x3F));
  return 2;
}

static void die(const char *what) {
  fprintf(stderr, "fuzz setup failed at %s: %s\n", what, clrt_last_error());
  abort();
}

static clrt_tokenizer *build(int nfc) {
  clrt_tokenizer *t = clrt_tokenizer_new();
  if (!t) die("new");
  char a[4], b[4], ab[8];
  for (int i = 0; i < 256; i++) {
    size_t n = spell(i, a);
    if (clrt_tokenizer_add_vocab(t, a, n, i)) die("vocab");
  }
  /* merges over common ASCII pairs, then pairs of those (ids from 256 up) */
  const char *pairs[] = { "th", "he", "in", "er", "an", " t", "e ", "  ", "\n\n", "00", "\xc3\xa9" };
  int id = 256;
  for (size_t k = 0; k < sizeof pairs / sizeof *pairs; k++) {
    size_t na = spell((unsigned char)pairs[k][0], a), nb = spell((unsigned char)pairs[k][1], b);
    memcpy(ab, a, na);
    memcpy(ab + na, b, nb);
    if (clrt_tokenizer_add_vocab(t, ab, na + nb, id++)) die("vocab pair");
    if (clrt_tokenizer_add_merge(t, a, na, b, nb)) die("merge");
  }
  if (clrt_tokenizer_add_added(t, "<|im_end|>", 10, 400, 1, nfc, nfc, 0)) die("added");
  if (clrt_tokenizer_add_added(t, "<|im", 4, 401, 0, 0, 0, 0)) die("added");
  if (clrt_tokenizer_add_split(t, GPT4, strlen(GPT4))) die("split");
  if (nfc && clrt_tokenizer_add_split(t, "\\p{N}", 5)) die("digits");
  if (clrt_tokenizer_set_flags(t, nfc, nfc, 0)) die("flags");
  int32_t bos = 401;
  if (clrt_tokenizer_set_template(t, &bos, nfc, NULL, 0)) die("template");
  if (clrt_tokenizer_finish(t)) die("finish");
  return t;
}

#define META "\xe2\x96\x81"

/* variant 0: Llama 2's pipeline (Prepend ▁, Replace ' ' -> ▁, byte fallback); 1: NFKC + Strip +
   Metaspace (first, split); 2: no byte fallback (unk, fused), Split "[.,]" MergedWithPrevious
   then " " Removed, and a single_word added token */
static clrt_tokenizer *build_sp(int variant) {
  clrt_tokenizer *t = clrt_tokenizer_new();
  if (!t || clrt_tokenizer_set_model(t, 0, variant != 2, variant == 2, 0)) die("sp model");
  if (clrt_tokenizer_add_vocab(t, "<unk>", 5, 0)) die("sp unk");
  int32_t id = 1;
  for (int b = 0; b < 256; b++) {
    char s[8];
    snprintf(s, sizeof s, "<0x%02X>", b);
    if (clrt_tokenizer_add_vocab(t, s, 6, id++)) die("sp byte");
  }
  const char *single[] = { "a", "b", "e", "h", "t", " ", ".", META, "\xc3\xa9" };
  for (size_t k = 0; k < sizeof single / sizeof *single; k++)
    if (clrt_tokenizer_add_vocab(t, single[k], strlen(single[k]), id++)) die("sp char");
  const char *merges[][2] = { { META, "t" }, { "h", "e" }, { META "t", "he" }, { META, META }, { "a", META },
                              { "e", "\xc3\xa9" }, { "a", "b" } };
  for (size_t k = 0; k < sizeof merges / sizeof *merges; k++) {
    char cat[32];
    snprintf(cat, sizeof cat, "%s%s", merges[k][0], merges[k][1]);
    if (clrt_tokenizer_add_vocab(t, cat, strlen(cat), id++)) die("sp merged");
    if (clrt_tokenizer_add_merge(t, merges[k][0], strlen(merges[k][0]), merges[k][1], strlen(merges[k][1]))) die("sp merge");
  }
  if (clrt_tokenizer_add_added_word(t, "<s>", 3, id++, 1, 0, 0, 0, 0)) die("sp added");
  if (clrt_tokenizer_add_added_word(t, "<w>", 3, id++, 0, variant == 2, variant == 2, 1, variant == 2)) die("sp word");
  if (variant == 1) {
    if (clrt_tokenizer_add_normalizer(t, "nfkc", NULL, 0, NULL, 0, 0, 0) ||
        clrt_tokenizer_add_normalizer(t, "strip", NULL, 0, NULL, 0, 1, 1) ||
        clrt_tokenizer_set_metaspace(t, META, 3, 1, 1)) die("sp metaspace");
  } else {
    if (clrt_tokenizer_add_normalizer(t, "prepend", META, 3, NULL, 0, 0, 0) ||
        clrt_tokenizer_add_normalizer(t, "replace", " ", 1, META, 3, 0, 0)) die("sp normalizer");
  }
  if (variant == 2 && (clrt_tokenizer_add_split_behavior(t, "[.,]", 4, 2) ||
                       clrt_tokenizer_add_split_behavior(t, "e", 1, 1))) die("sp split");
  if (clrt_tokenizer_add_decoder(t, "replace", META, 3, " ", 1, 0, 0) ||
      clrt_tokenizer_add_decoder(t, "byte_fallback", NULL, 0, NULL, 0, 0, 0) ||
      clrt_tokenizer_add_decoder(t, "fuse", NULL, 0, NULL, 0, 0, 0) ||
      clrt_tokenizer_add_decoder(t, "strip", " ", 1, NULL, 0, 1, 0)) die("sp decoder");
  if (clrt_tokenizer_finish(t)) die("sp finish");
  return t;
}

/* The SentencePiece-style tokenizers: valid UTF-8 always encodes (byte fallback or unk covers
   every character); variant 0 decodes back to the input (a space for each ▁) when no added
   token text is in it. */
static void fuzz_sp(const char *s, size_t size) {
  static clrt_tokenizer *sp[3];
  if (!sp[0]) for (int v = 0; v < 3; v++) sp[v] = build_sp(v);
  for (int v = 0; v < 3; v++) {
    int64_t n = 0;
    const int32_t *ids = clrt_tokenizer_encode(sp[v], s, size, 1, &n);
    if (!ids) continue;
    int32_t *copy = malloc((size_t)(n ? n : 1) * sizeof *copy);
    memcpy(copy, ids, (size_t)n * sizeof *copy);
    size_t len = 0;
    const char *back = clrt_tokenizer_decode(sp[v], copy, n, 0, &len);
    if (!back) { fprintf(stderr, "sp variant %d: decode failed: %s\n", v, clrt_last_error()); abort(); }
    if (v == 0 && !memchr(s, '<', size)) {
      char *want = malloc(size + 1);
      size_t w = 0;
      for (size_t i = 0; i < size;) {
        if (i + 3 <= size && memcmp(s + i, META, 3) == 0) { want[w++] = ' '; i += 3; } else want[w++] = s[i++];
      }
      if (len != w || memcmp(back, want, w) != 0) { fprintf(stderr, "sp round trip failed for %zu bytes\n", size); abort(); }
      free(want);
    }
    free(copy);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static clrt_tokenizer *plain, *norm;
  if (!plain) { plain = build(0); norm = build(1); }
  const char *s = (const char *)data;
  int64_t n = 0;
  const int32_t *ids = clrt_tokenizer_encode(plain, s, size, 1, &n);
  if (ids) {
    int32_t *copy = malloc((size_t)(n ? n : 1) * sizeof *copy);
    memcpy(copy, ids, (size_t)n * sizeof *copy);
    size_t len = 0;
    const char *back = clrt_tokenizer_decode(plain, copy, n, 0, &len);
    if (!back || len != size || memcmp(back, s, size) != 0) {
      fprintf(stderr, "round trip failed for %zu bytes\n", size);
      abort();
    }
    free(copy);
  }
  ids = clrt_tokenizer_encode(norm, s, size, 1, &n);
  if (ids && n > 0 && ids[0] != 401) { fprintf(stderr, "BOS missing\n"); abort(); }
  fuzz_sp(s, size);
  /* UTF-8 helpers over the raw bytes */
  char *out = malloc(size * 3 + 1);
  size_t m = clrt_utf8_lossy(s, size, out);
  if (m > size * 3) abort();
  size_t k = clrt_utf8_complete_prefix(s, size);
  if (k > size || size - k > 3) abort();
  free(out);
  /* a tiny training run on the input */
  if (size < 512) {
    const char *texts[1] = { s };
    size_t lens[1] = { size };
    int32_t *merges = NULL;
    int64_t nm = clrt_bpe_train(texts, lens, 1, GPT4, strlen(GPT4), 300, 1, &merges);
    if (nm > 44) abort();
    clrt_tokenizer_free_ids(merges);
  }
  return 0;
}
