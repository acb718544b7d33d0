/* lora_math.h — LoRA's per-element math shared by the CPU and CUDA kernels: the dropout mask on
   an adapter's input. The mask is a pure function of (key, element index), so backward
   regenerates the forward's mask instead of storing it, and a resumed run draws the same masks
   (key = the adapter's seed, the training step's counter, the layer and the target). */
#ifndef CLRT_LORA_MATH_H
#define CLRT_LORA_MATH_H
#include <stdint.h>

#include "bf16.h"   /* CLRT_HD */

/* splitmix64's finaliser: a well-mixed 64-bit value from any input. */
CLRT_HD uint64_t clrt_lora_mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* The factor element i of the adapter's input is multiplied by: 0 with probability p, else
   1/(1-p) (inverted dropout, as torch.nn.Dropout in training). */
CLRT_HD float clrt_lora_keep(uint64_t key, int64_t i, float p) {
  uint64_t h = clrt_lora_mix(key ^ clrt_lora_mix((uint64_t)i));
  float u = (float)(h >> 40) * (1.0f / 16777216.0f);   /* 24 bits: uniform in [0, 1) */
  return u < p ? 0.0f : 1.0f / (1.0f - p);
}

/* The key of one adapter application: seed, training-forward counter, layer, target. */
CLRT_HD uint64_t clrt_lora_key(uint64_t seed, uint64_t step, int layer, int target) {
  return clrt_lora_mix(seed ^ clrt_lora_mix(step * 0x100000001B3ull + (uint64_t)layer * 16u + (uint64_t)target));
}

#endif
