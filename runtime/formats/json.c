/* json.c — strict recursive-descent JSON parser with a depth limit. Input is untrusted (it
   comes from files on disk and is fuzzed), so every read is bounds-checked and every failure
   names the byte offset. */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_DEPTH = 64 };

typedef struct parser {
  clrt_json_doc *doc;
  char *p, *end, *start;
} parser;

static int fail(parser *ps, const char *what) {
  snprintf(ps->doc->error, sizeof ps->doc->error, "%s at byte %ld", what, (long)(ps->p - ps->start));
  return -1;
}

static int new_node(parser *ps, int type) {
  clrt_json_doc *d = ps->doc;
  if (d->n == d->cap) {
    int cap = d->cap ? d->cap * 2 : 64;
    clrt_json_node *nn = realloc(d->nodes, sizeof *nn * (size_t)cap);
    if (!nn) return fail(ps, "out of memory");
    d->nodes = nn;
    d->cap = cap;
  }
  clrt_json_node *n = &d->nodes[d->n];
  memset(n, 0, sizeof *n);
  n->type = type;
  n->first = n->next = -1;
  return d->n++;
}

static void skip_ws(parser *ps) {
  while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
    ps->p++;
}

static int hex4(parser *ps, unsigned *out) {
  if (ps->end - ps->p < 4) return fail(ps, "truncated \\u escape");
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = ps->p[i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
    else return fail(ps, "bad hex digit in \\u escape");
  }
  ps->p += 4;
  *out = v;
  return 0;
}

/* Unescapes in place: the output never outruns the input. */
static int parse_string(parser *ps, const char **out, size_t *out_len) {
  if (ps->p >= ps->end || *ps->p != '"') return fail(ps, "expected a string");
  ps->p++;
  char *w = ps->p, *begin = ps->p;
  for (;;) {
    if (ps->p >= ps->end) return fail(ps, "unterminated string");
    unsigned char c = (unsigned char)*ps->p;
    if (c == '"') break;
    if (c < 0x20) return fail(ps, "control character in string");
    if (c != '\\') {
      *w++ = *ps->p++;
      continue;
    }
    ps->p++;
    if (ps->p >= ps->end) return fail(ps, "unterminated escape");
    char e = *ps->p++;
    switch (e) {
      case '"': *w++ = '"'; break;
      case '\\': *w++ = '\\'; break;
      case '/': *w++ = '/'; break;
      case 'b': *w++ = '\b'; break;
      case 'f': *w++ = '\f'; break;
      case 'n': *w++ = '\n'; break;
      case 'r': *w++ = '\r'; break;
      case 't': *w++ = '\t'; break;
      case 'u': {
        unsigned cp;
        if (hex4(ps, &cp)) return -1;
        if (cp >= 0xD800 && cp < 0xDC00) {
          unsigned lo;
          if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u')
            return fail(ps, "unpaired surrogate in \\u escape");
          ps->p += 2;
          if (hex4(ps, &lo)) return -1;
          if (lo < 0xDC00 || lo > 0xDFFF) return fail(ps, "bad low surrogate in \\u escape");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp < 0xE000) {
          return fail(ps, "unpaired surrogate in \\u escape");
        }
        /* \uXXXX is 6 bytes of input; at most 4 of output (12 -> 4 for pairs). */
        if (cp < 0x80) *w++ = (char)cp;
        else if (cp < 0x800) {
          *w++ = (char)(0xC0 | (cp >> 6));
          *w++ = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
          *w++ = (char)(0xE0 | (cp >> 12));
          *w++ = (char)(0x80 | ((cp >> 6) & 0x3F));
          *w++ = (char)(0x80 | (cp & 0x3F));
        } else {
          *w++ = (char)(0xF0 | (cp >> 18));
          *w++ = (char)(0x80 | ((cp >> 12) & 0x3F));
          *w++ = (char)(0x80 | ((cp >> 6) & 0x3F));
          *w++ = (char)(0x80 | (cp & 0x3F));
        }
        break;
      }
      default: ps->p--; return fail(ps, "bad escape in string");
    }
  }
  /* The closing quote becomes the NUL terminator. */
  *out_len = (size_t)(w - begin);
  *w = 0;
  ps->p++;
  *out = begin;
  return 0;
}

static int parse_number(parser *ps, int idx) {
  char *s = ps->p;
  if (ps->p < ps->end && *ps->p == '-') ps->p++;
  if (ps->p >= ps->end) return fail(ps, "truncated number");
  if (*ps->p == '0') ps->p++;
  else if (*ps->p >= '1' && *ps->p <= '9') while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
  else return fail(ps, "bad number");
  int is_int = 1;
  if (ps->p < ps->end && *ps->p == '.') {
    is_int = 0;
    ps->p++;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad fraction in number");
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
  }
  if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
    is_int = 0;
    ps->p++;
    if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-')) ps->p++;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad exponent in number");
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
  }
  char buf[64];
  size_t n = (size_t)(ps->p - s);
  clrt_json_node *node = &ps->doc->nodes[idx];
  if (n >= sizeof buf) {
    /* Long literals are legal JSON; only their double value is kept. */
    char *tmp = malloc(n + 1);
    if (!tmp) return fail(ps, "out of memory");
    memcpy(tmp, s, n);
    tmp[n] = 0;
    node->num = strtod(tmp, NULL);
    free(tmp);
    return 0;
  }
  memcpy(buf, s, n);
  buf[n] = 0;
  node->num = strtod(buf, NULL);
  if (is_int) {
    errno = 0;
    long long v = strtoll(buf, NULL, 10);
    if (errno == 0) {
      node->is_int = 1;
      node->ival = v;
    }
  }
  return 0;
}

