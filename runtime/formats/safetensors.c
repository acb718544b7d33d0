/* safetensors.c — the Hugging Face safetensors format: an 8-byte little-endian header length,
   a JSON header {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
   {string: string}}, then the raw little-endian data. Files are memory-mapped and every
   offset, size and dtype is checked against the file before any tensor is touched, so a
   truncated or hostile file gives an error naming the file and the tensor, never a crash.
   Writing goes to a temporary name, is fsync'd, then renamed, so a crash never leaves half a
   checkpoint under the real name. */
#include "clrt.h"
#include "bf16.h"
#include "json.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum { ST_F64, ST_F32, ST_F16, ST_BF16, ST_I64, ST_I32, ST_I16, ST_I8, ST_U8, ST_BOOL,
       ST_F8_E4M3, ST_F8_E5M2, ST_NDTYPES };
static const char *const st_dtype_names[ST_NDTYPES] = {
    "F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2"};
static const int st_dtype_sizes[ST_NDTYPES] = {8, 4, 2, 2, 8, 4, 2, 1, 1, 1, 1, 1};

/* The header may not be larger than this (the reference implementation's limit). */
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

typedef struct st_entry {
  char *name;
  int dtype;
  int ndim;
  int64_t shape[CLRT_MAX_DIMS];
  uint64_t begin, end;   /* byte offsets into the data section */
} st_entry;

struct clrt_safetensors {
  char *path;
  void *map;
  size_t map_len;
  const uint8_t *data;   /* the data section */
  uint64_t data_len;
  int n;
  st_entry *e;           /* sorted by name */
  int nmeta;
  char **meta_k, **meta_v;
};

static char *dup_n(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, s, n);
    d[n] = 0;
  }
  return d;
}

void clrt_safetensors_close(clrt_safetensors *st) {
  if (!st) return;
  for (int i = 0; i < st->n; i++) free(st->e[i].name);
  free(st->e);
  for (int i = 0; i < st->nmeta; i++) {
    free(st->meta_k[i]);
    free(st->meta_v[i]);
  }
  free(st->meta_k);
  free(st->meta_v);
  if (st->map) munmap(st->map, st->map_len);
  free(st->path);
  free(st);
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

static int by_begin(const void *a, const void *b) {
  const st_entry *x = *(st_entry *const *)a, *y = *(st_entry *const *)b;
  return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end < y->end ? -1 : x->end > y->end);
}

