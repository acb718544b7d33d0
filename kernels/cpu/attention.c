/* attention.c — causal grouped-query attention, softmax(q k^T / sqrt(D)) v, on the CPU.
   Work is split by (batch, head) in forward and by (batch, kv head) in backward (the heads
   of a group accumulate into the same dk/dv rows); each task walks blocks of QB queries so
   its scores fit in a [QB, Tk] scratch and the causal upper triangle is mostly skipped.
   Backward keeps no [T, T] probabilities from forward: it recomputes them from q, k and the
   saved per-row logsumexp (one extra q k^T product).
   A sliding window (window > 0) lets the query at position p see keys p - window < j <= p
   (transformers' sliding-window mask: `window` keys, itself included); a block of queries then
   starts its products at the first key its first query sees. The scaled variant (Gemma 3) runs
   the same body with its own score scale and soft-capped scores, cap tanh(s / cap). */
/* GCC may vectorize clrt_expf's clamps only without trapping math (FP exceptions, unused). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "model_kernels.h"
#include "model_math.h"
#include "rowops.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

enum { QB = 64 };

size_t clrt_attention_scratch_floats(int Tq, int Tk, int nthreads) {
  (void)Tq;
  return (size_t)(nthreads > 0 ? nthreads : 1) * 2 * QB * (size_t)(Tk > 0 ? Tk : 1);
}

/* One query (a decode step) takes attention_decode.c's per-query kernel where the CPU has it. */
static void attention_forward(float *out /* [B, Tq, H, D] */, float *lse /* [B, H, Tq] */,
                              const float *q /* [B, Tq, H, D] */, const float *k /* [B, Tk, KV, D] */,
                              const float *v /* [B, Tk, KV, D] */, int B, int Tq, int H, int KV,
                              int D, const int32_t *pos0 /* [B] or NULL */, int64_t kv_bstride,
                              const int32_t *kv_row /* [B] or NULL */, int window, float *scratch,
                              int nthreads, float scale, float cap) {
  const int ldq = H * D, ldk = KV * D, group = H / KV;
  int Tk = 0;   /* longest key range of any row: sizes each thread's scratch slice */
  for (int b = 0; b < B; b++) {
    int tk = (pos0 ? pos0[b] : 0) + Tq;
    if (tk > Tk) Tk = tk;
  }
  if (Tq == 1 && clrt_attention_decode_forward(out, lse, q, k, v, B, H, KV, D, pos0, kv_bstride, kv_row, window,
                                               scratch, (int64_t)2 * QB * Tk, nthreads, scale, cap))
    return;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(nthreads > 0 ? nthreads : 1) \
    if ((int64_t)B * H * Tq * Tk * D > CLRT_OMP_MIN_WORK)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      float *S = scratch + (size_t)omp_get_thread_num() * 2 * QB * (size_t)Tk;
      int p0 = pos0 ? pos0[b] : 0;
      int64_t kr = kv_row ? kv_row[b] : b;   /* decode rows read their own cache slot */
      const float *kb = k + kr * kv_bstride + (int64_t)(h / group) * D;
      const float *vb = v + kr * kv_bstride + (int64_t)(h / group) * D;
      const float *qb = q + ((int64_t)b * Tq * H + h) * D;
      float *ob = out + ((int64_t)b * Tq * H + h) * D;
      for (int i0 = 0; i0 < Tq; i0 += QB) {
        int bq = Tq - i0 < QB ? Tq - i0 : QB;
        int k0 = clrt_window_first_key(p0 + i0, window);   /* first key the block sees */
        int nk = p0 + i0 + bq - k0;   /* keys from k0 to the block's last query */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, nk, D, scale,
                    qb + (int64_t)i0 * ldq, ldq, kb + (int64_t)k0 * ldk, ldk, 0.0f, S, nk);
        for (int r = 0; r < bq; r++) {
          float *s = S + (int64_t)r * nk;
          int lo = clrt_window_first_key(p0 + i0 + r, window) - k0, lim = p0 + i0 + r + 1 - k0;
          if (cap > 0)
            for (int j = lo; j < lim; j++) s[j] = clrt_attn_softcap(s[j], cap);
          float m = clrt_row_max(s + lo, lim - lo), l = clrt_row_exp_(s + lo, lim - lo, m);
          float inv = 1.0f / l;
          for (int j = 0; j < lo; j++) s[j] = 0;
          for (int j = lo; j < lim; j++) s[j] *= inv;
          for (int j = lim; j < nk; j++) s[j] = 0;
          if (lse) lse[((int64_t)b * H + h) * Tq + i0 + r] = clrt_lse_value(m, l);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bq, D, nk, 1.0f, S, nk,
                    vb + (int64_t)k0 * ldk, ldk, 0.0f, ob + (int64_t)i0 * ldq, ldq);
      }
    }
}

