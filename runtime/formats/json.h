/* json.h — a small strict JSON parser (RFC 8259) for headers the runtime must read itself,
   chiefly the safetensors header. Configuration and tokenizer files are parsed in Lua with
   cjson; this one exists because the safetensors reader is C and is fuzzed on its own. */
#ifndef CLRT_JSON_H
#define CLRT_JSON_H
#include <stddef.h>
#include <stdint.h>

enum { CLRT_JSON_NULL, CLRT_JSON_FALSE, CLRT_JSON_TRUE, CLRT_JSON_NUMBER, CLRT_JSON_STRING,
       CLRT_JSON_ARRAY, CLRT_JSON_OBJECT };

/* Nodes live in one array; children are linked by index (-1 ends a list). */
typedef struct clrt_json_node {
  int type;
  int first, next;        /* first child, next sibling */
  int count;              /* children of an array or object */
  const char *key;        /* member name when the parent is an object (unescaped, NUL-ended) */
  size_t key_len;
  const char *str;        /* string value (unescaped, NUL-ended; may hold NUL bytes) */
  size_t len;
  double num;
  int64_t ival;           /* exact value when is_int */
  int is_int;             /* an integer literal that fits in int64 */
} clrt_json_node;

typedef struct clrt_json_doc {
  clrt_json_node *nodes;
  int n, cap;
  char *text;             /* private copy; strings are unescaped in place */
  char error[256];        /* set when clrt_json_parse fails: what and at which byte offset */
} clrt_json_doc;

/* Parses len bytes (no NUL needed). Node 0 is the root. 0 on success, -1 with doc->error. */
int clrt_json_parse(clrt_json_doc *doc, const char *text, size_t len);
void clrt_json_free(clrt_json_doc *doc);
/* The member of object node `obj` named key, or -1. */
int clrt_json_get(const clrt_json_doc *doc, int obj, const char *key);

#endif
