/* attention_decode.c — the attention of a decode step: one query per row against the keys
   cached in its slot. Through sgemm this is two 1-row products per (row, head), hundreds of
   calls per step, each spending more on setup than on its few thousand multiply-adds; here
   each (row, head) is one pass over its keys for the scores and one over its values.
   The query heads that share a KV head (grouped-query attention) go through it together, up
   to four at a time, so each key and value is loaded once for all of them. A score is a dot
   product accumulated in 16 lanes, 16 dims at a time, then summed by one fixed tree of its
   own lanes (clrt_reduce4_512's, which sums each of its four inputs alone), whatever the
   tile, the key's place in it or the number of keys; the output accumulates p_t v_t in
   registers, 64 dims at a time, t in order. So a query's bits do not depend on which heads
   it was tiled with.
   Same math as the sgemm path (scaled scores, soft-capped when asked, max-subtracted exp,
   normalised sum), summed in another order: results agree to rounding. AVX-512, or the same
   passes 8 lanes wide on AVX2 (a fixed 8-lane tree), or 4 wide on aarch64's NEON (a fixed
   4-lane tree: deterministic, not x86's bits), chosen at run time.
   clrt_attention_rows_forward runs the same per-query pass for any number of queries per row
   (a prefill, a training forward) and on any CPU (plain loops without AVX-512): a query's
   output then depends on its own keys only, never on the batch or the prefill's padding,
   and a prefilled position gets the bits a decode step would give it (batch invariance). */
/* GCC may vectorize clrt_expf's clamps only without trapping math (FP exceptions, unused). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "model_kernels.h"
#include "model_math.h"
#include "rowops.h"
#include "simd512.h"

#include <math.h>
#include <omp.h>

#if CLRT_AVX512
#define TARGET CLRT_TARGET_AVX512

/* The lanes of the 16-dim chunk starting at d that lie inside D. */
static inline __mmask16 chunk_mask(int d, int D) {
  return d + 16 <= D ? (__mmask16)0xFFFF : d < D ? clrt_tail_mask16(D - d) : (__mmask16)0;
}

/* Up to four queries (R, the heads of one tile) against the same keys: s[i * lds + t] =
   scale * q_i . k_t for t < n. Keys go four at a time; a missing fourth (the range's end)
   is a zero vector whose score is not stored. */
TARGET static inline __attribute__((always_inline)) void scores_tile(
    float *s /* [R, lds] */, int64_t lds, const float *q /* [R, D], rows ldq apart */, int64_t ldq,
    const float *k /* [n, ldk] */, int64_t ldk, int n, int D, float scale, const int R) {
  const __m128 sc = _mm_set1_ps(scale);
  for (int t = 0; t < n; t += 4) {
    int have = n - t < 4 ? n - t : 4;
    const float *kt = k + t * ldk;
    __m512 acc[4][4];
    for (int i = 0; i < R; i++)
      for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
    for (int d = 0; d < D; d += 16) {
      __mmask16 m = chunk_mask(d, D);
      __m512 kv[4];
      for (int j = 0; j < 4; j++) kv[j] = j < have ? _mm512_maskz_loadu_ps(m, kt + j * ldk + d) : _mm512_setzero_ps();
      for (int i = 0; i < R; i++) {
        __m512 qv = _mm512_maskz_loadu_ps(m, q + i * ldq + d);
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_fmadd_ps(qv, kv[j], acc[i][j]);
      }
    }
    __mmask8 keep = (__mmask8)((1u << have) - 1);
    for (int i = 0; i < R; i++)
      _mm_mask_storeu_ps(s + i * lds + t, keep, _mm_mul_ps(sc, clrt_reduce4_512(acc[i][0], acc[i][1], acc[i][2], acc[i][3])));
  }
}

/* o_i[d] = inv[i] * sum_t p_i[t] v_t[d] for R queries over the same values: 64 dims per pass,
   each value chunk loaded once for the R sums, t in order. */
