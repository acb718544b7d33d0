/* linear_int8.c — int8 x int8 -> int32 products for generation (see linear_int8.h for the
   layout and why activations are quantized): AVX512-VNNI (vpdpbusd on 16 outputs) where the
   CPU has it, else AVX-VNNI (the 256-bit VEX form, 8 outputs: CPUs without AVX-512), else
   AVX2 (vpmaddubsw + vpmaddwd on |q| and sign-carrying weights); on aarch64 NEON (SDOT with
   the dot product, else vmull_s8 + vpadalq_s16); else a portable loop. All compute the same exact integer sums and the same f32 epilogue, so their
   outputs are bit-identical. */
#include "linear_int8.h"
#include "simd512.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- packing and quantization (shared by every path) ---------------------------------------- */

/* Output row o (o >= O: a zero padding row) into its panel lane, its scale and its sum. */
static void pack_row(int8_t *wq, float *ws, int32_t *wsum, const float *w, int K, int O, int o) {
  int K4 = clrt_int8_k4(K);
  int8_t *panel = wq + (size_t)(o / 16) * 16 * K4;
  int lane = o % 16;
  float scale = 1, inv = 0;
  if (o < O) {
    float amax = 0;
    for (int k = 0; k < K; k++) amax = fmaxf(amax, fabsf(w[(size_t)o * K + k]));
    if (amax > 0) {
      scale = amax / 127.0f;
      inv = 127.0f / amax;
    }
  }
  int32_t sum = 0;
  for (int k = 0; k < K4; k++) {
    long q = o < O && k < K ? lrintf(w[(size_t)o * K + k] * inv) : 0;
    q = q > 127 ? 127 : q < -127 ? -127 : q;
    panel[(size_t)(k / 4) * 64 + lane * 4 + k % 4] = (int8_t)q;
    sum += (int32_t)q;
  }
  if (o < O) {
    ws[o] = scale;
    wsum[o] = sum;
  }
}

void clrt_int8_pack(int8_t *wq, float *ws, int32_t *wsum, const float *w, int K, int O) {
  int O16 = clrt_int8_o16(O);
#pragma omp parallel for schedule(static)
  for (int o = 0; o < O16; o++) pack_row(wq, ws, wsum, w, K, O, o);
}

void clrt_int8_pack_rows(int8_t *wq, float *ws, int32_t *wsum, const float *w, int K, int O, int r0, int r1) {
  for (int o = r0; o < r1 && o < O; o++) pack_row(wq, ws, wsum, w, K, O, o);
}

/* One row, scalar: the reference the vector form below matches bit for bit. Stored as q + 128
   (linear_int8.h). */
static void quantize_row(uint8_t *qr, float *xs, const float *xr, int K) {
  int K4 = clrt_int8_k4(K);
  float amax = 0;
  for (int k = 0; k < K; k++) amax = fmaxf(amax, fabsf(xr[k]));
  float inv = amax > 0 ? 127.0f / amax : 0;
  *xs = amax > 0 ? amax / 127.0f : 1;
  for (int k = 0; k < K4; k++) {
    long q = k < K ? lrintf(xr[k] * inv) : 0;
    qr[k] = (uint8_t)((q > 127 ? 127 : q < -127 ? -127 : q) + 128);
  }
}

#if CLRT_AVX512
/* The same row 16 lanes at a time: max(|x|, m) keeps m where x is NaN, as fmaxf does;
   vcvtps2dq rounds to nearest even under the default MXCSR, as lrintf does, and gives
   INT_MIN for NaN, which the clamp turns into -127 as the scalar form's does. The lanes
   past K load as zeros, so the K4 padding is q = 0 (byte 128). */
CLRT_TARGET_AVX512 static void quantize_row_avx512(uint8_t *qr, float *xs, const float *xr, int K) {
  int K4 = clrt_int8_k4(K);
  __m512 m = _mm512_setzero_ps();
  for (int k = 0; k < K; k += 16) {
    __mmask16 lm = K - k >= 16 ? (__mmask16)0xFFFF : clrt_tail_mask16(K - k);
    m = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(lm, xr + k)), m);
  }
  float amax = _mm512_reduce_max_ps(m);
  float inv = amax > 0 ? 127.0f / amax : 0;
  *xs = amax > 0 ? amax / 127.0f : 1;
  const __m512 iv = _mm512_set1_ps(inv);
  const __m512i hi = _mm512_set1_epi32(127), lo = _mm512_set1_epi32(-127), offset = _mm512_set1_epi32(128);
  for (int k = 0; k < K4; k += 16) {
    int left = K - k < 0 ? 0 : K - k, out = K4 - k;
    __mmask16 lm = left >= 16 ? (__mmask16)0xFFFF : clrt_tail_mask16(left);
    __mmask16 sm = out >= 16 ? (__mmask16)0xFFFF : clrt_tail_mask16(out);
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(lm, xr + k), iv));
    q = _mm512_add_epi32(_mm512_max_epi32(_mm512_min_epi32(q, hi), lo), offset);
    _mm_mask_storeu_epi8(qr + k, sm, _mm512_cvtepi32_epi8(q));   /* 1..255: the low byte */
  }
}
#endif

