/* test_cpu_levels.c — every CPU level this machine can run (cpu_level.c: portable, avx2,
   avxvnni, avx512 on x86-64, portable and neon on aarch64, capped in-process), its products against scalar references that sum in the
   order the design fixes, bit for bit:
     packed f32 forward   y = (fma chain over k from 0) + (bias or 0): every level with a kernel
     strided gemm         c (+)= per 256-deep block of k, an fma chain from 0 added onto c
     bf16 pair panels     per pair, fma(odd) then fma(even) into one f32 sum (vdpbf16ps's
                          order), + (bias or 0): the fma-bf16 unit; avx512-bf16 and amx-bf16
                          against the same where the CPU has them (inputs kept normal)
     narrow gemm          c (+)= one fma chain over all of k from 0, added onto c (LoRA ranks)
     AdamW span           clrt_adamw_update's operations element by element
   and a forced level really runs its own kernels: a CPU level above portable must compute
   (never fall back to sgemm, which sums in another order), portable must decline. */
#include "check.h"
#include "bf16.h"
#include "cpu/cpu_level.h"
#include "cpu/model_kernels.h"
#include "model_math.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static uint32_t rng = 12345;
static float uniform(void) {
  rng = rng * 1664525u + 1013904223u;
  return ((rng >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

static int same_bits(const float *a, const float *b, int64_t n, const char *what, int level, int N, int K, int O) {
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      fprintf(stderr, "%s at %s, N=%d K=%d O=%d: element %lld: %.9g vs reference %.9g\n", what,
              clrt_cpu_level_name(level), N, K, O, (long long)i, a[i], b[i]);
      return 0;
    }
  return 1;
}

/* The packed forward: each output an fma chain over k in order, then + bias (or + 0). */
static void packed_reference(float *y, const float *x, const float *w, const float *b, int N, int K, int O) {
  for (int n = 0; n < N; n++)
    for (int o = 0; o < O; o++) {
      float s = 0;
      for (int k = 0; k < K; k++) s = fmaf(x[n * K + k], w[o * K + k], s);
      y[n * O + o] = s + (b ? b[o] : 0.0f);
    }
}

static void check_packed(int level) {
  static const int Ns[] = {1, 2, 5, 6, 7, 8, 13, 33}, Ks[] = {1, 7, 64, 130}, Os[] = {1, 16, 47, 48, 49, 100, 145};
  int ok = 1;
  for (size_t a = 0; a < sizeof Ns / sizeof *Ns; a++)
    for (size_t c = 0; c < sizeof Ks / sizeof *Ks; c++)
      for (size_t d = 0; d < sizeof Os / sizeof *Os; d++) {
        int N = Ns[a], K = Ks[c], O = Os[d];
        float *x = malloc(sizeof(float) * N * K), *w = malloc(sizeof(float) * O * K), *wp = malloc(sizeof(float) * O * K);
        float *b = malloc(sizeof(float) * O), *y = malloc(sizeof(float) * N * O), *r = malloc(sizeof(float) * N * O);
        for (int i = 0; i < N * K; i++) x[i] = uniform();
        for (int i = 0; i < O * K; i++) w[i] = uniform();
        for (int i = 0; i < O; i++) b[i] = uniform();
        clrt_linear_pack(wp, w, K, O);
        for (int with_bias = 0; with_bias < 2; with_bias++) {
          const float *bias = with_bias ? b : NULL;
          int done = clrt_linear_packed_forward(y, x, wp, bias, N, K, O);
          if (level == CLRT_CPU_PORTABLE) {
            ok &= !done;
            continue;
          }
          packed_reference(r, x, w, bias, N, K, O);
          ok &= done && same_bits(y, r, (int64_t)N * O, "packed f32", level, N, K, O);
        }
        free(x), free(w), free(wp), free(b), free(y), free(r);
      }
  CHECK(ok);
}

/* clrt_gemm_strided: c[i, j] (+)= sum_k a(i, k) b[k, j], per 256-deep block of k an fma chain
   from 0 added onto c (the first block stores when not accumulating). */
static void strided_reference(float *c, int ldc, const float *a, int a_rs, int a_ks, const float *b, int ldb, int M,
                              int Nc, int Kc, int accumulate) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < Nc; j++) {
      float out = c[i * ldc + j];
      for (int k0 = 0; k0 < Kc; k0 += 256) {
        float s = 0;
        for (int k = k0; k < Kc && k < k0 + 256; k++) s = fmaf(a[i * a_rs + k * a_ks], b[k * ldb + j], s);
        out = (accumulate || k0 > 0) ? s + out : s;
      }
      c[i * ldc + j] = out;
    }
}

