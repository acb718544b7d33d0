/* tensor.c — storage, tensor handles, views, element access, copies and the RNG.
   The arithmetic on tensors lives in tensor_ops.c; this file only manages memory and layout. */
#include "clrt.h"
#include "bf16.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

size_t clrt_dtype_size(int dtype) {
  switch (dtype) {
    case CLRT_F32: return 4;
    case CLRT_BF16: return 2;
    case CLRT_I32: return 4;
    default: return 0;
  }
}

const char *clrt_dtype_name(int dtype) {
  switch (dtype) {
    case CLRT_F32: return "f32";
    case CLRT_BF16: return "bf16";
    case CLRT_I32: return "i32";
    default: return "?";
  }
}

/* Serials start at 1 and never repeat within a process (an arena freed and another allocated at
   the same address still differ). */
static uint64_t clrt_storage_next_serial(void) {
  static uint64_t last;
  return __atomic_add_fetch(&last, 1, __ATOMIC_RELAXED);
}

clrt_storage *clrt_storage_new(size_t bytes, int device) {
  if (device == CLRT_CUDA) {   /* cuda_tensor.c */
    clrt_storage *s = clrt_cuda_storage_new(bytes);
    if (s) s->serial = clrt_storage_next_serial();
    return s;
  }
  if (device != CLRT_CPU) {
    clrt_set_error("storage: unknown device %d", device);
    return NULL;
  }
  clrt_storage *s = calloc(1, sizeof *s);
  if (!s) goto oom;
  /* 64-byte alignment for SIMD and to keep views of one arena on separate cache lines. */
  size_t rounded = (bytes + 63) & ~(size_t)63;
  /* Weights, packed copies, KV caches and activation arenas: on 2 MiB pages where the kernel
     allows them (transparent huge pages, madvise mode), streaming them takes a TLB miss per
     2 MiB rather than per 4 KiB. Decode on the 2-core Zen 5: 110M batch 1 +15%, batch 32 +9%. */
  const size_t huge = (size_t)2 << 20;
  size_t bytes_zeroed = 0;
  if (rounded >= 4 * huge) {
    rounded = (rounded + huge - 1) & ~(huge - 1);
    s->data = aligned_alloc(huge, rounded);
    if (s->data) (void)madvise(s->data, rounded, MADV_HUGEPAGE);   /* advice: refused is fine */
    /* Zeroed by giving the pages back (anonymous memory reads zero again) rather than by
       writing them: an arena becomes resident only as it is used, so a new copy made beside
       an old one (base16.c's conversion) does not take both at once. */
    if (s->data && madvise(s->data, rounded, MADV_DONTNEED) == 0) bytes_zeroed = rounded;
  } else {
    s->data = rounded ? aligned_alloc(64, rounded) : NULL;
  }
  if (rounded && !s->data) {
    free(s);
    goto oom;
  }
  if (rounded > bytes_zeroed) memset(s->data, 0, rounded);
  s->bytes = bytes;
  s->refcount = 1;
  s->serial = clrt_storage_next_serial();
  s->device = device;
  return s;
oom:
  clrt_set_error("storage: out of memory allocating %zu bytes", bytes);
  return NULL;
}

const void *clrt_give_back_pages(const void *a, const void *b) {
  uintptr_t hp = (uintptr_t)2 << 20, lo = ((uintptr_t)a + hp - 1) & ~(hp - 1), hi = (uintptr_t)b & ~(hp - 1);
  if (hi <= lo) return a;
  madvise((void *)lo, hi - lo, MADV_DONTNEED);
  return (const void *)hi;
}

void clrt_storage_written(clrt_storage *s) {
  if (s) s->version++;
}

void clrt_storage_retain(clrt_storage *s) {
  if (s) __atomic_add_fetch(&s->refcount, 1, __ATOMIC_RELAXED);
}

void clrt_storage_release(clrt_storage *s) {
  if (!s) return;
  if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
    if (s->device == CLRT_CUDA) clrt_cuda_storage_free(s->data);
    else free(s->data);
    free(s);
  }
}

static int check_shape(const char *op, int ndim, const int64_t *shape) {
  if (ndim < 0 || ndim > CLRT_MAX_DIMS) {
    clrt_set_error("%s: %d dimensions (at most %d)", op, ndim, CLRT_MAX_DIMS);
    return -1;
  }
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0) {
      clrt_set_error("%s: negative size %lld in dimension %d", op, (long long)shape[i], i);
      return -1;
    }
  return 0;
}