#if CLRT_AVX2
/* The same row 8 lanes at a time (AVX2), with the AVX-512 form's rules: max(|x|, m) keeps m
   for a NaN, vcvtps2dq rounds to nearest even and gives INT_MIN for NaN (clamped to -127),
   the lanes past K are zeros (byte 128). */
CLRT_TARGET_AVX2 static void quantize_row_avx2(uint8_t *qr, float *xs, const float *xr, int K) {
  int K4 = clrt_int8_k4(K);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 m = _mm256_setzero_ps();
  for (int k = 0; k < K; k += 8) {
    __m256i lm = _mm256_cmpgt_epi32(_mm256_set1_epi32(K - k), idx);
    m = _mm256_max_ps(_mm256_and_ps(_mm256_maskload_ps(xr + k, lm), abs_mask), m);
  }
  float lanes[8], amax = 0;
  _mm256_storeu_ps(lanes, m);
  for (int i = 0; i < 8; i++) amax = lanes[i] > amax ? lanes[i] : amax;   /* no NaN left in m */
  float inv = amax > 0 ? 127.0f / amax : 0;
  *xs = amax > 0 ? amax / 127.0f : 1;
  const __m256 iv = _mm256_set1_ps(inv);
  const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127), offset = _mm256_set1_epi32(128);
  const __m256i gather = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int k = 0; k < K4; k += 8) {
    __m256i lm = _mm256_cmpgt_epi32(_mm256_set1_epi32(K - k), idx);
    __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_maskload_ps(xr + k, lm), iv));
    q = _mm256_add_epi32(_mm256_max_epi32(_mm256_min_epi32(q, hi), lo), offset);   /* 1..255 */
    /* 8 dwords -> 8 bytes: pack to words, then bytes (within each 128-bit half), then the
       two halves' first dwords side by side */
    __m256i w = _mm256_packus_epi32(q, q), b = _mm256_packus_epi16(w, w);
    __m128i bytes = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(b, gather));
    int n = K4 - k < 8 ? K4 - k : 8;
    if (n == 8) _mm_storel_epi64((__m128i *)(qr + k), bytes);
    else {
      uint8_t tmp[16];
      _mm_storeu_si128((__m128i *)tmp, bytes);
      memcpy(qr + k, tmp, (size_t)n);
    }
  }
}
#endif

void clrt_int8_quantize_rows(uint8_t *xq, float *xs, const float *x, int64_t N, int K) {
  int K4 = clrt_int8_k4(K);
  int wide = CLRT_AVX512 && clrt_have_avx512(), avx2 = CLRT_AVX2 && clrt_have_avx2();
  (void)wide, (void)avx2;   /* unread where the build has no x86 SIMD path */
#pragma omp parallel for schedule(static) if (N * K > 65536)
  for (int64_t n = 0; n < N; n++) {
#if CLRT_AVX512
    if (wide) {
      quantize_row_avx512(xq + n * K4, xs + n, x + n * K, K);
      continue;
    }
#endif
#if CLRT_AVX2
    if (avx2) {
      quantize_row_avx2(xq + n * K4, xs + n, x + n * K, K);
      continue;
    }
#endif
    quantize_row(xq + n * K4, xs + n, x + n * K, K);
  }
}

int32_t clrt_int8_dot_ref(const uint8_t *xq_row, const int8_t *wq, int K, int o) {
  int K4 = clrt_int8_k4(K);
  const int8_t *panel = wq + (size_t)(o / 16) * 16 * K4;
  int32_t acc = 0;
  for (int k = 0; k < K4; k++)
    acc += ((int32_t)xq_row[k] - 128) * panel[(size_t)(k / 4) * 64 + (o % 16) * 4 + k % 4];
  return acc;
}

/* The epilogue every path shares, so that they agree to the bit. */
static inline float int8_out(int32_t acc, float xs, float ws, float b) { return fmaf((float)acc * xs, ws, b); }

/* ---- portable ---------------------------------------------------------------------------------- */

