/* test_gemm_bf16.c — the bf16 products of gemm_bf16.c on every matrix unit this CPU has (AMX
   tiles, AVX512-BF16, fma-bf16 on AVX2), each against a double-precision sum of the same bf16-rounded inputs:
   shapes with full and narrow panels, row counts that are and are not multiples of a tile,
   k that AMX takes (a multiple of 32) and k it leaves to the AVX512-BF16 tiles, bias and
   accumulation; a row's bits alone and among others (batch invariance); the packing against
   clrt_linear_pack_bf16; the units against each other. A unit the CPU lacks is skipped with
   a line saying so (77 when it has none). */
#include "check.h"
#include "cpu/model_kernels.h"
#include "bf16.h"

#include <stdint.h>
#include <stdlib.h>

static uint32_t rng = 12345;
static float uniform(void) {
  rng = rng * 1664525u + 1013904223u;
  return (float)((rng >> 8) / 16777216.0 * 2.0 - 1.0);
}

static float round_bf16(float f) { return clrt_bf16_to_f32(clrt_f32_to_bf16(f)); }

/* c = a b (+ bias or + c0) for a [M, Kc] row-major, b [Kc, Nc] row-major, through the
   kernel, checked against doubles over the rounded inputs. Returns c (caller frees). */
static float *product(int M, int Nc, int Kc, int with_bias, int accumulate, const float *a, const float *b,
                      const float *bias, const float *c0) {
  int64_t Kp = (Kc + 31) / 32 * 32 == Kc ? Kc : (Kc + 1) / 2 * 2;   /* AMX's k, or just even */
  if (Kc % 32 && Kc % 7 == 3) Kp = (Kc + 31) / 32 * 32;              /* some shapes padded to 32 */
  uint16_t *a16 = malloc(sizeof(uint16_t) * (size_t)M * (size_t)Kp);
  uint16_t *bp = malloc(sizeof(uint16_t) * (size_t)Nc * (size_t)Kp);
  float *c = malloc(sizeof(float) * (size_t)M * (size_t)Nc);
  clrt_to_bf16_rows(a16, Kp, a, Kc, 1, M, Kc);
  clrt_pack_pairs(bp, b, Nc, 1, Kc, Nc, Kp);
  for (int i = 0; i < M * Nc; i++) c[i] = accumulate ? c0[i] : -7.0f;
  CHECK(clrt_gemm_bf16(c, Nc, a16, Kp, M, bp, Nc, Kp, with_bias ? bias : NULL, accumulate) == 1);
  double worst = 0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < Nc; j++) {
      double s = 0, mag = 0;
      for (int k = 0; k < Kc; k++) {
        double t = (double)round_bf16(a[i * Kc + k]) * round_bf16(b[k * Nc + j]);
        s += t, mag += fabs(t);
      }
      if (with_bias) s += bias[j], mag += fabs(bias[j]);
      if (accumulate) s += c0[i * Nc + j], mag += fabs(c0[i * Nc + j]);
      /* f32 sums of exact products: a few ulps of the magnitude per term at most */
      double err = fabs(c[i * Nc + j] - s) / (mag * 1e-6 * (Kc + 2) + 1e-30);
      if (err > worst) worst = err;
    }
  if (worst > 1) fprintf(stderr, "  M=%d Nc=%d Kc=%d bias=%d acc=%d: error %.3g x tolerance\n", M, Nc, Kc, with_bias,
                         accumulate, worst);
  CHECK(worst <= 1);
  free(a16);
  free(bp);
  return c;
}

static void one_unit(int unit) {
  clrt_matrix_unit_cap(unit);
  CHECK(clrt_matrix_unit() == unit);
  printf("unit %s\n", clrt_matrix_unit_name(unit));
  static const int shapes[][3] = {
      {1, 48, 64},  {5, 96, 64},   {16, 48, 32},   {17, 80, 96},  {33, 144, 128}, {70, 112, 256},
      {3, 40, 64},  {9, 50, 30},   {20, 16, 31},   {65, 64, 896}, {130, 96, 64},  {2, 896, 128},
      {7, 32, 10},  {12, 200, 66}, {64, 48, 4864},
  };
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int M = shapes[s][0], Nc = shapes[s][1], Kc = shapes[s][2];
    float *a = malloc(sizeof(float) * (size_t)M * Kc), *b = malloc(sizeof(float) * (size_t)Kc * Nc);
    float *bias = malloc(sizeof(float) * Nc), *c0 = malloc(sizeof(float) * (size_t)M * Nc);
    for (int i = 0; i < M * Kc; i++) a[i] = uniform();
    for (int i = 0; i < Kc * Nc; i++) b[i] = uniform();
    for (int i = 0; i < Nc; i++) bias[i] = uniform();
    for (int i = 0; i < M * Nc; i++) c0[i] = uniform();
    for (int mode = 0; mode < 3; mode++) {
      float *c = product(M, Nc, Kc, mode == 1, mode == 2, a, b, bias, c0);
      /* batch invariance: each row alone gives the bits it gave among the others */
      if (mode == 0 && M > 1) {
        int same = 1;
        for (int i = 0; i < M; i += (M + 3) / 4) {
          float *c1 = product(1, Nc, Kc, 0, 0, a + (int64_t)i * Kc, b, bias, c0);
          same &= !memcmp(c1, c + (int64_t)i * Nc, sizeof(float) * Nc);
          free(c1);
        }
        if (!same) fprintf(stderr, "  M=%d Nc=%d Kc=%d: a row alone differs from the same row in the batch\n", M, Nc, Kc);
        CHECK(same);
      }
      free(c);
    }
    free(a), free(b), free(bias), free(c0);
  }
}