/* Parses the header JSON into st->e, checking it against a data section of data_len bytes. */
static int parse_header(clrt_safetensors *st, const char *hdr, size_t hlen) {
  const char *path = st->path;
  clrt_json_doc doc;
  if (clrt_json_parse(&doc, hdr, hlen)) {
    clrt_set_error("safetensors %s: header is not valid JSON: %s", path, doc.error);
    clrt_json_free(&doc);
    return -1;
  }
  int rc = -1;
  clrt_json_node *N = doc.nodes;
  if (N[0].type != CLRT_JSON_OBJECT) {
    clrt_set_error("safetensors %s: header is not a JSON object", path);
    goto done;
  }
  st->e = calloc((size_t)N[0].count + 1, sizeof *st->e);
  if (!st->e) {
    clrt_set_error("safetensors %s: out of memory", path);
    goto done;
  }
  for (int c = N[0].first; c >= 0; c = N[c].next) {
    const char *name = N[c].key;
    if (strlen(name) != N[c].key_len) {
      clrt_set_error("safetensors %s: a tensor name contains a NUL byte", path);
      goto done;
    }
    if (strcmp(name, "__metadata__") == 0) {
      if (N[c].type != CLRT_JSON_OBJECT) {
        clrt_set_error("safetensors %s: __metadata__ is not an object", path);
        goto done;
      }
      if (st->meta_k) {
        clrt_set_error("safetensors %s: __metadata__ appears twice", path);
        goto done;
      }
      st->meta_k = calloc((size_t)N[c].count + 1, sizeof(char *));
      st->meta_v = calloc((size_t)N[c].count + 1, sizeof(char *));
      if (!st->meta_k || !st->meta_v) {
        clrt_set_error("safetensors %s: out of memory", path);
        goto done;
      }
      for (int m = N[c].first; m >= 0; m = N[m].next) {
        if (N[m].type != CLRT_JSON_STRING) {
          clrt_set_error("safetensors %s: __metadata__ value '%s' is not a string", path, N[m].key);
          goto done;
        }
        st->meta_k[st->nmeta] = dup_n(N[m].key, N[m].key_len);
        st->meta_v[st->nmeta] = dup_n(N[m].str, N[m].len);
        st->nmeta++;
        if (!st->meta_k[st->nmeta - 1] || !st->meta_v[st->nmeta - 1]) {
          clrt_set_error("safetensors %s: out of memory", path);
          goto done;
        }
      }
      continue;
    }
    if (N[c].type != CLRT_JSON_OBJECT) {
      clrt_set_error("safetensors %s: tensor '%s': entry is not an object", path, name);
      goto done;
    }
    st_entry *e = &st->e[st->n];
    e->name = dup_n(name, N[c].key_len);
    if (!e->name) {
      clrt_set_error("safetensors %s: out of memory", path);
      goto done;
    }
    st->n++;
    int jd = clrt_json_get(&doc, c, "dtype"), js = clrt_json_get(&doc, c, "shape"),
        jo = clrt_json_get(&doc, c, "data_offsets");
    if (jd < 0 || N[jd].type != CLRT_JSON_STRING) {
      clrt_set_error("safetensors %s: tensor '%s': missing or non-string \"dtype\"", path, name);
      goto done;
    }
    e->dtype = -1;
    for (int k = 0; k < ST_NDTYPES; k++)
      if (strcmp(N[jd].str, st_dtype_names[k]) == 0) e->dtype = k;
    if (e->dtype < 0) {
      clrt_set_error("safetensors %s: tensor '%s': unknown dtype '%.32s'", path, name, N[jd].str);
      goto done;
    }
    if (js < 0 || N[js].type != CLRT_JSON_ARRAY) {
      clrt_set_error("safetensors %s: tensor '%s': missing or non-array \"shape\"", path, name);
      goto done;
    }
    if (N[js].count > CLRT_MAX_DIMS) {
      clrt_set_error("safetensors %s: tensor '%s': %d dimensions (at most %d)", path, name,
                     N[js].count, CLRT_MAX_DIMS);
      goto done;
    }
    uint64_t numel = 1;
    int overflow = 0;
    for (int d = N[js].first; d >= 0; d = N[d].next) {
      if (N[d].type != CLRT_JSON_NUMBER || !N[d].is_int || N[d].ival < 0) {
        clrt_set_error("safetensors %s: tensor '%s': shape entry is not a non-negative integer", path, name);
        goto done;
      }
      e->shape[e->ndim++] = N[d].ival;
      uint64_t s = (uint64_t)N[d].ival;
      if (s && numel > UINT64_MAX / 8 / s) overflow = 1;
      else numel *= s;
    }
    if (jo < 0 || N[jo].type != CLRT_JSON_ARRAY || N[jo].count != 2) {
      clrt_set_error("safetensors %s: tensor '%s': \"data_offsets\" is not a pair [begin, end]", path, name);
      goto done;
    }
    int b = N[jo].first, en = N[b].next;
    if (N[b].type != CLRT_JSON_NUMBER || !N[b].is_int || N[b].ival < 0 ||
        N[en].type != CLRT_JSON_NUMBER || !N[en].is_int || N[en].ival < 0) {
      clrt_set_error("safetensors %s: tensor '%s': data_offsets are not non-negative integers", path, name);
      goto done;
    }
    e->begin = (uint64_t)N[b].ival;
    e->end = (uint64_t)N[en].ival;
    if (e->begin > e->end || e->end > st->data_len) {
      clrt_set_error("safetensors %s: tensor '%s': data_offsets [%llu, %llu] out of range "
                     "(data section is %llu bytes; is the file truncated?)", path, name,
                     (unsigned long long)e->begin, (unsigned long long)e->end,
                     (unsigned long long)st->data_len);
      goto done;
    }
    if (overflow || numel * (uint64_t)st_dtype_sizes[e->dtype] != e->end - e->begin) {
      clrt_set_error("safetensors %s: tensor '%s': data_offsets span %llu bytes but shape and "
                     "dtype %s need %llu", path, name, (unsigned long long)(e->end - e->begin),
                     st_dtype_names[e->dtype],
                     (unsigned long long)(overflow ? 0 : numel * (uint64_t)st_dtype_sizes[e->dtype]));
      goto done;
    }
  }
  qsort(st->e, (size_t)st->n, sizeof *st->e, by_name);
  for (int i = 1; i < st->n; i++)
    if (strcmp(st->e[i - 1].name, st->e[i].name) == 0) {
      clrt_set_error("safetensors %s: tensor '%s' appears twice in the header", path, st->e[i].name);
      goto done;
    }
  /* Overlapping tensors would alias each other's bytes: reject them. */
  if (st->n > 1) {
    st_entry **order = malloc(sizeof *order * (size_t)st->n);
    if (!order) {
      clrt_set_error("safetensors %s: out of memory", path);
      goto done;
    }
    for (int i = 0; i < st->n; i++) order[i] = &st->e[i];
    qsort(order, (size_t)st->n, sizeof *order, by_begin);
    const st_entry *far = order[0];   /* the tensor reaching furthest so far */
    for (int i = 1; i < st->n; i++) {
      if (order[i]->end > order[i]->begin && order[i]->begin < far->end) {
        clrt_set_error("safetensors %s: tensors '%s' and '%s' overlap (bytes [%llu, %llu) and [%llu, %llu))",
                       path, far->name, order[i]->name,
                       (unsigned long long)far->begin, (unsigned long long)far->end,
                       (unsigned long long)order[i]->begin, (unsigned long long)order[i]->end);
        free(order);
        goto done;
      }
      if (order[i]->end > far->end) far = order[i];
    }
    free(order);
  }
  rc = 0;
done:
  clrt_json_free(&doc);
  return rc;
}