/* The unsigned bytes times the weights, less 128 * wsum, as the VNNI paths sum them. */
static void linear_portable(float *y, const uint8_t *xq, const float *xs, const int8_t *wq, const float *ws,
                            const int32_t *wsum, const float *b, int64_t N, int K, int O) {
  int K4 = clrt_int8_k4(K), panels = clrt_int8_o16(O) / 16;
#pragma omp parallel for schedule(static)
  for (int p = 0; p < panels; p++) {
    const int8_t *panel = wq + (size_t)p * 16 * K4;
    for (int64_t n = 0; n < N; n++) {
      const uint8_t *xr = xq + n * K4;
      int32_t acc[16] = {0};
      for (int g = 0; g < K4 / 4; g++) {
        const int8_t *wg = panel + (size_t)g * 64;
        const uint8_t *xg = xr + 4 * g;
        for (int lane = 0; lane < 16; lane++)
          acc[lane] += xg[0] * wg[lane * 4] + xg[1] * wg[lane * 4 + 1] + xg[2] * wg[lane * 4 + 2] +
                       xg[3] * wg[lane * 4 + 3];
      }
      for (int lane = 0; lane < 16 && p * 16 + lane < O; lane++) {
        int o = p * 16 + lane;
        y[n * O + o] = int8_out(acc[lane] - 128 * wsum[o], xs[n], ws[o], b ? b[o] : 0.0f);
      }
    }
  }
}

/* ---- AVX512-VNNI ------------------------------------------------------------------------------- */

#if CLRT_AVX512
#define TARGET_VNNI __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512vnni")))

static int have_avx512vnni(void) {
  static int known = -1;
  if (known < 0) known = __builtin_cpu_supports("avx512vnni");
  return known && clrt_have_avx512();
}

/* The accumulators' type: sixteen int32 lanes, the type GCC's vpdpbusd builtin works in. Kept
   as __m512i (eight int64 lanes), GCC 12 copies each accumulator to another register before
   every vpdpbusd and back after it, and spills two in the 8 x 2 tile; so typed, the tiles ran
   1.3-1.6x faster at 8 to 512 rows (Zen 5, 2 threads), as fast as vpdpbusd in inline asm,
   which instead kept the 1-row tile's accumulators on the stack (0.6x at one row). */
typedef int vnni_acc __attribute__((vector_size(64)));

/* R rows (n0..) by P panels (p0..): vpdpbusd takes unsigned inputs, which the activations
   already are (q + 128), and 128 * wsum comes off at the end: the same exact integer sum. */
TARGET_VNNI static inline __attribute__((always_inline)) void vnni_tile(
    float *y, const uint8_t *xq, const float *xs, const int8_t *wq, const float *ws, const int32_t *wsum,
    const float *b, int64_t n0, int p0, int K, int O, const int R, const int P) {
  int K4 = clrt_int8_k4(K);
  vnni_acc acc[8][4];
  for (int i = 0; i < R; i++)
    for (int j = 0; j < P; j++) acc[i][j] = (vnni_acc)_mm512_setzero_si512();
  const int8_t *pw[4];
  for (int j = 0; j < P; j++) pw[j] = wq + (size_t)(p0 + j) * 16 * K4;
  const uint8_t *px[8];
  for (int i = 0; i < R; i++) px[i] = xq + (n0 + i) * K4;
  for (int g = 0; g < K4 / 4; g++) {
    __m512i wv[4];
    for (int j = 0; j < P; j++) wv[j] = _mm512_loadu_si512((const void *)(pw[j] + (size_t)g * 64));
    for (int i = 0; i < R; i++) {
      int32_t x4;
      __builtin_memcpy(&x4, px[i] + 4 * g, 4);
      __m512i xv = _mm512_set1_epi32(x4);
      for (int j = 0; j < P; j++) acc[i][j] = (vnni_acc)_mm512_dpbusd_epi32((__m512i)acc[i][j], xv, wv[j]);
    }
  }
  for (int j = 0; j < P; j++) {
    int o0 = (p0 + j) * 16, lanes = O - o0 < 16 ? O - o0 : 16;
    __mmask16 m = lanes == 16 ? (__mmask16)0xFFFF : clrt_tail_mask16(lanes);
    __m512i corr = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(m, wsum + o0), 7);
    __m512 sv = _mm512_maskz_loadu_ps(m, ws + o0);
    __m512 bv = b ? _mm512_maskz_loadu_ps(m, b + o0) : _mm512_setzero_ps();
    for (int i = 0; i < R; i++) {
      __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32((__m512i)acc[i][j], corr));
      f = _mm512_mul_ps(f, _mm512_set1_ps(xs[n0 + i]));
      _mm512_mask_storeu_ps(y + (n0 + i) * O + o0, m, _mm512_fmadd_ps(f, sv, bv));
    }
  }
}

