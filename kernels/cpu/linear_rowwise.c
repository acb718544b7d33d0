/* linear_rowwise.c — y = x w^T + b with each row's outputs formed in an order fixed by K
   alone, whatever the number of rows and wherever the row sits among them: the product a
   batch-invariant model (clrt_model_set_batch_invariant) runs when it has no packed copy of
   its weights (linear_packed.c is row-invariant by itself).
   With AVX-512 it is the skinny kernel (linear_skinny.c) over slices of at most
   CLRT_SKINNY_MAX_ROWS rows: that kernel forms each output alone (one 16-lane dot over K,
   reduced at the end), so slicing changes nothing for a row; it reads the weights once per
   slice, which costs a long prefill against sgemm. Without AVX-512 it is a plain loop with
   eight partial sums per output, summed in a fixed order (slow: the fallback for CPUs that
   run none of the fast kernels). */
#include "model_kernels.h"

#include "bf16.h"

/* One output: eight partial sums over k, added pairwise; WIDEN reads a weight as f32. */
#define ROW_DOT(WT, WIDEN)                                                            \
  static float dot_##WT(const float *x /* [K] */, const WT *w /* [K] */, int K) {    \
    float s[8] = {0};                                                                 \
    int k = 0;                                                                        \
    for (; k + 8 <= K; k += 8)                                                        \
      for (int j = 0; j < 8; j++) s[j] += x[k + j] * WIDEN(w[k + j]);                 \
    for (int j = 0; k < K; k++, j++) s[j] += x[k] * WIDEN(w[k]);                      \
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));         \
  }
#define AS_F32(v) (v)
ROW_DOT(float, AS_F32)
ROW_DOT(uint16_t, clrt_bf16_to_f32)

#define PORTABLE(WT, xs)                                                                  \
  _Pragma("omp parallel for schedule(static) if (N * O * (int64_t)K > CLRT_OMP_MIN_WORK)") \
  for (int o = 0; o < O; o++)                                                             \
    for (int64_t n = 0; n < N; n++) {                                                     \
      float s = dot_##WT((xs) + n * K, w + (int64_t)o * K, K);                            \
      y[n * O + o] = b ? s + b[o] : s;                                                    \
    }

void clrt_linear_rowwise_forward(float *y /* [N, O] */, const float *x /* [N, K] */,
                                 const float *w /* [O, K] */, const float *b /* [O] or NULL */,
                                 int64_t N, int K, int O) {
  int sliced = 1;
  for (int64_t n0 = 0; n0 < N && sliced; n0 += CLRT_SKINNY_MAX_ROWS) {
    int64_t rows = N - n0 < CLRT_SKINNY_MAX_ROWS ? N - n0 : CLRT_SKINNY_MAX_ROWS;
    sliced = clrt_linear_skinny_forward(y + n0 * O, x + n0 * K, w, b, rows, K, O);
  }
  if (sliced) return;
  PORTABLE(float, x)
}

static void portable_bf16(float *y /* [N, O] */, const float *xr /* [N, K] */, const uint16_t *w /* [O, K] */,
                          const float *b /* [O] or NULL */, int64_t N, int K, int O) {
  PORTABLE(uint16_t, xr)
}

/* A slice of rows at a time: the skinny kernel's x16 and xr, or the plain loop's xr, never
   more than CLRT_SKINNY_MAX_ROWS rows of them. */
size_t clrt_linear_rowwise_bf16_workspace_bytes(int64_t N, int K) {
  return clrt_linear_skinny_bf16_workspace_bytes(N < CLRT_SKINNY_MAX_ROWS ? N : CLRT_SKINNY_MAX_ROWS, K);
}

int clrt_linear_rowwise_forward_bf16(float *y /* [N, O] */, const float *x /* [N, K] */,
                                     const uint16_t *w /* [O, K] bf16 */, const float *b /* [O] or NULL */,
                                     int64_t N, int K, int O, void *ws, size_t ws_bytes) {
  if (N < 1) return 1;
  if (ws_bytes < clrt_linear_rowwise_bf16_workspace_bytes(N, K)) return 0;
  int sliced = 1;
  for (int64_t n0 = 0; n0 < N && sliced; n0 += CLRT_SKINNY_MAX_ROWS) {
    int64_t rows = N - n0 < CLRT_SKINNY_MAX_ROWS ? N - n0 : CLRT_SKINNY_MAX_ROWS;
    sliced = clrt_linear_skinny_forward_bf16(y + n0 * O, x + n0 * K, w, b, rows, K, O, ws, ws_bytes);
  }
  if (sliced) return 1;
  /* x rounded to bf16 as the skinny kernel rounds it, a slice of rows at a time (each output
     is its own dot, so slicing changes no bit). */
  float *xr = ws;
  for (int64_t n0 = 0; n0 < N; n0 += CLRT_SKINNY_MAX_ROWS) {
    int64_t rows = N - n0 < CLRT_SKINNY_MAX_ROWS ? N - n0 : CLRT_SKINNY_MAX_ROWS;
    for (int64_t i = 0; i < rows * K; i++) xr[i] = clrt_bf16_to_f32(clrt_f32_to_bf16(x[n0 * K + i]));
    portable_bf16(y + n0 * O, xr, w, b, rows, K, O);
  }
  return 1;
}