/* Parses a whole file image (header length, header, data) held in memory. */
static clrt_safetensors *open_image(const uint8_t *buf, size_t len, const char *path) {
  clrt_safetensors *st = calloc(1, sizeof *st);
  if (!st || !(st->path = dup_n(path, strlen(path)))) {
    free(st);
    clrt_set_error("safetensors %s: out of memory", path);
    return NULL;
  }
  if (len < 8) {
    clrt_set_error("safetensors %s: file is %zu bytes, too short for the 8-byte header length "
                   "(truncated?)", path, len);
    goto fail;
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
  if (hlen > ST_MAX_HEADER || hlen > len - 8) {
    clrt_set_error("safetensors %s: header length %llu runs past the end of the file (%zu bytes; "
                   "truncated or not a safetensors file?)", path, (unsigned long long)hlen, len);
    goto fail;
  }
  st->data = buf + 8 + hlen;
  st->data_len = len - 8 - hlen;
  if (parse_header(st, (const char *)buf + 8, (size_t)hlen)) goto fail;
  return st;
fail:
  clrt_safetensors_close(st);
  return NULL;
}

clrt_safetensors *clrt_safetensors_open_memory(const void *data, size_t len, const char *name) {
  return open_image(data, len, name ? name : "<memory>");
}

clrt_safetensors *clrt_safetensors_open(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    clrt_set_error("safetensors %s: cannot open: %s", path, strerror(errno));
    return NULL;
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    clrt_set_error("safetensors %s: not a regular file", path);
    close(fd);
    return NULL;
  }
  size_t len = (size_t)sb.st_size;
  void *map = NULL;
  if (len > 0) {
    map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      clrt_set_error("safetensors %s: mmap failed: %s", path, strerror(errno));
      close(fd);
      return NULL;
    }
  }
  close(fd);
  clrt_safetensors *st = open_image(map ? map : (const void *)"", len, path);
  if (!st) {
    if (map) munmap(map, len);
    return NULL;
  }
  st->map = map;
  st->map_len = len;
  return st;
}

const char *clrt_safetensors_path(const clrt_safetensors *st) { return st->path; }
int clrt_safetensors_count(const clrt_safetensors *st) { return st->n; }

static int check_index(const clrt_safetensors *st, int i) {
  if (i < 0 || i >= st->n) {
    clrt_set_error("safetensors %s: tensor index %d out of range (%d tensors)", st->path, i, st->n);
    return -1;
  }
  return 0;
}

const char *clrt_safetensors_name(const clrt_safetensors *st, int i) {
  return check_index(st, i) ? NULL : st->e[i].name;
}

int clrt_safetensors_find(const clrt_safetensors *st, const char *name) {
  st_entry key = {.name = (char *)name};
  st_entry *hit = bsearch(&key, st->e, (size_t)st->n, sizeof *st->e, by_name);
  return hit ? (int)(hit - st->e) : -1;
}

const char *clrt_safetensors_dtype(const clrt_safetensors *st, int i) {
  return check_index(st, i) ? NULL : st_dtype_names[st->e[i].dtype];
}

