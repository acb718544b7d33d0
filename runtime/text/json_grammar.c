/* json_grammar.c — JSON-constrained decoding: a byte-level pushdown automaton compiled from a
 * JSON Schema subset, and a trie over the vocabulary's byte strings that turns an automaton
 * state into a mask of the tokens that keep the output on a path to a valid value.
 *
 * The automaton is deterministic: a state is a stack of frames (one per open value) plus the
 * text of the number being written. Every state it can reach has a valid completion (no dead
 * ends), so masking can never leave a row with nothing to sample:
 *   - a byte is accepted only if some completion still exists (string lengths, required
 *     properties, minItems, and number bounds are checked byte by byte);
 *   - nesting is capped (JSON_MAX_DEPTH) and a container at the cap cannot open children,
 *     which any-value containers can always satisfy by closing;
 *   - whitespace is at most one byte per gap (max_ws 1, a space or a newline; max_ws 0: compact
 *     output), so a model cannot spend its token budget on it; \t and \r never pass.
 * Objects with properties write them in the schema's order (optional ones may be skipped);
 * anyOf alternatives must differ in their first byte (a string vs an object, say). */
#include "clrt.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { JSON_MAX_DEPTH = 32, NUM_CAP = 24 };

typedef struct {
  char *s;
  int len;
  int prop;                           /* OBJECT keys: the property this key names */
} lit;

typedef struct {
  int child;
  int required;
} prop;

typedef struct {
  int kind;
  double lo, hi;
  int flags;
  int *kids;
  int nkids, capkids;
  lit *lits;                          /* ENUM literals / OBJECT keys, sorted by bytes when finished */
  int nlits, caplits;
  prop *props;                        /* OBJECT, in schema order */
  int nprops, capprops;
  int *req_after;                     /* OBJECT [nprops + 1]: first required index >= i, or nprops */
  uint8_t first[32];                  /* bytes a value of this node can start with */
  long long ilo, ihi;                 /* INTEGER: the bounds as integers (when flagged) */
} node;

struct clrt_jschema {
  node *nodes;
  int n, cap;
  int root, max_ws, finished;
  int error_node;                     /* the node finish refused, or -1 */
  int any_node, key_node;             /* hidden: any value; an object key string */
  struct numcache *cache;             /* bounded-number prefixes already judged */
};

/* num_viable costs ~100 strtod calls; the trie walk asks about the same few prefixes over and
   over (" 2", "\n2", every step), so answers are kept in a small direct-mapped table. */
enum { NUMCACHE = 1024 };
struct numcache {
  int32_t node;                       /* -1: empty */
  uint8_t len, viable;
  char text[NUM_CAP];
};

typedef struct {
  int32_t node;
  int32_t n, m, k, p;
  uint8_t ph, a, b, c;
} frame;

struct clrt_jschema_state {
  const clrt_jschema *g;
  int32_t depth, ws, numlen;
  char num[NUM_CAP + 1];
  frame f[JSON_MAX_DEPTH];
};

/* Phases. Every node starts in P_START; containers share the phase names below. */
enum { P_START = 0 };
enum { S_BODY = 1, S_ESC, S_UHEX, S_LOW_BS, S_LOW_U, S_LOW_HEX };
enum { N_MINUS = 1, N_ZERO, N_INT, N_DOT, N_FRAC, N_EXP, N_EXPSIGN, N_EXPD };
enum { C_OPEN = 1, C_KEY, C_COLON, C_AFTER, C_COMMA };

/* ---- builder ------------------------------------------------------------------------------ */

clrt_jschema *clrt_jschema_new(int max_ws) {
  if (max_ws < 0 || max_ws > 1) {
    clrt_set_error("json grammar: max_ws %d is outside [0, 1] (one optional space or newline per gap, or none)", max_ws);
    return NULL;
  }
  clrt_jschema *g = calloc(1, sizeof *g);
  if (!g) {
    clrt_set_error("json grammar: out of memory");
    return NULL;
  }
  g->max_ws = max_ws;
  g->root = g->any_node = g->key_node = g->error_node = -1;
  return g;
}

void clrt_jschema_free(clrt_jschema *g) {
  if (!g) return;
  for (int i = 0; i < g->n; i++) {
    node *d = &g->nodes[i];
    for (int j = 0; j < d->nlits; j++) free(d->lits[j].s);
    free(d->lits);
    free(d->kids);
    free(d->props);
    free(d->req_after);
  }
  free(g->nodes);
  free(g->cache);
  free(g);
}

static int grow(void **p, int *cap, int need, size_t size) {
  if (need <= *cap) return 0;
  int c = *cap ? *cap * 2 : 8;
  while (c < need) c *= 2;
  void *q = realloc(*p, (size_t)c * size);
  if (!q) {
    clrt_set_error("json grammar: out of memory");
    return -1;
  }
  *p = q;
  *cap = c;
  return 0;
}

static node *get(clrt_jschema *g, int i, const char *what) {
  if (!g || g->finished) {
    clrt_set_error("json grammar: %s on a %s grammar", what, g ? "finished" : "NULL");
    return NULL;
  }
  if (i < 0 || i >= g->n) {
    clrt_set_error("json grammar: %s: node %d does not exist (%d nodes)", what, i, g->n);
    return NULL;
  }
  return &g->nodes[i];
}

int clrt_jschema_node(clrt_jschema *g, int kind, double lo, double hi, int flags) {
  if (!g || g->finished) {
    clrt_set_error("json grammar: node added to a %s grammar", g ? "finished" : "NULL");
    return -1;
  }
  if (kind < CLRT_JSCHEMA_ANY || kind > CLRT_JSCHEMA_ANYOF) {
    clrt_set_error("json grammar: unknown node kind %d", kind);
    return -1;
  }
  if (grow((void **)&g->nodes, &g->cap, g->n + 1, sizeof(node))) return -1;
  node *d = &g->nodes[g->n];
  memset(d, 0, sizeof *d);
  d->kind = kind;
  d->lo = lo;
  d->hi = hi;
  d->flags = flags;
  return g->n++;
}

int clrt_jschema_add_child(clrt_jschema *g, int at, int child) {
  node *d = get(g, at, "add_child");
  if (!d || !get(g, child, "add_child")) return -1;
  if (d->kind != CLRT_JSCHEMA_ARRAY && d->kind != CLRT_JSCHEMA_MAP && d->kind != CLRT_JSCHEMA_ANYOF) {
    clrt_set_error("json grammar: node %d (kind %d) takes no children", at, d->kind);
    return -1;
  }
  if (d->kind != CLRT_JSCHEMA_ANYOF && d->nkids == 1) {
    clrt_set_error("json grammar: node %d already has its child", at);
    return -1;
  }
  if (grow((void **)&d->kids, &d->capkids, d->nkids + 1, sizeof(int))) return -1;
  d->kids[d->nkids++] = child;
  return 0;
}

