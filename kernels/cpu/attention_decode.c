/* attention_decode.c — the attention of a decode step: one query per row against the keys
   cached in its slot. Through sgemm this is two 1-row products per (row, head), hundreds of
   calls per step, each spending more on setup than on its few thousand multiply-adds; here
   each (row, head) is one pass over its keys for the scores and one over its values.
   Scores are dot products accumulated in 16 lanes four keys at a time (the horizontal sums
   shared by the four); the output accumulates p_t v_t in registers, 64 dims at a time.
   Same math as the sgemm path (scaled scores, max-subtracted exp, normalised sum), summed
   in another order: results agree to rounding. AVX-512 only, chosen at run time.
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

/* s[t] = scale * q . k_t for t < n; keys are rows of k with stride ldk. */
TARGET static void scores(float *s /* [n] */, const float *q /* [D] */, const float *k /* [n, ldk] */,
                          int64_t ldk, int n, int D, float scale) {
  int t = 0;
  for (; t + 4 <= n; t += 4) {
    const float *k0 = k + t * ldk, *k1 = k0 + ldk, *k2 = k1 + ldk, *k3 = k2 + ldk;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int d = 0; d < D; d += 16) {
      __mmask16 m = chunk_mask(d, D);
      __m512 qv = _mm512_maskz_loadu_ps(m, q + d);
      a0 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k0 + d), a0);
      a1 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k1 + d), a1);
      a2 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k2 + d), a2);
      a3 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k3 + d), a3);
    }
    _mm_storeu_ps(s + t, _mm_mul_ps(_mm_set1_ps(scale), clrt_reduce4_512(a0, a1, a2, a3)));
  }
  for (; t < n; t++) {
    const float *kt = k + t * ldk;
    __m512 a = _mm512_setzero_ps();
    for (int d = 0; d < D; d += 16) {
      __mmask16 m = chunk_mask(d, D);
      a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + d), _mm512_maskz_loadu_ps(m, kt + d), a);
    }
    s[t] = scale * _mm512_reduce_add_ps(a);
  }
}

