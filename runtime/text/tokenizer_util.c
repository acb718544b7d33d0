/* tokenizer_util.c — hash maps, the byte-level alphabet, UTF-8 and the regex translation the
   tokenizer builds on. */
#include "tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- hashing: FNV-1a folded through a 64-bit mix (keys are short token strings) ---- */
uint64_t tok_hash(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, s + i, 8);
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
  for (; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 32;
  return h;
}

void tok_strmap_free(tok_strmap *m) {
  free(m->slots);
  free(m->key_off);
  free(m->key_len);
  free(m->value);
  free(m->arena);
  memset(m, 0, sizeof *m);
}

static int strmap_find(const tok_strmap *m, const char *key, size_t len, uint64_t h, uint32_t *slot) {
  uint32_t mask = m->cap - 1, i = (uint32_t)h & mask;
  for (;;) {
    uint32_t e = m->slots[i];
    if (!e) { *slot = i; return 0; }
    e--;
    if (m->key_len[e] == len && memcmp(m->arena + m->key_off[e], key, len) == 0) { *slot = i; return 1; }
    i = (i + 1) & mask;
  }
}

static int strmap_grow(tok_strmap *m) {
  uint32_t ncap = m->cap ? m->cap * 2 : 1024;
  uint32_t *ns = calloc(ncap, sizeof *ns);
  if (!ns) return -1;
  for (uint32_t e = 0; e < m->n; e++) {
    uint32_t i = (uint32_t)tok_hash(m->arena + m->key_off[e], m->key_len[e]) & (ncap - 1);
    while (ns[i]) i = (i + 1) & (ncap - 1);
    ns[i] = e + 1;
  }
  free(m->slots);
  m->slots = ns;
  m->cap = ncap;
  return 0;
}

int tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t value) {
  if ((uint64_t)(m->n + 1) * 10 >= (uint64_t)m->cap * 7 && strmap_grow(m)) return -1;
  uint64_t h = tok_hash(key, len);
  uint32_t slot;
  if (strmap_find(m, key, len, h, &slot)) {
    m->value[m->slots[slot] - 1] = value;
    return 0;
  }
  if (m->n == m->entries_cap) {
    uint32_t nc = m->entries_cap ? m->entries_cap * 2 : 1024;
    uint64_t *ko = realloc(m->key_off, nc * sizeof *ko);
    if (ko) m->key_off = ko;
    uint32_t *kl = realloc(m->key_len, nc * sizeof *kl);
    if (kl) m->key_len = kl;
    int32_t *v = realloc(m->value, nc * sizeof *v);
    if (v) m->value = v;
    if (!ko || !kl || !v) return -1;
    m->entries_cap = nc;
  }
  if (m->arena_len + len + 1 > m->arena_cap) {
    size_t nc = m->arena_cap ? m->arena_cap * 2 : 65536;
    while (nc < m->arena_len + len + 1) nc *= 2;
    char *a = realloc(m->arena, nc);
    if (!a) return -1;
    m->arena = a;
    m->arena_cap = nc;
  }
  memcpy(m->arena + m->arena_len, key, len);
  m->key_off[m->n] = m->arena_len;
  m->key_len[m->n] = (uint32_t)len;
  m->value[m->n] = value;
  m->arena_len += len;
  m->slots[slot] = ++m->n;
  return 0;
}

int tok_strmap_get(const tok_strmap *m, const char *key, size_t len, int32_t *value) {
  if (!m->cap) return 0;
  uint32_t slot;
  if (!strmap_find(m, key, len, tok_hash(key, len), &slot)) return 0;
  *value = m->value[m->slots[slot] - 1];
  return 1;
}

/* ---- pair map ---- */
static inline uint32_t pair_slot(uint64_t k, uint32_t mask) {
  k *= 0x9E3779B97F4A7C15ull;
  return (uint32_t)(k >> 32) & mask;
}

int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged) {
  if ((uint64_t)(m->n + 1) * 2 >= m->cap) {
    uint32_t ncap = m->cap ? m->cap * 2 : 4096;
    tok_pair_slot *ns = calloc(ncap, sizeof *ns);
    if (!ns) return -1;
    for (uint32_t i = 0; i < m->cap; i++) {
      if (!m->slots[i].key) continue;
      uint32_t j = pair_slot(m->slots[i].key, ncap - 1);
      while (ns[j].key) j = (j + 1) & (ncap - 1);
      ns[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = ns;
    m->cap = ncap;
  }
  uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
  uint32_t mask = m->cap - 1, i = pair_slot(k, mask);
  while (m->slots[i].key && m->slots[i].key != k) i = (i + 1) & mask;
  if (m->slots[i].key == k) return 1;     /* duplicate merge: the first (best) rank stays */
  m->slots[i].key = k;
  m->slots[i].rank = rank;
  m->slots[i].merged = merged;
  m->n++;
  return 0;
}

int tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *merged) {
  if (!m->cap) return 0;
  uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
  uint32_t mask = m->cap - 1, i = pair_slot(k, mask);
  for (;;) {
    const tok_pair_slot *s = &m->slots[i];
    if (s->key == k) { *rank = s->rank; *merged = s->merged; return 1; }
    if (!s->key) return 0;
    i = (i + 1) & mask;
  }
}

void tok_pairmap_free(tok_pairmap *m) {
  free(m->slots);
  memset(m, 0, sizeof *m);
}

/* ---- byte-level alphabet: printable bytes stand for themselves, the other 68 bytes take
   code points 256.. in byte order (the GPT-2 convention every byte-level BPE file uses). ---- */
static int printable_byte(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174); }

