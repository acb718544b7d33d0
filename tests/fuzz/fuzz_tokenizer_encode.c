/* fuzz_tokenizer_encode.c — arbitrary bytes through the tokenizer built with the C API (no
   files): encode must succeed on valid UTF-8 (and decode back to the input when there is no
   normalizer or stripping) or fail cleanly on invalid UTF-8; the UTF-8 helpers and the BPE
   trainer must never crash either. */
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