#define TILE_R(R)                                                                              \
  switch (P) {                                                                                 \
    case 4: vnni_tile(y, xq, xs, wq, ws, wsum, b, n, p0, K, O, R, 4); break;                   \
    case 3: vnni_tile(y, xq, xs, wq, ws, wsum, b, n, p0, K, O, R, 3); break;                   \
    case 2: vnni_tile(y, xq, xs, wq, ws, wsum, b, n, p0, K, O, R, 2); break;                   \
    default: vnni_tile(y, xq, xs, wq, ws, wsum, b, n, p0, K, O, R, 1); break;                  \
  }

/* One block of four panels (64 outputs) by every row, in tiles of four rows, so the block's
   weights (up to 64 x K bytes) stay in cache while the rows stream past. */
TARGET_VNNI static void vnni_block(float *y, const uint8_t *xq, const float *xs, const int8_t *wq,
                                   const float *ws, const int32_t *wsum, const float *b, int64_t N,
                                   int K, int O, int blk) {
  int panels = clrt_int8_o16(O) / 16, p0 = blk * 4, P = panels - p0 < 4 ? panels - p0 : 4;
  int64_t n = 0;
  for (; n + 4 <= N; n += 4) TILE_R(4)
  switch (N - n) {
    case 3: TILE_R(3) break;
    case 2: TILE_R(2) break;
    case 1: TILE_R(1) break;
    default: break;
  }
}

/* Many rows (a prefill, a batched decode step): two panels (32 outputs) by eight rows, so each
   weight load feeds eight vpdpbusd instead of four and the pair's weights (32 x K bytes) stay
   in L1 while the rows pass at K = 896. At Qwen2.5-0.5B's four product shapes and 480 rows on
   2 threads (AMD Zen 5) this ran 548 GOP/s against the 4 x 4 tiles' 379. The sums are the
   same exact integers, so the outputs are the same bits. */
/* One tile of R rows by one or two panels (R constant where it is inlined, so the tile unrolls). */
TARGET_VNNI static inline __attribute__((always_inline)) void vnni_tile_p(
    float *y, const uint8_t *xq, const float *xs, const int8_t *wq, const float *ws, const int32_t *wsum,
    const float *b, int64_t n, int p0, int K, int O, const int R, int P) {
  if (P == 2) vnni_tile(y, xq, xs, wq, ws, wsum, b, n, p0, K, O, R, 2);
  else vnni_tile(y, xq, xs, wq, ws, wsum, b, n, p0, K, O, R, 1);
}

TARGET_VNNI static void vnni_pair(float *y, const uint8_t *xq, const float *xs, const int8_t *wq,
                                  const float *ws, const int32_t *wsum, const float *b, int64_t N,
                                  int K, int O, int pair) {
  int panels = clrt_int8_o16(O) / 16, p0 = pair * 2, P = panels - p0 < 2 ? panels - p0 : 2;
  int64_t n = 0;
  for (; n + 8 <= N; n += 8) vnni_tile_p(y, xq, xs, wq, ws, wsum, b, n, p0, K, O, 8, P);
  if (N - n >= 4) vnni_tile_p(y, xq, xs, wq, ws, wsum, b, n, p0, K, O, 4, P), n += 4;
  if (N - n >= 2) vnni_tile_p(y, xq, xs, wq, ws, wsum, b, n, p0, K, O, 2, P), n += 2;
  if (N - n >= 1) vnni_tile_p(y, xq, xs, wq, ws, wsum, b, n, p0, K, O, 1, P);
}

/* The blocks over the threads. The parallel loop lives outside the target("avx512...")
   function: clang outlines an OpenMP region into a function without its caller's target
   features, and inlining the VNNI tiles there fails to compile. */
static void linear_vnni(float *y, const uint8_t *xq, const float *xs, const int8_t *wq, const float *ws,
                        const int32_t *wsum, const float *b, int64_t N, int K, int O) {
  if (N >= 8) {
    int pairs = (clrt_int8_o16(O) / 16 + 1) / 2;
#pragma omp parallel for schedule(static)
    for (int pair = 0; pair < pairs; pair++) vnni_pair(y, xq, xs, wq, ws, wsum, b, N, K, O, pair);
    return;
  }
  int blocks = (clrt_int8_o16(O) / 16 + 3) / 4;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; blk++) vnni_block(y, xq, xs, wq, ws, wsum, b, N, K, O, blk);
}
#undef TILE_R
#else
static int have_avx512vnni(void) { return 0; }
#endif

