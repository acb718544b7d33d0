/* tensor_ops.c — elementwise arithmetic with broadcasting, reductions, softmax and matmul on
   tensors. This file checks arguments, works out shapes, dtypes and strides, and splits the
   work into chunks that OpenMP runs and that poll for Ctrl-C; the loops themselves live in
   kernels/cpu (tensor_kernels.h). f32 (and i32 where integer math makes sense) runs without
   copies over any strides; bf16 is converted to f32, computed, and rounded back. */
#include "clrt.h"
#include "cpu/tensor_kernels.h"

/* The kernels' op codes are clrt.h's (tensor_kernels.h keeps its own copy, being pure). */
#define SAME_CODE(a, b) _Static_assert((int)(a) == (int)(b), #a " differs from " #b)
SAME_CODE(CLRT_OP_ADD, K_ADD);
SAME_CODE(CLRT_OP_SUB, K_SUB);
SAME_CODE(CLRT_OP_MUL, K_MUL);
SAME_CODE(CLRT_OP_DIV, K_DIV);
SAME_CODE(CLRT_OP_POW, K_POW);
SAME_CODE(CLRT_OP_MAXIMUM, K_MAXIMUM);
SAME_CODE(CLRT_OP_MINIMUM, K_MINIMUM);
SAME_CODE(CLRT_OP_EQ, K_EQ);
SAME_CODE(CLRT_OP_NE, K_NE);
SAME_CODE(CLRT_OP_LT, K_LT);
SAME_CODE(CLRT_OP_LE, K_LE);
SAME_CODE(CLRT_OP_GT, K_GT);
SAME_CODE(CLRT_OP_GE, K_GE);
SAME_CODE(CLRT_OP_NEG, K_NEG);
SAME_CODE(CLRT_OP_ABS, K_ABS);
SAME_CODE(CLRT_OP_EXP, K_EXP);
SAME_CODE(CLRT_OP_LOG, K_LOG);
SAME_CODE(CLRT_OP_SQRT, K_SQRT);
SAME_CODE(CLRT_OP_TANH, K_TANH);
SAME_CODE(CLRT_OP_SIGMOID, K_SIGMOID);
SAME_CODE(CLRT_OP_RELU, K_RELU);
SAME_CODE(CLRT_RED_SUM, K_RED_SUM);
SAME_CODE(CLRT_RED_MEAN, K_RED_MEAN);
SAME_CODE(CLRT_RED_MAX, K_RED_MAX);
SAME_CODE(CLRT_RED_MIN, K_RED_MIN);
SAME_CODE(CLRT_RED_ARGMAX, K_RED_ARGMAX);
SAME_CODE(CLRT_RED_ARGMIN, K_RED_ARGMIN);
_Static_assert(CLRT_OP_BINARY_COUNT == K_GE + 1 && CLRT_OP_UNARY_COUNT == K_RELU + 1 &&
                   CLRT_RED_COUNT == K_RED_ARGMIN + 1, "an op code without its kernel copy");
#undef SAME_CODE

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  CHUNK = 16384,     /* elements per unit of elementwise work */
  PAR_MIN = 32768,   /* below this many elements threads cost more than they save */
  RED_COLS = 256,    /* columns per unit of a reduction over a non-last dimension */
  ALL_PIECE = 65536  /* elements per piece of a reduction over everything */
};

static const char *binary_names[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum",
                                     "eq",  "ne",  "lt",  "le",  "gt",  "ge"};
static const char *binary_inplace_names[] = {"add_", "sub_", "mul_", "div_", "pow_",
                                             "maximum_", "minimum_", "eq_", "ne_", "lt_",
                                             "le_", "gt_", "ge_"};
static const char *unary_names[] = {"neg", "abs", "exp", "log", "sqrt", "tanh", "sigmoid", "relu"};
static const char *unary_inplace_names[] = {"neg_",  "abs_",  "exp_",     "log_",
                                            "sqrt_", "tanh_", "sigmoid_", "relu_"};
static const char *reduce_names[] = {"sum", "mean", "max", "min", "argmax", "argmin"};

const char *clrt_binary_op_name(int op) {
  return op >= 0 && op < CLRT_OP_BINARY_COUNT ? binary_names[op] : "?";
}
const char *clrt_unary_op_name(int op) {
  return op >= 0 && op < CLRT_OP_UNARY_COUNT ? unary_names[op] : "?";
}
const char *clrt_reduce_op_name(int op) {
  return op >= 0 && op < CLRT_RED_COUNT ? reduce_names[op] : "?";
}

/* ---- argument checks and messages ---------------------------------------------------- */

