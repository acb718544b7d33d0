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

/* murmur3's 32-bit finaliser: 32-bit multiplies, so the per-element mask vectorizes (AVX2
   has no 64-bit multiply), which a 64-bit mix per element did not. */
CLRT_HD uint32_t clrt_lora_mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

/* The factor element i of the adapter's input is multiplied by: 0 with probability p, else
   inv = 1/(1-p) (inverted dropout, as torch.nn.Dropout in training). Two rounds over the index
   and both halves of the key; k1 carries the key's high half and the index's (so CPU loops run
   over 32-bit indices inside a block of 2^32 and vectorize). */
CLRT_HD uint32_t clrt_lora_k1(uint64_t key, int64_t i) {
  return (uint32_t)(key >> 32) ^ ((uint32_t)((uint64_t)i >> 32) * 0x9E3779B9u);
}

CLRT_HD float clrt_lora_keep_lo(uint32_t i, uint32_t k0, uint32_t k1, float p, float inv) {
  uint32_t h = clrt_lora_mix32(clrt_lora_mix32(i ^ k0) ^ k1);
  float u = (float)(int32_t)(h >> 8) * (1.0f / 16777216.0f);   /* 24 bits: uniform in [0, 1) */
  return u < p ? 0.0f : inv;
}

CLRT_HD float clrt_lora_keep(uint64_t key, int64_t i, float p) {
  return clrt_lora_keep_lo((uint32_t)i, (uint32_t)key, clrt_lora_k1(key, i), p, 1.0f / (1.0f - p));
}

/* The key of one adapter application: seed, training-forward counter, layer, target. */
CLRT_HD uint64_t clrt_lora_key(uint64_t seed, uint64_t step, int layer, int target) {
  return clrt_lora_mix(seed ^ clrt_lora_mix(step * 0x100000001B3ull + (uint64_t)layer * 16u + (uint64_t)target));
}

/* The output layer's adapter as the fused log-softmax kernels see it (CPU and CUDA, one block
   of logits z [rows, vb] at a time, so the [N, V] logits never exist): z += scale xa B_b^T;
   backward, with z turned into dz: dxa (=, then +=) scale dz B_b, dB_b += scale dz^T xa. The
   rest (xa = drop(x) A^T before, dA and dx from dxa after) runs outside the fused loop. */
typedef struct clrt_head_lora {
  const float *xa;   /* [N, r] */
  const float *B;    /* [V, r] */
  float *dxa;        /* [N, r] (backward) */
  float *dB;         /* [V, r] += (backward) */
  int r;
  float scale;
} clrt_head_lora;

#endif
