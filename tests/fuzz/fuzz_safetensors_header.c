/* fuzz_safetensors_header.c — arbitrary bytes as a safetensors file image: the header
   length, JSON header and data checks must reject anything malformed without crashing or
   leaking, and whatever is accepted must be readable in full. */
#include "clrt.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* Half the inputs get a valid length prefix so the fuzzer reaches the JSON parser fast. */
  uint8_t *buf = malloc(size + 8);
  if (!buf) return 0;
  size_t len = size;
  if (size > 0 && (data[0] & 1)) {
    uint64_t h = size - 1;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(h >> (8 * i));
    memcpy(buf + 8, data + 1, size - 1);
    len = size + 7;
  } else {
    memcpy(buf, data, size);
  }
  clrt_safetensors *st = clrt_safetensors_open_memory(buf, len, "fuzz");
  if (st) {
    int n = clrt_safetensors_count(st);
    for (int i = 0; i < n; i++) {
      const char *name = clrt_safetensors_name(st, i);
      if (clrt_safetensors_find(st, name) != i) abort();
      int64_t numel = 1;
      for (int d = 0; d < clrt_safetensors_ndim(st, i); d++) numel *= clrt_safetensors_dim(st, i, d);
      if (numel <= 4096) {
        float *out = malloc(sizeof(float) * (size_t)(numel ? numel : 1));
        if (out) clrt_safetensors_read_f32(st, i, out, numel);
        free(out);
      }
    }
    clrt_safetensors_metadata(st, "format");
    clrt_safetensors_close(st);
  }
  free(buf);
  return 0;
}