static int add_lit(node *d, const char *s, size_t len, int propi) {
  if (len == 0 || len > 1 << 20) {
    clrt_set_error("json grammar: literal of %zu bytes", len);
    return -1;
  }
  if (grow((void **)&d->lits, &d->caplits, d->nlits + 1, sizeof(lit))) return -1;
  char *c = malloc(len);
  if (!c) {
    clrt_set_error("json grammar: out of memory");
    return -1;
  }
  memcpy(c, s, len);
  d->lits[d->nlits++] = (lit){c, (int)len, propi};
  return 0;
}

int clrt_jschema_add_literal(clrt_jschema *g, int at, const char *json, size_t len) {
  node *d = get(g, at, "add_literal");
  if (!d) return -1;
  if (d->kind != CLRT_JSCHEMA_ENUM) {
    clrt_set_error("json grammar: node %d is not an enum", at);
    return -1;
  }
  return add_lit(d, json, len, -1);
}

int clrt_jschema_add_property(clrt_jschema *g, int at, const char *key_json, size_t len,
                           int child, int required) {
  node *d = get(g, at, "add_property");
  if (!d || !get(g, child, "add_property")) return -1;
  if (d->kind != CLRT_JSCHEMA_OBJECT) {
    clrt_set_error("json grammar: node %d is not an object", at);
    return -1;
  }
  if (len < 2 || key_json[0] != '"' || key_json[len - 1] != '"') {
    clrt_set_error("json grammar: property key of node %d is not a quoted JSON string", at);
    return -1;
  }
  for (int i = 0; i < d->nlits; i++)
    if (d->lits[i].len == (int)len && !memcmp(d->lits[i].s, key_json, len)) {
      clrt_set_error("json grammar: node %d has property %.*s twice", at, (int)len, key_json);
      return -1;
    }
  if (grow((void **)&d->props, &d->capprops, d->nprops + 1, sizeof(prop))) return -1;
  if (add_lit(d, key_json, len, d->nprops)) return -1;
  d->props[d->nprops++] = (prop){child, required != 0};
  return 0;
}

static int lit_cmp(const void *pa, const void *pb) {
  const lit *a = pa, *b = pb;
  int n = a->len < b->len ? a->len : b->len;
  int c = memcmp(a->s, b->s, (size_t)n);
  return c ? c : a->len - b->len;
}

static void set_bit(uint8_t *set, int b) { set[b >> 3] |= (uint8_t)(1 << (b & 7)); }
static int has_bit(const uint8_t *set, int b) { return set[b >> 3] >> (b & 7) & 1; }

/* First bytes of each node. mark: 0 new, 1 in progress, 2 done; an anyOf that reaches itself
   through alternatives alone has no first byte to decide on and is refused. */
static int first_set(clrt_jschema *g, int i, uint8_t *mark) {
  node *d = &g->nodes[i];
  if (mark[i] == 2) return 0;
  if (mark[i] == 1) {
    clrt_set_error("json schema: anyOf node %d is its own alternative", i);
    return -1;
  }
  mark[i] = 1;
  memset(d->first, 0, sizeof d->first);
  switch (d->kind) {
  case CLRT_JSCHEMA_STRING: set_bit(d->first, '"'); break;
  case CLRT_JSCHEMA_NUMBER:
  case CLRT_JSCHEMA_INTEGER:
    set_bit(d->first, '-');
    for (int c = '0'; c <= '9'; c++) set_bit(d->first, c);
    break;
  case CLRT_JSCHEMA_ENUM:
    for (int j = 0; j < d->nlits; j++) set_bit(d->first, (uint8_t)d->lits[j].s[0]);
    break;
  case CLRT_JSCHEMA_OBJECT:
  case CLRT_JSCHEMA_MAP: set_bit(d->first, '{'); break;
  case CLRT_JSCHEMA_ARRAY: set_bit(d->first, '['); break;
  case CLRT_JSCHEMA_ANYOF:
    for (int j = 0; j < d->nkids; j++) {
      if (first_set(g, d->kids[j], mark)) return -1;
      for (int b = 0; b < 32; b++) d->first[b] |= g->nodes[d->kids[j]].first[b];
    }
    break;
  }
  mark[i] = 2;
  return 0;
}

/* Nesting depth (frames) a value of node i needs; any-value counts 1 since it can always
   close where it is. memo: -1 new, -2 in progress (a cycle: a schema that contains itself). */
static int need_depth(clrt_jschema *g, int i, int *memo) {
  if (i == g->any_node) return 1;
  if (memo[i] >= 0) return memo[i];
  if (memo[i] == -2) return JSON_MAX_DEPTH + 1;
  memo[i] = -2;
  node *d = &g->nodes[i];
  int best = 0, self = 1;
  switch (d->kind) {
  case CLRT_JSCHEMA_OBJECT:
    for (int j = 0; j < d->nprops; j++) {
      int c = need_depth(g, d->props[j].child, memo);
      if (c > best) best = c;
    }
    break;
  case CLRT_JSCHEMA_MAP:
  case CLRT_JSCHEMA_ARRAY:
    best = need_depth(g, d->kids[0], memo);
    break;
  case CLRT_JSCHEMA_ANYOF:
    self = 0;
    for (int j = 0; j < d->nkids; j++) {
      int c = need_depth(g, d->kids[j], memo);
      if (c > best) best = c;
    }
    break;
  default: break;
  }
  best += self;
  if (best > JSON_MAX_DEPTH + 1) best = JSON_MAX_DEPTH + 1;
  memo[i] = best;
  return best;
}

static int step(clrt_jschema_state *s, int b);

/* Is s[0..len) exactly one value of node `root` (no surrounding whitespace)? */
static int is_json_text(const clrt_jschema *g, int root, const char *s, int len) {
  clrt_jschema_state st;
  memset(&st, 0, offsetof(clrt_jschema_state, f) + sizeof(frame));
  st.g = g;
  st.depth = 1;
  st.f[0].node = root;
  if (len == 0 || s[0] == ' ' || s[0] == '\n' || s[0] == '\t' || s[0] == '\r') return 0;
  for (int i = 0; i < len; i++)
    if (step(&st, (uint8_t)s[i])) return 0;
  return clrt_jschema_state_complete(&st);
}

static int hidden(clrt_jschema *g, int kind, double lo, double hi) {
  int i = clrt_jschema_node(g, kind, lo, hi, 0);
  return i;
}

int clrt_jschema_error_node(const clrt_jschema *g) { return g ? g->error_node : -1; }

/* Beyond 2^53 a double no longer holds every integer, so bounds there could not be exact. */
#define BOUND_MAX 9007199254740992.0

static int finish_nodes(clrt_jschema *g, int root);

int clrt_jschema_finish(clrt_jschema *g, int root) {
  if (!get(g, root, "finish")) return -1;
  g->error_node = -1;
  return finish_nodes(g, root);
}

