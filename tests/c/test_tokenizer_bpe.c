/* test_tokenizer_bpe.c — the C tokenizer against a naive BPE: random strings over a small
   alphabet, with random merges, encoded by clrt (short-piece scan and long-piece heap paths,
   single and batch) must equal an O(n^2) "merge the lowest-ranked pair, leftmost first" loop.
   Also the C API's errors. Runs under ASan/UBSan in scripts/test.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "clrt.h"

enum { NMERGE = 40, MAXTOK = 256 + NMERGE };

static uint64_t rng = 88172645463325252ull;
static uint32_t next_rand(void) {
  rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
  return (uint32_t)(rng >> 11);
}

static char tok_text[MAXTOK][64];
static int merge_a[NMERGE], merge_b[NMERGE], merge_r[NMERGE];

/* naive BPE over ids: each step scans all pairs for the lowest rank */
static int naive(const char *s, int n, int *out) {
  int m = n;
  for (int i = 0; i < n; i++) out[i] = (unsigned char)s[i];
  for (;;) {
    int best = -1, best_rank = NMERGE, best_r = -1;
    for (int i = 0; i + 1 < m; i++)
      for (int k = 0; k < best_rank; k++)
        if (merge_a[k] == out[i] && merge_b[k] == out[i + 1]) { best = i; best_rank = k; best_r = merge_r[k]; break; }
    if (best < 0) return m;
    out[best] = best_r;
    memmove(out + best + 1, out + best + 2, (size_t)(m - best - 2) * sizeof *out);
    m--;
  }
}

static size_t spell(int b, char *o) {      /* byte -> byte-level UTF-8 */
  int pr = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  unsigned cp = (unsigned)b;
  if (!pr) {
    cp = 256;
    for (int i = 0; i < b; i++) cp += !((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || i >= 174);
  }
  if (cp < 0x80) { o[0] = (char)cp; return 1; }
  o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F));
  return 2;
}

static size_t spell_str(const char *s, char *o) {
  size_t k = 0;
  for (; *s; s++) k += spell((unsigned char)*s, o + k);
  return k;
}

