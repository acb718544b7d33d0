/* lora.c — a LoRA adapter beside a frozen linear layer: y += s (drop(x) A^T) B^T, A [r, K],
   B [O, r], s = alpha / r, and its backward (OpenBLAS sgemm, row-major; dropout mask from
   lora_math.h). The rank-r products are skinny: OpenBLAS's own threading of one such call
   spent 10x the single-thread time on a loaded 2-core machine, so each product is split here
   over the OpenMP team (rows, or the output's columns for the reductions over rows), each
   thread running sgemm on its slice (OpenBLAS runs single-threaded inside a parallel region). */
#include "model_kernels.h"
#include "lora_math.h"
#include "simd512.h"

#include <cblas.h>
#include <omp.h>

/* This thread's share [*lo, *hi) of [0, n). */
static void share(int64_t n, int64_t *lo, int64_t *hi) {
  int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
  *lo = n * t / T;
  *hi = n * (t + 1) / T;
}

/* out[i] = x[i] * keep(i) (acc: +=) for i in [i0, i1), in runs whose index high half is fixed,
   so the mask's arithmetic stays 32-bit and vectorizes. */
static void mask_span(float *out, const float *x, int64_t i0, int64_t i1, uint64_t key, float p, int acc) {
  float inv = 1.0f / (1.0f - p);
  uint32_t k0 = (uint32_t)key;
  while (i0 < i1) {
    int64_t end = ((i0 >> 32) + 1) << 32;
    if (end > i1) end = i1;
    uint32_t k1 = clrt_lora_k1(key, i0), j0 = (uint32_t)i0;
    int64_t len = end - i0;
    float *o = out + i0;
    const float *xb = x + i0;
    if (acc)
      for (int64_t i = 0; i < len; i++) o[i] += xb[i] * clrt_lora_keep_lo(j0 + (uint32_t)i, k0, k1, p, inv);
    else
      for (int64_t i = 0; i < len; i++) o[i] = xb[i] * clrt_lora_keep_lo(j0 + (uint32_t)i, k0, k1, p, inv);
    i0 = end;
  }
}

void clrt_lora_dropout(float *out /* [n] */, const float *x /* [n] */, int64_t n, uint64_t key, float p) {
#pragma omp parallel if (n > CLRT_OMP_MIN_WORK)
  {
    int64_t a, b;
    share(n, &a, &b);
    mask_span(out, x, a, b, key, p, 0);
  }
}

/* ---- AVX-512: the six products through gemm_narrow.c (the r-wide ones) and gemm_strided.c
   (the others), each threaded inside; at Qwen2.5-0.5B's shapes sgemm on per-thread slices ran
   the adapters at a small fraction of the base products' rate. The scale goes into small
   copies (s B^T, s xa) or onto dxa [N, r], never onto an [N, K] or [N, O] array. ---------- */

/* dst [cols, rows] = s * src [rows, cols]^T */
static void transpose_scaled(float *dst, const float *src, int rows, int cols, float s) {
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) dst[(int64_t)j * rows + i] = s * src[(int64_t)i * cols + j];
}

/* A^T [K, r] and s B^T [r, O]. */
size_t clrt_lora_forward_workspace_bytes(int K, int O, int r) {
  return sizeof(float) * ((size_t)K * (size_t)r + (size_t)O * (size_t)r);
}

/* s xa [N, r]. */
size_t clrt_lora_backward_workspace_bytes(int64_t N, int r) { return sizeof(float) * (size_t)N * (size_t)r; }

static int lora_forward_fast(float *y, float *xa, const float *xd, const float *A, const float *B, int64_t N,
                             int K, int O, int r, float scale, void *ws, size_t ws_bytes) {
  if (!clrt_have_avx512() && !clrt_have_avx2()) return 0;   /* the narrow and strided kernels' levels */
  if (ws_bytes < clrt_lora_forward_workspace_bytes(K, O, r)) return 0;
  float *At = ws, *sBt = At + (size_t)K * r;
  transpose_scaled(At, A, r, K, 1.0f);
  transpose_scaled(sBt, B, O, r, scale);
  int done = clrt_gemm_narrow(xa, r, xd, K, 1, At, r, N, r, K, 0) &&   /* xa = xd A^T */
             clrt_gemm_strided(y, O, xa, r, 1, sBt, O, N, O, r, 1);      /* y += xa (s B^T) */
  return done;
}

static int lora_backward_fast(float *dx, float *dA, float *dB, float *dxa, float *xd, const float *dy,
                              const float *xa, const float *A, const float *B, int64_t N, int K, int O, int r,
                              float scale, uint64_t key, float p, void *ws, size_t ws_bytes) {
  if (!clrt_have_avx512() && !clrt_have_avx2()) return 0;
  if (ws_bytes < clrt_lora_backward_workspace_bytes(N, r)) return 0;
  float *xas = ws;
  for (int64_t i = 0; i < N * r; i++) xas[i] = scale * xa[i];
  /* dxa = s dy B; dB += dy^T (s xa); dA += dxa^T xd */
  int done = clrt_gemm_narrow(dxa, r, dy, O, 1, B, r, N, r, O, 0);
  for (int64_t i = 0; done && i < N * r; i++) dxa[i] *= scale;
  done = done && clrt_gemm_narrow(dB, r, dy, 1, O, xas, r, O, r, N, 1);
  if (!done) return 0;   /* unreachable with AVX-512 or AVX2: the kernel takes any shape */
  clrt_lora_input_backward(dx, dA, dxa, xd, A, N, K, r, key, p);
  return 1;
}

