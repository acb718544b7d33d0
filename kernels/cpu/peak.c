/* peak.c — the multiply-add rate a core reaches with every operand in registers, per unit:
   the ceiling benchmarks compare their GFLOP/s with (bench/train_step.lua). Twelve
   independent sums hide the latency of an FMA (4 cycles) on two pipes. Each call runs iters
   rounds on the calling thread and returns the floating-point operations done (a
   multiply-add counts 2), 0 when this CPU has no such unit. */
#include "model_kernels.h"
#include "simd512.h"

#if CLRT_AVX512
CLRT_TARGET_AVX512 static int64_t fma_peak(int64_t iters) {
  __m512 acc[12], x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(1e-9f);
  for (int i = 0; i < 12; i++) acc[i] = _mm512_setzero_ps();
  for (int64_t n = 0; n < iters; n++)
    for (int i = 0; i < 12; i++) acc[i] = _mm512_fmadd_ps(x, y, acc[i]);
  __m512 s = acc[0];
  for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, acc[i]);
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return iters * 12 * 16 * 2;
}

CLRT_TARGET_AVX512BF16 static int64_t dpbf16_peak(int64_t iters) {
  __m512 acc[12];
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x30003000);
  for (int i = 0; i < 12; i++) acc[i] = _mm512_setzero_ps();
  for (int64_t n = 0; n < iters; n++)
    for (int i = 0; i < 12; i++) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
  __m512 s = acc[0];
  for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, acc[i]);
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return iters * 12 * 16 * 2 * 2;
}

CLRT_TARGET_AVX2 static int64_t fma_peak_avx2(int64_t iters) {
  __m256 acc[12], x = _mm256_set1_ps(1.0f), y = _mm256_set1_ps(1e-9f);
  for (int i = 0; i < 12; i++) acc[i] = _mm256_setzero_ps();
  for (int64_t n = 0; n < iters; n++)
    for (int i = 0; i < 12; i++) acc[i] = _mm256_fmadd_ps(x, y, acc[i]);
  __m256 s = acc[0];
  for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, acc[i]);
  float lanes[8];
  _mm256_storeu_ps(lanes, s);
  volatile float sink = lanes[0];
  (void)sink;
  return iters * 12 * 8 * 2;
}
#endif

/* f32: the widest FMA the CPU level has; fma-bf16 runs on those same units, one FMA a bf16
   multiply-add, so its peak is theirs. */
int64_t clrt_unit_peak_flops(int unit, int64_t iters) {
#if CLRT_AVX512
  if (unit == CLRT_UNIT_AMX) return clrt_amx_peak_flops(iters);
  if (unit == CLRT_UNIT_AVX512BF16) return clrt_have_avx512bf16() ? dpbf16_peak(iters) : 0;
  if (clrt_have_avx512()) return fma_peak(iters);
  return clrt_have_avx2() ? fma_peak_avx2(iters) : 0;
#else
  (void)unit, (void)iters;
  return 0;
#endif
}
