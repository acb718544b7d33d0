/* cuda_context.h — the runtime's CUDA device layer (cuda_context.cu): the device, the kernels'
   launch context made on first use, device memory and copies, each failure set as the
   runtime's error. Only built with CLRT_CUDA; include only under CLRT_HAVE_CUDA. */
#ifndef CLRT_CUDA_CONTEXT_H
#define CLRT_CUDA_CONTEXT_H
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

int clrt_cuda_device_count(void);
/* Creates the stream and cuBLAS handle on first use; -1 with a message if no GPU. */
int clrt_cuda_init(void);
/* Destroys the stream and cuBLAS handle (clrt_cuda_init makes them again on next use). */
void clrt_cuda_shutdown(void);
/* Waits for the stream; -1 with the first recorded error ("<kernel>: <cuda error>"). */
int clrt_cuda_sync(void);
/* Device memory: NULL and a message naming the size requested and the free memory. */
void *clrt_cuda_malloc(size_t bytes, const char *what);
void clrt_cuda_free(void *p);
/* Copies on the stream; kind: 0 host->device, 1 device->host, 2 device->device. The
   device->host copy synchronises (the host reads the result next). */
int clrt_cuda_memcpy(void *dst, const void *src, size_t bytes, int kind);
int clrt_cuda_memset0(void *p, size_t bytes);
/* The device's name and bf16 dense peak in TFLOP/s (0 if unknown; see runtime/model/flops.c). */
int clrt_cuda_device_name(char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