TARGET static inline __attribute__((always_inline)) void weighted_sum_tile(
    float *o /* [R, D], rows ldo apart */, int64_t ldo, const float *p /* [R, lds] */, int64_t lds,
    const float *inv /* [R] */, const float *v /* [n, ldv] */, int64_t ldv, int n, int D, const int R) {
  for (int d0 = 0; d0 < D; d0 += 64) {
    __mmask16 m[4];
    for (int c = 0; c < 4; c++) m[c] = chunk_mask(d0 + 16 * c, D);
    __m512 acc[4][4];
    for (int i = 0; i < R; i++)
      for (int c = 0; c < 4; c++) acc[i][c] = _mm512_setzero_ps();
    for (int t = 0; t < n; t++) {
      const float *vt = v + t * ldv + d0;
      __m512 vv[4];
      for (int c = 0; c < 4; c++) vv[c] = _mm512_maskz_loadu_ps(m[c], vt + 16 * c);
      for (int i = 0; i < R; i++) {
        __m512 pt = _mm512_set1_ps(p[i * lds + t]);
        for (int c = 0; c < 4; c++) acc[i][c] = _mm512_fmadd_ps(pt, vv[c], acc[i][c]);
      }
    }
    for (int i = 0; i < R; i++) {
      __m512 iv = _mm512_set1_ps(inv[i]);
      for (int c = 0; c < 4; c++) _mm512_mask_storeu_ps(o + i * ldo + d0 + 16 * c, m[c], _mm512_mul_ps(acc[i][c], iv));
    }
  }
}

#endif

#if CLRT_AVX2
/* The AVX2 passes: the same tiles 8 lanes wide. A score's 8 lanes are summed by one fixed
   tree (reduce4_256, each input alone), whatever the tile or the key's place in it. */
#define TARGET2 CLRT_TARGET_AVX2