int main(void) {
  /* The weight layout: w [O, K] packed with rs = 1, cs = K is clrt_linear_pack_bf16's. */
  {
    int O = 100, K = 70;
    float *w = malloc(sizeof(float) * O * K);
    for (int i = 0; i < O * K; i++) w[i] = uniform();
    uint16_t *p1 = malloc(2 * O * K), *p2 = malloc(2 * O * K);
    clrt_linear_pack_bf16(p1, w, K, O);
    clrt_pack_pairs(p2, w, 1, K, K, O, K);
    CHECK(!memcmp(p1, p2, 2 * O * K));
    /* packing in parts (rows of w = columns of b, and k ranges) gives the same bits */
    memset(p2, 0xff, 2 * O * K);
    clrt_pack_pairs_part(p2, w, 1, K, K, O, K, 0, K, 0, 48);
    clrt_pack_pairs_part(p2, w, 1, K, K, O, K, 0, 40, 48, O);
    clrt_pack_pairs_part(p2, w, 1, K, K, O, K, 40, K, 48, O);
    CHECK(!memcmp(p1, p2, 2 * O * K));
    /* the optimizer's row packers give the whole packers' bits, rows in any split, with a
       NaN, an infinity, a denormal and a tie to round in the weights */
    w[3] = NAN, w[K + 5] = INFINITY, w[2 * K + 1] = 1e-40f, w[7] = 1.00390625f;
    clrt_linear_pack_bf16(p1, w, K, O);
    memset(p2, 0xff, 2 * O * K);
    int cuts[] = {0, 48, 50, 96, O};
    for (int i = 0; i < 4; i++) clrt_pack_rows_bf16(p2, w, K, O, cuts[i], cuts[i + 1]);
    CHECK(!memcmp(p1, p2, 2 * O * K));
    clrt_pack_pairs(p1, w, K, 1, O, K, O);
    memset(p2, 0xff, 2 * O * K);
    for (int i = 0; i < 4; i++) clrt_pack_rows_bf16_t(p2, w, K, O, cuts[i], cuts[i + 1]);
    CHECK(!memcmp(p1, p2, 2 * O * K));
    float *f1 = malloc(sizeof(float) * O * K), *f2 = malloc(sizeof(float) * O * K);
    clrt_linear_pack(f1, w, K, O);
    memset(f2, 0xff, sizeof(float) * O * K);
    for (int i = 0; i < 4; i++) clrt_pack_rows_f32(f2, w, K, O, cuts[i], cuts[i + 1]);
    CHECK(!memcmp(f1, f2, sizeof(float) * O * K));
    free(w), free(p1), free(p2), free(f1), free(f2);
  }
  int best = clrt_matrix_unit_best();
  printf("best matrix unit here: %s\n", clrt_matrix_unit_name(best));
  if (best == CLRT_UNIT_F32) {
    printf("SKIP: this CPU (level) has no AMX-BF16, AVX512-BF16 or AVX2 FMA; clrt_gemm_bf16 must decline\n");
    clrt_matrix_unit_cap(CLRT_UNIT_F32);
    float c = 0;
    uint16_t a[2] = {0}, b[2] = {0};
    if (clrt_gemm_bf16(&c, 1, a, 2, 1, b, 1, 2, NULL, 0) != 0) return 1;
    return 77;
  }
  one_unit(CLRT_UNIT_FMA_BF16);   /* every level with AVX2: vdpbf16ps's sums on FMAs */
  if (best >= CLRT_UNIT_AVX512BF16) one_unit(CLRT_UNIT_AVX512BF16);
  if (best >= CLRT_UNIT_AMX) {
    one_unit(CLRT_UNIT_AMX);
    /* AMX and AVX512-BF16 agree to rounding on a product AMX takes whole */
    int M = 37, Nc = 96, K = 256;
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * Nc);
    for (int i = 0; i < M * K; i++) a[i] = uniform();
    for (int i = 0; i < K * Nc; i++) b[i] = uniform();
    clrt_matrix_unit_cap(CLRT_UNIT_AMX);
    CHECK(clrt_amx_panel_fits(48, K));
    float *x = product(M, Nc, K, 0, 0, a, b, NULL, NULL);
    clrt_matrix_unit_cap(CLRT_UNIT_AVX512BF16);
    CHECK(!clrt_amx_panel_fits(48, K));
    float *y = product(M, Nc, K, 0, 0, a, b, NULL, NULL);
    double worst = 0;
    for (int i = 0; i < M * Nc; i++) worst = fmax(worst, fabs(x[i] - y[i]));
    printf("AMX against AVX512-BF16: largest difference %.3g\n", worst);
    CHECK(worst < 1e-3);
    free(a), free(b), free(x), free(y);
  } else {
    printf("SKIP AMX: this CPU has no AMX-BF16 (or Linux did not grant the tile data); "
           "the AMX kernel was compiled but not run\n");
  }
  return check_summary();
}
