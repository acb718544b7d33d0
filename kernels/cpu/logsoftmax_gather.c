/* logsoftmax_gather.c — the output layer fused with log-softmax and the gather of the
   target's log-probability. The [N, V] logits never exist: the caller's scratch ([chunk, V]
   floats, ~16 MB at a large vocabulary) holds one block of ROWS rows by Vb vocabulary
   entries at a time, so every product is a proper matrix product (256 rows x 16,008 entries
   at V = 151,936) rather than a sliver of chunk = 27 rows over the whole vocabulary.
   Forward folds each block into a running (max, sum) per row (online logsumexp) and picks up
   the target's logit from the block holding it; backward recomputes each block's logits,
   turns them in place into dlogits = dlp * (onehot(target) - softmax), and adds the block's
   share into dx = dlogits w and dw += dlogits^T x (gemm_strided.c, ~1.3-2x sgemm here, when
   the caller asks for the fast kernels; else sgemm). The logits run over the packed head
   (linear_packed.c, ~2x sgemm) when the caller has a current one, else sgemm. A forward whose caller kept all logits (chunk = N, see
   logits_ready) is one block: backward reuses them without a recompute. With a LoRA adapter
   beside the output layer (clrt_head_lora, lora_math.h) each block also gains its rank-r
   share, and backward takes the adapter's share of each block's dz, still per block. */
/* GCC may vectorize clrt_expf's clamps only without trapping math (FP exceptions, unused). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "model_kernels.h"
#include "lora_math.h"
#include "model_math.h"
#include "rowops.h"

#include <cblas.h>
#include <math.h>

enum { ROWS = 256, VALIGN = 48 };   /* rows per block; vocabulary blocks in packed-panel steps */

/* The block shape for N rows over scratch of chunk * V floats: rows *R, vocabulary *Vb. */
static void block_shape(int64_t N, int V, int chunk, int *R, int *Vb) {
  int64_t cap = (int64_t)chunk * V;
  int64_t r = N < ROWS ? N : ROWS;
  if (chunk > r) r = N < chunk ? N : chunk;   /* the caller's chunk is bigger: all of it */
  if (r < 1) r = 1;   /* no rows (every row one token long): nothing to do, no division by 0 */
  int64_t vb = cap / r;
  if (vb >= V) vb = V;
  else if (vb >= VALIGN) vb -= vb % VALIGN;
  else if (vb < 1) vb = 1;
  *R = (int)r;
  *Vb = (int)vb;
}

/* z [rows, vb] = x [rows, C] w[v0 .. v0+vb)^T: over the packed copy wp (linear_packed.c, ~2x
   sgemm here) when given and the block starts and ends on its panels, else (fast) the tiles
   that pack w's block on the fly (gemm_strided.c: a large model has no packed head; ~1.5x
   sgemm here at 256 x 896 x 16,008), else sgemm. */
static void block_logits(float *z, const float *x, const float *w, const float *wp, int fast, int rows,
                         int C, int V, int v0, int vb) {
  if (wp && v0 % VALIGN == 0 && (vb % VALIGN == 0 || v0 + vb == V) &&
      clrt_linear_packed_forward(z, x, wp + (int64_t)v0 * C, NULL, rows, C, vb))
    return;
  if (fast & CLRT_OUT_ROWWISE) {   /* a row's logits as a batch-invariant decode step forms them */
    clrt_linear_rowwise_forward(z, x, w + (int64_t)v0 * C, NULL, rows, C, vb);
    return;
  }
  if ((fast & CLRT_OUT_FAST) && clrt_linear_forward_strided(z, x, w + (int64_t)v0 * C, NULL, rows, C, vb)) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, vb, C, 1.0f, x, C, w + (int64_t)v0 * C, C,
              0.0f, z, vb);
}

/* z [rows, vb] += s xa[n0 ..] B[v0 ..]^T: the adapter's share of the block. */
static void head_block_forward(float *z, const clrt_head_lora *hl, int64_t n0, int rows, int v0, int vb) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, vb, hl->r, hl->scale, hl->xa + n0 * hl->r, hl->r,
              hl->B + (int64_t)v0 * hl->r, hl->r, 1.0f, z, vb);
}

/* dxa[n0 ..] (= at v0 = 0, else +=) s dz B_b; dB_b += s dz^T xa[n0 ..]. */
static void head_block_backward(const float *dz, const clrt_head_lora *hl, int64_t n0, int rows, int v0, int vb) {
  int r = hl->r;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, r, vb, hl->scale, dz, vb, hl->B + (int64_t)v0 * r, r,
              v0 > 0 ? 1.0f : 0.0f, hl->dxa + n0 * r, r);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, vb, r, rows, hl->scale, dz, vb, hl->xa + n0 * r, r, 1.0f,
              hl->dB + (int64_t)v0 * r, r);
}