int clrt_safetensors_ndim(const clrt_safetensors *st, int i) {
  return check_index(st, i) ? -1 : st->e[i].ndim;
}

int64_t clrt_safetensors_dim(const clrt_safetensors *st, int i, int d) {
  if (check_index(st, i)) return -1;
  if (d < 0 || d >= st->e[i].ndim) return -1;
  return st->e[i].shape[d];
}

const char *clrt_safetensors_metadata(const clrt_safetensors *st, const char *key) {
  for (int i = 0; i < st->nmeta; i++)
    if (strcmp(st->meta_k[i], key) == 0) return st->meta_v[i];
  return NULL;
}

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0) {
    if (man == 0) u = sign;
    else {   /* subnormal: renormalise */
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400));
      u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* A tensor is copied out once: the mapping's whole pages inside each copied chunk leave this
   process's resident set as it goes (they stay in the page cache), so a model's file does not
   sit in memory beside the arena it was read into until the file closes (loading
   Qwen2.5-0.5B's 2 GB file peaked at about the arena plus its 545 MB embedding before). */
static void release_pages(const clrt_safetensors *st, const uint8_t *src, size_t bytes) {
  if (!st->map) return;
  uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)src + pg - 1) & ~(pg - 1),
            b = ((uintptr_t)src + bytes) & ~(pg - 1);
  if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

int clrt_safetensors_read_f32(const clrt_safetensors *st, int i, float *dst, int64_t numel) {
  if (check_index(st, i)) return -1;
  const st_entry *e = &st->e[i];
  int64_t n = (int64_t)((e->end - e->begin) / (uint64_t)st_dtype_sizes[e->dtype]);
  if (n != numel) {
    clrt_set_error("safetensors %s: tensor '%s' has %lld elements, expected %lld", st->path,
                   e->name, (long long)n, (long long)numel);
    return -1;
  }
  if (e->dtype != ST_F32 && e->dtype != ST_BF16 && e->dtype != ST_F16 && e->dtype != ST_F64) {
    clrt_set_error("safetensors %s: tensor '%s' has dtype %s; only F32, BF16, F16 and F64 "
                   "convert to f32", st->path, e->name, st_dtype_names[e->dtype]);
    return -1;
  }
  /* In chunks, each one's pages given back as soon as it is copied (release_pages). */
  const int64_t size = st_dtype_sizes[e->dtype], CHUNK = (int64_t)1 << 22;
  for (int64_t k0 = 0; k0 < n; k0 += CHUNK) {
    int64_t k1 = n - k0 < CHUNK ? n : k0 + CHUNK;
    const uint8_t *src = st->data + e->begin + size * k0;
    float *out = dst + k0;
    int64_t m = k1 - k0;
    if (e->dtype == ST_F32) memcpy(out, src, (size_t)m * 4);
    for (int64_t k = 0; e->dtype != ST_F32 && k < m; k++) {
      uint16_t h;
      double d;
      if (e->dtype == ST_F64) {
        memcpy(&d, src + 8 * k, 8);
        out[k] = (float)d;
      } else {
        memcpy(&h, src + 2 * k, 2);
        out[k] = e->dtype == ST_BF16 ? clrt_bf16_to_f32(h) : f16_to_f32(h);
      }
    }
    release_pages(st, src, (size_t)(size * m));
  }
  return 0;
}

clrt_tensor *clrt_safetensors_tensor(const clrt_safetensors *st, int i) {
  if (check_index(st, i)) return NULL;
  const st_entry *e = &st->e[i];
  if (e->dtype == ST_I32 || e->dtype == ST_I64) {
    clrt_tensor *t = clrt_tensor_new(CLRT_I32, e->ndim, e->shape, CLRT_CPU);
    if (!t) return NULL;
    int32_t *p = clrt_tensor_data(t);
    int64_t n = clrt_tensor_numel(t);
    for (int64_t k = 0; k < n; k++) {
      if (e->dtype == ST_I32) memcpy(&p[k], st->data + e->begin + 4 * (uint64_t)k, 4);
      else {
        int64_t v;
        memcpy(&v, st->data + e->begin + 8 * (uint64_t)k, 8);
        p[k] = (int32_t)v;
      }
    }
    return t;
  }
  clrt_tensor *t = clrt_tensor_new(CLRT_F32, e->ndim, e->shape, CLRT_CPU);
  if (!t) return NULL;
  if (clrt_safetensors_read_f32(st, i, clrt_tensor_data(t), clrt_tensor_numel(t))) {
    clrt_tensor_free(t);
    return NULL;
  }
  return t;
}