void clrt_lora_forward(float *y /* [N, O] += */, float *xa /* [N, r] = */, const float *xd /* [N, K] */,
                       const float *A /* [r, K] */, const float *B /* [O, r] */, int64_t N, int K,
                       int O, int r, float scale, void *ws, size_t ws_bytes) {
  if (N == 0 || lora_forward_fast(y, xa, xd, A, B, N, K, O, r, scale, ws, ws_bytes)) return;
#pragma omp parallel if (N * (K + O) > CLRT_OMP_MIN_WORK)
  {
    int64_t a, b;
    share(N, &a, &b);
    if (b > a) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(b - a), r, K, 1.0f, xd + a * K, K, A, K,
                  0.0f, xa + a * r, r);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(b - a), O, r, scale, xa + a * r, r, B, r,
                  1.0f, y + a * O, O);
    }
  }
}

void clrt_lora_backward(float *dx /* [N, K] += */, float *dA /* [r, K] += */, float *dB /* [O, r] += */,
                        float *dxa /* [N, r] scratch */, float *xd /* [N, K]: in, then scratch */,
                        const float *dy /* [N, O] */, const float *xa /* [N, r] */,
                        const float *A /* [r, K] */, const float *B /* [O, r] */, int64_t N, int K,
                        int O, int r, float scale, uint64_t key, float p, void *ws, size_t ws_bytes) {
  if (N == 0 || lora_backward_fast(dx, dA, dB, dxa, xd, dy, xa, A, B, N, K, O, r, scale, key, p, ws, ws_bytes))
    return;
#pragma omp parallel if (N * (K + O) > CLRT_OMP_MIN_WORK)
  {
    int64_t a, b;
    share(N, &a, &b);
    /* dxa = s dy B, by rows */
    if (b > a)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(b - a), r, O, scale, dy + a * O, O, B, r,
                  0.0f, dxa + a * r, r);
#pragma omp barrier
    /* dB += s dy^T xa by dB's rows; dA += dxa^T xd by dA's columns */
    int64_t o0, o1, k0, k1;
    share(O, &o0, &o1);
    share(K, &k0, &k1);
    if (o1 > o0)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(o1 - o0), r, (int)N, scale, dy + o0, O, xa, r,
                  1.0f, dB + o0 * r, r);
    if (k1 > k0)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, (int)(k1 - k0), (int)N, 1.0f, dxa, r, xd + k0, K,
                  1.0f, dA + k0, K);
#pragma omp barrier
    /* dx += dxa A by rows; through the dropout, xd (spent) takes dxa A first */
    if (b > a) {
      if (p <= 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(b - a), K, r, 1.0f, dxa + a * r, r, A, K,
                    1.0f, dx + a * K, K);
      } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(b - a), K, r, 1.0f, dxa + a * r, r, A, K,
                    0.0f, xd + a * K, K);
        mask_span(dx, xd, a * K, b * K, key, p, 1);
      }
    }
  }
}

void clrt_lora_merge(float *W /* [O, K] += */, const float *A /* [r, K] */, const float *B /* [O, r] */,
                     int K, int O, int r, float scale) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, O, K, r, scale, B, r, A, K, 1.0f, W, K);
}

void clrt_lora_xa(float *xa, const float *xd, const float *A, int64_t N, int K, int r) {
  if (N > 0) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, r, K, 1.0f, xd, K, A, K, 0.0f, xa, r);
}

/* Also the tail of lora_backward_fast; each product on clrt_gemm_strided where the CPU has
   it, else sgemm. */
void clrt_lora_input_backward(float *dx, float *dA, const float *dxa, float *xd, const float *A, int64_t N, int K,
                              int r, uint64_t key, float p) {
  if (N == 0) return;
  if (!clrt_gemm_strided(dA, K, dxa, 1, r, xd, K, r, K, N, 1))
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, K, (int)N, 1.0f, dxa, r, xd, K, 1.0f, dA, K);
  /* dx += dxa A; through the dropout, xd (spent) takes dxa A first */
  float *to = p > 0 ? xd : dx;
  int acc = p <= 0;
  if (!clrt_gemm_strided(to, K, dxa, r, 1, A, K, N, K, r, acc))
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, K, r, 1.0f, dxa, r, A, K, acc ? 1.0f : 0.0f, to, K);
  if (p <= 0) return;
#pragma omp parallel if (N * K > CLRT_OMP_MIN_WORK)
  {
    int64_t a, b;
    share(N * K, &a, &b);
    mask_span(dx, xd, a, b, key, p, 1);
  }
}

/* ---- the embedding's adapter (PEFT's lora_embedding_A [r, V], lora_embedding_B [C, r]) ---- */

void clrt_lora_embed_forward(float *y, float *ea, const int32_t *tok, const float *A, const float *B, int64_t N,
                             int V, int C, int r, float scale) {
  if (N == 0) return;
  for (int64_t n = 0; n < N; n++)
    for (int k = 0; k < r; k++) ea[n * r + k] = A[(int64_t)k * V + tok[n]];
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, C, r, scale, ea, r, B, r, 1.0f, y, C);
}

void clrt_lora_embed_backward(float *dA, float *dB, float *dea, const float *dy, const float *ea,
                              const int32_t *tok, const float *B, int64_t N, int V, int C, int r, float scale) {
  if (N == 0) return;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, r, (int)N, scale, dy, C, ea, r, 1.0f, dB, r);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, r, C, scale, dy, C, B, r, 0.0f, dea, r);
  /* The scatter in row order (a token may repeat): the same sums in the same order every run. */
  for (int64_t n = 0; n < N; n++)
    for (int k = 0; k < r; k++) dA[(int64_t)k * V + tok[n]] += dea[n * r + k];
}

void clrt_lora_merge_embed(float *E, const float *A, const float *B, int V, int C, int r, float scale) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasTrans, V, C, r, scale, A, V, B, r, 1.0f, E, C);
}