/* Soft-capping (cap > 0): the block's logits become cap tanh(z / cap) in place. */
static void block_softcap(float *z, int64_t n, float cap) {
  if (!(cap > 0)) return;
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; i++) z[i] = cap * tanhf(z[i] / cap);
}

static void forward_blocks(float *lp, float *lse, const float *x, const float *w, const float *wp, int fast,
                           const int32_t *target, int64_t N, int C, int V, float *scratch, int chunk,
                           const clrt_head_lora *hl, float cap);
static void backward_blocks(float *dx, float *dw, const float *dlp, const float *x, const float *w, const float *wp,
                            int fast, const int32_t *target, const float *lse, int64_t N, int C, int V,
                            float *scratch, int chunk, int logits_ready, const clrt_head_lora *hl, float cap);

void clrt_logsoftmax_gather_softcap_forward(float *lp, float *lse, const float *x, const float *w, const float *wp,
                                            int fast, const int32_t *target, int64_t N, int C, int V,
                                            float *scratch, int chunk, const clrt_head_lora *hl, float cap) {
  forward_blocks(lp, lse, x, w, wp, fast, target, N, C, V, scratch, chunk, hl, cap);
}

void clrt_logsoftmax_gather_softcap_backward(float *dx, float *dw, const float *dlp, const float *x, const float *w,
                                             const float *wp, int fast, const int32_t *target, const float *lse,
                                             int64_t N, int C, int V, float *scratch, int chunk, int logits_ready,
                                             const clrt_head_lora *hl, float cap) {
  backward_blocks(dx, dw, dlp, x, w, wp, fast, target, lse, N, C, V, scratch, chunk, logits_ready, hl, cap);
}

void clrt_logsoftmax_gather_forward(float *lp, float *lse, const float *x, const float *w, const float *wp, int fast,
                                    const int32_t *target, int64_t N, int C, int V, float *scratch, int chunk) {
  clrt_logsoftmax_gather_forward_lora(lp, lse, x, w, wp, fast, target, N, C, V, scratch, chunk, NULL);
}

void clrt_logsoftmax_gather_backward(float *dx, float *dw, const float *dlp, const float *x, const float *w,
                                     const float *wp, int fast, const int32_t *target, const float *lse, int64_t N,
                                     int C, int V, float *scratch, int chunk, int logits_ready) {
  clrt_logsoftmax_gather_backward_lora(dx, dw, dlp, x, w, wp, fast, target, lse, N, C, V, scratch, chunk,
                                       logits_ready, NULL);
}

void clrt_logsoftmax_gather_forward_lora(float *lp /* [N] */, float *lse /* [N] or NULL */,
                                         const float *x /* [N, C] */, const float *w /* [V, C] */,
                                         const float *wp /* w packed by clrt_linear_pack, or NULL */, int fast,
                                         const int32_t *target /* [N] */, int64_t N, int C, int V,
                                         float *scratch /* [chunk, V] */, int chunk, const clrt_head_lora *hl) {
  forward_blocks(lp, lse, x, w, wp, fast, target, N, C, V, scratch, chunk, hl, 0.0f);
}

static void forward_blocks(float *lp /* [N] */, float *lse /* [N] or NULL */, const float *x /* [N, C] */,
                           const float *w /* [V, C] */, const float *wp, int fast, const int32_t *target /* [N] */,
                           int64_t N, int C, int V, float *scratch /* [chunk, V] */, int chunk,
                           const clrt_head_lora *hl, float cap) {
  int R, Vb;
  block_shape(N, V, chunk, &R, &Vb);
  for (int64_t n0 = 0; n0 < N; n0 += R) {
    int rows = N - n0 < R ? (int)(N - n0) : R;
    /* Running state per row in lp (the max) and lse (the sum) would need lse; keep it local. */
    float m[ROWS], l[ROWS], zt[ROWS];
    int one_block = Vb >= V;
    for (int r = 0; r < (one_block ? 0 : rows); r++) m[r] = -INFINITY, l[r] = 0, zt[r] = 0;
    for (int v0 = 0; v0 < V; v0 += Vb) {
      int vb = V - v0 < Vb ? V - v0 : Vb;
      block_logits(scratch, x + n0 * C, w, wp, fast, rows, C, V, v0, vb);
      if (hl) head_block_forward(scratch, hl, n0, rows, v0, vb);
      block_softcap(scratch, (int64_t)rows * vb, cap);
#pragma omp parallel for schedule(static)
      for (int r = 0; r < rows; r++) {
        const float *z = scratch + (int64_t)r * vb;
        int t = target[n0 + r];
        if (one_block) {   /* rows may exceed ROWS here (a kept forward): no running state */
          float bm = clrt_row_max(z, vb), L = clrt_lse_value(bm, clrt_row_sumexp(z, vb, bm));
          if (lse) lse[n0 + r] = L;
          lp[n0 + r] = z[t] - L;
          continue;
        }
        float bm = clrt_row_max(z, vb);
        clrt_lse_merge(&m[r], &l[r], bm, clrt_row_sumexp(z, vb, bm));
        if (t >= v0 && t < v0 + vb) zt[r] = z[t - v0];
      }
    }
    if (one_block) continue;
    for (int r = 0; r < rows; r++) {
      float L = clrt_lse_value(m[r], l[r]);
      if (lse) lse[n0 + r] = L;
      lp[n0 + r] = zt[r] - L;
    }
  }
}