static int finish_nodes(clrt_jschema *g, int root) {
  int user = g->n;
  /* any value = anyOf(object of anything, array of anything, string, number, bool, null) */
  int any = hidden(g, CLRT_JSCHEMA_ANYOF, 0, 0);
  int mp = hidden(g, CLRT_JSCHEMA_MAP, 0, 0);
  int arr = hidden(g, CLRT_JSCHEMA_ARRAY, 0, -1);
  int str = hidden(g, CLRT_JSCHEMA_STRING, 0, -1);
  int num = hidden(g, CLRT_JSCHEMA_NUMBER, 0, 0);
  int bl = hidden(g, CLRT_JSCHEMA_ENUM, 0, 0);
  int nl = hidden(g, CLRT_JSCHEMA_ENUM, 0, 0);
  if (nl < 0) return -1;
  g->any_node = any;
  g->key_node = str;
  if (clrt_jschema_add_child(g, mp, any) || clrt_jschema_add_child(g, arr, any) ||
      add_lit(&g->nodes[bl], "false", 5, -1) || add_lit(&g->nodes[bl], "true", 4, -1) ||
      add_lit(&g->nodes[nl], "null", 4, -1))
    return -1;
  int alts[6] = {mp, arr, str, num, bl, nl};
  for (int j = 0; j < 6; j++)
    if (clrt_jschema_add_child(g, any, alts[j])) return -1;
  for (int i = 0; i < user; i++) {
    node *d = &g->nodes[i];
    if (d->kind == CLRT_JSCHEMA_ANY) {   /* becomes an alias of the hidden any-value node */
      d->kind = CLRT_JSCHEMA_ANYOF;
      for (int j = 0; j < 6; j++)
        if (clrt_jschema_add_child(g, i, alts[j])) return -1;
    }
    if ((d->kind == CLRT_JSCHEMA_MAP || d->kind == CLRT_JSCHEMA_ARRAY) && d->nkids == 0)
      if (clrt_jschema_add_child(g, i, any)) return -1;
  }
  for (int i = 0; i < g->n; i++) {
    node *d = &g->nodes[i];
    switch (d->kind) {
    case CLRT_JSCHEMA_STRING:
    case CLRT_JSCHEMA_ARRAY: {
      const char *what = d->kind == CLRT_JSCHEMA_STRING ? "minLength/maxLength" : "minItems/maxItems";
      if (d->lo < 0 || d->lo > 1e9 || d->hi > 1e9 || (d->hi >= 0 && d->hi < d->lo)) {
        clrt_set_error("json schema: %s %g/%g cannot be met (node %d)", what, d->lo, d->hi, i);
        g->error_node = i;
        return -1;
      }
      break;
    }
    case CLRT_JSCHEMA_NUMBER:
    case CLRT_JSCHEMA_INTEGER:
      if ((d->flags & CLRT_JSCHEMA_HAS_MIN) && (d->flags & CLRT_JSCHEMA_HAS_MAX) &&
          (d->hi < d->lo || (d->hi == d->lo && (d->flags & (CLRT_JSCHEMA_EXCL_MIN | CLRT_JSCHEMA_EXCL_MAX))))) {
        clrt_set_error("json schema: minimum %g above maximum %g (node %d)", d->lo, d->hi, i);
        g->error_node = i;
        return -1;
      }
      if ((d->flags & (CLRT_JSCHEMA_HAS_MIN | CLRT_JSCHEMA_HAS_MAX)) &&
          ((d->flags & CLRT_JSCHEMA_HAS_MIN && !(fabs(d->lo) <= BOUND_MAX)) ||
           (d->flags & CLRT_JSCHEMA_HAS_MAX && !(fabs(d->hi) <= BOUND_MAX)))) {
        clrt_set_error("json schema: number bounds beyond +-2^53 (9007199254740992) are not supported (node %d)", i);
        g->error_node = i;
        return -1;
      }
      if (d->kind == CLRT_JSCHEMA_INTEGER && (d->flags & CLRT_JSCHEMA_HAS_MIN) && (d->flags & CLRT_JSCHEMA_HAS_MAX)) {
        double a = d->lo, b = d->hi;
        long long lo = (long long)a, hi = (long long)b;
        if ((double)lo < a || ((d->flags & CLRT_JSCHEMA_EXCL_MIN) && (double)lo == a)) lo++;
        if ((double)hi > b || ((d->flags & CLRT_JSCHEMA_EXCL_MAX) && (double)hi == b)) hi--;
        if (hi < lo) {
          clrt_set_error("json schema: no integer lies between minimum %g and maximum %g (node %d)", a, b, i);
          g->error_node = i;
          return -1;
        }
      }
      if (d->kind == CLRT_JSCHEMA_INTEGER) {   /* exact integer bounds: compared without rounding */
        d->ilo = (long long)ceil(d->lo);
        if ((d->flags & CLRT_JSCHEMA_EXCL_MIN) && (double)d->ilo == d->lo) d->ilo++;
        d->ihi = (long long)floor(d->hi);
        if ((d->flags & CLRT_JSCHEMA_EXCL_MAX) && (double)d->ihi == d->hi) d->ihi--;
      }
      break;
    case CLRT_JSCHEMA_ENUM:
      if (d->nlits == 0) {
        clrt_set_error("json schema: enum with no values (node %d)", i);
        g->error_node = i;
        return -1;
      }
      qsort(d->lits, (size_t)d->nlits, sizeof(lit), lit_cmp);
      {   /* drop duplicates so the literal a prefix ends is unique */
        int w = 1;
        for (int j = 1; j < d->nlits; j++) {
          if (lit_cmp(&d->lits[j], &d->lits[w - 1]) == 0) free(d->lits[j].s);
          else d->lits[w++] = d->lits[j];
        }
        d->nlits = w;
      }
      break;
    case CLRT_JSCHEMA_OBJECT:
      if (d->nlits > 1) qsort(d->lits, (size_t)d->nlits, sizeof(lit), lit_cmp);
      d->req_after = malloc(sizeof(int) * (size_t)(d->nprops + 1));
      if (!d->req_after) {
        clrt_set_error("json grammar: out of memory");
        return -1;
      }
      d->req_after[d->nprops] = d->nprops;
      for (int j = d->nprops - 1; j >= 0; j--) d->req_after[j] = d->props[j].required ? j : d->req_after[j + 1];
      break;
    case CLRT_JSCHEMA_ANYOF:
      if (d->nkids == 0) {
        clrt_set_error("json schema: anyOf with no alternatives (node %d)", i);
        g->error_node = i;
        return -1;
      }
      break;
    }
  }
  uint8_t *mark = calloc((size_t)g->n, 1);
  int *memo = malloc(sizeof(int) * (size_t)g->n);
  if (!mark || !memo) {
    free(mark);
    free(memo);
    clrt_set_error("json grammar: out of memory");
    return -1;
  }
  int bad = 0;
  for (int i = 0; i < g->n && !bad; i++) bad = first_set(g, i, mark);
  for (int i = 0; i < g->n; i++) memo[i] = -1;
  int depth = bad ? 0 : need_depth(g, root, memo);
  free(mark);
  free(memo);
  if (bad) return -1;
  for (int i = 0; i < g->n; i++) {
    node *d = &g->nodes[i];
    if (d->kind != CLRT_JSCHEMA_ANYOF) continue;
    for (int x = 0; x < d->nkids; x++)
      for (int y = x + 1; y < d->nkids; y++)
        for (int b = 0; b < 256; b++)
          if (has_bit(g->nodes[d->kids[x]].first, b) && has_bit(g->nodes[d->kids[y]].first, b)) {
            clrt_set_error("json schema: anyOf alternatives %d and %d can both start with '%c' "
                           "(alternatives of the same JSON type are not supported)", x, y, b);
            g->error_node = i;
            return -1;
          }
  }
  /* literals and keys must be JSON texts themselves, or a row could enter one and never leave */
  for (int i = 0; i < g->n; i++) {
    node *d = &g->nodes[i];
    for (int j = 0; j < d->nlits; j++)
      if (!is_json_text(g, d->kind == CLRT_JSCHEMA_OBJECT ? g->key_node : g->any_node, d->lits[j].s, d->lits[j].len)) {
        clrt_set_error("json schema: %s %d of node %d is not a JSON %s: %.*s", d->kind == CLRT_JSCHEMA_OBJECT ? "key" : "literal",
                       j, i, d->kind == CLRT_JSCHEMA_OBJECT ? "string" : "value", d->lits[j].len > 40 ? 40 : d->lits[j].len, d->lits[j].s);
        g->error_node = i;
        return -1;
      }
  }
  if (depth > JSON_MAX_DEPTH) {
    clrt_set_error("json schema: nests deeper than %d levels (or refers to itself)", JSON_MAX_DEPTH);
    g->error_node = root;
    return -1;
  }
  g->cache = malloc(sizeof(struct numcache) * NUMCACHE);
  if (!g->cache) {
    clrt_set_error("json grammar: out of memory");
    return -1;
  }
  for (int i = 0; i < NUMCACHE; i++) g->cache[i].node = -1;
  g->root = root;
  g->finished = 1;
  return 0;
}

