/* simd512.h — what the AVX-512 and AVX2 kernels share (and, on aarch64, whether NEON's run): the target attributes (the build
   targets x86-64-v2, so each wider function opts in and is only called after
   clrt_have_avx512() or clrt_have_avx2()), the run-time checks (the CPU's level, capped by
   CLRT_CPU: cpu_level.c), and the horizontal sums. CPU only. */
#ifndef CLRT_SIMD512_H
#define CLRT_SIMD512_H

#include "cpu_level.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CLRT_AVX512 1
#define CLRT_AVX2 1   /* the compiler emits both; the run-time checks below choose */
#define CLRT_TARGET_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl")))

#define CLRT_TARGET_AVX2 __attribute__((target("avx2,fma")))

static inline int clrt_have_avx512(void) { return clrt_cpu_level() >= CLRT_CPU_AVX512; }

/* AVX2 + FMA: every level from avx2 up (an AVX-512 CPU runs these too when capped to avx2). */
static inline int clrt_have_avx2(void) { return clrt_cpu_level() >= CLRT_CPU_AVX2; }

/* AVX512-BF16 (vdpbf16ps) on top of the above. */
#define CLRT_TARGET_AVX512BF16 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16")))
static inline int clrt_have_avx512bf16(void) {
  static int known = -1;
  if (known < 0) known = __builtin_cpu_supports("avx512bf16");
  return known && clrt_have_avx512();
}

/* Four 16-lane sums a, b, c, d -> {sum a, sum b, sum c, sum d}. */
CLRT_TARGET_AVX512 static inline __m128 clrt_reduce4_512(__m512 a, __m512 b, __m512 c, __m512 d) {
  __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
  __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
  __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
  __m256 ab = _mm256_hadd_ps(a8, b8), cd = _mm256_hadd_ps(c8, d8);
  __m256 abcd = _mm256_hadd_ps(ab, cd);   /* lanes: a b c d (low half) | a b c d (high) */
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* A plain loop compiled twice, for the build's baseline and for x86-64-v4, the loader picking
   the clone this CPU runs: the compiler vectorizes it 16 wide by itself. SwiGLU's exp ran 5x
   faster so (63 -> 12 us for a 32 x 2048 decode step on the 2-core Zen 5). */
#define CLRT_WIDE __attribute__((target_clones("default", "arch=x86-64-v4")))

/* The mask of the first n (< 16) lanes: the tail of a row whose length is not a multiple of 16. */
static inline __mmask16 clrt_tail_mask16(int n) { return (__mmask16)((1u << n) - 1); }

#define CLRT_NEON 0
static inline int clrt_have_neon(void) { return 0; }

#else
#define CLRT_AVX512 0
#define CLRT_AVX2 0
#define CLRT_WIDE
static inline int clrt_have_avx512(void) { return 0; }
static inline int clrt_have_avx2(void) { return 0; }
static inline int clrt_have_avx512bf16(void) { return 0; }

#if defined(__aarch64__) && defined(__GNUC__)
/* aarch64: Advanced SIMD is in the Armv8-A baseline the build targets, so the NEON kernels
   (panels_neon.c, linear_int8.c) need no attribute; the dot product does
   (CLRT_TARGET_DOTPROD, after clrt_cpu_has_dotprod()). The neon level can be capped off
   (CLRT_CPU=portable), so every NEON kernel asks clrt_have_neon() first. */
#include <arm_neon.h>
#define CLRT_NEON 1
#define CLRT_TARGET_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
static inline int clrt_have_neon(void) { return clrt_cpu_level() >= CLRT_CPU_NEON; }
#else
#define CLRT_NEON 0
static inline int clrt_have_neon(void) { return 0; }
#endif
#endif

#endif