/* ---- AVX-VNNI (256-bit) ------------------------------------------------------------------------ */

#if defined(__x86_64__) && defined(__GNUC__)
#define CLRT_AVXVNNI 1
#define TARGET_AVXVNNI __attribute__((target("avx2,fma,avxvnni")))

/* AVX-VNNI (cpu_level.c reads its CPUID bit): at the avxvnni level and above. */
static int have_avxvnni(void) { return clrt_cpu_level() >= CLRT_CPU_AVXVNNI && clrt_cpu_has_avxvnni(); }

/* Eight int32 lanes, for the reason vnni_acc above has sixteen. */
typedef int avxvnni_acc __attribute__((vector_size(32)));

/* R rows by one panel: a panel group's 64 bytes are two 256-bit operands (outputs 0-7 and
   8-15); the same unsigned-input correction as above, and the shared scalar epilogue. */
TARGET_AVXVNNI static inline __attribute__((always_inline)) void avxvnni_tile(
    float *y, const uint8_t *xq, const float *xs, const int8_t *wq, const float *ws, const int32_t *wsum,
    const float *b, int64_t n0, int p, int K, int O, const int R) {
  int K4 = clrt_int8_k4(K);
  avxvnni_acc acc[4][2];
  for (int i = 0; i < R; i++) acc[i][0] = acc[i][1] = (avxvnni_acc)_mm256_setzero_si256();
  const int8_t *pw = wq + (size_t)p * 16 * K4;
  for (int g = 0; g < K4 / 4; g++) {
    __m256i w0 = _mm256_loadu_si256((const __m256i *)(pw + (size_t)g * 64));
    __m256i w1 = _mm256_loadu_si256((const __m256i *)(pw + (size_t)g * 64 + 32));
    for (int i = 0; i < R; i++) {
      int32_t x4;
      __builtin_memcpy(&x4, xq + (n0 + i) * K4 + 4 * g, 4);
      __m256i xv = _mm256_set1_epi32(x4);
      acc[i][0] = (avxvnni_acc)_mm256_dpbusd_avx_epi32((__m256i)acc[i][0], xv, w0);
      acc[i][1] = (avxvnni_acc)_mm256_dpbusd_avx_epi32((__m256i)acc[i][1], xv, w1);
    }
  }
  int o0 = p * 16, lanes = O - o0 < 16 ? O - o0 : 16;
  for (int i = 0; i < R; i++) {
    int32_t sums[16];
    _mm256_storeu_si256((__m256i *)sums, (__m256i)acc[i][0]);
    _mm256_storeu_si256((__m256i *)(sums + 8), (__m256i)acc[i][1]);
    for (int lane = 0; lane < lanes; lane++) {
      int o = o0 + lane;
      y[(n0 + i) * O + o] = int8_out(sums[lane] - 128 * wsum[o], xs[n0 + i], ws[o], b ? b[o] : 0.0f);
    }
  }
}

TARGET_AVXVNNI static void avxvnni_panel(float *y, const uint8_t *xq, const float *xs, const int8_t *wq,
                                         const float *ws, const int32_t *wsum, const float *b, int64_t N,
                                         int K, int O, int p) {
  int64_t n = 0;
  for (; n + 4 <= N; n += 4) avxvnni_tile(y, xq, xs, wq, ws, wsum, b, n, p, K, O, 4);
  switch (N - n) {
    case 3: avxvnni_tile(y, xq, xs, wq, ws, wsum, b, n, p, K, O, 3); break;
    case 2: avxvnni_tile(y, xq, xs, wq, ws, wsum, b, n, p, K, O, 2); break;
    case 1: avxvnni_tile(y, xq, xs, wq, ws, wsum, b, n, p, K, O, 1); break;
    default: break;
  }
}

/* The panels over the threads (the parallel loop outside the target function, as above). */
static void linear_avxvnni(float *y, const uint8_t *xq, const float *xs, const int8_t *wq, const float *ws,
                           const int32_t *wsum, const float *b, int64_t N, int K, int O) {
  int panels = clrt_int8_o16(O) / 16;
#pragma omp parallel for schedule(static)
  for (int p = 0; p < panels; p++) avxvnni_panel(y, xq, xs, wq, ws, wsum, b, N, K, O, p);
}
#else
#define CLRT_AVXVNNI 0
static int have_avxvnni(void) { return 0; }
#endif

/* ---- AVX2 (no VNNI: Zen 2/3, Intel before Alder Lake) ----------------------------------------- */

#if CLRT_AVX2
#define TARGET_AVX2_INT8 CLRT_TARGET_AVX2