/* ---- automaton ---------------------------------------------------------------------------- */

clrt_jschema_state *clrt_jschema_state_new(const clrt_jschema *g) {
  if (!g || !g->finished) {
    clrt_set_error("json state: the grammar is %s", g ? "not finished" : "NULL");
    return NULL;
  }
  clrt_jschema_state *s = calloc(1, sizeof *s);
  if (!s) {
    clrt_set_error("json state: out of memory");
    return NULL;
  }
  s->g = g;
  s->depth = 1;
  s->f[0].node = g->root;
  return s;
}

void clrt_jschema_state_free(clrt_jschema_state *s) { free(s); }

/* Only the live frames are copied: the trie walk clones a state per visited node. */
void clrt_jschema_state_copy(clrt_jschema_state *dst, const clrt_jschema_state *src) {
  memcpy(dst, src, offsetof(clrt_jschema_state, f) + sizeof(frame) * (size_t)src->depth);
}

/* The only whitespace ever written: one space or newline per gap (\t and \r never pass). */
static int is_ws(int b) { return b == ' ' || b == '\n'; }
static int hexval(int b) {
  if (b >= '0' && b <= '9') return b - '0';
  if (b >= 'a' && b <= 'f') return b - 'a' + 10;
  if (b >= 'A' && b <= 'F') return b - 'A' + 10;
  return -1;
}

/* ---- numbers: grammar and bounds ---- */

static int num_next(int ph, int b, int integer, int bounded) {
  int digit = b >= '0' && b <= '9';
  switch (ph) {
  case P_START: return b == '-' ? N_MINUS : b == '0' ? N_ZERO : digit ? N_INT : -1;
  case N_MINUS: return b == '0' ? (integer ? -1 : N_ZERO) : digit ? N_INT : -1;
  case N_ZERO:
  case N_INT:
    if (ph == N_INT && digit) return N_INT;
    if (integer) return -1;
    if (b == '.') return N_DOT;
    if ((b == 'e' || b == 'E') && !bounded) return N_EXP;
    return -1;
  case N_DOT: return digit ? N_FRAC : -1;
  case N_FRAC:
    if (digit) return N_FRAC;
    return (b == 'e' || b == 'E') && !bounded ? N_EXP : -1;
  case N_EXP: return b == '+' || b == '-' ? N_EXPSIGN : digit ? N_EXPD : -1;
  case N_EXPSIGN:
  case N_EXPD: return digit ? N_EXPD : -1;
  }
  return -1;
}

static int num_can_end(int ph) { return ph == N_ZERO || ph == N_INT || ph == N_FRAC || ph == N_EXPD; }

static int in_bounds(const node *d, double v) {
  if (d->flags & CLRT_JSCHEMA_HAS_MIN) {
    if (v < d->lo || ((d->flags & CLRT_JSCHEMA_EXCL_MIN) && v == d->lo)) return 0;
  }
  if (d->flags & CLRT_JSCHEMA_HAS_MAX) {
    if (v > d->hi || ((d->flags & CLRT_JSCHEMA_EXCL_MAX) && v == d->hi)) return 0;
  }
  return 1;
}

/* The value of a complete number text in bounds: integers exactly (no double rounding near
   2^53), other numbers by strtod. */
static int text_in_bounds(const node *d, const char *s, int len) {
  if (d->kind != CLRT_JSCHEMA_INTEGER) {
    char buf[NUM_CAP + 1];
    memcpy(buf, s, (size_t)len);
    buf[len] = 0;
    return in_bounds(d, strtod(buf, NULL));
  }
  int neg = s[0] == '-';
  if (len - neg > 17) {   /* beyond 1e17 > 2^53 >= |every bound| */
    if (neg) return !(d->flags & CLRT_JSCHEMA_HAS_MIN);
    return !(d->flags & CLRT_JSCHEMA_HAS_MAX);
  }
  long long v = 0;
  for (int i = neg; i < len; i++) v = v * 10 + (s[i] - '0');
  if (neg) v = -v;
  if ((d->flags & CLRT_JSCHEMA_HAS_MIN) && v < d->ilo) return 0;
  if ((d->flags & CLRT_JSCHEMA_HAS_MAX) && v > d->ihi) return 0;
  return 1;
}

/* A complete number text (grammatical, within the length cap) whose value is in bounds. */
static int num_ok(const node *d, const char *s, int len) {
  if (len > NUM_CAP) return 0;
  int ph = P_START, integer = d->kind == CLRT_JSCHEMA_INTEGER;
  for (int i = 0; i < len; i++)
    if ((ph = num_next(ph, (uint8_t)s[i], integer, 1)) < 0) return 0;
  if (!num_can_end(ph)) return 0;
  return text_in_bounds(d, s, len);
}

static int try_suffix(const node *d, const char *t, int tl, const char *suf, int sl) {
  char buf[2 * NUM_CAP + 2];
  if (tl + sl > NUM_CAP) return 0;
  memcpy(buf, t, (size_t)tl);
  memcpy(buf + tl, suf, (size_t)sl);
  return num_ok(d, buf, tl + sl);
}

