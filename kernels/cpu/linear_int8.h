/* linear_int8.h — int8 weights for generation (quant=int8): per-output-channel symmetric
   weight scales, activations quantized per row when a product runs, int32 accumulation.

   Why activations are quantized rather than the weights dequantized in registers: with both
   operands int8, AVX512-VNNI's vpdpbusd does 64 multiply-adds per instruction against the 16
   of an f32 FMA, so prefill and batched decode (compute-bound) gain up to 4x, and decode at
   batch 1 (bound by reading the weights) reads a quarter of the f32 bytes either way.
   Dequantizing in registers keeps f32 FMA's rate and only wins the bandwidth half.

   The sums are exact integers, so every path (VNNI, portable, any row tiling, any thread
   count) gives bit-identical outputs: y = fma((float)acc * xs[n], ws[o], b[o]). Kernel choice
   depends on the CPU and the weight's shape only, never on the row count.

   Weight layout (clrt_int8_pack): panels of 16 outputs; within a panel, for each group of 4
   inputs, 16 outputs x 4 int8 (64 bytes, one vpdpbusd operand). O is padded to a multiple of
   16 and K to a multiple of 4 with zeros. Activations (clrt_int8_quantize_rows): rows of K4
   bytes (K rounded up to 4) with one scale each, stored offset by 128: byte = q + 128 (q's
   sign bit flipped), because vpdpbusd, in both its AVX-512 and AVX-VNNI forms, multiplies
   unsigned bytes by signed ones; storing them so once per row spares the products an XOR per
   row and group of 4 inputs. Every path subtracts 128 * wsum[o] from its sum, which gives
   back the signed sum exactly; a padding input is q = 0 (byte 128) against padding weights
   of 0, so it adds 0 to the unsigned sum, and wsum holds no padding to correct for. */
#ifndef CLRT_LINEAR_INT8_H
#define CLRT_LINEAR_INT8_H
#include <stddef.h>
#include <stdint.h>

/* Paths; clrt_int8_path() is the best this CPU runs at its level (AVX512-VNNI, else AVX-VNNI,
   else AVX2; on aarch64 NEON with the dot product, else NEON; else portable);
   clrt_int8_path_available says whether it runs a given one. */
enum { CLRT_INT8_PORTABLE = 0, CLRT_INT8_AVX512VNNI = 1, CLRT_INT8_AVXVNNI = 2, CLRT_INT8_AVX2 = 3,
       CLRT_INT8_NEON_DOT = 4, CLRT_INT8_NEON = 5, CLRT_INT8_PATHS = 6 };
int clrt_int8_path(void);
int clrt_int8_path_available(int path);
const char *clrt_int8_path_name(int path);

static inline int clrt_int8_k4(int K) { return (K + 3) & ~3; }
static inline int clrt_int8_o16(int O) { return (O + 15) & ~15; }
/* Bytes of a packed [O, K] weight. */
static inline size_t clrt_int8_packed_bytes(int K, int O) { return (size_t)clrt_int8_o16(O) * (size_t)clrt_int8_k4(K); }

/* wq [packed] and per-output scale ws [O] = max|w[o,:]| / 127 (1 for an all-zero row) and
   wsum [O] = sum of row o's int8 weights (the correction for the activations' 128 offset). */
void clrt_int8_pack(int8_t *wq /* [clrt_int8_packed_bytes] */, float *ws /* [O] */, int32_t *wsum /* [O] */,
                    const float *w /* [O, K] */, int K, int O);

/* Rows [r0, r1) of w into a packed copy made by clrt_int8_pack: the same bits as packing the
   whole weight again (each output row is packed on its own). Single-threaded: the optimizer
   step calls it from its own threads, right after updating those rows. */
void clrt_int8_pack_rows(int8_t *wq /* [clrt_int8_packed_bytes] */, float *ws /* [O] */, int32_t *wsum /* [O] */,
                         const float *w /* [O, K] */, int K, int O, int r0, int r1);

/* xq [N, K4] and xs [N]: row n's scale max|x[n,:]| / 127, q = round(x / scale) (to nearest
   even) clamped to [-127, 127], stored as the byte q + 128 (1..255; the K4 padding 128). */
void clrt_int8_quantize_rows(uint8_t *xq /* [N, K4] */, float *xs /* [N] */, const float *x /* [N, K] */,
                             int64_t N, int K);

/* y [N, O] = (q . wq) * xs[n] * ws[o] + b[o] with q = xq - 128 (clrt_int8_quantize_rows's
   bytes), on the given path (one the CPU runs; the portable path runs everywhere). Returns 0,
   or -1 for a path this CPU lacks. */
int clrt_int8_linear(float *y /* [N, O] */, const uint8_t *xq /* [N, K4], q + 128 */, const float *xs /* [N] */,
                     const int8_t *wq /* packed */, const float *ws /* [O] */, const int32_t *wsum /* [O] */,
                     const float *b /* [O] or NULL */, int64_t N, int K, int O, int path);

/* The int32 sum of the q of row n of xq and output o of the packed weight (the scalar
   reference). */
int32_t clrt_int8_dot_ref(const uint8_t *xq_row /* [K4], q + 128 */, const int8_t *wq /* packed */, int K, int o);

#endif
