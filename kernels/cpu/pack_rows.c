/* pack_rows.c — rows [r0, r1) of a weight w [O, K] written into the layouts the products read,
   so the optimizer step can refresh each layout right after it updates those rows (while they
   are in cache) instead of a whole repack per step:
     f32 panels        clrt_linear_pack's (48 rows a panel, transposed to [K, 48])
     bf16 panels       clrt_linear_pack_bf16's (pairs of k): the forward's b
     bf16 transposed   w read as b(o, k): pairs of o, panels of 48 columns of k: dx = dy w's b
   The bits are those of the whole-matrix packers (clrt_linear_pack, clrt_pack_pairs: round to
   nearest even, NaN kept); AVX-512 does the bf16 rounding 16 lanes at a time with the same
   integer arithmetic. Rows of different panels may be packed by different threads at once. */
#include "model_kernels.h"

#include "bf16.h"
#include "simd512.h"

enum { PANEL = 48 };

void clrt_pack_rows_f32(float *wp /* [O * K] panels */, const float *w /* [O, K] */, int K, int O, int r0, int r1) {
  for (int p = r0 / PANEL; p * PANEL < r1; p++) {
    int o0 = p * PANEL, pw = O - o0 < PANEL ? O - o0 : PANEL;
    int ja = r0 > o0 ? r0 - o0 : 0, jb = r1 < o0 + pw ? r1 - o0 : pw;
    float *panel = wp + (int64_t)o0 * K;
    for (int k0 = 0; k0 < K; k0 += 16) {   /* 16 k at a time: reads sequential per row */
      int k1 = k0 + 16 < K ? k0 + 16 : K;
      for (int j = ja; j < jb; j++) {
        const float *src = w + (int64_t)(o0 + j) * K;
        for (int k = k0; k < k1; k++) panel[(int64_t)k * pw + j] = src[k];
      }
    }
  }
}

#if CLRT_AVX512
/* 16 floats to bf16 as clrt_f32_to_bf16 does (round to nearest even; NaN quieted). */
CLRT_TARGET_AVX512 static inline __m256i to_bf16x16(__m512 f) {
  __m512i u = _mm512_castps_si512(f);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}

/* Forward panels: for each row, 16 pairs of k at a time, each pair one 32-bit store. */
CLRT_TARGET_AVX512 static void rows_bf16(uint16_t *wp, const float *w, int K, int O, int r0, int r1) {
  for (int p = r0 / PANEL; p * PANEL < r1; p++) {
    int o0 = p * PANEL, pw = O - o0 < PANEL ? O - o0 : PANEL;
    int ja = r0 > o0 ? r0 - o0 : 0, jb = r1 < o0 + pw ? r1 - o0 : pw;
    uint16_t *panel = wp + (int64_t)o0 * K;
    for (int j = ja; j < jb; j++) {
      const float *src = w + (int64_t)(o0 + j) * K;
      int k = 0;
      for (; k + 32 <= K; k += 32) {
        __m256i lo = to_bf16x16(_mm512_loadu_ps(src + k)), hi = to_bf16x16(_mm512_loadu_ps(src + k + 16));
        uint32_t pairs[16];
        _mm256_storeu_si256((__m256i *)pairs, lo);
        _mm256_storeu_si256((__m256i *)(pairs + 8), hi);
        uint32_t *dst = (uint32_t *)(panel + (int64_t)k * pw) + j;
        for (int i = 0; i < 16; i++) dst[(int64_t)i * pw] = pairs[i];
      }
      for (; k < K; k++) panel[(int64_t)(k / 2) * 2 * pw + 2 * j + (k & 1)] = clrt_f32_to_bf16(src[k]);
    }
  }
}

/* Transposed panels: a pair of rows and 16 columns of k make 64 contiguous bytes. */
CLRT_TARGET_AVX512 static void rows_bf16_t(uint16_t *wt, const float *w, int K, int O, int r0, int r1) {
  for (int o = r0; o < r1; o += 2) {
    const float *s0 = w + (int64_t)o * K, *s1 = s0 + K;
    int have1 = o + 1 < O;
    for (int c0 = 0; c0 < K; c0 += PANEL) {
      int pw = K - c0 < PANEL ? K - c0 : PANEL;
      uint16_t *dst = wt + (int64_t)c0 * O + (int64_t)o * pw;
      int j = 0;
      for (; j + 16 <= pw; j += 16) {
        __m512i a = _mm512_cvtepu16_epi32(to_bf16x16(_mm512_loadu_ps(s0 + c0 + j)));
        __m512i b = have1 ? _mm512_cvtepu16_epi32(to_bf16x16(_mm512_loadu_ps(s1 + c0 + j))) : _mm512_setzero_si512();
        _mm512_storeu_si512(dst + 2 * j, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
      }
      for (; j < pw; j++) {
        dst[2 * j] = clrt_f32_to_bf16(s0[c0 + j]);
        dst[2 * j + 1] = have1 ? clrt_f32_to_bf16(s1[c0 + j]) : 0;
      }
    }
  }
}
#endif

void clrt_pack_rows_bf16(uint16_t *wp /* [O * K] */, const float *w /* [O, K] */, int K, int O, int r0, int r1) {
#if CLRT_AVX512
  if (clrt_have_avx512()) {
    rows_bf16(wp, w, K, O, r0, r1);
    return;
  }
#endif
  clrt_pack_pairs_part(wp, w, 1, K, K, O, K, 0, K, r0, r1);
}

void clrt_pack_rows_bf16_t(uint16_t *wt /* [K * O] */, const float *w /* [O, K] */, int K, int O, int r0, int r1) {
#if CLRT_AVX512
  if (clrt_have_avx512()) {
    rows_bf16_t(wt, w, K, O, r0, r1);
    return;
  }
#endif
  clrt_pack_pairs_part(wt, w, K, 1, O, K, O, r0, r1, 0, K);
}