static int try_repr(const node *d, const char *t, int tl, double v) {
  char buf[64];
  for (int prec = 1; prec <= 17; prec++) {   /* shortest round trip, then longer spellings */
    int n = snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (n <= 0 || n > NUM_CAP || strchr(buf, 'e')) continue;
    if (n >= tl && !memcmp(buf, t, (size_t)tl) && num_ok(d, buf, n)) return 1;
  }
  int n = snprintf(buf, sizeof buf, "%.*f", 6, v);   /* and a fixed spelling */
  return n > 0 && n <= NUM_CAP && n >= tl && !memcmp(buf, t, (size_t)tl) && num_ok(d, buf, n);
}

/* Does some completion of the number prefix t lie in bounds? Values reachable from t form
   runs (t followed by j digits: [t*10^j, (t+1)*10^j) for integers, and decimal intervals
   after a point); a run meets [lo, hi] iff one of its ends is in bounds or a bound lies in it,
   and a bound lies in it iff a spelling of the bound extends t. So the candidates below are
   the ends of every run and the spellings of the bounds, each checked exactly by strtod. */
static int num_viable(const node *d, const char *t, int tl) {
  if (!(d->flags & (CLRT_JSCHEMA_HAS_MIN | CLRT_JSCHEMA_HAS_MAX))) {
    /* one more digit completes any prefix, if it fits */
    int ph = P_START;
    for (int i = 0; i < tl; i++) ph = num_next(ph, (uint8_t)t[i], d->kind == CLRT_JSCHEMA_INTEGER, 0);
    return num_can_end(ph) || tl < NUM_CAP;
  }
  char suf[NUM_CAP + 2];
  int room = NUM_CAP - tl;
  if (num_ok(d, t, tl)) return 1;
  int integer = d->kind == CLRT_JSCHEMA_INTEGER;
  for (int j = 1; j <= room; j++) {
    const char fills[2] = {'0', '9'};
    for (int f = 0; f < 2; f++) {
      memset(suf, fills[f], (size_t)j);
      if (try_suffix(d, t, tl, suf, j)) return 1;
    }
    suf[0] = '1';
    memset(suf + 1, '0', (size_t)(j - 1));
    if (try_suffix(d, t, tl, suf, j)) return 1;
    memset(suf, '0', (size_t)(j - 1));
    suf[j - 1] = '1';
    if (try_suffix(d, t, tl, suf, j)) return 1;
    if (!integer && j >= 2) {        /* "." then a run: for prefixes that end in digits */
      suf[0] = '.';
      for (int f = 0; f < 2; f++) {
        memset(suf + 1, fills[f], (size_t)(j - 1));
        if (try_suffix(d, t, tl, suf, j)) return 1;
      }
      memset(suf + 1, '0', (size_t)(j - 1));
      suf[j - 1] = '1';
      if (try_suffix(d, t, tl, suf, j)) return 1;
    }
  }
  if (integer) {   /* the integers nearest the bounds */
    if ((d->flags & CLRT_JSCHEMA_HAS_MIN) && (try_repr(d, t, tl, ceil(d->lo)) || try_repr(d, t, tl, ceil(d->lo) + 1)))
      return 1;
    if ((d->flags & CLRT_JSCHEMA_HAS_MAX) && (try_repr(d, t, tl, floor(d->hi)) || try_repr(d, t, tl, floor(d->hi) - 1)))
      return 1;
  }
  if ((d->flags & CLRT_JSCHEMA_HAS_MIN) && try_repr(d, t, tl, d->lo)) return 1;
  if ((d->flags & CLRT_JSCHEMA_HAS_MAX) && try_repr(d, t, tl, d->hi)) return 1;
  if ((d->flags & CLRT_JSCHEMA_HAS_MIN) && (d->flags & CLRT_JSCHEMA_HAS_MAX) && try_repr(d, t, tl, 0.5 * (d->lo + d->hi)))
    return 1;
  return 0;
}

static int cached_viable(const clrt_jschema *g, int nodei, const char *t, int tl) {
  const node *d = &g->nodes[nodei];
  if (!(d->flags & (CLRT_JSCHEMA_HAS_MIN | CLRT_JSCHEMA_HAS_MAX))) return num_viable(d, t, tl);
  uint32_t h = 2166136261u ^ (uint32_t)nodei;
  for (int i = 0; i < tl; i++) h = (h ^ (uint8_t)t[i]) * 16777619u;
  struct numcache *e = &g->cache[h % NUMCACHE];
  if (e->node == nodei && e->len == tl && !memcmp(e->text, t, (size_t)tl)) return e->viable;
  int r = num_viable(d, t, tl);
  e->node = nodei;
  e->len = (uint8_t)tl;
  e->viable = (uint8_t)r;
  memcpy(e->text, t, (size_t)tl);
  return r;
}

/* ---- one byte ---- */

enum { R_REJECT = -1, R_OK = 0, R_AGAIN = 1, R_WS = 2 };

static int gap_ws(clrt_jschema_state *s, int b) {
  if (!is_ws(b)) return 0;
  return s->ws < s->g->max_ws ? R_WS : R_REJECT;
}

static int push(clrt_jschema_state *s, int nodei, int ph) {
  if (s->depth >= JSON_MAX_DEPTH) return -1;
  frame *f = &s->f[s->depth++];
  memset(f, 0, sizeof *f);
  f->node = nodei;
  f->ph = (uint8_t)ph;
  if (ph == S_BODY) f->n = 0;
  return 0;
}

/* The enum literal range [lo, hi) narrowed to those with byte b at pos; 0 if none remain.
   allow(): for object keys, only properties that may come next count. */
static int narrow(const node *d, frame *f, int b, int klo, int khi) {
  int lo = f->n, hi = f->m, pos = f->k, first = -1, last = -1, allowed = 0;
  for (int i = lo; i < hi; i++) {
    const lit *l = &d->lits[i];
    if (l->len > pos && (uint8_t)l->s[pos] == b) {
      if (first < 0) first = i;
      last = i;
      if (l->prop < 0 || (l->prop >= klo && l->prop <= khi)) allowed = 1;
    }
  }
  if (first < 0 || !allowed) return 0;
  f->n = first;
  f->m = last + 1;
  f->k = pos + 1;
  return 1;
}

static int utf8_lead(frame *f, int b) {
  if (b >= 0xC2 && b <= 0xDF) { f->a = 1; f->b = 0x80; f->c = 0xBF; }
  else if (b == 0xE0) { f->a = 2; f->b = 0xA0; f->c = 0xBF; }
  else if (b == 0xED) { f->a = 2; f->b = 0x80; f->c = 0x9F; }   /* no surrogates */
  else if (b >= 0xE1 && b <= 0xEF) { f->a = 2; f->b = 0x80; f->c = 0xBF; }
  else if (b == 0xF0) { f->a = 3; f->b = 0x90; f->c = 0xBF; }
  else if (b >= 0xF1 && b <= 0xF3) { f->a = 3; f->b = 0x80; f->c = 0xBF; }
  else if (b == 0xF4) { f->a = 3; f->b = 0x80; f->c = 0x8F; }
  else return 0;
  return 1;
}