/* o[d] = inv * sum_t p[t] v_t[d]: 64 dims per pass over the values, four independent sums. */
TARGET static void weighted_sum(float *o /* [D] */, const float *p /* [n] */,
                                const float *v /* [n, ldv] */, int64_t ldv, int n, int D, float inv) {
  for (int d0 = 0; d0 < D; d0 += 64) {
    __mmask16 m0 = chunk_mask(d0, D), m1 = chunk_mask(d0 + 16, D), m2 = chunk_mask(d0 + 32, D),
              m3 = chunk_mask(d0 + 48, D);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int t = 0; t < n; t++) {
      const float *vt = v + t * ldv + d0;
      __m512 pt = _mm512_set1_ps(p[t]);
      a0 = _mm512_fmadd_ps(pt, _mm512_maskz_loadu_ps(m0, vt), a0);
      a1 = _mm512_fmadd_ps(pt, _mm512_maskz_loadu_ps(m1, vt + 16), a1);
      a2 = _mm512_fmadd_ps(pt, _mm512_maskz_loadu_ps(m2, vt + 32), a2);
      a3 = _mm512_fmadd_ps(pt, _mm512_maskz_loadu_ps(m3, vt + 48), a3);
    }
    __m512 iv = _mm512_set1_ps(inv);
    _mm512_mask_storeu_ps(o + d0, m0, _mm512_mul_ps(a0, iv));
    _mm512_mask_storeu_ps(o + d0 + 16, m1, _mm512_mul_ps(a1, iv));
    _mm512_mask_storeu_ps(o + d0 + 32, m2, _mm512_mul_ps(a2, iv));
    _mm512_mask_storeu_ps(o + d0 + 48, m3, _mm512_mul_ps(a3, iv));
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

/* The keys query (b, t) sees, k0 .. its position (a sliding window starts them later), and
   its flat index (b * Tq + t) * H + h as `item`: returns how many, with the first in *k0. */
static inline int item_keys(int64_t item, int Tq, int H, const int32_t *pos0, int window, int *b, int *k0) {
  int64_t bt = item / H;
  *b = (int)(bt / Tq);
  int p = (pos0 ? pos0[*b] : 0) + (int)(bt % Tq);
  *k0 = clrt_window_first_key(p, window);
  return p + 1 - *k0;
}

/* One (query, head): scores, softmax, weighted sum, each in an order fixed by its own key
   range: the AVX-512 passes, or plain loops on other CPUs. */
#if CLRT_AVX512
TARGET static void one_query_simd(float *out, float *lse, const float *q, const float *k, const float *v,
                                  int64_t ldk, int n, int D, float scale, float *s) {
  scores(s, q, k, ldk, n, D, scale);
  float mx = clrt_row_max(s, n), l = clrt_row_exp_(s, n, mx);
  weighted_sum(out, s, v, ldk, n, D, 1.0f / l);
  if (lse) *lse = clrt_lse_value(mx, l);
}
#endif

static void one_query_plain(float *out, float *lse, const float *q, const float *k, const float *v,
                            int64_t ldk, int n, int D, float scale, float *s) {
  for (int t = 0; t < n; t++) s[t] = scale * clrt_row_dot(q, k + t * ldk, D);
  float mx = clrt_row_max(s, n), l = clrt_row_exp_(s, n, mx), inv = 1.0f / l;
  for (int d = 0; d < D; d++) out[d] = 0;
  for (int t = 0; t < n; t++) {
    const float *vt = v + t * ldk;
    for (int d = 0; d < D; d++) out[d] += s[t] * vt[d];
  }
  for (int d = 0; d < D; d++) out[d] *= inv;
  if (lse) *lse = clrt_lse_value(mx, l);
}

/* Every (query, head) of the step, each alone (see one_query): what a query computes does
   not depend on the other rows, the other queries of its row, or how threads split them. */
static void rows_all(float *out, float *lse, const float *q, const float *k, const float *v, int B, int Tq,
                     int H, int KV, int D, const int32_t *pos0, int64_t kv_bstride, const int32_t *kv_row,
                     int window, float *scratch, int64_t scratch_stride, int nthreads, int simd) {
  const float scale = 1.0f / sqrtf((float)D);
  const int64_t ldk = (int64_t)KV * D, items = (int64_t)B * Tq * H;
  const int group = H / KV;
  int64_t work = 0;
  for (int b = 0; b < B; b++) work += (int64_t)H * Tq * ((pos0 ? pos0[b] : 0) + Tq) * D * 2;
#pragma omp parallel for schedule(static) num_threads(nthreads > 0 ? nthreads : 1) \
    if (work > CLRT_OMP_MIN_WORK)
  for (int64_t item = 0; item < items; item++) {   /* item = (b * Tq + t) * H + h */
    float *s = scratch + (int64_t)omp_get_thread_num() * scratch_stride;
    int b, k0, h = (int)(item % H), n = item_keys(item, Tq, H, pos0, window, &b, &k0);
    int64_t off = kv_offset(b, h, group, D, kv_row, kv_bstride) + (int64_t)k0 * ldk;
#if CLRT_AVX512
    /* Each (row, head) reads a few KiB of keys and values, too short a stream for the
       hardware prefetcher: fetching the next one's while this one computes took a 110M
       model's batch-32 attention from 4.4-4.6 to 3.2-3.7 ms per step in a microbenchmark
       (the KV cache comes from memory every step). */
    if (simd && item + 1 < items) {
      int b1, k1, n1 = item_keys(item + 1, Tq, H, pos0, window, &b1, &k1);
      int64_t off1 = kv_offset(b1, (int)((item + 1) % H), group, D, kv_row, kv_bstride) + (int64_t)k1 * ldk;
      prefetch_rows(k + off1, ldk, n1, D);
      prefetch_rows(v + off1, ldk, n1, D);
    }
#endif
    float *lse_at = lse ? lse + ((int64_t)b * H + h) * Tq + (item / H) % Tq : NULL;
#if CLRT_AVX512
    if (simd) {
      one_query_simd(out + item * D, lse_at, q + item * D, k + off, v + off, ldk, n, D, scale, s);
      continue;
    }
#endif
    one_query_plain(out + item * D, lse_at, q + item * D, k + off, v + off, ldk, n, D, scale, s);
  }
}

int clrt_attention_decode_forward(float *out /* [B, H, D] */, float *lse /* [B, H] or NULL */,
                                  const float *q /* [B, H, D] */, const float *k /* [B, Tk, KV, D] */,
                                  const float *v /* [B, Tk, KV, D] */, int B, int H, int KV, int D,
                                  const int32_t *pos0 /* [B] or NULL */, int64_t kv_bstride,
                                  const int32_t *kv_row /* [B] or NULL */, int window, float *scratch,
                                  int64_t scratch_stride, int nthreads) {
  if (!CLRT_AVX512 || !clrt_have_avx512()) return 0;
  rows_all(out, lse, q, k, v, B, 1, H, KV, D, pos0, kv_bstride, kv_row, window, scratch, scratch_stride,
           nthreads, 1);
  return 1;
}

void clrt_attention_rows_forward(float *out /* [B, Tq, H, D] */, float *lse /* [B, H, Tq] or NULL */,
                                 const float *q /* [B, Tq, H, D] */, const float *k /* [B, Tk, KV, D] */,
                                 const float *v /* [B, Tk, KV, D] */, int B, int Tq, int H, int KV, int D,
                                 const int32_t *pos0 /* [B] or NULL */, int64_t kv_bstride,
                                 const int32_t *kv_row /* [B] or NULL */, int window, float *scratch,
                                 int64_t scratch_stride, int nthreads) {
  rows_all(out, lse, q, k, v, B, Tq, H, KV, D, pos0, kv_bstride, kv_row, window, scratch, scratch_stride,
           nthreads, CLRT_AVX512 && clrt_have_avx512());
}