void clrt_logsoftmax_gather_backward_lora(float *dx /* [N, C] = */, float *dw /* [V, C] += */,
                                          const float *dlp /* [N] */, const float *x /* [N, C] */,
                                          const float *w /* [V, C] */, const float *wp /* packed w or NULL */,
                                          int fast, const int32_t *target /* [N] */, const float *lse /* [N] */,
                                          int64_t N, int C, int V, float *scratch /* [chunk, V] */, int chunk,
                                          int logits_ready, const clrt_head_lora *hl) {
  backward_blocks(dx, dw, dlp, x, w, wp, fast, target, lse, N, C, V, scratch, chunk, logits_ready, hl, 0.0f);
}

/* With cap > 0 the kept (or recomputed) logits are the capped ones, c = cap tanh(z / cap), and
   dz = dc (1 - (c / cap)^2). */
static void backward_blocks(float *dx /* [N, C] = */, float *dw /* [V, C] += */, const float *dlp /* [N] */,
                            const float *x /* [N, C] */, const float *w /* [V, C] */, const float *wp, int fast,
                            const int32_t *target /* [N] */, const float *lse /* [N] */, int64_t N, int C, int V,
                            float *scratch /* [chunk, V] */, int chunk, int logits_ready, const clrt_head_lora *hl,
                            float cap) {
  int R, Vb;
  block_shape(N, V, chunk, &R, &Vb);
  if (logits_ready && (R < N || Vb < V)) logits_ready = 0;
  for (int64_t n0 = 0; n0 < N; n0 += R) {
    int rows = N - n0 < R ? (int)(N - n0) : R;
    const float *xc = x + n0 * C;
    float *dxc = dx + n0 * C;
    for (int v0 = 0; v0 < V; v0 += Vb) {
      int vb = V - v0 < Vb ? V - v0 : Vb;
      if (!logits_ready) {
        block_logits(scratch, xc, w, wp, fast, rows, C, V, v0, vb);
        if (hl) head_block_forward(scratch, hl, n0, rows, v0, vb);
        block_softcap(scratch, (int64_t)rows * vb, cap);
      }
#pragma omp parallel for schedule(static)
      for (int r = 0; r < rows; r++) {
        float *z = scratch + (int64_t)r * vb;
        float g = dlp[n0 + r], L = lse[n0 + r];
        int t = target[n0 + r];
        if (cap > 0) {
          for (int j = 0; j < vb; j++) {
            float c = z[j] / cap, d = clrt_lsm_dlogit(z[j], L, g) + (j == t - v0 ? g : 0.0f);
            z[j] = d * (1.0f - c * c);
          }
          continue;
        }
        for (int j = 0; j < vb; j++) z[j] = clrt_lsm_dlogit(z[j], L, g);
        if (t >= v0 && t < v0 + vb) z[t - v0] += g;
      }
      if (hl) head_block_backward(scratch, hl, n0, rows, v0, vb);
      const float *wb = w + (int64_t)v0 * C;
      float *dwb = dw ? dw + (int64_t)v0 * C : NULL;   /* NULL: a frozen output layer (LoRA) */
      /* dx [rows, C] (+)= dz [rows, vb] w_b [vb, C]; dw_b [vb, C] += dz^T x [rows, C] */
      if (!(fast & CLRT_OUT_FAST) || !clrt_gemm_strided(dxc, C, scratch, vb, 1, wb, C, rows, C, vb, v0 > 0))
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, C, vb, 1.0f, scratch, vb, wb, C,
                    v0 > 0 ? 1.0f : 0.0f, dxc, C);
      if (dwb && (!(fast & CLRT_OUT_FAST) || !clrt_gemm_strided(dwb, C, scratch, 1, vb, xc, C, vb, C, rows, 1)))
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, vb, C, rows, 1.0f, scratch, vb, xc, C, 1.0f,
                    dwb, C);
    }
  }
}
