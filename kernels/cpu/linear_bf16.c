/* linear_bf16.c — the products of a linear layer whose weight is held only in bf16 (a frozen
   base under LoRA adapters, train.base_dtype=bf16: no f32 copy exists), f32 accumulation:
     y = x w^T + b   AVX512-BF16: linear_packed.c's bf16 tiles over the panels, x rounded to
                     bf16 (two roundings per product: error ~2^-8 relative per term);
                     else BLOCK_ROWS weight rows at a time widened to f32 and sgemm (x exact)
     dx (+)= dy w    BLOCK_ROWS weight rows at a time widened to f32 into a scratch
                     [BLOCK_ROWS, K], then dx += dy[:, block] scratch through gemm_strided.c's
                     tiles (else sgemm). Widening costs O*K conversions against N*O*K
                     multiply-adds, and the scratch (the caller's workspace, <= 9 MiB at
                     K = 8960) is all the f32 a call holds. vdpbf16ps cannot serve dx: its
                     pairs run along k, the sum of dx runs along o.
   There is no dw: a bf16 weight is frozen.
   Layout (clrt_linear_pack_bf16): panel p holds weight rows o0 = 48p .. o0 + pw - 1 with the
   two weights of each pair of k side by side: wp[o0 K + kp 2 pw + 2 j + e] = w[o0 + j][2 kp + e]. */
#include "model_kernels.h"

#include "bf16.h"

#include <cblas.h>

enum { PANEL = 48, BLOCK_ROWS = 5 * PANEL };

/* The widened block [min(O, BLOCK_ROWS), K] f32 both directions unpack into. */
static size_t widened_bytes(int K, int O) {
  return sizeof(float) * (size_t)(O < BLOCK_ROWS ? O : BLOCK_ROWS) * (size_t)K;
}

size_t clrt_linear_bf16_workspace_bytes(int64_t N, int K, int O, int dot) {
  size_t packed = dot ? clrt_linear_packed_bf16_workspace_bytes(N, K) : 0, widened = widened_bytes(K, O);
  return packed > widened ? packed : widened;
}

size_t clrt_linear_bf16_backward_dx_workspace_bytes(int K, int O) { return widened_bytes(K, O); }

void clrt_linear_unpack_bf16(float *wf /* [r1 - r0, K] */, const uint16_t *wp /* [O * K] panels */,
                             int K, int O, int r0, int r1) {
  int p0 = r0 / PANEL, p1 = (r1 + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static) if ((int64_t)(r1 - r0) * K > CLRT_OMP_MIN_WORK)
  for (int p = p0; p < p1; p++) {
    int o0 = p * PANEL, pw = O - o0 < PANEL ? O - o0 : PANEL;
    const uint16_t *panel = wp + (int64_t)o0 * K;
    float *rows = wf + (int64_t)(o0 - r0) * K;
    for (int kp = 0; kp < K / 2; kp++) {
      const uint16_t *src = panel + (int64_t)kp * 2 * pw;
      for (int j = 0; j < pw; j++) {
        float *dst = rows + (int64_t)j * K + 2 * kp;
        dst[0] = clrt_bf16_to_f32(src[2 * j]);
        dst[1] = clrt_bf16_to_f32(src[2 * j + 1]);
      }
    }
  }
}

int clrt_linear_bf16_forward(float *y /* [N, O] */, const float *x /* [N, K] */,
                             const uint16_t *wp /* [O * K] panels */, const float *b /* [O] or NULL */,
                             int64_t N, int K, int O, int dot, void *ws, size_t ws_bytes) {
  if (N < 1) return 1;
  if (ws_bytes < clrt_linear_bf16_workspace_bytes(N, K, O, dot)) return 0;
  clrt_packed_part part = {y, wp, b, O};
  if (dot && clrt_linear_packed_bf16_forward_rows(x, N, K, &part, 1, ws, ws_bytes)) return 1;
  float *wf = ws;
  for (int r0 = 0; r0 < O; r0 += BLOCK_ROWS) {
    int rows = O - r0 < BLOCK_ROWS ? O - r0 : BLOCK_ROWS;
    clrt_linear_unpack_bf16(wf, wp, K, O, r0, r0 + rows);
    if (b)
      for (int64_t n = 0; n < N; n++)
        for (int j = 0; j < rows; j++) y[n * O + r0 + j] = b[r0 + j];
    /* y[:, r0 .. r0 + rows) (+)= x wf^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, rows, K, 1.0f, x, K, wf, K,
                b ? 1.0f : 0.0f, y + r0, O);
  }
  return 1;
}

int clrt_linear_bf16_backward_dx(float *dx /* [N, K] */, const float *dy /* [N, O] */,
                                 const uint16_t *wp /* [O * K] panels */, int64_t N, int K, int O,
                                 int accumulate, int fast, void *ws, size_t ws_bytes) {
  if (N < 1) return 1;
  if (ws_bytes < widened_bytes(K, O)) return 0;
  float *wf = ws;
  for (int r0 = 0; r0 < O; r0 += BLOCK_ROWS) {
    int rows = O - r0 < BLOCK_ROWS ? O - r0 : BLOCK_ROWS, add = accumulate || r0 > 0;
    clrt_linear_unpack_bf16(wf, wp, K, O, r0, r0 + rows);
    /* dx (+)= dy[:, r0 .. r0 + rows) wf: a(i, k) = dy[i O + r0 + k], b = wf [rows, K] */
    if (!(fast && clrt_gemm_strided(dx, K, dy + r0, O, 1, wf, K, N, K, rows, add)))
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, K, rows, 1.0f, dy + r0, O, wf,
                  K, add ? 1.0f : 0.0f, dx, K);
  }
  return 1;
}
