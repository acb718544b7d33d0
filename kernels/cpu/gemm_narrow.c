/* gemm_narrow.c — c (+)= a b where c has few columns (a LoRA rank: xa = x A^T [N, r],
   dxa = dy B [N, r], dB += dy^T xa [O, r]). gemm_strided.c's tile is 48 columns wide; at
   r = 16 it would multiply two masked-off vectors out of three. Here a tile is 16 rows by one
   16-lane vector of columns: per k one load of b's row and 16 broadcasts of a, 16 independent
   sums (enough to hide the multiply-add latency on two pipes). a is read through two strides
   as in gemm_strided.c (a row stride and a k stride), so dy^T needs no transposed copy.
   Rows are split over the threads in blocks. Each element of c is a sum over k in order, so
   results agree with sgemm to rounding. AVX-512, or on AVX2 panels_avx2.c's strided tiles
   (6 rows by 16 columns, each sum over k in order from 0 then onto c: the same bits), chosen
   at run time (0: use sgemm). */
#include "model_kernels.h"

#include "simd512.h"

#include <omp.h>

enum { NROWS = 16, NBLOCK = 64 };

#if CLRT_AVX512
#define TARGET CLRT_TARGET_AVX512

/* c[r, 0 .. 16) over the lanes of mk, for the nr (<= 16) rows of a tile. */
TARGET static inline __attribute__((always_inline)) void ntile(float *c, int64_t ldc, const float *a, int64_t a_rs,
                                                               int64_t a_ks, const float *b, int64_t ldb, int nr,
                                                               int64_t kn, __mmask16 mk, int add) {
  __m512 acc[NROWS];
  for (int r = 0; r < NROWS; r++) acc[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kn; k++) {
    __m512 bv = _mm512_maskz_loadu_ps(mk, b + k * ldb);
    const float *ak = a + k * a_ks;
    for (int r = 0; r < NROWS; r++) {
      if (r >= nr) break;
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(ak[(int64_t)r * a_rs]), bv, acc[r]);
    }
  }
  for (int r = 0; r < nr; r++) {
    float *cr = c + (int64_t)r * ldc;
    if (add) acc[r] = _mm512_add_ps(acc[r], _mm512_maskz_loadu_ps(mk, cr));
    _mm512_mask_storeu_ps(cr, mk, acc[r]);
  }
}

TARGET static void nblock(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_ks, const float *b,
                          int64_t ldb, int64_t i0, int64_t i1, int Nc, int64_t Kc, int add) {
  for (int j0 = 0; j0 < Nc; j0 += 16) {
    __mmask16 mk = Nc - j0 >= 16 ? (__mmask16)0xFFFF : clrt_tail_mask16(Nc - j0);
    for (int64_t i = i0; i < i1; i += NROWS) {
      int nr = i1 - i < NROWS ? (int)(i1 - i) : NROWS;
      float *ct = c + i * ldc + j0;
      const float *at = a + i * a_rs;
      if (nr == NROWS) ntile(ct, ldc, at, a_rs, a_ks, b + j0, ldb, NROWS, Kc, mk, add);
      else ntile(ct, ldc, at, a_rs, a_ks, b + j0, ldb, nr, Kc, mk, add);
    }
  }
}
#endif

/* The AVX2 block: column groups of up to 48 (one strided tile call each); on aarch64 the same
   with NEON's strided tiles (panels_neon.c, the same order). */
#if CLRT_NEON
#define STRIDED_TILE clrt_neon_tile_strided
#else
#define STRIDED_TILE clrt_avx2_tile_strided
#endif
static void nblock_avx2(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_ks, const float *b,
                        int64_t ldb, int64_t i0, int64_t i1, int Nc, int64_t Kc, int add) {
  for (int j0 = 0; j0 < Nc; j0 += 48) {
    int pw = Nc - j0 < 48 ? Nc - j0 : 48;
    STRIDED_TILE(c + i0 * ldc + j0, ldc, a + i0 * a_rs, a_rs, a_ks, b + j0, ldb, (int)(i1 - i0), (int)Kc, pw, add);
  }
}

int clrt_gemm_narrow(float *c /* [M, ldc] */, int64_t ldc, const float *a /* a(i, k) at a[i a_rs + k a_ks] */,
                     int64_t a_rs, int64_t a_ks, const float *b /* [Kc, ldb] */, int64_t ldb, int64_t M, int Nc,
                     int64_t Kc, int accumulate) {
  int wide = CLRT_AVX512 && clrt_have_avx512();
  if (M < 1 || Nc < 1 || Kc < 0 || Kc > INT32_MAX || (!wide && !clrt_have_avx2() && !clrt_have_neon())) return 0;
  int64_t blocks = (M + NBLOCK - 1) / NBLOCK;
#pragma omp parallel for schedule(static) if (M * Nc * Kc > CLRT_OMP_MIN_WORK)
  for (int64_t t = 0; t < blocks; t++) {
    int64_t i0 = t * NBLOCK, i1 = M - i0 < NBLOCK ? M : i0 + NBLOCK;
#if CLRT_AVX512
    if (wide) {
      nblock(c, ldc, a, a_rs, a_ks, b, ldb, i0, i1, Nc, Kc, accumulate);
      continue;
    }
#endif
    nblock_avx2(c, ldc, a, a_rs, a_ks, b, ldb, i0, i1, Nc, Kc, accumulate);
  }
  return 1;
}