static void check_strided(int level) {
  static const int Ms[] = {1, 7, 8, 9, 50}, Ncs[] = {1, 17, 48, 100}, Kcs[] = {1, 5, 256, 300, 600};
  int ok = 1;
  for (size_t e = 0; e < sizeof Ms / sizeof *Ms; e++)
    for (size_t f = 0; f < sizeof Ncs / sizeof *Ncs; f++)
      for (size_t g = 0; g < sizeof Kcs / sizeof *Kcs; g++)
        for (int transposed = 0; transposed < 2; transposed++)
          for (int accumulate = 0; accumulate < 2; accumulate++) {
            int M = Ms[e], Nc = Ncs[f], Kc = Kcs[g], ldb = Nc + 3, ldc = Nc + 1;
            /* a [M, Kc] by rows, or read by columns from [Kc, M] (dy^T) */
            int a_rs = transposed ? 1 : Kc, a_ks = transposed ? M : 1;
            float *a = malloc(sizeof(float) * M * Kc), *b = malloc(sizeof(float) * Kc * ldb);
            float *c = malloc(sizeof(float) * M * ldc), *r = malloc(sizeof(float) * M * ldc);
            for (int i = 0; i < M * Kc; i++) a[i] = uniform();
            for (int i = 0; i < Kc * ldb; i++) b[i] = uniform();
            for (int i = 0; i < M * ldc; i++) c[i] = r[i] = uniform();
            int done = clrt_gemm_strided(c, ldc, a, a_rs, a_ks, b, ldb, M, Nc, Kc, accumulate);
            if (level == CLRT_CPU_PORTABLE) {
              ok &= !done;
            } else {
              strided_reference(r, ldc, a, a_rs, a_ks, b, ldb, M, Nc, Kc, accumulate);
              ok &= done && same_bits(c, r, (int64_t)M * ldc, "strided gemm", level, M, Kc, Nc);
            }
            free(a), free(b), free(c), free(r);
          }
  CHECK(ok);
}

/* bf16 pair panels: the same y from clrt_gemm_bf16 over clrt_pack_pairs' panels and from the
   packed forward over clrt_linear_pack_bf16's (one layout), against the pair-order reference. */
static void bf16_reference(float *y, const uint16_t *x16, const uint16_t *w16, const float *b, int N, int K, int O) {
  for (int n = 0; n < N; n++)
    for (int o = 0; o < O; o++) {
      float s = 0;
      for (int k = 0; k < K; k += 2) {
        s = fmaf(clrt_bf16_to_f32(x16[n * K + k + 1]), clrt_bf16_to_f32(w16[o * K + k + 1]), s);
        s = fmaf(clrt_bf16_to_f32(x16[n * K + k]), clrt_bf16_to_f32(w16[o * K + k]), s);
      }
      y[n * O + o] = s + (b ? b[o] : 0.0f);
    }
}

static void check_bf16(int unit) {
  static const int Ns[] = {1, 3, 4, 5, 9, 40}, Ks[] = {2, 8, 64, 130}, Os[] = {1, 15, 16, 48, 50, 97};
  int ok = 1;
  clrt_matrix_unit_cap(unit);
  if (clrt_matrix_unit() != unit) {
    printf("skip: matrix unit %s is not available here\n", clrt_matrix_unit_name(unit));
    clrt_matrix_unit_cap(CLRT_UNIT_AMX);
    return;
  }
  for (size_t a = 0; a < sizeof Ns / sizeof *Ns; a++)
    for (size_t c = 0; c < sizeof Ks / sizeof *Ks; c++)
      for (size_t d = 0; d < sizeof Os / sizeof *Os; d++) {
        int N = Ns[a], K = Ks[c], O = Os[d];
        float *x = malloc(sizeof(float) * N * K), *w = malloc(sizeof(float) * O * K), *b = malloc(sizeof(float) * O);
        uint16_t *x16 = malloc(2 * N * K), *w16 = malloc(2 * O * K), *wp = malloc(2 * O * K);
        float *y = malloc(sizeof(float) * N * O), *r = malloc(sizeof(float) * N * O);
        for (int i = 0; i < N * K; i++) x16[i] = clrt_f32_to_bf16(x[i] = uniform());
        for (int i = 0; i < O * K; i++) w16[i] = clrt_f32_to_bf16(w[i] = uniform());
        for (int i = 0; i < O; i++) b[i] = uniform();
        clrt_linear_pack_bf16(wp, w, K, O);
        bf16_reference(r, x16, w16, b, N, K, O);
        /* AMX sums a 32-deep tile in its own order: only the vector units promise this one */
        int exact = unit != CLRT_UNIT_AMX;
        ok &= clrt_gemm_bf16(y, O, x16, K, N, wp, O, K, b, 0);
        if (exact) ok &= same_bits(y, r, (int64_t)N * O, clrt_matrix_unit_name(unit), clrt_cpu_level(), N, K, O);
        clrt_packed_part part = {y, wp, b, O};
        uint16_t *ws = malloc(clrt_linear_packed_bf16_workspace_bytes(N, K));
        ok &= clrt_linear_packed_bf16_forward_rows(x, N, K, &part, 1, ws, clrt_linear_packed_bf16_workspace_bytes(N, K));
        if (exact) ok &= same_bits(y, r, (int64_t)N * O, "packed bf16", clrt_cpu_level(), N, K, O);
        free(ws), free(x), free(w), free(b), free(x16), free(w16), free(wp), free(y), free(r);
      }
  CHECK(ok);
  clrt_matrix_unit_cap(CLRT_UNIT_AMX);
}