int main(void) {
  clrt_tokenizer *t = clrt_tokenizer_new();
  CHECK(t != NULL);
  char sp[256], sp2[256];
  for (int b = 0; b < 256; b++) {
    tok_text[b][0] = (char)b; tok_text[b][1] = 0;
    size_t k = spell(b, sp);
    CHECK(clrt_tokenizer_add_vocab(t, sp, k, b) == 0);
  }
  /* random merges over tokens of the alphabet {a, b, c} and earlier merges */
  int ntok = 256, pool[MAXTOK], npool = 3;
  pool[0] = 'a'; pool[1] = 'b'; pool[2] = 'c';
  for (int k = 0; k < NMERGE;) {
    int a = pool[next_rand() % (uint32_t)npool], b = pool[next_rand() % (uint32_t)npool];
    if (k == 0) a = b = 'a';      /* a self-pair makes ties ("aaa") */
    if (strlen(tok_text[a]) + strlen(tok_text[b]) >= 60) continue;
    int dup = 0;
    for (int j = 0; j < k; j++) dup |= merge_a[j] == a && merge_b[j] == b;
    if (dup) continue;
    char cat[64];
    size_t la = strlen(tok_text[a]), lb = strlen(tok_text[b]);
    memcpy(cat, tok_text[a], la);
    memcpy(cat + la, tok_text[b], lb + 1);
    int r = -1;
    for (int j = 256; j < ntok; j++) if (!strcmp(tok_text[j], cat)) r = j;
    if (r < 0) {
      r = ntok++;
      strcpy(tok_text[r], cat);
      pool[npool++] = r;
      size_t n = spell_str(cat, sp);
      CHECK(clrt_tokenizer_add_vocab(t, sp, n, r) == 0);
    }
    merge_a[k] = a; merge_b[k] = b; merge_r[k] = r;
    size_t na = spell_str(tok_text[a], sp), nb = spell_str(tok_text[b], sp2);
    CHECK(clrt_tokenizer_add_merge(t, sp, na, sp2, nb) == 0);
    k++;
  }
  /* one piece per line: split on newlines only */
  CHECK(clrt_tokenizer_add_split(t, "\\n|[^\\n]+", 10) == 0);
  CHECK(clrt_tokenizer_finish(t) == 0);

  enum { NTEXT = 400 };
  static char texts[NTEXT][320];
  const char *ptrs[NTEXT];
  size_t lens[NTEXT];
  int mismatches = 0;
  static int want[320];
  for (int i = 0; i < NTEXT; i++) {
    int n = 1 + (int)(next_rand() % (i < 200 ? 40u : 300u));   /* short and long pieces */
    for (int j = 0; j < n; j++) texts[i][j] = "abc"[next_rand() % 3];
    texts[i][n] = 0;
    ptrs[i] = texts[i];
    lens[i] = (size_t)n;
    int m = naive(texts[i], n, want);
    int64_t got_n = 0;
    const int32_t *got = clrt_tokenizer_encode(t, texts[i], (size_t)n, 0, &got_n);
    int same = got && got_n == m;
    for (int j = 0; same && j < m; j++) same = got[j] == want[j];
    if (!same) {
      if (!mismatches) fprintf(stderr, "first mismatch on %s\n", texts[i]);
      mismatches++;
    }
  }
  CHECK(mismatches == 0);

  /* batch = single, for every text (twice: the second call reuses warm per-thread contexts) */
  for (int round = 0; round < 2; round++) {
    int64_t off[NTEXT + 1];
    int32_t *all = clrt_tokenizer_encode_batch(t, ptrs, lens, NTEXT, 0, off);
    CHECK(all != NULL);
    int bad = 0;
    for (int i = 0; all && i < NTEXT; i++) {
      int m = naive(texts[i], (int)lens[i], want);
      bad += off[i + 1] - off[i] != m;
      for (int j = 0; j < m && off[i + 1] - off[i] == m; j++) bad += all[off[i] + j] != want[j];
    }
    CHECK(bad == 0);
    clrt_tokenizer_free_ids(all);
  }

  /* decode is the inverse on valid text */
  int64_t n = 0;
  const int32_t *ids = clrt_tokenizer_encode(t, "abcabc\ncab", 10, 0, &n);
  int32_t copy[64];
  memcpy(copy, ids, (size_t)n * sizeof *copy);
  size_t len = 0;
  const char *back = clrt_tokenizer_decode(t, copy, n, 0, &len);
  CHECK(back && len == 10 && !memcmp(back, "abcabc\ncab", 10));

  /* errors */
  CHECK(clrt_tokenizer_encode(t, "a\xff", 2, 0, &n) == NULL);
  CHECK_ERROR("not valid UTF-8 at byte 1");
  int32_t badid = 99999;
  CHECK(clrt_tokenizer_decode(t, &badid, 1, 0, &len) == NULL);
  CHECK_ERROR("id 99999");
  CHECK(clrt_tokenizer_add_merge(t, "zz", 2, "a", 1) != 0);
  CHECK_ERROR("not in the vocab");
  CHECK(clrt_tokenizer_add_split(t, "(", 1) != 0);
  CHECK_ERROR("bad regex");
  CHECK(clrt_tokenizer_add_vocab(t, "", 0, 5) != 0);
  CHECK_ERROR("empty token");
  clrt_tokenizer_free(t);

  clrt_tokenizer *u = clrt_tokenizer_new();
  CHECK(clrt_tokenizer_finish(u) != 0);
  CHECK_ERROR("no token for byte 0x00");
  CHECK(clrt_tokenizer_encode(u, "a", 1, 0, &n) == NULL);
  CHECK_ERROR("not built");
  clrt_tokenizer_free(u);

  /* UTF-8 helpers */
  CHECK(clrt_utf8_complete_prefix("a\xe4\xb8", 3) == 1);
  CHECK(clrt_utf8_complete_prefix("a\xe4\xb8\x80", 4) == 4);
  CHECK(clrt_utf8_complete_prefix("\xf0\x9f\x91", 3) == 0);
  CHECK(clrt_utf8_complete_prefix("ab\x80", 3) == 3);
  char lossy[32];
  size_t ln = clrt_utf8_lossy("a\xf0\x9f\x91z", 5, lossy);
  CHECK(ln == 5 && !memcmp(lossy, "a\xef\xbf\xbdz", 5));
  return check_summary();
}