static void contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    strides[i] = s;
    s *= shape[i];
  }
}

static int64_t shape_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

clrt_tensor *clrt_tensor_over(clrt_storage *s, int dtype, int ndim, const int64_t *shape,
                              const int64_t *strides, int64_t offset) {
  if (check_shape("tensor", ndim, shape)) return NULL;
  if (clrt_dtype_size(dtype) == 0) {
    clrt_set_error("tensor: unknown dtype %d", dtype);
    return NULL;
  }
  clrt_tensor *t = calloc(1, sizeof *t);
  if (!t) {
    clrt_set_error("tensor: out of memory");
    return NULL;
  }
  t->storage = s;
  clrt_storage_retain(s);
  t->offset = offset;
  t->ndim = ndim;
  t->dtype_id = dtype;
  t->device_id = s ? s->device : CLRT_CPU;
  memcpy(t->dims, shape, sizeof(int64_t) * (size_t)ndim);
  if (strides)
    memcpy(t->strides, strides, sizeof(int64_t) * (size_t)ndim);
  else
    contiguous_strides(ndim, shape, t->strides);
  return t;
}

clrt_tensor *clrt_tensor_new(int dtype, int ndim, const int64_t *shape, int device) {
  if (check_shape("tensor", ndim, shape)) return NULL;
  size_t es = clrt_dtype_size(dtype);
  if (!es) {
    clrt_set_error("tensor: unknown dtype %d", dtype);
    return NULL;
  }
  clrt_storage *s = clrt_storage_new(es * (size_t)shape_numel(ndim, shape), device);
  if (!s) return NULL;
  clrt_tensor *t = clrt_tensor_over(s, dtype, ndim, shape, NULL, 0);
  clrt_storage_release(s);
  return t;
}

void clrt_tensor_free(clrt_tensor *t) {
  if (!t) return;
  clrt_storage_release(t->storage);
  free(t);
}

int64_t clrt_tensor_numel(const clrt_tensor *t) { return shape_numel(t->ndim, t->dims); }

int clrt_tensor_is_contiguous(const clrt_tensor *t) {
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->dims[i] != 1 && t->strides[i] != s) return 0;
    s *= t->dims[i];
  }
  return 1;
}

void *clrt_tensor_data(const clrt_tensor *t) {
  if (!t->storage || !t->storage->data) return NULL;
  return (char *)t->storage->data + (size_t)t->offset * clrt_dtype_size(t->dtype_id);
}

clrt_tensor *clrt_tensor_reshape(const clrt_tensor *t, int ndim, const int64_t *shape) {
  if (check_shape("reshape", ndim, shape)) return NULL;
  if (shape_numel(ndim, shape) != clrt_tensor_numel(t)) {
    clrt_set_error("reshape: cannot view %lld elements as a shape of %lld elements",
                   (long long)clrt_tensor_numel(t), (long long)shape_numel(ndim, shape));
    return NULL;
  }
  if (!clrt_tensor_is_contiguous(t)) {
    clrt_set_error("reshape: the tensor is not contiguous; clone it first");
    return NULL;
  }
  return clrt_tensor_over(t->storage, t->dtype_id, ndim, shape, NULL, t->offset);
}

clrt_tensor *clrt_tensor_narrow(const clrt_tensor *t, int dim, int64_t start, int64_t len) {
  if (dim < 0 || dim >= t->ndim) {
    clrt_set_error("narrow: dimension %d out of range for a %d-d tensor", dim, t->ndim);
    return NULL;
  }
  if (start < 0 || len < 0 || start + len > t->dims[dim]) {
    clrt_set_error("narrow: range [%lld, %lld) out of bounds for dimension %d of size %lld",
                   (long long)start, (long long)(start + len), dim, (long long)t->dims[dim]);
    return NULL;
  }
  int64_t shape[CLRT_MAX_DIMS];
  memcpy(shape, t->dims, sizeof shape);
  shape[dim] = len;
  return clrt_tensor_over(t->storage, t->dtype_id, t->ndim, shape, t->strides,
                          t->offset + start * t->strides[dim]);
}