static void check_narrow(int level) {
  static const int Ms[] = {1, 6, 17, 70}, Ncs[] = {1, 8, 16, 33, 64}, Kcs[] = {0, 1, 9, 300};
  int ok = 1;
  for (size_t e = 0; e < sizeof Ms / sizeof *Ms; e++)
    for (size_t f = 0; f < sizeof Ncs / sizeof *Ncs; f++)
      for (size_t g = 0; g < sizeof Kcs / sizeof *Kcs; g++)
        for (int accumulate = 0; accumulate < 2; accumulate++) {
          int M = Ms[e], Nc = Ncs[f], Kc = Kcs[g], ldc = Nc + 2, lda = Kc + 1;
          float *a = malloc(sizeof(float) * (M * lda + 1)), *b = malloc(sizeof(float) * (Kc * Nc + 1));
          float *c = malloc(sizeof(float) * M * ldc), *r = malloc(sizeof(float) * M * ldc);
          for (int i = 0; i < M * lda; i++) a[i] = uniform();
          for (int i = 0; i < Kc * Nc; i++) b[i] = uniform();
          for (int i = 0; i < M * ldc; i++) c[i] = r[i] = uniform();
          int done = clrt_gemm_narrow(c, ldc, a, lda, 1, b, Nc, M, Nc, Kc, accumulate);
          if (level == CLRT_CPU_PORTABLE) ok &= !done;
          else {
            for (int i = 0; i < M; i++)
              for (int j = 0; j < Nc; j++) {
                float sum = 0;
                for (int k = 0; k < Kc; k++) sum = fmaf(a[i * lda + k], b[k * Nc + j], sum);
                r[i * ldc + j] = accumulate ? sum + r[i * ldc + j] : sum;
              }
            ok &= done && same_bits(c, r, (int64_t)M * ldc, "narrow gemm", level, M, Kc, Nc);
          }
          free(a), free(b), free(c), free(r);
        }
  CHECK(ok);
}

/* clrt_adamw_span on spans of every length mod 16, against clrt_adamw_update one by one. */
static void check_adamw(int level) {
  int ok = 1;
  for (int n = 1; n <= 40; n += 3) {
    float p[40], m[40], v[40], g[40], rp[40], rm[40], rv[40];
    for (int i = 0; i < n; i++) {
      rp[i] = p[i] = uniform(), rm[i] = m[i] = 0.1f * uniform(), g[i] = uniform();
      rv[i] = v[i] = 0.01f * (uniform() + 1.0f);
    }
    clrt_adamw_span(p, m, v, g, n, 0.7f, 1e-3f, 0.9f, 0.999f, 1e-8f, 1e-5f, 0.19f, 0.0447f);
    for (int i = 0; i < n; i++) clrt_adamw_update(&rp[i], &rm[i], &rv[i], g[i] * 0.7f, 1e-3f, 0.9f, 0.999f, 1e-8f, 1e-5f, 0.19f, 0.0447f);
    ok &= same_bits(p, rp, n, "adamw p", level, n, 0, 0) && same_bits(m, rm, n, "adamw m", level, n, 0, 0) &&
          same_bits(v, rv, n, "adamw v", level, n, 0, 0);
  }
  CHECK(ok);
}

int main(void) {
  int best = clrt_cpu_level_best();
  printf("cpu level: best %s, CLRT_CPU cap gives %s\n", clrt_cpu_level_name(best), clrt_cpu_level_name(clrt_cpu_level()));
#if defined(__aarch64__)
  CHECK(clrt_cpu_level_by_name("neon") == CLRT_CPU_NEON && clrt_cpu_level_by_name("avx2") == -1);
#else
  CHECK(clrt_cpu_level_by_name("avx2") == CLRT_CPU_AVX2 && clrt_cpu_level_by_name("sse") == -1);
#endif
  for (int level = CLRT_CPU_PORTABLE; level <= best; level++) {
    clrt_cpu_level_cap(level);
    CHECK(clrt_cpu_level() == level);
    CHECK(clrt_linear_packed_available() == (level >= CLRT_CPU_SIMD));
    check_packed(level);
    check_strided(level);
    check_adamw(level);
    check_narrow(level);
    if (level >= CLRT_CPU_SIMD) {   /* avx2 and up, or neon */
      check_bf16(CLRT_UNIT_FMA_BF16);
      if (level == CLRT_CPU_AVX512) {
        check_bf16(CLRT_UNIT_AVX512BF16);
        check_bf16(CLRT_UNIT_AMX);
      }
    } else {
      CHECK(clrt_matrix_unit() == CLRT_UNIT_F32);   /* no bf16 numerics without FMA: none claimed */
    }
  }
  return check_summary();
}