/* The same exact sums without vpdpbusd. vpmaddubsw multiplies unsigned bytes by signed ones
   into saturating 16-bit pair sums: fed the stored q + 128 it could reach 2 * 255 * 127 and
   clip. Fed |q| (<= 127) against the weights carrying q's sign (vpsignb; weights are in
   [-127, 127], so no -128 to negate), a pair is at most 2 * 127 * 127 = 32258: exact. vpmaddwd
   then adds the pairs into each output's int32 lane. The sum is the signed q . w itself, so
   no 128 * wsum correction; the epilogue is the shared one. */
TARGET_AVX2_INT8 static inline __attribute__((always_inline)) void avx2_tile(
    float *y, const uint8_t *xq, const float *xs, const int8_t *wq, const float *ws, const float *b, int64_t n0,
    int p, int K, int O, const int R) {
  int K4 = clrt_int8_k4(K);
  __m256i acc[4][2];
  for (int i = 0; i < R; i++) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
  const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
  const int8_t *pw = wq + (size_t)p * 16 * K4;
  for (int g = 0; g < K4 / 4; g++) {
    __m256i w0 = _mm256_loadu_si256((const __m256i *)(pw + (size_t)g * 64));
    __m256i w1 = _mm256_loadu_si256((const __m256i *)(pw + (size_t)g * 64 + 32));
    for (int i = 0; i < R; i++) {
      int32_t x4;
      __builtin_memcpy(&x4, xq + (n0 + i) * K4 + 4 * g, 4);
      __m256i q = _mm256_xor_si256(_mm256_set1_epi32(x4), flip);   /* the signed q */
      __m256i aq = _mm256_abs_epi8(q);
      __m256i p0 = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(w0, q));
      __m256i p1 = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(w1, q));
      acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(p0, ones));
      acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(p1, ones));
    }
  }
  int o0 = p * 16, lanes = O - o0 < 16 ? O - o0 : 16;
  for (int i = 0; i < R; i++) {
    int32_t sums[16];
    _mm256_storeu_si256((__m256i *)sums, acc[i][0]);
    _mm256_storeu_si256((__m256i *)(sums + 8), acc[i][1]);
    for (int lane = 0; lane < lanes; lane++) {
      int o = o0 + lane;
      y[(n0 + i) * O + o] = int8_out(sums[lane], xs[n0 + i], ws[o], b ? b[o] : 0.0f);
    }
  }
}

TARGET_AVX2_INT8 static void avx2_panel(float *y, const uint8_t *xq, const float *xs, const int8_t *wq,
                                        const float *ws, const float *b, int64_t N, int K, int O, int p) {
  int64_t n = 0;
  for (; n + 4 <= N; n += 4) avx2_tile(y, xq, xs, wq, ws, b, n, p, K, O, 4);
  switch (N - n) {
    case 3: avx2_tile(y, xq, xs, wq, ws, b, n, p, K, O, 3); break;
    case 2: avx2_tile(y, xq, xs, wq, ws, b, n, p, K, O, 2); break;
    case 1: avx2_tile(y, xq, xs, wq, ws, b, n, p, K, O, 1); break;
    default: break;
  }
}

static void linear_avx2(float *y, const uint8_t *xq, const float *xs, const int8_t *wq, const float *ws,
                        const float *b, int64_t N, int K, int O) {
  int panels = clrt_int8_o16(O) / 16;
#pragma omp parallel for schedule(static)
  for (int p = 0; p < panels; p++) avx2_panel(y, xq, xs, wq, ws, b, N, K, O, p);
}
#endif

/* ---- NEON (aarch64) ---------------------------------------------------------------------------- */

#if CLRT_NEON
/* Both forms undo the stored offset once per group (an XOR of 0x80 gives the signed q) and sum
   the signed q . w exactly, so no 128 * wsum correction; the epilogue is the shared one. A
   group's 64 bytes are four 16-byte vectors, outputs 4v .. 4v + 3, four inputs each.
   With the dot product (Armv8.2 SDOT, HWCAP_ASIMDDP): vdotq_s32 adds each output's four
   products into its int32 lane, 16 multiply-adds an instruction. Without it: vmull_s8 forms
   the products in 16 bits (|q|, |w| <= 127: at most 16129, exact) and vpadalq_s16 adds their
   pairs into int32 lanes, two per output, which a pairwise add joins at the end. */
static int have_neon_dot(void) { return clrt_have_neon() && clrt_cpu_has_dotprod(); }

/* The signed q of a row's group of 4 inputs, in all four 32-bit lanes. */
static inline int8x16_t group_q(const uint8_t *x) {
  uint32_t x4;
  __builtin_memcpy(&x4, x, 4);
  return vreinterpretq_s8_u8(veorq_u8(vreinterpretq_u8_u32(vdupq_n_u32(x4)), vdupq_n_u8(0x80)));
}