static int parse_value(parser *ps, int depth, int *out);

static int expect_word(parser *ps, const char *w) {
  size_t n = strlen(w);
  if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, w, n) != 0) return fail(ps, "unexpected token");
  ps->p += n;
  return 0;
}

static int parse_value(parser *ps, int depth, int *out) {
  if (depth > MAX_DEPTH) return fail(ps, "nesting too deep");
  skip_ws(ps);
  if (ps->p >= ps->end) return fail(ps, "unexpected end of input");
  char c = *ps->p;
  int idx;
  if (c == '{' || c == '[') {
    int is_obj = c == '{';
    if ((idx = new_node(ps, is_obj ? CLRT_JSON_OBJECT : CLRT_JSON_ARRAY)) < 0) return -1;
    ps->p++;
    skip_ws(ps);
    int last = -1;
    if (ps->p < ps->end && *ps->p == (is_obj ? '}' : ']')) {
      ps->p++;
      *out = idx;
      return 0;
    }
    for (;;) {
      const char *key = NULL;
      size_t key_len = 0;
      skip_ws(ps);
      if (is_obj) {
        if (parse_string(ps, &key, &key_len)) return -1;
        skip_ws(ps);
        if (ps->p >= ps->end || *ps->p != ':') return fail(ps, "expected ':' after object key");
        ps->p++;
      }
      int child;
      if (parse_value(ps, depth + 1, &child)) return -1;
      /* nodes may have moved (realloc): index, never hold pointers across parse_value. */
      clrt_json_node *cn = &ps->doc->nodes[child];
      cn->key = key;
      cn->key_len = key_len;
      if (last < 0) ps->doc->nodes[idx].first = child;
      else ps->doc->nodes[last].next = child;
      last = child;
      ps->doc->nodes[idx].count++;
      skip_ws(ps);
      if (ps->p >= ps->end) return fail(ps, is_obj ? "unterminated object" : "unterminated array");
      if (*ps->p == ',') {
        ps->p++;
        continue;
      }
      if (*ps->p == (is_obj ? '}' : ']')) {
        ps->p++;
        break;
      }
      return fail(ps, is_obj ? "expected ',' or '}' in object" : "expected ',' or ']' in array");
    }
    *out = idx;
    return 0;
  }
  if (c == '"') {
    if ((idx = new_node(ps, CLRT_JSON_STRING)) < 0) return -1;
    const char *s;
    size_t n;
    if (parse_string(ps, &s, &n)) return -1;
    ps->doc->nodes[idx].str = s;
    ps->doc->nodes[idx].len = n;
    *out = idx;
    return 0;
  }
  if (c == '-' || (c >= '0' && c <= '9')) {
    if ((idx = new_node(ps, CLRT_JSON_NUMBER)) < 0) return -1;
    if (parse_number(ps, idx)) return -1;
    *out = idx;
    return 0;
  }
  int type;
  const char *w;
  if (c == 't') type = CLRT_JSON_TRUE, w = "true";
  else if (c == 'f') type = CLRT_JSON_FALSE, w = "false";
  else if (c == 'n') type = CLRT_JSON_NULL, w = "null";
  else return fail(ps, "unexpected character");
  if (expect_word(ps, w)) return -1;
  if ((idx = new_node(ps, type)) < 0) return -1;
  *out = idx;
  return 0;
}

int clrt_json_parse(clrt_json_doc *doc, const char *text, size_t len) {
  memset(doc, 0, sizeof *doc);
  doc->text = malloc(len + 1);
  if (!doc->text) {
    snprintf(doc->error, sizeof doc->error, "out of memory for %zu bytes of JSON", len);
    return -1;
  }
  memcpy(doc->text, text, len);
  doc->text[len] = 0;
  parser ps = {doc, doc->text, doc->text + len, doc->text};
  int root;
  if (parse_value(&ps, 0, &root)) return -1;
  skip_ws(&ps);
  if (ps.p != ps.end) return fail(&ps, "trailing characters after JSON value");
  return 0;
}

void clrt_json_free(clrt_json_doc *doc) {
  free(doc->nodes);
  free(doc->text);
  doc->nodes = NULL;
  doc->text = NULL;
  doc->n = doc->cap = 0;
}

int clrt_json_get(const clrt_json_doc *doc, int obj, const char *key) {
  if (obj < 0 || doc->nodes[obj].type != CLRT_JSON_OBJECT) return -1;
  size_t kl = strlen(key);
  for (int c = doc->nodes[obj].first; c >= 0; c = doc->nodes[c].next)
    if (doc->nodes[c].key_len == kl && memcmp(doc->nodes[c].key, key, kl) == 0) return c;
  return -1;
}
