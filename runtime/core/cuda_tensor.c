/* cuda_tensor.c — clrt_storage on the GPU and copies between host and device. Built always;
   without CLRT_HAVE_CUDA every entry point fails with a message saying so. */
#include "clrt.h"

#include <stdlib.h>

#ifdef CLRT_HAVE_CUDA
#include "cuda_context.h"

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

int clrt_cuda_copy_bytes(void *dst, const void *src, size_t bytes, int kind) {
  return clrt_cuda_memcpy(dst, src, bytes, kind);
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

int clrt_cuda_copy_bytes(void *dst, const void *src, size_t bytes, int kind) {
  (void)dst, (void)src, (void)bytes, (void)kind;
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