/* y for rows n0 .. n0 + R of one panel, from the 16 int32 sums of each row. */
static inline void neon_store(float *y, const int32_t sums[][16], const float *xs, const float *ws, const float *b,
                              int64_t n0, int p, int O, int R) {
  int o0 = p * 16, lanes = O - o0 < 16 ? O - o0 : 16;
  for (int i = 0; i < R; i++)
    for (int lane = 0; lane < lanes; lane++) {
      int o = o0 + lane;
      y[(n0 + i) * O + o] = int8_out(sums[i][lane], xs[n0 + i], ws[o], b ? b[o] : 0.0f);
    }
}

CLRT_TARGET_DOTPROD static inline __attribute__((always_inline)) void neon_dot_tile(
    float *y, const uint8_t *xq, const float *xs, const int8_t *wq, const float *ws, const float *b, int64_t n0,
    int p, int K, int O, const int R) {
  int K4 = clrt_int8_k4(K);
  int32x4_t acc[4][4];
  for (int i = 0; i < R; i++)
    for (int v = 0; v < 4; v++) acc[i][v] = vdupq_n_s32(0);
  const int8_t *pw = wq + (size_t)p * 16 * K4;
  for (int g = 0; g < K4 / 4; g++) {
    const int8_t *wg = pw + (size_t)g * 64;
    int8x16_t w0 = vld1q_s8(wg), w1 = vld1q_s8(wg + 16), w2 = vld1q_s8(wg + 32), w3 = vld1q_s8(wg + 48);
    for (int i = 0; i < R; i++) {
      int8x16_t q = group_q(xq + (n0 + i) * K4 + 4 * g);
      acc[i][0] = vdotq_s32(acc[i][0], q, w0);
      acc[i][1] = vdotq_s32(acc[i][1], q, w1);
      acc[i][2] = vdotq_s32(acc[i][2], q, w2);
      acc[i][3] = vdotq_s32(acc[i][3], q, w3);
    }
  }
  int32_t sums[4][16];
  for (int i = 0; i < R; i++)
    for (int v = 0; v < 4; v++) vst1q_s32(sums[i] + 4 * v, acc[i][v]);
  neon_store(y, (const int32_t(*)[16])sums, xs, ws, b, n0, p, O, R);
}

CLRT_TARGET_DOTPROD static void neon_dot_panel(float *y, const uint8_t *xq, const float *xs, const int8_t *wq,
                                               const float *ws, const float *b, int64_t N, int K, int O, int p) {
  int64_t n = 0;
  for (; n + 4 <= N; n += 4) neon_dot_tile(y, xq, xs, wq, ws, b, n, p, K, O, 4);
  switch (N - n) {
    case 3: neon_dot_tile(y, xq, xs, wq, ws, b, n, p, K, O, 3); break;
    case 2: neon_dot_tile(y, xq, xs, wq, ws, b, n, p, K, O, 2); break;
    case 1: neon_dot_tile(y, xq, xs, wq, ws, b, n, p, K, O, 1); break;
    default: break;
  }
}

/* Without the dot product: two rows a tile (8 pair sums a row: 16 accumulators). */
static inline __attribute__((always_inline)) void neon_tile(float *y, const uint8_t *xq, const float *xs,
                                                            const int8_t *wq, const float *ws, const float *b,
                                                            int64_t n0, int p, int K, int O, const int R) {
  int K4 = clrt_int8_k4(K);
  int32x4_t acc[2][8];   /* [v][0]: outputs 4v, 4v + 1 (two pair sums each); [v][1]: 4v + 2, 4v + 3 */
  for (int i = 0; i < R; i++)
    for (int j = 0; j < 8; j++) acc[i][j] = vdupq_n_s32(0);
  const int8_t *pw = wq + (size_t)p * 16 * K4;
  for (int g = 0; g < K4 / 4; g++) {
    const int8_t *wg = pw + (size_t)g * 64;
    int8x16_t w[4] = {vld1q_s8(wg), vld1q_s8(wg + 16), vld1q_s8(wg + 32), vld1q_s8(wg + 48)};
    for (int i = 0; i < R; i++) {
      int8x16_t q = group_q(xq + (n0 + i) * K4 + 4 * g);
      for (int v = 0; v < 4; v++) {
        acc[i][2 * v] = vpadalq_s16(acc[i][2 * v], vmull_s8(vget_low_s8(w[v]), vget_low_s8(q)));
        acc[i][2 * v + 1] = vpadalq_s16(acc[i][2 * v + 1], vmull_high_s8(w[v], q));
      }
    }
  }
  int32_t sums[2][16];
  for (int i = 0; i < R; i++)
    for (int v = 0; v < 4; v++) vst1q_s32(sums[i] + 4 * v, vpaddq_s32(acc[i][2 * v], acc[i][2 * v + 1]));
  neon_store(y, (const int32_t(*)[16])sums, xs, ws, b, n0, p, O, R);
}