static int step_string(const node *d, frame *f, int b) {
  int room = d->hi < 0 || f->n < (int)d->hi;
  switch (f->ph) {
  case S_BODY:
    if (f->a) {
      if (b < f->b || b > f->c) return R_REJECT;
      f->b = 0x80;
      f->c = 0xBF;
      if (--f->a == 0) f->n++;
      return R_OK;
    }
    if (b == '"') return f->n >= (int)d->lo ? 3 /* close */ : R_REJECT;
    if (!room) return R_REJECT;
    if (b == '\\') { f->ph = S_ESC; return R_OK; }
    if (b < 0x20) return R_REJECT;
    if (b < 0x80) { f->n++; return R_OK; }
    return utf8_lead(f, b) ? R_OK : R_REJECT;
  case S_ESC:
    if (b && strchr("\"\\/bfnrt", b)) { f->ph = S_BODY; f->n++; return R_OK; }
    if (b == 'u') { f->ph = S_UHEX; f->k = 0; f->m = 0; return R_OK; }
    return R_REJECT;
  case S_UHEX: {
    int h = hexval(b);
    if (h < 0) return R_REJECT;
    f->m = f->m * 16 + h;
    f->k++;
    if (f->k == 2 && (f->m >> 4) == 0xD && (f->m & 0xF) >= 0xC) return R_REJECT;   /* lone low surrogate */
    if (f->k == 4) {
      if (f->m >= 0xD800 && f->m <= 0xDBFF) f->ph = S_LOW_BS;
      else { f->ph = S_BODY; f->n++; }
    }
    return R_OK;
  }
  case S_LOW_BS: if (b != '\\') return R_REJECT; f->ph = S_LOW_U; return R_OK;
  case S_LOW_U: if (b != 'u') return R_REJECT; f->ph = S_LOW_HEX; f->k = 0; return R_OK;
  case S_LOW_HEX: {
    int h = hexval(b);
    if (h < 0 || (f->k == 0 && h != 0xD) || (f->k == 1 && h < 0xC)) return R_REJECT;
    if (++f->k == 4) { f->ph = S_BODY; f->n++; }
    return R_OK;
  }
  }
  return R_REJECT;
}

static int frame_ends_number(const clrt_jschema_state *s, const node *d, const frame *f) {
  if (!num_can_end(f->ph)) return 0;
  return text_in_bounds(d, s->num, s->numlen);
}

static int enum_can_end(const node *d, const frame *f) {
  return f->k > 0 && d->lits[f->n].len == f->k;
}

static int frame_step(clrt_jschema_state *s, int b) {
  const clrt_jschema *g = s->g;
  frame *f = &s->f[s->depth - 1];
  const node *d = &g->nodes[f->node];
  int r;
  switch (d->kind) {
  case CLRT_JSCHEMA_STRING:
    if (f->ph == P_START) {
      if ((r = gap_ws(s, b))) return r;
      if (b != '"') return R_REJECT;
      f->ph = S_BODY;
      f->n = 0;
      return R_OK;
    }
    r = step_string(d, f, b);
    if (r == 3) { s->depth--; return R_OK; }
    return r;
  case CLRT_JSCHEMA_NUMBER:
  case CLRT_JSCHEMA_INTEGER: {
    if (f->ph == P_START) {
      if ((r = gap_ws(s, b))) return r;
      s->numlen = 0;
    }
    int bounded = (d->flags & (CLRT_JSCHEMA_HAS_MIN | CLRT_JSCHEMA_HAS_MAX)) != 0;
    int nph = num_next(f->ph, b, d->kind == CLRT_JSCHEMA_INTEGER, bounded);
    if (nph >= 0 && s->numlen < NUM_CAP) {
      s->num[s->numlen] = (char)b;
      if (cached_viable(g, f->node, s->num, s->numlen + 1)) {
        s->numlen++;
        f->ph = (uint8_t)nph;
        return R_OK;
      }
    }
    if (f->ph != P_START && frame_ends_number(s, d, f)) { s->depth--; return R_AGAIN; }
    return R_REJECT;
  }
  case CLRT_JSCHEMA_ENUM:
    if (f->ph == P_START) {
      if ((r = gap_ws(s, b))) return r;
      f->ph = 1;
      f->n = 0;
      f->m = d->nlits;
      f->k = 0;
    }
    if (narrow(d, f, b, 0, 0)) {
      if (f->m - f->n == 1 && d->lits[f->n].len == f->k) s->depth--;   /* nothing can follow */
      return R_OK;
    }
    if (enum_can_end(d, f)) { s->depth--; return R_AGAIN; }
    return R_REJECT;
  case CLRT_JSCHEMA_ANYOF:
    if ((r = gap_ws(s, b))) return r;
    for (int j = 0; j < d->nkids; j++)
      if (has_bit(g->nodes[d->kids[j]].first, b)) {
        memset(f, 0, sizeof *f);
        f->node = d->kids[j];
        return R_AGAIN;
      }
    return R_REJECT;
  case CLRT_JSCHEMA_ARRAY: {
    int room = s->depth < JSON_MAX_DEPTH;
    switch (f->ph) {
    case P_START:
      if ((r = gap_ws(s, b))) return r;
      if (b != '[') return R_REJECT;
      f->ph = C_OPEN;
      f->n = 0;
      return R_OK;
    case C_OPEN:
    case C_COMMA:
      if ((r = gap_ws(s, b))) return r;
      if (f->ph == C_OPEN && b == ']') {
        if (d->lo > 0) return R_REJECT;
        s->depth--;
        return R_OK;
      }
      if (!room || (d->hi >= 0 && f->n >= (int)d->hi)) return R_REJECT;
      f->ph = C_AFTER;
      f->n++;
      push(s, d->kids[0], P_START);
      return R_AGAIN;
    case C_AFTER:
      if ((r = gap_ws(s, b))) return r;
      if (b == ']' && f->n >= (int)d->lo) { s->depth--; return R_OK; }
      if (b == ',' && room && (d->hi < 0 || f->n < (int)d->hi)) { f->ph = C_COMMA; return R_OK; }
      return R_REJECT;
    }
    return R_REJECT;
  }
  case CLRT_JSCHEMA_MAP: {
    int room = s->depth < JSON_MAX_DEPTH;
    switch (f->ph) {
    case P_START:
      if ((r = gap_ws(s, b))) return r;
      if (b != '{') return R_REJECT;
      f->ph = C_OPEN;
      return R_OK;
    case C_OPEN:
    case C_COMMA:
      if ((r = gap_ws(s, b))) return r;
      if (f->ph == C_OPEN && b == '}') { s->depth--; return R_OK; }
      if (b != '"' || !room) return R_REJECT;
      f->ph = C_COLON;
      push(s, g->key_node, S_BODY);
      return R_OK;
    case C_COLON:
      if ((r = gap_ws(s, b))) return r;
      if (b != ':') return R_REJECT;
      f->ph = C_AFTER;
      push(s, d->kids[0], P_START);
      return R_OK;
    case C_AFTER:
      if ((r = gap_ws(s, b))) return r;
      if (b == '}') { s->depth--; return R_OK; }
      if (b == ',' && room) { f->ph = C_COMMA; return R_OK; }
      return R_REJECT;
    }
    return R_REJECT;
  }
  case CLRT_JSCHEMA_OBJECT: {
    /* f->p: the next property index that may appear; keys later than the first required
       one at or after it cannot come yet. */
    int next = f->p, req = d->req_after[next];
    int can_close = req >= d->nprops;
    int last_ok = req < d->nprops ? req : d->nprops - 1;
    switch (f->ph) {
    case P_START:
      if ((r = gap_ws(s, b))) return r;
      if (b != '{') return R_REJECT;
      f->ph = C_OPEN;
      f->p = 0;
      return R_OK;
    case C_OPEN:
    case C_COMMA:
      if ((r = gap_ws(s, b))) return r;
      if (f->ph == C_OPEN && b == '}') {
        if (!can_close) return R_REJECT;
        s->depth--;
        return R_OK;
      }
      if (b != '"' || next >= d->nprops) return R_REJECT;
      f->ph = C_KEY;
      f->n = 0;
      f->m = d->nlits;
      f->k = 0;
      return narrow(d, f, b, next, last_ok) ? R_OK : R_REJECT;
    case C_KEY:
      if (!narrow(d, f, b, next, last_ok)) return R_REJECT;
      if (b == '"') {   /* a key is complete when its closing quote matched */
        for (int i = f->n; i < f->m; i++)
          if (d->lits[i].len == f->k) {
            f->p = d->lits[i].prop;
            f->ph = C_COLON;
            return R_OK;
          }
      }
      return R_OK;
    case C_COLON:
      if ((r = gap_ws(s, b))) return r;
      if (b != ':') return R_REJECT;
      if (s->depth >= JSON_MAX_DEPTH) return R_REJECT;
      f->ph = C_AFTER;
      {
        int child = d->props[f->p].child;
        f->p++;
        push(s, child, P_START);
      }
      return R_OK;
    case C_AFTER:
      if ((r = gap_ws(s, b))) return r;
      if (b == '}' && can_close) { s->depth--; return R_OK; }
      if (b == ',' && next < d->nprops) { f->ph = C_COMMA; return R_OK; }
      return R_REJECT;
    }
    return R_REJECT;
  }
  }
  return R_REJECT;
}