TARGET2 static inline __m256i lanes8(int n) {
  n = n < 0 ? 0 : n > 8 ? 8 : n;
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Four 8-lane sums a, b, c, d -> {sum a, sum b, sum c, sum d}. */
TARGET2 static inline __m128 reduce4_256(__m256 a, __m256 b, __m256 c, __m256 d) {
  __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

TARGET2 static inline __attribute__((always_inline)) void scores_tile_avx2(
    float *s /* [R, lds] */, int64_t lds, const float *q /* [R, D], rows ldq apart */, int64_t ldq,
    const float *k /* [n, ldk] */, int64_t ldk, int n, int D, float scale, const int R) {
  const __m128 sc = _mm_set1_ps(scale);
  for (int t = 0; t < n; t += 4) {
    int have = n - t < 4 ? n - t : 4;
    const float *kt = k + t * ldk;
    __m256 acc[4][4];
    for (int i = 0; i < R; i++)
      for (int j = 0; j < 4; j++) acc[i][j] = _mm256_setzero_ps();
    for (int d = 0; d < D; d += 8) {
      __m256i m = lanes8(D - d);
      __m256 kv[4];
      for (int j = 0; j < 4; j++) kv[j] = j < have ? _mm256_maskload_ps(kt + j * ldk + d, m) : _mm256_setzero_ps();
      for (int i = 0; i < R; i++) {
        __m256 qv = _mm256_maskload_ps(q + i * ldq + d, m);
        for (int j = 0; j < 4; j++) acc[i][j] = _mm256_fmadd_ps(qv, kv[j], acc[i][j]);
      }
    }
    for (int i = 0; i < R; i++) {
      float four[4];
      _mm_storeu_ps(four, _mm_mul_ps(sc, reduce4_256(acc[i][0], acc[i][1], acc[i][2], acc[i][3])));
      for (int j = 0; j < have; j++) s[i * lds + t + j] = four[j];
    }
  }
}

/* o_i[d] = inv[i] * sum_t p_i[t] v_t[d]: 32 dims per pass, t in order. */
TARGET2 static inline __attribute__((always_inline)) void weighted_sum_tile_avx2(
    float *o /* [R, D], rows ldo apart */, int64_t ldo, const float *p /* [R, lds] */, int64_t lds,
    const float *inv /* [R] */, const float *v /* [n, ldv] */, int64_t ldv, int n, int D, const int R) {
  for (int d0 = 0; d0 < D; d0 += 32) {
    __m256i m[4];
    for (int c = 0; c < 4; c++) m[c] = lanes8(D - d0 - 8 * c);
    __m256 acc[4][4];
    for (int i = 0; i < R; i++)
      for (int c = 0; c < 4; c++) acc[i][c] = _mm256_setzero_ps();
    for (int t = 0; t < n; t++) {
      const float *vt = v + t * ldv + d0;
      __m256 vv[4];
      for (int c = 0; c < 4; c++) vv[c] = _mm256_maskload_ps(vt + 8 * c, m[c]);
      for (int i = 0; i < R; i++) {
        __m256 pt = _mm256_set1_ps(p[i * lds + t]);
        for (int c = 0; c < 4; c++) acc[i][c] = _mm256_fmadd_ps(pt, vv[c], acc[i][c]);
      }
    }
    for (int i = 0; i < R; i++) {
      __m256 iv = _mm256_set1_ps(inv[i]);
      for (int c = 0; c < 4; c++) _mm256_maskstore_ps(o + i * ldo + d0 + 8 * c, m[c], _mm256_mul_ps(acc[i][c], iv));
    }
  }
}
#endif

#if CLRT_NEON
/* The NEON passes (aarch64): the same tiles 4 lanes wide. A score's 4 lanes are summed by one
   fixed tree (reduce4_128: pairwise adds, each input alone), whatever the tile or the key's
   place in it, so a query's bits depend on its own keys only; they are not x86's bits (AVX2
   and AVX-512 sum 8 and 16 lanes). */

/* The first n (<= 4, may be <= 0) floats at p, zeros past them. */
static inline float32x4_t att_load(const float *p, int n) {
  if (n >= 4) return vld1q_f32(p);
  float t[4] = {0, 0, 0, 0};
  for (int i = 0; i < n; i++) t[i] = p[i];
  return vld1q_f32(t);
}

static inline void att_store(float *p, float32x4_t v, int n) {
  if (n >= 4) {
    vst1q_f32(p, v);
    return;
  }
  float t[4];
  vst1q_f32(t, v);
  for (int i = 0; i < n; i++) p[i] = t[i];
}

/* Four 4-lane sums a, b, c, d -> {sum a, sum b, sum c, sum d}: (x0 + x1) + (x2 + x3) each. */
static inline float32x4_t reduce4_128(float32x4_t a, float32x4_t b, float32x4_t c, float32x4_t d) {
  return vpaddq_f32(vpaddq_f32(a, b), vpaddq_f32(c, d));
}

static inline __attribute__((always_inline)) void scores_tile_neon(
    float *s /* [R, lds] */, int64_t lds, const float *q /* [R, D], rows ldq apart */, int64_t ldq,
    const float *k /* [n, ldk] */, int64_t ldk, int n, int D, float scale, const int R) {
  const float32x4_t sc = vdupq_n_f32(scale);
  for (int t = 0; t < n; t += 4) {
    int have = n - t < 4 ? n - t : 4;
    const float *kt = k + t * ldk;
    float32x4_t acc[4][4];
    for (int i = 0; i < R; i++)
      for (int j = 0; j < 4; j++) acc[i][j] = vdupq_n_f32(0);
    for (int d = 0; d < D; d += 4) {
      float32x4_t kv[4];
      for (int j = 0; j < 4; j++) kv[j] = j < have ? att_load(kt + j * ldk + d, D - d) : vdupq_n_f32(0);
      for (int i = 0; i < R; i++) {
        float32x4_t qv = att_load(q + i * ldq + d, D - d);
        for (int j = 0; j < 4; j++) acc[i][j] = vfmaq_f32(acc[i][j], qv, kv[j]);
      }
    }
    for (int i = 0; i < R; i++)
      att_store(s + i * lds + t, vmulq_f32(sc, reduce4_128(acc[i][0], acc[i][1], acc[i][2], acc[i][3])), have);
  }
}

/* o_i[d] = inv[i] * sum_t p_i[t] v_t[d]: 16 dims per pass, t in order. */
static inline __attribute__((always_inline)) void weighted_sum_tile_neon(
    float *o /* [R, D], rows ldo apart */, int64_t ldo, const float *p /* [R, lds] */, int64_t lds,
    const float *inv /* [R] */, const float *v /* [n, ldv] */, int64_t ldv, int n, int D, const int R) {
  for (int d0 = 0; d0 < D; d0 += 16) {
    float32x4_t acc[4][4];
    for (int i = 0; i < R; i++)
      for (int c = 0; c < 4; c++) acc[i][c] = vdupq_n_f32(0);
    for (int t = 0; t < n; t++) {
      const float *vt = v + t * ldv + d0;
      float32x4_t vv[4];
      for (int c = 0; c < 4; c++) vv[c] = att_load(vt + 4 * c, D - d0 - 4 * c);
      for (int i = 0; i < R; i++) {
        float32x4_t pt = vdupq_n_f32(p[i * lds + t]);
        for (int c = 0; c < 4; c++) acc[i][c] = vfmaq_f32(acc[i][c], pt, vv[c]);
      }
    }
    for (int i = 0; i < R; i++) {
      float32x4_t iv = vdupq_n_f32(inv[i]);
      for (int c = 0; c < 4; c++) {
        int left = D - d0 - 4 * c;
        if (left > 0) att_store(o + i * ldo + d0 + 4 * c, vmulq_f32(acc[i][c], iv), left);
      }
    }
  }
}
#endif

/* Where row b's keys (and values) for query head h start: its cache slot, its KV head. */
static inline int64_t kv_offset(int b, int h, int group, int D, const int32_t *kv_row, int64_t kv_bstride) {
  return (kv_row ? kv_row[b] : b) * kv_bstride + (int64_t)(h / group) * D;
}

#if CLRT_AVX512
/* Asks for the cache lines of n rows of D floats, ld apart. */
static inline void prefetch_rows(const float *p, int64_t ld, int n, int D) {
  for (int t = 0; t < n; t++)
    for (int d = 0; d < D; d += 16) _mm_prefetch((const char *)(p + t * ld + d), _MM_HINT_T0);
}
#endif

/* The keys position t of row b sees, k0 .. its position (a sliding window starts them later):
   returns how many, with the first in *k0. */
static inline int query_keys(int b, int t, const int32_t *pos0, int window, int *k0) {
  int p = (pos0 ? pos0[b] : 0) + t;
  *k0 = clrt_window_first_key(p, window);
  return p + 1 - *k0;
}

/* A unit of work: R (<= 4) query heads h0.. of one KV head at (row b, position t). Units are
   numbered ((b * Tq + t) * KV + kv head) * tiles + tile. */
typedef struct {
  int b, t, h0, R;
} attn_unit;

static inline attn_unit unit_of(int64_t u, int Tq, int KV, int group, int tiles, int qt) {
  attn_unit w;
  int j = (int)(u % tiles);
  int64_t rest = u / tiles;
  int kvh = (int)(rest % KV);
  int64_t bt = rest / KV;
  w.b = (int)(bt / Tq);
  w.t = (int)(bt % Tq);
  w.h0 = kvh * group + j * qt;
  w.R = group - j * qt < qt ? group - j * qt : qt;
  return w;
}

/* Gemma 3's attn_logit_softcapping (cap > 0): each score becomes cap tanh(s / cap). */
static void softcap_scores(float *s /* [n] */, int n, float cap) {
  if (cap > 0)
    for (int t = 0; t < n; t++) s[t] = clrt_attn_softcap(s[t], cap);
}

/* R query heads of one KV head (q, out rows D apart; lse entries lse_step apart) over the
   same n keys: scores, softmax, weighted sum, each query's in an order fixed by its own key
   range (scratch: R rows of lds floats). The AVX-512 passes; plain loops on other CPUs. */
#if CLRT_AVX512
TARGET static inline __attribute__((always_inline)) void tile_simd_r(
    float *out, float *lse, int64_t lse_step, const float *q, const float *k, const float *v, int64_t ldk, int n,
    int D, float scale, float cap, float *s, int64_t lds, const int R) {
  scores_tile(s, lds, q, D, k, ldk, n, D, scale, R);
  float inv[4], mx[4], l[4];
  for (int i = 0; i < R; i++) {
    float *si = s + i * lds;
    softcap_scores(si, n, cap);
    mx[i] = clrt_row_max(si, n);
    l[i] = clrt_row_exp_(si, n, mx[i]);
    inv[i] = 1.0f / l[i];
  }
  weighted_sum_tile(out, D, s, lds, inv, v, ldk, n, D, R);
  if (lse)
    for (int i = 0; i < R; i++) lse[i * lse_step] = clrt_lse_value(mx[i], l[i]);
}

TARGET static void tile_simd(float *out, float *lse, int64_t lse_step, const float *q, const float *k, const float *v,
                             int64_t ldk, int n, int D, float scale, float cap, float *s, int64_t lds, int R) {
  switch (R) {
    case 4: tile_simd_r(out, lse, lse_step, q, k, v, ldk, n, D, scale, cap, s, lds, 4); break;
    case 3: tile_simd_r(out, lse, lse_step, q, k, v, ldk, n, D, scale, cap, s, lds, 3); break;
    case 2: tile_simd_r(out, lse, lse_step, q, k, v, ldk, n, D, scale, cap, s, lds, 2); break;
    default: tile_simd_r(out, lse, lse_step, q, k, v, ldk, n, D, scale, cap, s, lds, 1); break;
  }
}
#endif

#if CLRT_AVX2
TARGET2 static inline __attribute__((always_inline)) void tile_avx2_r(
    float *out, float *lse, int64_t lse_step, const float *q, const float *k, const float *v, int64_t ldk, int n,
    int D, float scale, float cap, float *s, int64_t lds, const int R) {
  scores_tile_avx2(s, lds, q, D, k, ldk, n, D, scale, R);
  float inv[4], mx[4], l[4];
  for (int i = 0; i < R; i++) {
    float *si = s + i * lds;
    softcap_scores(si, n, cap);
    mx[i] = clrt_row_max(si, n);
    l[i] = clrt_row_exp_(si, n, mx[i]);
    inv[i] = 1.0f / l[i];
  }
  weighted_sum_tile_avx2(out, D, s, lds, inv, v, ldk, n, D, R);
  if (lse)
    for (int i = 0; i < R; i++) lse[i * lse_step] = clrt_lse_value(mx[i], l[i]);
}

TARGET2 static void tile_avx2(float *out, float *lse, int64_t lse_step, const float *q, const float *k, const float *v,
                              int64_t ldk, int n, int D, float scale, float cap, float *s, int64_t lds, int R) {
  switch (R) {
    case 4: tile_avx2_r(out, lse, lse_step, q, k, v, ldk, n, D, scale, cap, s, lds, 4); break;
    case 3: tile_avx2_r(out, lse, lse_step, q, k, v, ldk, n, D, scale, cap, s, lds, 3); break;
    case 2: tile_avx2_r(out, lse, lse_step, q, k, v, ldk, n, D, scale, cap, s, lds, 2); break;
    default: tile_avx2_r(out, lse, lse_step, q, k, v, ldk, n, D, scale, cap, s, lds, 1); break;
  }
}
#endif

#if CLRT_NEON
static inline __attribute__((always_inline)) void tile_neon_r(
    float *out, float *lse, int64_t lse_step, const float *q, const float *k, const float *v, int64_t ldk, int n,
    int D, float scale, float cap, float *s, int64_t lds, const int R) {
  scores_tile_neon(s, lds, q, D, k, ldk, n, D, scale, R);
  float inv[4], mx[4], l[4];
  for (int i = 0; i < R; i++) {
    float *si = s + i * lds;
    softcap_scores(si, n, cap);
    mx[i] = clrt_row_max(si, n);
    l[i] = clrt_row_exp_(si, n, mx[i]);
    inv[i] = 1.0f / l[i];
  }
  weighted_sum_tile_neon(out, D, s, lds, inv, v, ldk, n, D, R);
  if (lse)
    for (int i = 0; i < R; i++) lse[i * lse_step] = clrt_lse_value(mx[i], l[i]);
}

static void tile_neon(float *out, float *lse, int64_t lse_step, const float *q, const float *k, const float *v,
                      int64_t ldk, int n, int D, float scale, float cap, float *s, int64_t lds, int R) {
  switch (R) {
    case 4: tile_neon_r(out, lse, lse_step, q, k, v, ldk, n, D, scale, cap, s, lds, 4); break;
    case 3: tile_neon_r(out, lse, lse_step, q, k, v, ldk, n, D, scale, cap, s, lds, 3); break;
    case 2: tile_neon_r(out, lse, lse_step, q, k, v, ldk, n, D, scale, cap, s, lds, 2); break;
    default: tile_neon_r(out, lse, lse_step, q, k, v, ldk, n, D, scale, cap, s, lds, 1); break;
  }
}
#endif

static void one_query_plain(float *out, float *lse, const float *q, const float *k, const float *v,
                            int64_t ldk, int n, int D, float scale, float cap, float *s) {
  for (int t = 0; t < n; t++) s[t] = scale * clrt_row_dot(q, k + t * ldk, D);
  softcap_scores(s, n, cap);
  float mx = clrt_row_max(s, n), l = clrt_row_exp_(s, n, mx), inv = 1.0f / l;
  for (int d = 0; d < D; d++) out[d] = 0;
  for (int t = 0; t < n; t++) {
    const float *vt = v + t * ldk;
    for (int d = 0; d < D; d++) out[d] += s[t] * vt[d];
  }
  for (int d = 0; d < D; d++) out[d] *= inv;
  if (lse) *lse = clrt_lse_value(mx, l);
}

/* The passes rows_all runs: AVX-512's, AVX2's, NEON's (aarch64), or plain loops
   (CLRT_CPU_PORTABLE). */
static int rows_level(void) {
#if CLRT_NEON
  return clrt_have_neon() ? CLRT_CPU_NEON : CLRT_CPU_PORTABLE;
#else
  return clrt_have_avx512() ? CLRT_CPU_AVX512 : clrt_have_avx2() ? CLRT_CPU_AVX2 : CLRT_CPU_PORTABLE;
#endif
}

/* Every (query, head) of the step, each alone: what a query computes does not depend on the
   other rows, the other queries of its row, the heads it is tiled with, or how threads split
   the work. Tiles of up to four heads of a KV group, smaller when the units would otherwise be
   fewer than the threads (a decode step at batch 1). scale 0: 1/sqrt(D); cap 0: no soft cap. */
static void rows_all(float *out, float *lse, const float *q, const float *k, const float *v, int B, int Tq,
                     int H, int KV, int D, const int32_t *pos0, int64_t kv_bstride, const int32_t *kv_row,
                     int window, float *scratch, int64_t scratch_stride, int nthreads, int simd, float scale,
                     float cap) {
  if (!(scale > 0)) scale = 1.0f / sqrtf((float)D);
  const int64_t ldk = (int64_t)KV * D, base = (int64_t)B * Tq * KV;
  const int group = H / KV, threads = nthreads > 0 ? nthreads : 1;
  /* tiles per group: of at most four heads, and at least enough units for the threads */
  int tiles = (group + 3) / 4;
  const int64_t need = (threads + base - 1) / base;
  if (need > tiles) tiles = need < group ? (int)need : group;
  const int qt = (group + tiles - 1) / tiles;
  tiles = (group + qt - 1) / qt;
  const int64_t units = base * tiles, lds = scratch_stride / 4;
  (void)lds;   /* the plain loops (a build without x86 SIMD) do not read it */
  int64_t work = 0;
  for (int b = 0; b < B; b++) work += (int64_t)H * Tq * ((pos0 ? pos0[b] : 0) + Tq) * D * 2;
#pragma omp parallel for schedule(static) num_threads(threads) if (work > CLRT_OMP_MIN_WORK)
  for (int64_t u = 0; u < units; u++) {
    float *s = scratch + (int64_t)omp_get_thread_num() * scratch_stride;
    attn_unit w = unit_of(u, Tq, KV, group, tiles, qt);
    int k0, n = query_keys(w.b, w.t, pos0, window, &k0);
    int64_t off = kv_offset(w.b, w.h0, group, D, kv_row, kv_bstride) + (int64_t)k0 * ldk;
    int64_t item = ((int64_t)w.b * Tq + w.t) * H + w.h0;   /* the tile's first query row */
    float *lse_at = lse ? lse + ((int64_t)w.b * H + w.h0) * Tq + w.t : NULL;
#if CLRT_AVX512
    /* Each unit reads a few KiB of keys and values, too short a stream for the hardware
       prefetcher: fetching the next unit's while this one computes took a 110M model's
       batch-32 attention from 4.4-4.6 to 3.2-3.7 ms per step in a microbenchmark (the KV
       cache comes from memory every step). The next tile of the same group reads these. */
    if (simd == CLRT_CPU_AVX512 && u + 1 < units && (u + 1) % tiles == 0) {
      attn_unit w1 = unit_of(u + 1, Tq, KV, group, tiles, qt);
      int k1, n1 = query_keys(w1.b, w1.t, pos0, window, &k1);
      int64_t off1 = kv_offset(w1.b, w1.h0, group, D, kv_row, kv_bstride) + (int64_t)k1 * ldk;
      prefetch_rows(k + off1, ldk, n1, D);
      prefetch_rows(v + off1, ldk, n1, D);
    }
    if (simd == CLRT_CPU_AVX512) {
      tile_simd(out + item * D, lse_at, Tq, q + item * D, k + off, v + off, ldk, n, D, scale, cap, s, lds, w.R);
      continue;
    }
#endif
#if CLRT_AVX2
    if (simd == CLRT_CPU_AVX2) {
      tile_avx2(out + item * D, lse_at, Tq, q + item * D, k + off, v + off, ldk, n, D, scale, cap, s, lds, w.R);
      continue;
    }
#endif
#if CLRT_NEON
    if (simd == CLRT_CPU_NEON) {
      tile_neon(out + item * D, lse_at, Tq, q + item * D, k + off, v + off, ldk, n, D, scale, cap, s, lds, w.R);
      continue;
    }
#endif
    for (int i = 0; i < w.R; i++)
      one_query_plain(out + (item + i) * D, lse_at ? lse_at + (int64_t)i * Tq : NULL, q + (item + i) * D, k + off,
                      v + off, ldk, n, D, scale, cap, s);
  }
}

int clrt_attention_decode_forward(float *out /* [B, H, D] */, float *lse /* [B, H] or NULL */,
                                  const float *q /* [B, H, D] */, const float *k /* [B, Tk, KV, D] */,
                                  const float *v /* [B, Tk, KV, D] */, int B, int H, int KV, int D,
                                  const int32_t *pos0 /* [B] or NULL */, int64_t kv_bstride,
                                  const int32_t *kv_row /* [B] or NULL */, int window, float *scratch,
                                  int64_t scratch_stride, int nthreads, float scale, float cap) {
  if (!clrt_attention_rows_fast()) return 0;
  rows_all(out, lse, q, k, v, B, 1, H, KV, D, pos0, kv_bstride, kv_row, window, scratch, scratch_stride,
           nthreads, rows_level(), scale, cap);
  return 1;
}

void clrt_attention_rows_forward(float *out /* [B, Tq, H, D] */, float *lse /* [B, H, Tq] or NULL */,
                                 const float *q /* [B, Tq, H, D] */, const float *k /* [B, Tk, KV, D] */,
                                 const float *v /* [B, Tk, KV, D] */, int B, int Tq, int H, int KV, int D,
                                 const int32_t *pos0 /* [B] or NULL */, int64_t kv_bstride,
                                 const int32_t *kv_row /* [B] or NULL */, int window, float *scratch,
                                 int64_t scratch_stride, int nthreads, float scale, float cap) {
  rows_all(out, lse, q, k, v, B, Tq, H, KV, D, pos0, kv_bstride, kv_row, window, scratch, scratch_stride,
           nthreads, rows_level(), scale, cap);
}

int clrt_attention_rows_fast(void) { return rows_level() != CLRT_CPU_PORTABLE; }