static void neon_panel(float *y, const uint8_t *xq, const float *xs, const int8_t *wq, const float *ws,
                       const float *b, int64_t N, int K, int O, int p) {
  int64_t n = 0;
  for (; n + 2 <= N; n += 2) neon_tile(y, xq, xs, wq, ws, b, n, p, K, O, 2);
  if (n < N) neon_tile(y, xq, xs, wq, ws, b, n, p, K, O, 1);
}

/* The panels over the threads (the parallel loop outside the target function, as above). */
static void linear_neon(float *y, const uint8_t *xq, const float *xs, const int8_t *wq, const float *ws,
                        const float *b, int64_t N, int K, int O, int dot) {
  int panels = clrt_int8_o16(O) / 16;
#pragma omp parallel for schedule(static)
  for (int p = 0; p < panels; p++) {
    if (dot) neon_dot_panel(y, xq, xs, wq, ws, b, N, K, O, p);
    else neon_panel(y, xq, xs, wq, ws, b, N, K, O, p);
  }
}
#else
static int have_neon_dot(void) { return 0; }
#endif

/* ---- dispatch ---------------------------------------------------------------------------------- */

int clrt_int8_path(void) {
  return have_avx512vnni() ? CLRT_INT8_AVX512VNNI
         : have_avxvnni()  ? CLRT_INT8_AVXVNNI
         : clrt_have_avx2() ? CLRT_INT8_AVX2
         : have_neon_dot()  ? CLRT_INT8_NEON_DOT
         : clrt_have_neon() ? CLRT_INT8_NEON
                            : CLRT_INT8_PORTABLE;
}

const char *clrt_int8_path_name(int path) {
  return path == CLRT_INT8_AVX512VNNI ? "avx512-vnni"
         : path == CLRT_INT8_AVXVNNI  ? "avx-vnni"
         : path == CLRT_INT8_AVX2     ? "avx2"
         : path == CLRT_INT8_NEON_DOT ? "neon-dotprod"
         : path == CLRT_INT8_NEON     ? "neon"
                                      : "portable";
}

int clrt_int8_path_available(int path) {
  return path == CLRT_INT8_PORTABLE || (path == CLRT_INT8_AVX512VNNI && have_avx512vnni()) ||
         (path == CLRT_INT8_AVXVNNI && have_avxvnni()) || (path == CLRT_INT8_AVX2 && clrt_have_avx2()) ||
         (path == CLRT_INT8_NEON_DOT && have_neon_dot()) || (path == CLRT_INT8_NEON && clrt_have_neon());
}

int clrt_int8_linear(float *y, const uint8_t *xq, const float *xs, const int8_t *wq, const float *ws,
                     const int32_t *wsum, const float *b, int64_t N, int K, int O, int path) {
  if (path == CLRT_INT8_AVX512VNNI) {
#if CLRT_AVX512
    if (!have_avx512vnni()) return -1;
    linear_vnni(y, xq, xs, wq, ws, wsum, b, N, K, O);
    return 0;
#else
    return -1;
#endif
  }
  if (path == CLRT_INT8_AVXVNNI) {
#if CLRT_AVXVNNI
    if (!have_avxvnni()) return -1;
    linear_avxvnni(y, xq, xs, wq, ws, wsum, b, N, K, O);
    return 0;
#else
    return -1;
#endif
  }
  if (path == CLRT_INT8_AVX2) {
#if CLRT_AVX2
    if (!clrt_have_avx2()) return -1;
    linear_avx2(y, xq, xs, wq, ws, b, N, K, O);
    return 0;
#else
    return -1;
#endif
  }
  if (path == CLRT_INT8_NEON_DOT || path == CLRT_INT8_NEON) {
#if CLRT_NEON
    if (path == CLRT_INT8_NEON_DOT ? !have_neon_dot() : !clrt_have_neon()) return -1;
    linear_neon(y, xq, xs, wq, ws, b, N, K, O, path == CLRT_INT8_NEON_DOT);
    return 0;
#else
    return -1;
#endif
  }
  linear_portable(y, xq, xs, wq, ws, wsum, b, N, K, O);
  return 0;
}