clrt_tensor *clrt_tensor_transpose(const clrt_tensor *t, int d0, int d1) {
  if (d0 < 0 || d0 >= t->ndim || d1 < 0 || d1 >= t->ndim) {
    clrt_set_error("transpose: dimensions %d and %d out of range for a %d-d tensor", d0, d1,
                   t->ndim);
    return NULL;
  }
  int64_t shape[CLRT_MAX_DIMS], strides[CLRT_MAX_DIMS];
  memcpy(shape, t->dims, sizeof shape);
  memcpy(strides, t->strides, sizeof strides);
  shape[d0] = t->dims[d1];
  shape[d1] = t->dims[d0];
  strides[d0] = t->strides[d1];
  strides[d1] = t->strides[d0];
  return clrt_tensor_over(t->storage, t->dtype_id, t->ndim, shape, strides, t->offset);
}

/* Storage offset (in elements) of the element at flat row-major logical index i. */
static int64_t flat_to_offset(const clrt_tensor *t, int64_t i) {
  int64_t off = t->offset;
  for (int d = t->ndim - 1; d >= 0; d--) {
    int64_t n = t->dims[d];
    off += (i % n) * t->strides[d];
    i /= n;
  }
  return off;
}

static double load_at(const clrt_tensor *t, int64_t off) {
  const char *base = t->storage->data;
  switch (t->dtype_id) {
    case CLRT_F32: return ((const float *)base)[off];
    case CLRT_BF16: return clrt_bf16_to_f32(((const uint16_t *)base)[off]);
    default: return ((const int32_t *)base)[off];
  }
}

static void store_at(clrt_tensor *t, int64_t off, double v) {
  char *base = t->storage->data;
  switch (t->dtype_id) {
    case CLRT_F32: ((float *)base)[off] = (float)v; break;
    case CLRT_BF16: ((uint16_t *)base)[off] = clrt_f32_to_bf16((float)v); break;
    default: ((int32_t *)base)[off] = (int32_t)v; break;
  }
}

static int check_cpu(const char *op, const clrt_tensor *t) {
  if (t->device_id != CLRT_CPU) {
    clrt_set_error("%s: tensor is on cuda; move it to cpu first", op);
    return -1;
  }
  return 0;
}

double clrt_tensor_get(const clrt_tensor *t, int64_t index) {
  if (check_cpu("get", t)) return NAN;
  int64_t n = clrt_tensor_numel(t);
  if (index < 0 || index >= n) {
    clrt_set_error("get: index %lld out of range for %lld elements", (long long)index,
                   (long long)n);
    return NAN;
  }
  return load_at(t, flat_to_offset(t, index));
}

int clrt_tensor_set(clrt_tensor *t, int64_t index, double value) {
  clrt_storage_written(t->storage);
  if (check_cpu("set", t)) return -1;
  int64_t n = clrt_tensor_numel(t);
  if (index < 0 || index >= n) {
    clrt_set_error("set: index %lld out of range for %lld elements", (long long)index,
                   (long long)n);
    return -1;
  }
  store_at(t, flat_to_offset(t, index), value);
  return 0;
}

/* copy_ when either side is on cuda: same dtype, same numel, both contiguous, then one
   copy of the bytes (cuda_tensor.c). */
static int cuda_copy(clrt_tensor *dst, const clrt_tensor *src) {
  int64_t n = clrt_tensor_numel(dst);
  if (n != clrt_tensor_numel(src) || dst->dtype_id != src->dtype_id) {
    clrt_set_error("copy_: cuda copies need the same dtype and size (destination %s[%lld], source %s[%lld])",
                   clrt_dtype_name(dst->dtype_id), (long long)n, clrt_dtype_name(src->dtype_id),
                   (long long)clrt_tensor_numel(src));
    return -1;
  }
  if (!clrt_tensor_is_contiguous(dst) || !clrt_tensor_is_contiguous(src)) {
    clrt_set_error("copy_: cuda copies need contiguous tensors (call :contiguous() on the cpu side)");
    return -1;
  }
  int kind = src->device_id == CLRT_CPU ? 0 : dst->device_id == CLRT_CPU ? 1 : 2;
  return clrt_cuda_copy_bytes(clrt_tensor_data(dst), clrt_tensor_data(src),
                              (size_t)n * clrt_dtype_size(src->dtype_id), kind);
}