void clrt_attention_forward(float *out /* [B, Tq, H, D] */, float *lse /* [B, H, Tq] */,
                            const float *q /* [B, Tq, H, D] */, const float *k /* [B, Tk, KV, D] */,
                            const float *v /* [B, Tk, KV, D] */, int B, int Tq, int H, int KV,
                            int D, const int32_t *pos0 /* [B] or NULL */, int64_t kv_bstride,
                            const int32_t *kv_row /* [B] or NULL */, int window,
                            float *scratch, int nthreads) {
  attention_forward(out, lse, q, k, v, B, Tq, H, KV, D, pos0, kv_bstride, kv_row, window, scratch, nthreads,
                    1.0f / sqrtf((float)D), 0.0f);
}

void clrt_attention_scaled_forward(float *out /* [B, Tq, H, D] */, float *lse /* [B, H, Tq] */,
                                   const float *q /* [B, Tq, H, D] */, const float *k /* [B, Tk, KV, D] */,
                                   const float *v /* [B, Tk, KV, D] */, int B, int Tq, int H, int KV,
                                   int D, const int32_t *pos0 /* [B] or NULL */, int64_t kv_bstride,
                                   const int32_t *kv_row /* [B] or NULL */, int window, float *scratch,
                                   int nthreads, float scale, float cap) {
  attention_forward(out, lse, q, k, v, B, Tq, H, KV, D, pos0, kv_bstride, kv_row, window, scratch, nthreads,
                    scale, cap);
}

/* Queries t = 0 .. Tq-1 of each row sit at positions p0 + t and see keys 0 .. p0 + t (training:
   p0 = 0; a branch of a shared prefix: the prefix's p0 keys come first, see the header). */