uint32_t tok_byte_to_cp(uint8_t b) {
  static uint32_t table[256];
  static int ready;
  if (!ready) {
    uint32_t next = 256;
    for (int i = 0; i < 256; i++) table[i] = printable_byte(i) ? (uint32_t)i : next++;
    ready = 1;
  }
  return table[b];
}

int tok_cp_to_byte(uint32_t cp) {
  static int16_t table[256 + 68];
  static int ready;
  if (!ready) {
    for (int b = 0; b < 256; b++) table[tok_byte_to_cp((uint8_t)b)] = (int16_t)b;
    ready = 1;
  }
  return cp < 256 + 68 && (cp >= 256 || printable_byte((int)cp)) ? table[cp] : -1;
}

int tok_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
  if (n == 0) return 0;
  unsigned c = s[0];
  if (c < 0x80) { *cp = c; return 1; }
  if (c < 0xC2) return 0;
  if (c < 0xE0) {
    if (n < 2 || (s[1] & 0xC0) != 0x80) return 0;
    *cp = ((c & 0x1F) << 6) | (s[1] & 0x3F);
    return 2;
  }
  if (c < 0xF0) {
    if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
    uint32_t v = ((c & 0x0F) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3F);
    if (v < 0x800 || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return 3;
  }
  if (c < 0xF5) {
    if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
    uint32_t v = ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3F);
    if (v < 0x10000 || v > 0x10FFFF) return 0;
    *cp = v;
    return 4;
  }
  return 0;
}

/* Unicode White_Space (what Rust's char::is_whitespace tests, used by lstrip/rstrip). */
int tok_is_white_space(uint32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

/* ---- regex: Hugging Face compiles Split patterns with Oniguruma, whose Unicode \s is
   U+0009-000D, U+0085 and the Z categories. PCRE2's UCP \s lacks U+0085, so \s and \S are
   spelled out; everything else these patterns use (\p{L}, \p{N}, (?i:...), look-ahead,
   greedy/alternation order) already means the same in both engines. ---- */
#define ONIG_SPACE "\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}"

pcre2_code *tok_compile_regex(const char *pat, size_t len, const char *what) {
  size_t cap = len * 4 + 64, o = 0;
  char *out = malloc(cap + sizeof ONIG_SPACE * 2);
  if (!out) { clrt_set_error("%s: out of memory", what); return NULL; }
  int in_class = 0;
  for (size_t i = 0; i < len; i++) {
    if (o + 2 * sizeof ONIG_SPACE + 8 > cap) {
      cap *= 2;
      char *n = realloc(out, cap + sizeof ONIG_SPACE * 2);
      if (!n) { free(out); clrt_set_error("%s: out of memory", what); return NULL; }
      out = n;
    }
    char c = pat[i];
    if (c == '\\' && i + 1 < len) {
      char e = pat[i + 1];
      if (e == 's') {
        o += (size_t)sprintf(out + o, in_class ? "%s" : "[%s]", ONIG_SPACE);
        i++;
        continue;
      }
      if (e == 'S') {
        if (in_class) {
          free(out);
          clrt_set_error("%s: \\S inside a character class is not supported in pattern %.*s", what,
                         (int)len, pat);
          return NULL;
        }
        o += (size_t)sprintf(out + o, "[^%s]", ONIG_SPACE);
        i++;
        continue;
      }
      out[o++] = c;
      out[o++] = e;
      i++;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = 1;
      out[o++] = c;
      if (i + 1 < len && pat[i + 1] == '^') out[o++] = pat[++i];
      if (i + 1 < len && pat[i + 1] == ']') out[o++] = pat[++i];   /* leading ] is literal */
      continue;
    }
    if (c == '[' && in_class && i + 1 < len && pat[i + 1] == ':') {
      free(out);
      clrt_set_error("%s: POSIX classes and nested classes are not supported in pattern %.*s", what,
                     (int)len, pat);
      return NULL;
    }
    if (c == ']' && in_class) in_class = 0;
    out[o++] = c;
  }
  int err;
  PCRE2_SIZE off;
  pcre2_code *code = pcre2_compile((PCRE2_SPTR)out, o, PCRE2_UTF | PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C,
                                   &err, &off, NULL);
  free(out);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    clrt_set_error("%s: bad regex %.*s: %s", what, (int)len, pat, (const char *)msg);
    return NULL;
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);   /* falls back to the interpreter if JIT is unavailable */
  return code;
}