int clrt_tensor_copy_(clrt_tensor *dst, const clrt_tensor *src) {
  clrt_storage_written(dst->storage);
  if (dst->device_id == CLRT_CUDA || src->device_id == CLRT_CUDA) return cuda_copy(dst, src);
  if (check_cpu("copy_", dst) || check_cpu("copy_", src)) return -1;
  int64_t n = clrt_tensor_numel(dst);
  if (n != clrt_tensor_numel(src)) {
    clrt_set_error("copy_: destination has %lld elements, source %lld", (long long)n,
                   (long long)clrt_tensor_numel(src));
    return -1;
  }
  if (dst->dtype_id == src->dtype_id && clrt_tensor_is_contiguous(dst) &&
      clrt_tensor_is_contiguous(src)) {
    memmove(clrt_tensor_data(dst), clrt_tensor_data(src),
            (size_t)n * clrt_dtype_size(src->dtype_id));
    return 0;
  }
  if (dst->dtype_id == CLRT_I32 && src->dtype_id == CLRT_I32) {
    for (int64_t i = 0; i < n; i++)
      ((int32_t *)dst->storage->data)[flat_to_offset(dst, i)] =
          ((const int32_t *)src->storage->data)[flat_to_offset(src, i)];
    return 0;
  }
  for (int64_t i = 0; i < n; i++) store_at(dst, flat_to_offset(dst, i), load_at(src, flat_to_offset(src, i)));
  return 0;
}

clrt_tensor *clrt_tensor_clone(const clrt_tensor *t) { return clrt_tensor_to_dtype(t, t->dtype_id); }

clrt_tensor *clrt_tensor_to_dtype(const clrt_tensor *t, int dtype) {
  clrt_tensor *out = clrt_tensor_new(dtype, t->ndim, t->dims, t->device_id);
  if (!out) return NULL;
  if (clrt_tensor_copy_(out, t)) {
    clrt_tensor_free(out);
    return NULL;
  }
  return out;
}

int clrt_tensor_fill_(clrt_tensor *t, double value) {
  clrt_storage_written(t->storage);
  if (check_cpu("fill_", t)) return -1;
  int64_t n = clrt_tensor_numel(t);
  if (t->dtype_id == CLRT_F32 && clrt_tensor_is_contiguous(t)) {
    float *p = clrt_tensor_data(t);
    for (int64_t i = 0; i < n; i++) p[i] = (float)value;
    return 0;
  }
  for (int64_t i = 0; i < n; i++) store_at(t, flat_to_offset(t, i), value);
  return 0;
}

/* xoshiro256** seeded through splitmix64: small, fast, and its state fits in a checkpoint. */
static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void clrt_rng_seed(clrt_rng *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t clrt_rng_next(clrt_rng *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double clrt_rng_uniform(clrt_rng *r) { return (double)(clrt_rng_next(r) >> 11) * 0x1.0p-53; }

double clrt_rng_normal(clrt_rng *r) {
  /* Box-Muller; one value per call keeps the stream position simple to reason about. */
  double u1 = clrt_rng_uniform(r), u2 = clrt_rng_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int clrt_tensor_rand_(clrt_tensor *t, clrt_rng *r) {
  clrt_storage_written(t->storage);
  if (check_cpu("rand_", t)) return -1;
  int64_t n = clrt_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) store_at(t, flat_to_offset(t, i), clrt_rng_uniform(r));
  return 0;
}

int clrt_tensor_randn_(clrt_tensor *t, clrt_rng *r) {
  clrt_storage_written(t->storage);
  if (check_cpu("randn_", t)) return -1;
  int64_t n = clrt_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) store_at(t, flat_to_offset(t, i), clrt_rng_normal(r));
  return 0;
}

clrt_tensor *clrt_tensor_to_device(const clrt_tensor *t, int device) {
  if (device != CLRT_CPU && device != CLRT_CUDA) {
    clrt_set_error("to: unknown device %d", device);
    return NULL;
  }
  if (device == CLRT_CPU && t->device_id == CLRT_CPU) return clrt_tensor_clone(t);
  clrt_tensor *src = (clrt_tensor *)t, *tmp = NULL;
  if (!clrt_tensor_is_contiguous(t)) {
    if (t->device_id != CLRT_CPU) {
      clrt_set_error("to: a strided view on cuda cannot be copied (make it contiguous first)");
      return NULL;
    }
    if (!(tmp = clrt_tensor_clone(t))) return NULL;
    src = tmp;
  }
  clrt_tensor *out = clrt_tensor_new(t->dtype_id, t->ndim, t->dims, device);
  if (out && clrt_tensor_copy_(out, src)) {
    clrt_tensor_free(out);
    out = NULL;
  }
  clrt_tensor_free(tmp);
  return out;
}