/* "[2, 3]" into buf. */
static const char *shape_text(const clrt_tensor *t, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < t->ndim && k < n; d++)
    k += (size_t)snprintf(buf + k, n - k, d ? ", %lld" : "%lld", (long long)t->dims[d]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

typedef struct { char s[4][160]; } shape_bufs;
#define SH(bufs, i, t) shape_text((t), (bufs).s[i], sizeof (bufs).s[i])

static int check_tensor(const char *op, const clrt_tensor *t) {
  if (!t) {
    clrt_set_error("%s: expected a tensor, got NULL", op);
    return -1;
  }
  if (t->device_id != CLRT_CPU) {
    clrt_set_error("%s: tensor is on cuda; move it to cpu first", op);
    return -1;
  }
  if (clrt_dtype_size(t->dtype_id) == 0 || t->ndim < 0 || t->ndim > CLRT_MAX_DIMS) {
    clrt_set_error("%s: malformed tensor (dtype %d, %d dimensions)", op, t->dtype_id, t->ndim);
    return -1;
  }
  return 0;
}

static int promote(int a, int b) {
  if (a == CLRT_F32 || b == CLRT_F32) return CLRT_F32;
  if (a == CLRT_BF16 || b == CLRT_BF16) return CLRT_BF16;
  return CLRT_I32;
}

static int is_comparison(int op) { return op >= CLRT_OP_EQ && op <= CLRT_OP_GE; }

static clrt_tensor *scalar_tensor(int dtype, double v) {
  int64_t shape[1] = {1};
  clrt_tensor *t = clrt_tensor_new(dtype, 0, shape, CLRT_CPU);
  if (t && clrt_tensor_set(t, 0, v)) {
    clrt_tensor_free(t);
    return NULL;
  }
  return t;
}

/* t itself when it already has dtype dt (and is contiguous if asked), else a converted copy.
   The caller frees the result when it differs from t. */
static clrt_tensor *as_dtype(const clrt_tensor *t, int dt, int contiguous) {
  if (t->dtype_id == dt && (!contiguous || clrt_tensor_is_contiguous(t))) return (clrt_tensor *)t;
  return clrt_tensor_to_dtype(t, dt);
}

static void drop(clrt_tensor *tmp, const clrt_tensor *orig) {
  if (tmp && tmp != orig) clrt_tensor_free(tmp);
}

/* Broadcast the shapes of n tensors; on failure name the op and every shape. */
static int broadcast_shapes(const char *op, int n, const clrt_tensor *const *ts, int *nd,
                            int64_t *shape) {
  int m = 0;
  for (int k = 0; k < n; k++) m = ts[k]->ndim > m ? ts[k]->ndim : m;
  for (int d = 0; d < m; d++) {
    int64_t s = 1;
    for (int k = 0; k < n; k++) {
      int j = d - (m - ts[k]->ndim);
      int64_t e = j < 0 ? 1 : ts[k]->dims[j];
      if (e == s || e == 1) continue;
      if (s != 1) {
        shape_bufs b;
        if (n == 2)
          clrt_set_error("%s: shapes %s and %s cannot broadcast", op, SH(b, 0, ts[0]), SH(b, 1, ts[1]));
        else
          clrt_set_error("%s: shapes %s, %s and %s cannot broadcast", op, SH(b, 0, ts[0]),
                         SH(b, 1, ts[1]), SH(b, 2, ts[2]));
        return -1;
      }
      s = e;
    }
    shape[d] = s;
  }
  *nd = m;
  return 0;
}

static int same_shape(int nd, const int64_t *shape, const clrt_tensor *t) {
  if (t->ndim != nd) return 0;
  for (int d = 0; d < nd; d++)
    if (t->dims[d] != shape[d]) return 0;
  return 1;
}

static int64_t numel_of(int nd, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= shape[d];
  return n;
}

/* ---- the strided iterator ------------------------------------------------------------ */

/* Up to four operands (the output first) over one broadcast shape, with size-1 dimensions
   dropped and mergeable neighbours merged so contiguous tensors become one long row. */
typedef struct {
  int nops, ndim;
  int64_t dims[CLRT_MAX_DIMS];
  int64_t st[4][CLRT_MAX_DIMS];
  char *base[4];
  int64_t es[4];
} iter;

typedef void (*row_fn)(const void *ctx, int64_t n, char *const *p, const int64_t *st);

static void iter_init(iter *it, int nd, const int64_t *shape, int nops, const clrt_tensor *const *ts) {
  int64_t bst[4][CLRT_MAX_DIMS];
  it->nops = nops;
  for (int k = 0; k < nops; k++) {
    const clrt_tensor *t = ts[k];
    for (int d = 0; d < nd; d++) {
      int j = d - (nd - t->ndim);
      bst[k][d] = (j < 0 || t->dims[j] == 1) ? 0 : t->strides[j];
    }
    it->base[k] = clrt_tensor_data(t);
    it->es[k] = (int64_t)clrt_dtype_size(t->dtype_id);
  }
  int m = 0;
  for (int d = 0; d < nd; d++) {
    if (shape[d] == 1) continue;
    int merge = m > 0;
    for (int k = 0; k < nops && merge; k++) merge = it->st[k][m - 1] == bst[k][d] * shape[d];
    if (merge) {
      it->dims[m - 1] *= shape[d];
      for (int k = 0; k < nops; k++) it->st[k][m - 1] = bst[k][d];
    } else {
      it->dims[m] = shape[d];
      for (int k = 0; k < nops; k++) it->st[k][m] = bst[k][d];
      m++;
    }
  }
  if (m == 0) {
    it->dims[0] = 1;
    for (int k = 0; k < nops; k++) it->st[k][0] = 0;
    m = 1;
  }
  it->ndim = m;
}

static int iter_run(const char *op, const iter *it, row_fn fn, const void *ctx) {
  int nd = it->ndim;
  int64_t inner = it->dims[nd - 1], rows = 1;
  for (int d = 0; d < nd - 1; d++) rows *= it->dims[d];
  if (inner == 0 || rows == 0) return 0;
  int long_rows = inner >= CHUNK;
  int64_t per_row = long_rows ? (inner + CHUNK - 1) / CHUNK : 1;
  int64_t rows_per = long_rows ? 1 : CHUNK / inner;
  int64_t chunks = long_rows ? rows * per_row : (rows + rows_per - 1) / rows_per;
  int64_t inner_st[4];
  for (int k = 0; k < it->nops; k++) inner_st[k] = it->st[k][nd - 1];
  int stop = 0;
#pragma omp parallel for schedule(static) if (rows * inner >= PAR_MIN)
  for (int64_t c = 0; c < chunks; c++) {
    if (__atomic_load_n(&stop, __ATOMIC_RELAXED)) continue;
    if (clrt_interrupted()) {
      __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
      continue;
    }
    int64_t r0, r1, start, len;
    if (long_rows) {
      r0 = c / per_row;
      r1 = r0 + 1;
      start = (c % per_row) * CHUNK;
      len = inner - start < CHUNK ? inner - start : CHUNK;
    } else {
      r0 = c * rows_per;
      r1 = r0 + rows_per < rows ? r0 + rows_per : rows;
      start = 0;
      len = inner;
    }
    for (int64_t r = r0; r < r1; r++) {
      int64_t off[4] = {0, 0, 0, 0}, rr = r;
      for (int d = nd - 2; d >= 0; d--) {
        int64_t i = rr % it->dims[d];
        rr /= it->dims[d];
        for (int k = 0; k < it->nops; k++) off[k] += i * it->st[k][d];
      }
      char *p[4];
      for (int k = 0; k < it->nops; k++)
        p[k] = it->base[k] + (off[k] + start * inner_st[k]) * it->es[k];
      fn(ctx, len, p, inner_st);
    }
  }
  if (stop) {
    clrt_set_error("%s: interrupted", op);
    return -1;
  }
  return 0;
}

typedef struct { int op; } op_ctx;

static void row_binary_f32(const void *ctx, int64_t n, char *const *p, const int64_t *st) {
  clrt_k_binary_f32(((const op_ctx *)ctx)->op, n, (float *)p[0], st[0], (const float *)p[1],
                    st[1], (const float *)p[2], st[2]);
}
static void row_binary_i32(const void *ctx, int64_t n, char *const *p, const int64_t *st) {
  clrt_k_binary_i32(((const op_ctx *)ctx)->op, n, (int32_t *)p[0], st[0], (const int32_t *)p[1],
                    st[1], (const int32_t *)p[2], st[2]);
}
static void row_unary_f32(const void *ctx, int64_t n, char *const *p, const int64_t *st) {
  clrt_k_unary_f32(((const op_ctx *)ctx)->op, n, (float *)p[0], st[0], (const float *)p[1], st[1]);
}
static void row_unary_i32(const void *ctx, int64_t n, char *const *p, const int64_t *st) {
  clrt_k_unary_i32(((const op_ctx *)ctx)->op, n, (int32_t *)p[0], st[0], (const int32_t *)p[1],
                   st[1]);
}
static void row_where_f32(const void *ctx, int64_t n, char *const *p, const int64_t *st) {
  (void)ctx;
  clrt_k_where_f32(n, (float *)p[0], st[0], (const float *)p[1], st[1], (const float *)p[2],
                   st[2], (const float *)p[3], st[3]);
}
static void row_where_i32(const void *ctx, int64_t n, char *const *p, const int64_t *st) {
  (void)ctx;
  clrt_k_where_i32(n, (int32_t *)p[0], st[0], (const float *)p[1], st[1], (const int32_t *)p[2],
                   st[2], (const int32_t *)p[3], st[3]);
}

/* ---- where results go ------------------------------------------------------------------ */

/* Pick the buffer a kernel writes: the target itself when it has the compute dtype, a fresh
   result when the result has it, else a temporary in the compute dtype. */
static clrt_tensor *output_for(clrt_tensor *target, int cd, int outdt, int nd, const int64_t *shape) {
  if (target && target->dtype_id == cd) return target;
  return clrt_tensor_new(target ? cd : (outdt == cd ? outdt : cd), nd, shape, CLRT_CPU);
}

/* Move a computed buffer into its final place: the target (converting, any strides), or a
   result tensor of dtype outdt. Returns the result (the target for in-place ops). */
static clrt_tensor *finish(clrt_tensor *dst, clrt_tensor *target, int outdt) {
  if (target) {
    if (dst == target) return target;
    int st = clrt_tensor_copy_(target, dst);
    clrt_tensor_free(dst);
    return st ? NULL : target;
  }
  if (dst->dtype_id == outdt) return dst;
  if (outdt == CLRT_I32 && dst->dtype_id == CLRT_F32) {
    /* i32 results computed in f32 (matmul) round to nearest and saturate: a float outside
       int32's range has no defined conversion in C. */
    clrt_tensor *r = clrt_tensor_new(CLRT_I32, dst->ndim, dst->dims, CLRT_CPU);
    if (r) {
      const float *f = clrt_tensor_data(dst);
      int32_t *o = clrt_tensor_data(r);
      int64_t n = clrt_tensor_numel(dst);
      for (int64_t i = 0; i < n; i++) {
        float v = nearbyintf(f[i]);
        o[i] = v != v ? 0 : v >= 2147483648.0f ? INT32_MAX : v <= -2147483648.0f ? INT32_MIN : (int32_t)v;
      }
    }
    clrt_tensor_free(dst);
    return r;
  }
  clrt_tensor *r = clrt_tensor_to_dtype(dst, outdt);
  clrt_tensor_free(dst);
  return r;
}

/* ---- elementwise ----------------------------------------------------------------------- */

/* out = a op b, computed in f32 (or i32 for integer math); rdt is the promoted input dtype.
   With a target, the result is written into it (b must broadcast to its shape). */
static clrt_tensor *binary_impl(int op, const clrt_tensor *a, const clrt_tensor *b, int rdt,
                                clrt_tensor *target) {
  const char *name = target ? binary_inplace_names[op] : binary_names[op];
  const clrt_tensor *pair[2] = {a, b};
  int nd;
  int64_t shape[CLRT_MAX_DIMS];
  if (broadcast_shapes(name, 2, pair, &nd, shape)) return NULL;
  int cd = (rdt == CLRT_I32 && op != CLRT_OP_DIV) ? CLRT_I32 : CLRT_F32;
  int outdt = is_comparison(op) ? CLRT_F32 : (op == CLRT_OP_DIV && rdt == CLRT_I32) ? CLRT_F32 : rdt;
  if (target) {
    shape_bufs sb;
    if (!same_shape(nd, shape, target)) {
      clrt_set_error("%s: shapes %s and %s cannot broadcast into %s", name, SH(sb, 0, a),
                     SH(sb, 1, b), SH(sb, 2, target));
      return NULL;
    }
    if (target->dtype_id == CLRT_I32 && outdt != CLRT_I32 && !is_comparison(op)) {
      clrt_set_error("%s: result dtype %s cannot be stored in the i32 tensor (shapes %s and %s)",
                     name, clrt_dtype_name(outdt), SH(sb, 0, a), SH(sb, 1, b));
      return NULL;
    }
    outdt = target->dtype_id;
  }
  clrt_tensor *ca = as_dtype(a, cd, 0), *cb = as_dtype(b, cd, 0);
  clrt_tensor *dst = NULL, *res = NULL;
  if (!ca || !cb) goto done;
  /* b read through another view of the storage we write could see half-updated values. */
  if (target && cb == b && b->storage == target->storage &&
      !(b->offset == target->offset && same_shape(target->ndim, target->dims, b) &&
        !memcmp(b->strides, target->strides, sizeof(int64_t) * (size_t)b->ndim))) {
    cb = clrt_tensor_clone(b);
    if (!cb) goto done;
  }
  dst = output_for(target, cd, outdt, nd, shape);
  if (!dst) goto done;
  if (numel_of(nd, shape) > 0) {
    const clrt_tensor *ops[3] = {dst, ca, cb};
    iter it;
    iter_init(&it, nd, shape, 3, ops);
    op_ctx ctx = {op};
    if (iter_run(name, &it, cd == CLRT_I32 ? row_binary_i32 : row_binary_f32, &ctx)) {
      if (dst != target) clrt_tensor_free(dst);
      goto done;
    }
  }
  /* Integer comparisons came out as i32 0/1; finish() converts them to f32. */
  res = finish(dst, target, outdt);
done:
  drop(ca, a);
  drop(cb, b);
  return res;
}

static int check_binary(int op, const clrt_tensor *a, const clrt_tensor *b) {
  if (op < 0 || op >= CLRT_OP_BINARY_COUNT) {
    clrt_set_error("binary op: unknown op %d", op);
    return -1;
  }
  return check_tensor(binary_names[op], a) || (b && check_tensor(binary_names[op], b)) ? -1 : 0;
}

clrt_tensor *clrt_tensor_binary(int op, const clrt_tensor *a, const clrt_tensor *b) {
  if (check_binary(op, a, b) || check_tensor(binary_names[op], b)) return NULL;
  return binary_impl(op, a, b, promote(a->dtype_id, b->dtype_id), NULL);
}

int clrt_tensor_binary_(int op, clrt_tensor *a, const clrt_tensor *b) {
  clrt_storage_written(a->storage);
  if (check_binary(op, a, b) || check_tensor(binary_names[op], b)) return -1;
  return binary_impl(op, a, b, promote(a->dtype_id, b->dtype_id), a) ? 0 : -1;
}

/* A number keeps the tensor's dtype unless an i32 tensor meets a fractional number. */
static int scalar_dtype(const clrt_tensor *a, double s, int *rdt) {
  if (a->dtype_id == CLRT_I32) {
    int integral = s == floor(s) && s >= INT32_MIN && s <= INT32_MAX;
    *rdt = integral ? CLRT_I32 : CLRT_F32;
    return *rdt;
  }
  *rdt = a->dtype_id;
  return CLRT_F32;   /* bf16 math runs in f32, and the number keeps its f32 precision */
}

clrt_tensor *clrt_tensor_binary_scalar(int op, const clrt_tensor *a, double s, int scalar_first) {
  if (check_binary(op, a, NULL)) return NULL;
  int rdt, sdt = scalar_dtype(a, s, &rdt);
  clrt_tensor *st = scalar_tensor(sdt, s);
  if (!st) return NULL;
  clrt_tensor *r = scalar_first ? binary_impl(op, st, a, rdt, NULL) : binary_impl(op, a, st, rdt, NULL);
  clrt_tensor_free(st);
  return r;
}

int clrt_tensor_binary_scalar_(int op, clrt_tensor *a, double s) {
  clrt_storage_written(a->storage);
  if (check_binary(op, a, NULL)) return -1;
  int rdt, sdt = scalar_dtype(a, s, &rdt);
  clrt_tensor *st = scalar_tensor(sdt, s);
  if (!st) return -1;
  clrt_tensor *r = binary_impl(op, a, st, rdt, a);
  clrt_tensor_free(st);
  return r ? 0 : -1;
}

static int unary_int_ok(int op) { return op == CLRT_OP_NEG || op == CLRT_OP_ABS || op == CLRT_OP_RELU; }

static clrt_tensor *unary_impl(int op, const clrt_tensor *a, clrt_tensor *target) {
  const char *name = target ? unary_inplace_names[op] : unary_names[op];
  int int_ok = unary_int_ok(op);
  int cd = (a->dtype_id == CLRT_I32 && int_ok) ? CLRT_I32 : CLRT_F32;
  int outdt = a->dtype_id == CLRT_I32 ? (int_ok ? CLRT_I32 : CLRT_F32) : a->dtype_id;
  if (target && target->dtype_id == CLRT_I32 && !int_ok) {
    char sb[160];
    clrt_set_error("%s: result dtype f32 cannot be stored in the i32 tensor (shape %s)", name,
                   shape_text(a, sb, sizeof sb));
    return NULL;
  }
  clrt_tensor *ca = as_dtype(a, cd, 0), *res = NULL;
  if (!ca) return NULL;
  clrt_tensor *dst = output_for(target, cd, outdt, a->ndim, a->dims);
  if (!dst) goto done;
  if (clrt_tensor_numel(a) > 0) {
    const clrt_tensor *ops[2] = {dst, ca};
    iter it;
    iter_init(&it, a->ndim, a->dims, 2, ops);
    op_ctx ctx = {op};
    if (iter_run(name, &it, cd == CLRT_I32 ? row_unary_i32 : row_unary_f32, &ctx)) {
      if (dst != target) clrt_tensor_free(dst);
      goto done;
    }
  }
  res = finish(dst, target, outdt);
done:
  drop(ca, a);
  return res;
}

clrt_tensor *clrt_tensor_unary(int op, const clrt_tensor *a) {
  if (op < 0 || op >= CLRT_OP_UNARY_COUNT) {
    clrt_set_error("unary op: unknown op %d", op);
    return NULL;
  }
  if (check_tensor(unary_names[op], a)) return NULL;
  return unary_impl(op, a, NULL);
}

int clrt_tensor_unary_(int op, clrt_tensor *a) {
  clrt_storage_written(a->storage);
  if (op < 0 || op >= CLRT_OP_UNARY_COUNT) {
    clrt_set_error("unary op: unknown op %d", op);
    return -1;
  }
  if (check_tensor(unary_inplace_names[op], a)) return -1;
  return unary_impl(op, a, a) ? 0 : -1;
}

/* out (shape nd/shape, dtype of a and b, i.e. cd) = cond ? a : b. */
static int where_into(const char *name, clrt_tensor *dst, const clrt_tensor *cond,
                      const clrt_tensor *a, const clrt_tensor *b, int nd, const int64_t *shape) {
  if (numel_of(nd, shape) == 0) return 0;
  clrt_tensor *cc = as_dtype(cond, CLRT_F32, 0);
  if (!cc) return -1;
  const clrt_tensor *ops[4] = {dst, cc, a, b};
  iter it;
  iter_init(&it, nd, shape, 4, ops);
  int st = iter_run(name, &it, dst->dtype_id == CLRT_I32 ? row_where_i32 : row_where_f32, NULL);
  drop(cc, cond);
  return st;
}

clrt_tensor *clrt_tensor_where(const clrt_tensor *cond, const clrt_tensor *a, const clrt_tensor *b) {
  if (check_tensor("where", cond) || check_tensor("where", a) || check_tensor("where", b)) return NULL;
  const clrt_tensor *three[3] = {cond, a, b};
  int nd;
  int64_t shape[CLRT_MAX_DIMS];
  if (broadcast_shapes("where", 3, three, &nd, shape)) return NULL;
  int rdt = promote(a->dtype_id, b->dtype_id), cd = rdt == CLRT_I32 ? CLRT_I32 : CLRT_F32;
  clrt_tensor *ca = as_dtype(a, cd, 0), *cb = as_dtype(b, cd, 0), *res = NULL, *dst = NULL;
  if (!ca || !cb) goto done;
  dst = clrt_tensor_new(cd, nd, shape, CLRT_CPU);
  if (!dst) goto done;
  if (where_into("where", dst, cond, ca, cb, nd, shape)) {
    clrt_tensor_free(dst);
    goto done;
  }
  res = finish(dst, NULL, rdt);
done:
  drop(ca, a);
  drop(cb, b);
  return res;
}

int clrt_tensor_masked_fill_(clrt_tensor *t, const clrt_tensor *mask, double value) {
  clrt_storage_written(t->storage);
  if (check_tensor("masked_fill_", t) || check_tensor("masked_fill_", mask)) return -1;
  const clrt_tensor *pair[2] = {t, mask};
  int nd;
  int64_t shape[CLRT_MAX_DIMS];
  if (broadcast_shapes("masked_fill_", 2, pair, &nd, shape) || !same_shape(nd, shape, t)) {
    shape_bufs sb;
    clrt_set_error("masked_fill_: mask shape %s cannot broadcast into %s", SH(sb, 0, mask), SH(sb, 1, t));
    return -1;
  }
  int cd = t->dtype_id == CLRT_I32 ? CLRT_I32 : CLRT_F32;
  if (cd == CLRT_I32 && !(value >= INT32_MIN && value <= INT32_MAX)) {
    clrt_set_error("masked_fill_: value %g does not fit in an i32 tensor", value);
    return -1;
  }
  clrt_tensor *v = scalar_tensor(cd, value);
  clrt_tensor *work = as_dtype(t, cd, 0);
  int st = -1;
  if (v && work) {
    st = where_into("masked_fill_", work, mask, v, work, nd, shape);
    if (!st && work != t) st = clrt_tensor_copy_(t, work);
  }
  drop(work, t);
  clrt_tensor_free(v);
  return st;
}

/* ---- reductions and softmax over one dimension ----------------------------------------- */

static int check_dim(const char *op, const clrt_tensor *a, int dim) {
  if (dim < 0 || dim >= a->ndim) {
    char sb[160];
    clrt_set_error("%s: dimension index %d (0-based) out of range for shape %s", op, dim,
                   shape_text(a, sb, sizeof sb));
    return -1;
  }
  return 0;
}

/* The tensor as a slab [outer, n, inner] around dim. */
static void slab_of(const clrt_tensor *a, int dim, int64_t *outer, int64_t *n, int64_t *inner) {
  *outer = 1;
  *inner = 1;
  for (int d = 0; d < dim; d++) *outer *= a->dims[d];
  for (int d = dim + 1; d < a->ndim; d++) *inner *= a->dims[d];
  *n = a->dims[dim];
}

typedef struct {
  int op, cd;   /* op: a reduce op, or -1/-2 for softmax/log_softmax */
  int64_t n, inner;
  const void *in;   /* f32 or i32 (4 bytes either way) */
  void *out;
  int32_t *idx;
} slab_job;

/* Units: a group of whole rows when inner == 1, else (outer index, block of RED_COLS columns). */
static void slab_unit(const slab_job *j, int64_t o, int64_t i0, int64_t i1) {
  int64_t base = o * j->n * j->inner, obase = o * j->inner;
  /* An empty reduced dimension has no input buffer at all (NULL + 0 is undefined). */
  const char *in = j->in ? (const char *)j->in + base * 4 : NULL;
  if (j->op < 0) {
    clrt_k_softmax_f32(j->op == -2, j->n, j->inner, i0, i1, (const float *)in, (float *)j->out + base);
  } else if (j->cd == CLRT_I32) {
    clrt_k_reduce_i32(j->op, j->n, j->inner, i0, i1, (const int32_t *)in,
                      j->out ? (int32_t *)j->out + obase : NULL, j->idx ? j->idx + obase : NULL);
  } else {
    clrt_k_reduce_f32(j->op, j->n, j->inner, i0, i1, (const float *)in,
                      j->out ? (float *)j->out + obase : NULL, j->idx ? j->idx + obase : NULL);
  }
}

static int slab_run(const char *op, const slab_job *j, int64_t outer) {
  int64_t blocks = (j->inner + RED_COLS - 1) / RED_COLS;
  int rows_mode = j->inner == 1;
  int64_t rows_per = rows_mode ? (j->n >= CHUNK ? 1 : CHUNK / (j->n ? j->n : 1)) : 1;
  int64_t units = rows_mode ? (outer + rows_per - 1) / rows_per : outer * blocks;
  int stop = 0;
#pragma omp parallel for schedule(dynamic, 1) if (outer * j->n * j->inner >= PAR_MIN && units > 1)
  for (int64_t u = 0; u < units; u++) {
    if (__atomic_load_n(&stop, __ATOMIC_RELAXED)) continue;
    if (clrt_interrupted()) {
      __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
      continue;
    }
    if (rows_mode) {
      int64_t o1 = (u + 1) * rows_per < outer ? (u + 1) * rows_per : outer;
      for (int64_t o = u * rows_per; o < o1; o++) slab_unit(j, o, 0, 1);
    } else {
      int64_t o = u / blocks, i0 = (u % blocks) * RED_COLS;
      slab_unit(j, o, i0, i0 + RED_COLS < j->inner ? i0 + RED_COLS : j->inner);
    }
  }
  if (stop) {
    clrt_set_error("%s: interrupted", op);
    return -1;
  }
  return 0;
}

clrt_tensor *clrt_tensor_reduce(int op, const clrt_tensor *a, int dim, int keepdim) {
  if (op < 0 || op >= CLRT_RED_COUNT) {
    clrt_set_error("reduce: unknown op %d", op);
    return NULL;
  }
  const char *name = reduce_names[op];
  if (check_tensor(name, a) || check_dim(name, a, dim)) return NULL;
  int64_t outer, n, inner;
  slab_of(a, dim, &outer, &n, &inner);
  int is_arg = op == CLRT_RED_ARGMAX || op == CLRT_RED_ARGMIN;
  if (n == 0 && op != CLRT_RED_SUM && op != CLRT_RED_MEAN) {
    char sb[160];
    clrt_set_error("%s: cannot reduce dimension index %d of size 0 (shape %s)", name, dim,
                   shape_text(a, sb, sizeof sb));
    return NULL;
  }
  if (n > INT32_MAX && is_arg) {
    clrt_set_error("%s: dimension of %lld elements is too long for i32 positions", name, (long long)n);
    return NULL;
  }
  int cd = (a->dtype_id == CLRT_I32 && op != CLRT_RED_MEAN) ? CLRT_I32 : CLRT_F32;
  int outdt = is_arg ? CLRT_I32 : (a->dtype_id == CLRT_I32 && op == CLRT_RED_MEAN) ? CLRT_F32 : a->dtype_id;
  int64_t shape[CLRT_MAX_DIMS];
  int nd = 0;
  for (int d = 0; d < a->ndim; d++) {
    if (d != dim) shape[nd++] = a->dims[d];
    else if (keepdim) shape[nd++] = 1;
  }
  clrt_tensor *ca = as_dtype(a, cd, 1), *dst = NULL, *res = NULL;
  if (!ca) return NULL;
  dst = clrt_tensor_new(is_arg ? CLRT_I32 : cd, nd, shape, CLRT_CPU);
  if (!dst) goto done;
  if (outer * inner > 0) {
    slab_job j = {op, cd, n, inner, clrt_tensor_data(ca), is_arg ? NULL : clrt_tensor_data(dst),
                  is_arg ? clrt_tensor_data(dst) : NULL};
    if (slab_run(name, &j, outer)) {
      clrt_tensor_free(dst);
      goto done;
    }
  }
  res = finish(dst, NULL, outdt);
done:
  drop(ca, a);
  return res;
}

clrt_tensor *clrt_tensor_softmax(const clrt_tensor *a, int dim, int use_log) {
  const char *name = use_log ? "log_softmax" : "softmax";
  if (check_tensor(name, a) || check_dim(name, a, dim)) return NULL;
  int64_t outer, n, inner;
  slab_of(a, dim, &outer, &n, &inner);
  int outdt = a->dtype_id == CLRT_BF16 ? CLRT_BF16 : CLRT_F32;
  clrt_tensor *ca = as_dtype(a, CLRT_F32, 1), *dst = NULL, *res = NULL;
  if (!ca) return NULL;
  dst = clrt_tensor_new(CLRT_F32, a->ndim, a->dims, CLRT_CPU);
  if (!dst) goto done;
  if (outer * n * inner > 0) {
    slab_job j = {use_log ? -2 : -1, CLRT_F32, n, inner, clrt_tensor_data(ca), clrt_tensor_data(dst), NULL};
    if (slab_run(name, &j, outer)) {
      clrt_tensor_free(dst);
      goto done;
    }
  }
  res = finish(dst, NULL, outdt);
done:
  drop(ca, a);
  return res;
}

/* Better of two partial results: NaN wins max/min (as numpy), then the earlier position. */
static int better_partial(int op, double v, double best) {
  if (best != best) return 0;
  if (v != v) return 1;
  return (op == CLRT_RED_MAX || op == CLRT_RED_ARGMAX) ? v > best : v < best;
}

int clrt_tensor_reduce_all(int op, const clrt_tensor *a, double *out) {
  if (op < 0 || op >= CLRT_RED_COUNT) {
    clrt_set_error("reduce: unknown op %d", op);
    return -1;
  }
  const char *name = reduce_names[op];
  if (check_tensor(name, a)) return -1;
  int64_t n = clrt_tensor_numel(a);
  if (n == 0) {
    if (op == CLRT_RED_SUM || op == CLRT_RED_MEAN) {
      *out = op == CLRT_RED_SUM ? 0.0 : NAN;
      return 0;
    }
    char sb[160];
    clrt_set_error("%s: cannot reduce an empty tensor (shape %s)", name, shape_text(a, sb, sizeof sb));
    return -1;
  }
  int cd = a->dtype_id == CLRT_I32 ? CLRT_I32 : CLRT_F32;
  clrt_tensor *ca = as_dtype(a, cd, 1);
  if (!ca) return -1;
  int64_t pieces = (n + ALL_PIECE - 1) / ALL_PIECE;
  double *val = malloc(sizeof(double) * (size_t)pieces);
  int64_t *pos = malloc(sizeof(int64_t) * (size_t)pieces);
  int st = -1;
  if (!val || !pos) {
    clrt_set_error("%s: out of memory", name);
    goto done;
  }
  const char *base = clrt_tensor_data(ca);
  int stop = 0;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
  for (int64_t p = 0; p < pieces; p++) {
    if (__atomic_load_n(&stop, __ATOMIC_RELAXED)) continue;
    if (clrt_interrupted()) {
      __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
      continue;
    }
    int64_t s = p * ALL_PIECE, len = n - s < ALL_PIECE ? n - s : ALL_PIECE;
    if (cd == CLRT_I32)
      clrt_k_reduce_all_i32(op, len, (const int32_t *)base + s, &val[p], &pos[p]);
    else
      clrt_k_reduce_all_f32(op, len, (const float *)base + s, &val[p], &pos[p]);
  }
  if (stop) {
    clrt_set_error("%s: interrupted", name);
    goto done;
  }
  /* Pieces combine in order, so the result does not depend on the thread count. */
  double acc = val[0];
  int64_t at = pos[0];
  for (int64_t p = 1; p < pieces; p++) {
    if (op == CLRT_RED_SUM || op == CLRT_RED_MEAN)
      acc += val[p];
    else if (better_partial(op, val[p], acc))
      acc = val[p], at = p * ALL_PIECE + pos[p];
  }
  if (op == CLRT_RED_MEAN) acc /= (double)n;
  if (op == CLRT_RED_SUM && a->dtype_id == CLRT_F32) acc = (float)acc;   /* as an f32 sum would hold it */
  *out = (op == CLRT_RED_ARGMAX || op == CLRT_RED_ARGMIN) ? (double)at : acc;
  st = 0;
done:
  free(val);
  free(pos);
  drop(ca, a);
  return st;
}

/* ---- matmul ------------------------------------------------------------------------------- */

/* How sgemm can read a [R, C] matrix with row stride rs and column stride cs without a copy:
   returns 0 (row-major, *ld = row stride), 1 (transposed, *ld = column stride), -1 (copy). */
static int gemm_layout(int64_t R, int64_t C, int64_t rs, int64_t cs, int64_t *ld) {
  int64_t minr = C > 1 ? C : 1, minc = R > 1 ? R : 1;
  if ((C <= 1 || cs == 1) && (R <= 1 || rs >= minr)) {
    *ld = R <= 1 ? minr : rs;
    return 0;
  }
  if ((R <= 1 || rs == 1) && (C <= 1 || cs >= minc)) {
    *ld = C <= 1 ? minc : cs;
    return 1;
  }
  return -1;
}

clrt_tensor *clrt_tensor_matmul(const clrt_tensor *a, const clrt_tensor *b) {
  if (check_tensor("matmul", a) || check_tensor("matmul", b)) return NULL;
  shape_bufs sb;
  if (a->ndim == 0 || b->ndim == 0) {
    clrt_set_error("matmul: shapes %s and %s: both operands need at least one dimension",
                   SH(sb, 0, a), SH(sb, 1, b));
    return NULL;
  }
  int rdt = promote(a->dtype_id, b->dtype_id);
  clrt_tensor *ca = as_dtype(a, CLRT_F32, 0), *cb = as_dtype(b, CLRT_F32, 0);
  clrt_tensor *dst = NULL, *res = NULL;
  if (!ca || !cb) goto done;
  /* A: [M, K] with strides (ars, acs); B: [K, N] with strides (brs, bcs). */
  int64_t M, K, N, Kb, ars, acs, brs, bcs;
  if (a->ndim == 1) M = 1, K = a->dims[0], ars = 0, acs = ca->strides[0];
  else M = a->dims[a->ndim - 2], K = a->dims[a->ndim - 1], ars = ca->strides[a->ndim - 2], acs = ca->strides[a->ndim - 1];
  if (b->ndim == 1) Kb = b->dims[0], N = 1, brs = cb->strides[0], bcs = 0;
  else Kb = b->dims[b->ndim - 2], N = b->dims[b->ndim - 1], brs = cb->strides[b->ndim - 2], bcs = cb->strides[b->ndim - 1];
  if (K != Kb) {
    clrt_set_error("matmul: shapes %s and %s do not match (%lld != %lld)", SH(sb, 0, a),
                   SH(sb, 1, b), (long long)K, (long long)Kb);
    goto done;
  }
  /* Batch dimensions broadcast like elementwise ones. */
  int abd = a->ndim > 2 ? a->ndim - 2 : 0, bbd = b->ndim > 2 ? b->ndim - 2 : 0;
  int bd = abd > bbd ? abd : bbd;
  int64_t bshape[CLRT_MAX_DIMS], ast[CLRT_MAX_DIMS], bst[CLRT_MAX_DIMS];
  for (int d = 0; d < bd; d++) {
    int ja = d - (bd - abd), jb = d - (bd - bbd);
    int64_t ea = ja < 0 ? 1 : a->dims[ja], eb = jb < 0 ? 1 : b->dims[jb];
    if (ea != eb && ea != 1 && eb != 1) {
      clrt_set_error("matmul: shapes %s and %s: batch dimensions cannot broadcast", SH(sb, 0, a), SH(sb, 1, b));
      goto done;
    }
    bshape[d] = ea == 1 ? eb : ea;
    ast[d] = (ja < 0 || ea == 1) ? 0 : ca->strides[ja];
    bst[d] = (jb < 0 || eb == 1) ? 0 : cb->strides[jb];
  }
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX) {
    clrt_set_error("matmul: shapes %s and %s are too large for sgemm", SH(sb, 0, a), SH(sb, 1, b));
    goto done;
  }
  int64_t oshape[CLRT_MAX_DIMS];
  int ond = 0;
  for (int d = 0; d < bd; d++) oshape[ond++] = bshape[d];
  if (a->ndim > 1) oshape[ond++] = M;
  if (b->ndim > 1) oshape[ond++] = N;
  dst = clrt_tensor_new(CLRT_F32, ond, oshape, CLRT_CPU);
  if (!dst) goto done;
  int64_t nb = numel_of(bd, bshape);
  if (nb == 0 || M == 0 || N == 0 || K == 0) {   /* empty sums are 0, and new tensors are 0 */
    res = finish(dst, NULL, rdt);
    dst = NULL;
    goto done;
  }
  int64_t lda = 1, ldb = 1;
  int ta = gemm_layout(M, K, ars, acs, &lda), tb = gemm_layout(K, N, brs, bcs, &ldb);
  /* Neither layout fits (e.g. a strided slice of both dims): copy to contiguous once. */
  if (ta < 0) {
    clrt_tensor *c = clrt_tensor_clone(ca);
    drop(ca, a);
    ca = c;
    if (!ca) goto done;
    for (int d = 0; d < bd; d++) {
      int ja = d - (bd - abd);
      if (ast[d]) ast[d] = ca->strides[ja];
    }
    ars = a->ndim == 1 ? 0 : ca->strides[a->ndim - 2];
    acs = ca->strides[a->ndim - 1];
    ta = gemm_layout(M, K, ars, acs, &lda);
  }
  if (tb < 0) {
    clrt_tensor *c = clrt_tensor_clone(cb);
    drop(cb, b);
    cb = c;
    if (!cb) goto done;
    for (int d = 0; d < bd; d++) {
      int jb = d - (bd - bbd);
      if (bst[d]) bst[d] = cb->strides[jb];
    }
    brs = cb->strides[b->ndim == 1 ? 0 : b->ndim - 2];
    bcs = b->ndim == 1 ? 0 : cb->strides[b->ndim - 1];
    tb = gemm_layout(K, N, brs, bcs, &ldb);
  }
  const float *A = clrt_tensor_data(ca), *B = clrt_tensor_data(cb);
  float *Cm = clrt_tensor_data(dst);
  /* [batch..., M, K] @ [K, N] with a contiguous A is one [batch*M, K] @ [K, N] product. */
  if (bbd == 0 && ta == 0 && clrt_tensor_is_contiguous(ca) && nb * M <= INT_MAX) {
    clrt_k_matmul_f32(0, tb, nb * M, N, K, A, lda, B, ldb, Cm, N);
  } else {
    for (int64_t i = 0; i < nb; i++) {
      if (clrt_interrupted()) {
        clrt_set_error("matmul: interrupted");
        goto done;
      }
      int64_t aoff = 0, boff = 0, r = i;
      for (int d = bd - 1; d >= 0; d--) {
        int64_t k = r % bshape[d];
        r /= bshape[d];
        aoff += k * ast[d];
        boff += k * bst[d];
      }
      clrt_k_matmul_f32(ta, tb, M, N, K, A + aoff, lda, B + boff, ldb, Cm + i * M * N, N);
    }
  }
  res = finish(dst, NULL, rdt);
  dst = NULL;
done:
  clrt_tensor_free(dst);
  drop(ca, a);
  drop(cb, b);
  return res;
}
