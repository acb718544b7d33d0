/* cuda_tensor.c — clrt_storage on the GPU and copies between host and device. Built always;
   without CLRT_HAVE_CUDA every entry point fails with a message saying so. */
#include "clrt.h"

#include <stdlib.h>

#ifdef CLRT_HAVE_CUDA
#include "cuda/cuda_kernels.h"

clrt_storage *clrt_cuda_storage_new(size_t bytes) {
  clrt_storage *s = calloc(1, sizeof *s);
  if (!s) {
    clrt_set_error("storage: out of host memory for a cuda storage header");
    return NULL;
  }
  s->data = clrt_cuda_malloc(bytes, "a tensor storage");
  if (!s->data || clrt_cuda_memset0(s->data, bytes)) {
    clrt_cuda_free(s->data);
    free(s);
    return NULL;
  }
  s->bytes = bytes;
  s->refcount = 1;
  s->device = CLRT_CUDA;
  return s;
}

void clrt_cuda_storage_free(void *data) { clrt_cuda_free(data); }

int clrt_cuda_tensor_copy(clrt_tensor *dst, const clrt_tensor *src) {
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
  return clrt_cuda_memcpy(clrt_tensor_data(dst), clrt_tensor_data(src),
                          (size_t)n * clrt_dtype_size(src->dtype_id), kind);
}

const char *clrt_cuda_device_name_str(void) {
  static char name[256];
  if (clrt_cuda_device_name(name, sizeof name)) name[0] = 0;
  return name;
}

#else

clrt_storage *clrt_cuda_storage_new(size_t bytes) {
  clrt_set_error("storage: cannot allocate %zu bytes on cuda: clrt was built without CUDA", bytes);
  return NULL;
}

void clrt_cuda_storage_free(void *data) { (void)data; }

int clrt_cuda_tensor_copy(clrt_tensor *dst, const clrt_tensor *src) {
  (void)dst, (void)src;
  clrt_set_error("copy_: a tensor is on cuda but clrt was built without CUDA");
  return -1;
}

const char *clrt_cuda_device_name_str(void) {
  clrt_set_error("cuda: clrt was built without CUDA");
  return "";
}

const char *clrt_cuda_status(void) { return "clrt was built without CUDA"; }

int clrt_cuda_device_count(void) { return 0; }

#endif

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
