/* tensor_kernels.h — CPU kernels behind runtime/core/tensor_ops.c, on raw buffers.
   Elementwise kernels do one strided row; reductions and softmax do a block of columns of
   one [n, inner] slab; the runtime splits work into these units, runs them under OpenMP and
   polls for Ctrl-C between them. Strides are in elements. Kernels include no runtime header,
   so the op codes are their own; they have clrt.h's values (the runtime checks each at
   compile time in tensor_ops.c), so a code passes through unchanged. */
#ifndef CLRT_TENSOR_KERNELS_H
#define CLRT_TENSOR_KERNELS_H
#include <stdint.h>

enum { K_ADD = 0, K_SUB, K_MUL, K_DIV, K_POW, K_MAXIMUM, K_MINIMUM, K_EQ, K_NE, K_LT, K_LE, K_GT, K_GE };
enum { K_NEG = 0, K_ABS, K_EXP, K_LOG, K_SQRT, K_TANH, K_SIGMOID, K_RELU };
enum { K_RED_SUM = 0, K_RED_MEAN, K_RED_MAX, K_RED_MIN, K_RED_ARGMAX, K_RED_ARGMIN };

/* out[i*so] = a[i*sa] op b[i*sb] for i < n; comparisons store 0/1. */
void clrt_k_binary_f32(int op, int64_t n, float *out, int64_t so, const float *a, int64_t sa,
                       const float *b, int64_t sb);
/* Integer arithmetic wraps around (two's complement) instead of overflowing. */
void clrt_k_binary_i32(int op, int64_t n, int32_t *out, int64_t so, const int32_t *a,
                       int64_t sa, const int32_t *b, int64_t sb);
/* out[i*so] = op(a[i*sa]). */
void clrt_k_unary_f32(int op, int64_t n, float *out, int64_t so, const float *a, int64_t sa);
/* Only neg, abs and relu are defined on integers. */
void clrt_k_unary_i32(int op, int64_t n, int32_t *out, int64_t so, const int32_t *a, int64_t sa);
/* out[i*so] = cond[i*sc] != 0 ? a[i*sa] : b[i*sb]. */
void clrt_k_where_f32(int64_t n, float *out, int64_t so, const float *cond, int64_t sc,
                      const float *a, int64_t sa, const float *b, int64_t sb);
void clrt_k_where_i32(int64_t n, int32_t *out, int64_t so, const float *cond, int64_t sc,
                      const int32_t *a, int64_t sa, const int32_t *b, int64_t sb);

/* Reduce over n for columns [i0, i1) of a contiguous slab.
   in: [n, inner]; out: [inner] values (sum, mean, max, min); idx: [inner] positions (argmax,
   argmin), out unused then. Sums accumulate in double. n == 0 gives 0 for sum/mean. */
void clrt_k_reduce_f32(int op, int64_t n, int64_t inner, int64_t i0, int64_t i1,
                       const float *in, float *out, int32_t *idx);
/* i32: sums accumulate in int64 and wrap into int32; mean is not defined here. */
void clrt_k_reduce_i32(int op, int64_t n, int64_t inner, int64_t i0, int64_t i1,
                       const int32_t *in, int32_t *out, int32_t *idx);
/* One piece of a reduction over everything. in: [n]. *val gets the sum (sum/mean) or the
   extreme value, *pos its position in the piece (argmax/argmin/max/min). n >= 1. */
void clrt_k_reduce_all_f32(int op, int64_t n, const float *in, double *val, int64_t *pos);
void clrt_k_reduce_all_i32(int op, int64_t n, const int32_t *in, double *val, int64_t *pos);

/* softmax (log_softmax when use_log) over n for columns [i0, i1). in, out: [n, inner]. */
void clrt_k_softmax_f32(int use_log, int64_t n, int64_t inner, int64_t i0, int64_t i1,
                        const float *in, float *out);

/* C = op(A) op(B), row-major, beta 0. C: [M, N] with row stride ldc; A: [M, K] (or [K, M]
   when ta) with row stride lda; B: [K, N] (or [N, K] when tb) with row stride ldb.
   Sizes must fit in int (the caller checks). */
void clrt_k_matmul_f32(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                       int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc);

#endif