static void attention_backward(float *dq /* [B, Tq, H, D] */, float *dk /* [B, p0 + Tq, KV, D] */,
                               float *dv /* [B, p0 + Tq, KV, D] */, const float *dout /* [B, Tq, H, D] */,
                               const float *q, const float *k, const float *v,
                               const float *out /* [B, Tq, H, D] */, const float *lse /* [B, H, Tq] */,
                               int B, int Tq, int p0, int H, int KV, int D, int window, float *scratch,
                               int nthreads, float scale, float cap) {
  const int ldq = H * D, ldk = KV * D, group = H / KV, Tk = p0 + Tq;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(nthreads > 0 ? nthreads : 1)
  for (int b = 0; b < B; b++)
    for (int g = 0; g < KV; g++) {
      float *P = scratch + (size_t)omp_get_thread_num() * 2 * QB * (size_t)Tk;
      float *dP = P + (size_t)QB * Tk;
      const int64_t kvoff = (int64_t)b * Tk * ldk + (int64_t)g * D;
      for (int t = 0; t < Tk; t++) {
        memset(dk + kvoff + (int64_t)t * ldk, 0, sizeof(float) * (size_t)D);
        memset(dv + kvoff + (int64_t)t * ldk, 0, sizeof(float) * (size_t)D);
      }
      for (int h = g * group; h < (g + 1) * group; h++) {
        const int64_t qoff = ((int64_t)b * Tq * H + h) * D;
        for (int i0 = 0; i0 < Tq; i0 += QB) {
          int bq = Tq - i0 < QB ? Tq - i0 : QB;
          int k0 = clrt_window_first_key(p0 + i0, window), nk = p0 + i0 + bq - k0;
          const int64_t kvblk = kvoff + (int64_t)k0 * ldk;   /* the block's first key */
          const float *qblk = q + qoff + (int64_t)i0 * ldq, *doblk = dout + qoff + (int64_t)i0 * ldq;
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, nk, D, scale, qblk, ldq,
                      k + kvblk, ldk, 0.0f, P, nk);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, nk, D, 1.0f, doblk, ldq,
                      v + kvblk, ldk, 0.0f, dP, nk);
          for (int r = 0; r < bq; r++) {
            float *p = P + (int64_t)r * nk, *dp = dP + (int64_t)r * nk;
            const float *o = out + qoff + (int64_t)(i0 + r) * ldq, *dor = doblk + (int64_t)r * ldq;
            float L = lse[((int64_t)b * H + h) * Tq + i0 + r], Di = clrt_row_dot(dor, o, D);
            int lo = clrt_window_first_key(p0 + i0 + r, window) - k0, lim = p0 + i0 + r + 1 - k0;
            for (int j = 0; j < lo; j++) p[j] = dp[j] = 0;
            for (int j = lo; j < lim; j++) {
              float c = clrt_attn_softcap(p[j], cap);   /* the capped score; its slope is 1 - (c / cap)^2 */
              p[j] = clrt_attn_prob(c, L);
              dp[j] = clrt_attn_dscore(p[j], dp[j], Di, scale);
              if (cap > 0) dp[j] *= 1.0f - (c / cap) * (c / cap);
            }
            for (int j = lim; j < nk; j++) p[j] = dp[j] = 0;
          }
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bq, D, nk, 1.0f, dP, nk,
                      k + kvblk, ldk, 0.0f, dq + qoff + (int64_t)i0 * ldq, ldq);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, bq, 1.0f, dP, nk, qblk, ldq,
                      1.0f, dk + kvblk, ldk);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, bq, 1.0f, P, nk, doblk, ldq,
                      1.0f, dv + kvblk, ldk);
        }
      }
    }
}

void clrt_attention_backward(float *dq /* [B, T, H, D] */, float *dk /* [B, T, KV, D] */,
                             float *dv /* [B, T, KV, D] */, const float *dout /* [B, T, H, D] */,
                             const float *q, const float *k, const float *v,
                             const float *out /* [B, T, H, D] */, const float *lse /* [B, H, T] */,
                             int B, int T, int H, int KV, int D, int window, float *scratch,
                             int nthreads) {
  attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, 0, H, KV, D, window, scratch, nthreads,
                     1.0f / sqrtf((float)D), 0.0f);
}

void clrt_attention_backward_offset(float *dq /* [B, Tq, H, D] */, float *dk /* [B, p0 + Tq, KV, D] */,
                                    float *dv /* [B, p0 + Tq, KV, D] */, const float *dout /* [B, Tq, H, D] */,
                                    const float *q, const float *k, const float *v,
                                    const float *out /* [B, Tq, H, D] */, const float *lse /* [B, H, Tq] */,
                                    int B, int Tq, int p0, int H, int KV, int D, int window, float *scratch,
                                    int nthreads) {
  attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, Tq, p0, H, KV, D, window, scratch, nthreads,
                     1.0f / sqrtf((float)D), 0.0f);
}

void clrt_attention_scaled_backward(float *dq /* [B, T, H, D] */, float *dk /* [B, T, KV, D] */,
                                    float *dv /* [B, T, KV, D] */, const float *dout /* [B, T, H, D] */,
                                    const float *q, const float *k, const float *v,
                                    const float *out /* [B, T, H, D] */, const float *lse /* [B, H, T] */,
                                    int B, int T, int H, int KV, int D, int window, float *scratch,
                                    int nthreads, float scale, float cap) {
  attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, 0, H, KV, D, window, scratch, nthreads, scale, cap);
}