static int step(clrt_jschema_state *s, int b) {
  for (int guard = 0; guard < 4 * JSON_MAX_DEPTH; guard++) {
    if (s->depth == 0) return -1;
    int r = frame_step(s, b);
    if (r == R_REJECT) return -1;
    if (r == R_OK) { s->ws = 0; return 0; }
    if (r == R_WS) { s->ws++; return 0; }
  }
  return -1;
}

int clrt_jschema_state_advance(clrt_jschema_state *s, const uint8_t *bytes, size_t len) {
  clrt_jschema_state t;
  clrt_jschema_state_copy(&t, s);
  for (size_t i = 0; i < len; i++)
    if (step(&t, bytes[i])) {
      clrt_set_error("json state: byte %zu (0x%02x) of %zu leaves the grammar", i, bytes[i], len);
      return -1;
    }
  clrt_jschema_state_copy(s, &t);
  return 0;
}

int clrt_jschema_state_complete(const clrt_jschema_state *s) {
  if (s->depth == 0) return 1;
  if (s->depth > 1) return 0;
  const frame *f = &s->f[0];
  const node *d = &s->g->nodes[f->node];
  if (d->kind == CLRT_JSCHEMA_NUMBER || d->kind == CLRT_JSCHEMA_INTEGER)
    return f->ph != P_START && frame_ends_number(s, d, f);
  if (d->kind == CLRT_JSCHEMA_ENUM) return f->ph != P_START && enum_can_end(d, f);
  return 0;
}

/* ---- vocabulary trie ---------------------------------------------------------------------- */

typedef struct {
  int32_t child0;                     /* children are contiguous: [child0, child0 + nchild) */
  int32_t sub0, sub1;                 /* the subtree's tokens: sorted[sub0, sub1) */
  int32_t nend;                       /* tokens ending here: sorted[sub0, sub0 + nend) */
  int32_t maxchars;                   /* plain subtrees: most code points in one token */
  uint16_t nchild;
  uint8_t byte;
  uint8_t plain;                      /* every token below is plain string text */
} tnode;

struct clrt_jschema_vocab {
  int V, ntok, maxlen;
  const uint8_t *bytes;               /* a private copy */
  int64_t *off;                       /* [V + 1] */
  int32_t *sorted;                    /* token ids with bytes, sorted by bytes */
  tnode *nodes;
  int nnodes, capnodes;
  clrt_jschema_state *scratch;           /* [maxlen + 1] states for the walk */
  uint8_t *plain_mask;                /* [V] tokens of plain string text */
  int nplain;
};

static const uint8_t *tok_bytes(const clrt_jschema_vocab *v, int id, int *len) {
  *len = (int)(v->off[id + 1] - v->off[id]);
  return v->bytes + v->off[id];
}

static const clrt_jschema_vocab *sort_vocab;
static int tok_cmp(const void *pa, const void *pb) {
  int la, lb;
  const uint8_t *a = tok_bytes(sort_vocab, *(const int32_t *)pa, &la);
  const uint8_t *b = tok_bytes(sort_vocab, *(const int32_t *)pb, &lb);
  int c = memcmp(a, b, (size_t)(la < lb ? la : lb));
  if (c) return c;
  if (la != lb) return la - lb;
  return *(const int32_t *)pa - *(const int32_t *)pb;
}

/* Plain string text: no quote, backslash or control byte, and whole UTF-8 characters; a token
   like that is accepted inside any string with room for its code points. -1 if not plain. */
static int plain_chars(const uint8_t *s, int len) {
  frame f;
  memset(&f, 0, sizeof f);
  int n = 0;
  for (int i = 0; i < len; i++) {
    int b = s[i];
    if (f.a) {
      if (b < f.b || b > f.c) return -1;
      f.b = 0x80;
      f.c = 0xBF;
      if (--f.a == 0) n++;
    } else if (b == '"' || b == '\\' || b < 0x20) {
      return -1;
    } else if (b < 0x80) {
      n++;
    } else if (!utf8_lead(&f, b)) {
      return -1;
    }
  }
  return f.a ? -1 : n;
}

static int new_nodes(clrt_jschema_vocab *v, int k) {
  if (grow((void **)&v->nodes, &v->capnodes, v->nnodes + k, sizeof(tnode))) return -1;
  memset(v->nodes + v->nnodes, 0, sizeof(tnode) * (size_t)k);
  v->nnodes += k;
  return v->nnodes - k;
}

