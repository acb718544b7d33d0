/* tokenizer_internal.h — the tokenizer's private structures, shared by tokenizer*.c and
   bpe_train.c. Not part of the FFI. */
#ifndef CLRT_TOKENIZER_INTERNAL_H
#define CLRT_TOKENIZER_INTERNAL_H
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "clrt.h"

/* A byte-string -> int32 hash map (open addressing); keys live in one arena. */
typedef struct {
  uint32_t *slots;      /* [cap]: 1 + entry index, 0 = empty */
  uint32_t cap;         /* power of two */
  uint32_t n;
  uint64_t *key_off;    /* [n]: offset into arena */
  uint32_t *key_len;    /* [n] */
  int32_t *value;       /* [n] */
  uint32_t entries_cap;
  char *arena;
  size_t arena_len, arena_cap;
} tok_strmap;

void tok_strmap_free(tok_strmap *m);
int tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t value); /* -1 on OOM */
int tok_strmap_get(const tok_strmap *m, const char *key, size_t len, int32_t *value);
uint64_t tok_hash(const char *s, size_t n);

/* (left id, right id) -> (rank, merged id). */
typedef struct {
  uint64_t key;         /* (left << 32 | right) + 1, 0 = empty */
  int32_t rank, merged;
} tok_pair_slot;        /* one slot = one cache access on the hot path */

typedef struct {
  tok_pair_slot *slots; /* [cap] */
  uint32_t cap, n;
} tok_pairmap;

int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged);
int tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *merged);
void tok_pairmap_free(tok_pairmap *m);

typedef struct {
  char *content;
  size_t len;
  int32_t id;
  int special, lstrip, rstrip, normalized, single_word;
} tok_added;

enum { TOK_MAX_STAGES = 8, TOK_MAX_NORM = 16, TOK_MAX_DEC_REPLACE = 4 };
enum { TOK_ISOLATED, TOK_REMOVED, TOK_MERGED_PREV, TOK_MERGED_NEXT };
enum { TOK_NORM_NFC, TOK_NORM_NFD, TOK_NORM_NFKC, TOK_NORM_NFKD, TOK_NORM_PREPEND, TOK_NORM_REPLACE, TOK_NORM_STRIP };

typedef struct {
  int kind;
  char *a, *b;                   /* prepend text; replace pattern -> content */
  size_t a_len, b_len;
  int left, right;               /* strip sides */
} tok_norm;

typedef struct tok_trie_node {
  int32_t child, sibling;        /* first child, next sibling (-1: none) */
  int32_t token;                 /* index into added[] of the token ending here, -1 if none */
  uint8_t byte;
} tok_trie_node;

struct clrt_tokenizer {
  tok_strmap vocab;              /* raw bytes of a model token -> id */
  char **id_bytes;               /* [n_ids]: raw bytes of each id (model or added), NULL if unused */
  uint32_t *id_len;              /* [n_ids] */
  uint8_t *id_special;           /* [n_ids]: 0 model token, 1 added token, 2 special added token */
  int32_t n_ids;                 /* capacity of the id arrays = largest id + 1 */
  int32_t byte_id[256];          /* id of each single byte */
  tok_pairmap merges;
  int32_t n_merges;
  tok_added *added;
  int n_added, added_cap;
  uint8_t added_first[256];      /* bytes that start some added token */
  struct tok_trie_node *trie;    /* added tokens by content; node 0 is the root */
  int n_trie;
  pcre2_code *stage[TOK_MAX_STAGES];
  int n_stages;
  int jit[TOK_MAX_STAGES];       /* stage k was JIT-compiled */
  int behavior[TOK_MAX_STAGES];   /* TOK_ISOLATED ... of stage k */
  int nfc, ignore_merges, add_prefix_space, finished;
  /* SentencePiece-style model (byte_level == 0): symbols are characters */
  int byte_level, byte_fallback, fuse_unk;
  int32_t unk_id;
  int32_t fallback_id[256];      /* <0xNN> token of each byte, -1 if absent */
  int32_t *char_id;              /* [65536]: id of each BMP character's one-character token, -1 none */
  char **id_text;                /* [n_ids] token text as in tokenizer.json (SentencePiece-style only) */
  uint32_t *id_text_len;
  uint32_t *sp_join;             /* sorted code points c for which some token holds c followed by ▁ */
  int n_sp_join, sp_split;       /* sp_split: cutting pieces before ▁ is exact (see tokenizer_encode.c) */
  tok_norm norm[TOK_MAX_NORM];
  int n_norm;
  char meta_rep[8];              /* Metaspace replacement character, meta_len 0: no Metaspace */
  int meta_len, meta_prepend, meta_split;
  /* decoder: per-token replaces and byte fallback (before Fuse), then Strip on the whole text */
  char *dec_from[TOK_MAX_DEC_REPLACE], *dec_to[TOK_MAX_DEC_REPLACE];
  size_t dec_from_len[TOK_MAX_DEC_REPLACE], dec_to_len[TOK_MAX_DEC_REPLACE];
  int n_dec_replace, dec_byte_fallback, dec_fused, dec_byte_level, n_dec;
  char strip_char;
  int strip_start, strip_stop;
  int32_t prefix[8], suffix[8];
  int n_prefix, n_suffix;
  struct tok_ctx *ctx;           /* for the single-threaded entry points */
  struct tok_ctx **pool;         /* [n_pool] one per OpenMP thread, for encode_batch */
  int n_pool;
  int32_t *out;                  /* result of clrt_tokenizer_encode */
  size_t out_cap;
  char *dec;                     /* result of clrt_tokenizer_decode */
  size_t dec_cap;
};

/* Per-thread encoding state: regex match data, BPE piece cache, scratch. */
typedef struct tok_ctx tok_ctx;
tok_ctx *tok_ctx_new(const clrt_tokenizer *t);
void tok_ctx_free(tok_ctx *c);
/* Appends the ids of text to *out (growable); returns -1 with the error set on failure. */
int tok_encode(const clrt_tokenizer *t, tok_ctx *c, const char *text, size_t len, int add_special,
               int32_t **out, size_t *n, size_t *cap);

/* Byte-level alphabet (GPT-2): byte -> code point and back. */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp);      /* -1 if cp is not in the alphabet */
/* Decode one UTF-8 char at s (n bytes left); returns its length, or 0 if invalid/incomplete. */
int tok_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
int tok_is_white_space(uint32_t cp);
/* Normalizer steps of t over s: s itself when no step changed it, else a malloc'd string
   (*out_len); NULL with the error set on failure. */
char *tok_normalize(const clrt_tokenizer *t, const char *s, size_t n, size_t *out_len);
/* Per-token decoder steps over a token's text -> malloc'd bytes; NULL on OOM. */
char *tok_decode_token(const clrt_tokenizer *t, const char *s, size_t n, size_t *out_len);
void tok_pipeline_free(clrt_tokenizer *t);

/* Translate a Hugging Face (Oniguruma) pattern into PCRE2 with the same meaning; compiles it.
   NULL with the error set (naming `what`) on failure. */
pcre2_code *tok_compile_regex(const char *pattern, size_t len, const char *what);

#endif