/* ---- writing ---------------------------------------------------------------------------- */

typedef struct sbuf {
  char *p;
  size_t n, cap;
  int oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->n + n + 1) cap *= 2;
    char *np = realloc(b->p, cap);
    if (!np) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

static void sb_json_string(sbuf *b, const char *s) {
  sb_add(b, "\"", 1);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    char esc[8];
    if (c == '"' || c == '\\') {
      esc[0] = '\\';
      esc[1] = (char)c;
      sb_add(b, esc, 2);
    } else if (c < 0x20) {
      snprintf(esc, sizeof esc, "\\u%04x", c);
      sb_add(b, esc, 6);
    } else {
      sb_add(b, (const char *)&c, 1);
    }
  }
  sb_add(b, "\"", 1);
}

static const char *dtype_tag(int dtype) {
  switch (dtype) {
    case CLRT_F32: return "F32";
    case CLRT_BF16: return "BF16";
    case CLRT_I32: return "I32";
    default: return NULL;
  }
}

int clrt_safetensors_write(const char *path, int n, const char *const *names,
                           const clrt_tensor *const *tensors, int nmeta,
                           const char *const *meta_keys, const char *const *meta_values) {
  sbuf h = {0};
  sb_str(&h, "{");
  int first = 1;
  if (nmeta > 0) {
    sb_str(&h, "\"__metadata__\":{");
    for (int i = 0; i < nmeta; i++) {
      if (i) sb_str(&h, ",");
      sb_json_string(&h, meta_keys[i]);
      sb_str(&h, ":");
      sb_json_string(&h, meta_values[i]);
    }
    sb_str(&h, "}");
    first = 0;
  }
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    const clrt_tensor *t = tensors[i];
    const char *tag = dtype_tag(t->dtype_id);
    if (!tag || t->device_id != CLRT_CPU || !clrt_tensor_is_contiguous(t)) {
      clrt_set_error("safetensors %s: tensor '%s' must be a contiguous f32/bf16/i32 cpu tensor",
                     path, names[i]);
      free(h.p);
      return -1;
    }
    uint64_t bytes = (uint64_t)clrt_tensor_numel(t) * clrt_dtype_size(t->dtype_id);
    char num[64];
    if (!first) sb_str(&h, ",");
    first = 0;
    sb_json_string(&h, names[i]);
    sb_str(&h, ":{\"dtype\":\"");
    sb_str(&h, tag);
    sb_str(&h, "\",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
      snprintf(num, sizeof num, d ? ",%lld" : "%lld", (long long)t->dims[d]);
      sb_str(&h, num);
    }
    snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
             (unsigned long long)(off + bytes));
    sb_str(&h, num);
    off += bytes;
  }
  sb_str(&h, "}");
  while (!h.oom && h.n % 8) sb_add(&h, " ", 1);   /* keep the data 8-byte aligned */
  if (h.oom) {
    free(h.p);
    clrt_set_error("safetensors %s: out of memory building the header", path);
    return -1;
  }
  /* The parts back to back: the header's length (8 bytes, little-endian), the header, then
     every tensor's bytes; clrt_file_write_parts_atomic writes them under a temporary name,
     fsyncs and renames. */
  uint8_t len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h.n >> (8 * i));
  const void **parts = malloc(sizeof *parts * (size_t)(n + 2));
  size_t *lens = malloc(sizeof *lens * (size_t)(n + 2));
  if (!parts || !lens) {
    free(parts);
    free(lens);
    free(h.p);
    clrt_set_error("safetensors %s: out of memory", path);
    return -1;
  }
  parts[0] = len8;
  lens[0] = 8;
  parts[1] = h.p;
  lens[1] = h.n;
  for (int i = 0; i < n; i++) {
    parts[i + 2] = clrt_tensor_data(tensors[i]);
    lens[i + 2] = (size_t)clrt_tensor_numel(tensors[i]) * clrt_dtype_size(tensors[i]->dtype_id);
  }
  int rc = clrt_file_write_parts_atomic(path, n + 2, parts, lens);
  free(parts);
  free(lens);
  free(h.p);
  if (rc != 0) {
    char why[512];
    snprintf(why, sizeof why, "%s", clrt_last_error());
    clrt_set_error("safetensors %s: %s", path, why);
  }
  return rc;
}