/* Node ni covers sorted[lo, hi), which share their first `depth` bytes. */
static int build(clrt_jschema_vocab *v, int ni, int lo, int hi, int depth, const int32_t *chars) {
  int i = lo, len;
  while (i < hi && (tok_bytes(v, v->sorted[i], &len), len == depth)) i++;
  int plain = 1, maxc = 0;
  for (int j = lo; j < i; j++) {
    int c = chars[v->sorted[j]];
    if (c < 0) plain = 0;
    else if (c > maxc) maxc = c;
  }
  int groups = 0, prev = -1;
  for (int j = i; j < hi; j++) {
    int b = tok_bytes(v, v->sorted[j], &len)[depth];
    if (b != prev) groups++, prev = b;
  }
  int c0 = groups ? new_nodes(v, groups) : 0;
  if (c0 < 0) return -1;
  tnode *t = &v->nodes[ni];
  t->sub0 = lo;
  t->sub1 = hi;
  t->nend = i - lo;
  t->child0 = c0;
  t->nchild = (uint16_t)groups;
  int g = 0;
  for (int j = i; j < hi;) {
    int b = tok_bytes(v, v->sorted[j], &len)[depth], e = j;
    while (e < hi && tok_bytes(v, v->sorted[e], &len)[depth] == b) e++;
    v->nodes[c0 + g].byte = (uint8_t)b;
    if (build(v, c0 + g, j, e, depth + 1, chars)) return -1;
    if (!v->nodes[c0 + g].plain) plain = 0;
    else if (v->nodes[c0 + g].maxchars > maxc) maxc = v->nodes[c0 + g].maxchars;
    g++;
    j = e;
  }
  v->nodes[ni].plain = (uint8_t)plain;
  v->nodes[ni].maxchars = maxc;
  return 0;
}

clrt_jschema_vocab *clrt_jschema_vocab_new(const uint8_t *bytes, const int64_t *offsets, int V) {
  if (V <= 0 || !offsets || offsets[0] != 0) {
    clrt_set_error("json vocab: bad arguments (V %d, offsets %s)", V, offsets ? "not starting at 0" : "NULL");
    return NULL;
  }
  for (int i = 0; i < V; i++)
    if (offsets[i + 1] < offsets[i] || offsets[i + 1] - offsets[i] > 4096) {
      clrt_set_error("json vocab: token %d has offsets %lld..%lld", i, (long long)offsets[i], (long long)offsets[i + 1]);
      return NULL;
    }
  clrt_jschema_vocab *v = calloc(1, sizeof *v);
  int32_t *chars = NULL;
  if (!v) goto oom;
  v->V = V;
  size_t total = (size_t)offsets[V];
  uint8_t *copy = malloc(total ? total : 1);
  v->off = malloc(sizeof(int64_t) * (size_t)(V + 1));
  v->sorted = malloc(sizeof(int32_t) * (size_t)V);
  chars = malloc(sizeof(int32_t) * (size_t)V);
  v->plain_mask = calloc((size_t)V, 1);
  v->bytes = copy;
  if (!copy || !v->off || !v->sorted || !chars || !v->plain_mask) goto oom;
  if (total) memcpy(copy, bytes, total);
  memcpy(v->off, offsets, sizeof(int64_t) * (size_t)(V + 1));
  for (int i = 0; i < V; i++) {
    int len;
    const uint8_t *s = tok_bytes(v, i, &len);
    if (len == 0) continue;
    v->sorted[v->ntok++] = i;
    chars[i] = plain_chars(s, len);
    if (chars[i] >= 0) v->plain_mask[i] = 1, v->nplain++;
    if (len > v->maxlen) v->maxlen = len;
  }
  sort_vocab = v;
  qsort(v->sorted, (size_t)v->ntok, sizeof(int32_t), tok_cmp);
  sort_vocab = NULL;
  if (new_nodes(v, 1) < 0 || build(v, 0, 0, v->ntok, 0, chars)) goto fail;
  v->scratch = malloc(sizeof(clrt_jschema_state) * (size_t)(v->maxlen + 1));
  if (!v->scratch) goto oom;
  free(chars);
  return v;
oom:
  clrt_set_error("json vocab: out of memory for %d tokens", V);
fail:
  free(chars);
  clrt_jschema_vocab_free(v);
  return NULL;
}

void clrt_jschema_vocab_free(clrt_jschema_vocab *v) {
  if (!v) return;
  free((void *)v->bytes);
  free(v->off);
  free(v->sorted);
  free(v->nodes);
  free(v->scratch);
  free(v->plain_mask);
  free(v);
}

int clrt_jschema_vocab_size(const clrt_jschema_vocab *v) { return v ? v->V : 0; }

typedef struct {
  clrt_jschema_vocab *v;
  uint8_t *mask;
  int prune;                          /* start state is plain string text ... */
  int have_plain;                     /* ... and every plain token is already in the mask */
  int64_t room;                       /* ... with room for this many more code points */
  int count;
} walk_ctx;

static void mark_range(walk_ctx *w, int a, int b) {
  for (int i = a; i < b; i++) {
    int id = w->v->sorted[i];
    w->count += !w->mask[id];
    w->mask[id] = 1;
  }
}

/* Depth-first over the trie: scratch[level] is the state after this node's bytes. Subtrees
   of plain text inside a string are taken whole without stepping through them. */
static void walk(walk_ctx *w, int ni, int level) {
  const tnode *t = &w->v->nodes[ni];
  for (int c = 0; c < t->nchild; c++) {
    const tnode *ch = &w->v->nodes[t->child0 + c];
    if (w->prune && ch->plain && ch->maxchars <= w->room) {
      if (!w->have_plain) mark_range(w, ch->sub0, ch->sub1);
      continue;
    }
    clrt_jschema_state *next = &w->v->scratch[level + 1];
    clrt_jschema_state_copy(next, &w->v->scratch[level]);
    if (step(next, ch->byte)) continue;
    mark_range(w, ch->sub0, ch->sub0 + ch->nend);
    walk(w, t->child0 + c, level + 1);
  }
}

int clrt_jschema_fill_mask(clrt_jschema_vocab *v, const clrt_jschema_state *s, const int32_t *stop_ids,
                        int n_stop, uint8_t *mask) {
  if (!v || !s || !mask) {
    clrt_set_error("json mask: NULL argument");
    return -1;
  }
  memset(mask, 0, (size_t)v->V);
  walk_ctx w = {v, mask, 0, 0, 0, 0};
  if (s->depth > 0) {
    const frame *f = &s->f[s->depth - 1];
    const node *d = &s->g->nodes[f->node];
    if (d->kind == CLRT_JSCHEMA_STRING && f->ph == S_BODY && f->a == 0) {
      w.prune = 1;
      w.room = d->hi < 0 ? (int64_t)1 << 40 : (int64_t)d->hi - f->n;
      if (d->hi < 0) {   /* unbounded text: start from every plain token, walk only the rest */
        memcpy(mask, v->plain_mask, (size_t)v->V);
        w.have_plain = 1;
        w.count = v->nplain;
      }
    }
    clrt_jschema_state_copy(&v->scratch[0], s);
    walk(&w, 0, 0);
  }
  if (clrt_jschema_state_complete(s))
    for (int i = 0; i < n_stop; i++) {
      if (stop_ids[i] < 0 || stop_ids[i] >= v->V) {
        clrt_set_error("json mask: stop id %d outside the vocabulary of %d", stop_ids[i], v->V);
        return -1;
      }
      if (!mask[stop_ids[i]]) {
        mask[stop_ids[i]] = 1;
        w.count++;
      }
    }
  return w.count;
}
