/* model_kernels.h — the CPU kernels of the transformer, one forward/backward pair per op.
   Kernels work on raw row-major f32 buffers with shape arguments; they never allocate (the
   caller passes scratch) and know nothing about models. Backward kernels say for each
   output whether they overwrite (=) or accumulate (+=).
   Letters: N rows (= B*T tokens), C model width, V vocabulary, H query heads, KV key/value
   heads, D head dim, I MLP width. */
#ifndef CLRT_MODEL_KERNELS_H
#define CLRT_MODEL_KERNELS_H
#include <stddef.h>
#include <stdint.h>

/* Below this many elements of work a kernel runs on one thread: a parallel region costs more
   than it saves there, and on a busy machine a descheduled worker would stall every region
   for a whole time slice (decoding a small model is hundreds of tiny regions per token). */
enum { CLRT_OMP_MIN_WORK = 32768 };
/* Elementwise kernels hand their threads spans of this many elements. */
enum { CLRT_SPAN = 4096 };

/* ---- embedding.c ------------------------------------------------------------------------ */
void clrt_embedding_forward(float *out /* [N, C] */, const int32_t *tok /* [N] */,
                            const float *wte /* [V, C] */, int64_t N, int C);
/* dwte += scatter of dout by token (serial over rows: repeated tokens would race). */
void clrt_embedding_backward(float *dwte /* [V, C] += */, const float *dout /* [N, C] */,
                             const int32_t *tok /* [N] */, int64_t N, int C);

/* ---- linear.c (OpenBLAS sgemm) -------------------------------------------------------- */
/* y = x w^T + b */
void clrt_linear_forward(float *y /* [N, O] */, const float *x /* [N, K] */,
                         const float *w /* [O, K] */, const float *b /* [O] or NULL */,
                         int64_t N, int K, int O);
/* dx (= or += when dx_accumulate; skipped when NULL), dw +=, db += (when not NULL). */
void clrt_linear_backward(float *dx /* [N, K] */, float *dw /* [O, K] */, float *db /* [O] */,
                          const float *dy /* [N, O] */, const float *x /* [N, K] */,
                          const float *w /* [O, K] */, int64_t N, int K, int O, int dx_accumulate);

/* ---- lora.c: a LoRA adapter beside a frozen linear layer (mask math in lora_math.h) ----- */
/* out = x * keep(key, i, p) per element (inverted dropout). */
void clrt_lora_dropout(float *out /* [n] */, const float *x /* [n] */, int64_t n, uint64_t key, float p);
/* xa = xd A^T; y += scale * xa B^T. ws: the caller's workspace of
   clrt_lora_forward_workspace_bytes (less: the portable sgemm path, which sums differently). */
size_t clrt_lora_forward_workspace_bytes(int K, int O, int r);
void clrt_lora_forward(float *y /* [N, O] += */, float *xa /* [N, r] = */, const float *xd /* [N, K] */,
                       const float *A /* [r, K] */, const float *B /* [O, r] */, int64_t N, int K,
                       int O, int r, float scale, void *ws /* A^T [K, r], s B^T [r, O] */, size_t ws_bytes);
/* dA, dB += their gradients; dx += the input's gradient through the dropout of (key, p) (p 0:
   none). xd (the dropped input) is overwritten when p > 0. ws as for the forward. */
size_t clrt_lora_backward_workspace_bytes(int64_t N, int r);
void clrt_lora_backward(float *dx /* [N, K] += */, float *dA /* [r, K] += */, float *dB /* [O, r] += */,
                        float *dxa /* [N, r] scratch */, float *xd /* [N, K]: in, then scratch */,
                        const float *dy /* [N, O] */, const float *xa /* [N, r] */,
                        const float *A /* [r, K] */, const float *B /* [O, r] */, int64_t N, int K,
                        int O, int r, float scale, uint64_t key, float p, void *ws /* s xa [N, r] */,
                        size_t ws_bytes);

/* W [O, K] += scale * B [O, r] A [r, K] (merging an adapter into its base). */
void clrt_lora_merge(float *W, const float *A, const float *B, int K, int O, int r, float scale);

/* xa = xd A^T (the output layer's adapter: the first of lora_forward's products alone). */
void clrt_lora_xa(float *xa /* [N, r] = */, const float *xd /* [N, K] */, const float *A /* [r, K] */, int64_t N,
                  int K, int r);
/* The tail of an adapter's backward once dxa [N, r] (scale included) is known (the output
   layer's adapter gets it from the fused log-softmax): dA += dxa^T xd; dx += dxa A through the
   dropout of (key, p) (p 0: none; xd is overwritten when p > 0). */
void clrt_lora_input_backward(float *dx /* [N, K] += */, float *dA /* [r, K] += */, const float *dxa /* [N, r] */,
                              float *xd /* [N, K] */, const float *A /* [r, K] */, int64_t N, int K, int r,
                              uint64_t key, float p);
/* PEFT's embedding adapter: y[n] += scale B A[:, tok[n]], A [r, V], B [C, r]; ea [N, r] =
   A[:, tok[n]] kept for backward. No dropout (PEFT's Embedding applies none). */
void clrt_lora_embed_forward(float *y /* [N, C] += */, float *ea /* [N, r] = */, const int32_t *tok /* [N] */,
                             const float *A /* [r, V] */, const float *B /* [C, r] */, int64_t N, int V, int C,
                             int r, float scale);
/* dB += scale dy^T ea; dA[:, tok[n]] += scale (dy B)[n] (dea [N, r] scratch). */
void clrt_lora_embed_backward(float *dA /* [r, V] += */, float *dB /* [C, r] += */, float *dea /* [N, r] */,
                              const float *dy /* [N, C] */, const float *ea /* [N, r] */,
                              const int32_t *tok /* [N] */, const float *B /* [C, r] */, int64_t N, int V,
                              int C, int r, float scale);
/* E [V, C] += scale A^T B^T, i.e. row v of E gains scale B A[:, v] (merging an embedding adapter). */
void clrt_lora_merge_embed(float *E, const float *A /* [r, V] */, const float *B /* [C, r] */, int V, int C, int r,
                           float scale);

/* ---- linear_skinny.c ------------------------------------------------------------------ */
/* The forward of few rows (N <= CLRT_SKINNY_MAX_ROWS), reading w without packing it. Returns 1
   when it computed y, 0 when this CPU has no kernel for it (then use clrt_linear_forward). */
enum { CLRT_SKINNY_MAX_ROWS = 32 };
int clrt_linear_skinny_forward(float *y /* [N, O] */, const float *x /* [N, K] */,
                               const float *w /* [O, K] */, const float *b /* [O] or NULL */,
                               int64_t N, int K, int O);
/* The same with bf16 weights and x rounded to bf16 (f32 accumulation and y); 0 when this CPU
   has no kernel or ws is short of clrt_linear_skinny_bf16_workspace_bytes. */
size_t clrt_linear_skinny_bf16_workspace_bytes(int64_t N, int K);
int clrt_linear_skinny_forward_bf16(float *y /* [N, O] */, const float *x /* [N, K] */,
                                    const uint16_t *w /* [O, K] bf16 */, const float *b /* [O] or NULL */,
                                    int64_t N, int K, int O, void *ws /* x in bf16 and widened [N, K] */,
                                    size_t ws_bytes);

/* linear_rowwise.c: any number of rows, each row's outputs in an order fixed by K alone
   (batch invariance without a packed copy): the skinny kernel over slices of rows, else a
   plain loop. The bf16 one rounds x to bf16 as the skinny kernel does, a slice of rows at a
   time in ws; 0 when ws is short of clrt_linear_rowwise_bf16_workspace_bytes. */
void clrt_linear_rowwise_forward(float *y /* [N, O] */, const float *x /* [N, K] */,
                                 const float *w /* [O, K] */, const float *b /* [O] or NULL */,
                                 int64_t N, int K, int O);
size_t clrt_linear_rowwise_bf16_workspace_bytes(int64_t N, int K);
int clrt_linear_rowwise_forward_bf16(float *y /* [N, O] */, const float *x /* [N, K] */,
                                     const uint16_t *w /* [O, K] bf16 */, const float *b /* [O] or NULL */,
                                     int64_t N, int K, int O, void *ws /* a slice's x [32, K] */,
                                     size_t ws_bytes);

/* linear_skinny_dpbf16.c: bf16 x and w through AVX512-BF16; 0 when the CPU lacks it. */
int clrt_linear_skinny_dpbf16(float *y /* [N, O] */, const uint16_t *x /* [N, K] bf16 */,
                              const uint16_t *w /* [O, K] bf16 */, const float *b /* [O] or NULL */,
                              int N, int K, int O);

/* ---- linear_packed.c ------------------------------------------------------------------ */
/* wp: w in panels of 48 weight rows, each transposed to [K, 48] (the last panel narrower);
   the same size as w. */
void clrt_linear_pack(float *wp /* [O * K] panels */, const float *w /* [O, K] */, int K, int O);
/* 1 when this CPU runs clrt_linear_packed_forward (AVX-512, or AVX2 + FMA: the same bits). */
int clrt_linear_packed_available(void);
/* The forward over packed weights, any number of rows: 1 when it computed y, 0 when this CPU
   has no kernel for it (then use clrt_linear_forward on w). */
int clrt_linear_packed_forward(float *y /* [N, O] */, const float *x /* [N, K] */,
                               const float *wp /* [O * K] packed by clrt_linear_pack */,
                               const float *b /* [O] or NULL */, int64_t N, int K, int O);
/* One of several products of the same x, each with its own packed weights. */
typedef struct {
  float *y;         /* [N, O] */
  const void *wp;   /* [O * K] packed by clrt_linear_pack (f32) or clrt_linear_pack_bf16 */
  const float *b;   /* [O] or NULL */
  int O;
} clrt_packed_part;
/* y_i = x w_i^T + b_i for every part in one parallel pass; 1 when computed, 0 as above. */
int clrt_linear_packed_forward_parts(const float *x /* [N, K] */, int64_t N, int K,
                                     const clrt_packed_part *parts, int count);
/* bf16: panels of bf16 pairs of k (K even), x rounded to bf16, f32 sums and y, on the matrix
   unit (AMX panels where the shape suits, else AVX512-BF16, else AVX2's FMAs with the same
   sums: CLRT_UNIT_FMA_BF16); 0 without one (capped to f32 included) or ws short of clrt_linear_packed_bf16_workspace_bytes (x in bf16).
   _parts: decode-sized products only (N <= CLRT_SKINNY_MAX_ROWS). */
void clrt_linear_pack_bf16(uint16_t *wp /* [O * K] */, const float *w /* [O, K] */, int K, int O);
int clrt_linear_packed_bf16_available(void);
size_t clrt_linear_packed_bf16_workspace_bytes(int64_t N, int K);
int clrt_linear_packed_bf16_forward_parts(const float *x /* [N, K] */, int64_t N, int K,
                                          const clrt_packed_part *parts, int count,
                                          void *ws /* x in bf16 [N, K] */, size_t ws_bytes);
/* The same for any number of rows (N up to INT32_MAX). */
int clrt_linear_packed_bf16_forward_rows(const float *x /* [N, K] */, int64_t N, int K,
                                         const clrt_packed_part *parts, int count,
                                         void *ws /* x in bf16 [N, K] */, size_t ws_bytes);

/* ---- panels_avx2.c: one panel of the above on AVX2 + FMA --------------------------------- */
/* c[i, 0..pw) (= or +=) a[i] . panel + bias for the M rows of a: f32 panels (clrt_linear_pack's,
   K deep) in the AVX-512 tiles' order (the same bits), or pair panels (clrt_pack_pairs', Kp
   deep, a in bf16) as vdpbf16ps sums them. 0 when the CPU (or CLRT_CPU) has no AVX2. */
int clrt_avx2_panel_f32(float *c /* [M, ldc] */, int64_t ldc, const float *a /* [M, lda] */, int64_t lda,
                        int64_t M, const float *wp /* [K, pw] */, int pw, int K, const float *bias /* [pw] or NULL */,
                        int add);
/* c[r, 0..pw) (+)= sum over k < kn of a(r, k) b[k, 0..pw) for nr rows, a(r, k) at
   a[r a_rs + k a_ks]: gemm_strided.c's tile; 0 without AVX2. */
int clrt_avx2_tile_strided(float *c /* [nr, ldc] */, int64_t ldc, const float *a, int64_t a_rs, int64_t a_ks,
                           const float *b /* [kn, ldb] */, int64_t ldb, int nr, int kn, int pw, int add);
int clrt_avx2_panel_bf16(float *c /* [M, ldc] */, int64_t ldc, const uint16_t *a /* [M, lda] bf16 */, int64_t lda,
                         int64_t M, const uint16_t *bp /* [Kp / 2, pw, 2] */, int pw, int64_t Kp,
                         const float *bias /* [pw] or NULL */, int add);

/* ---- panels_neon.c: the same three on aarch64's NEON ------------------------------------ */
/* As the clrt_avx2_ ones above, in the same order per output (the same bits); 0 when the
   build is not for aarch64 or the level is capped below neon (CLRT_CPU=portable). */
int clrt_neon_panel_f32(float *c /* [M, ldc] */, int64_t ldc, const float *a /* [M, lda] */, int64_t lda,
                        int64_t M, const float *wp /* [K, pw] */, int pw, int K, const float *bias /* [pw] or NULL */,
                        int add);
int clrt_neon_tile_strided(float *c /* [nr, ldc] */, int64_t ldc, const float *a, int64_t a_rs, int64_t a_ks,
                           const float *b /* [kn, ldb] */, int64_t ldb, int nr, int kn, int pw, int add);
int clrt_neon_panel_bf16(float *c /* [M, ldc] */, int64_t ldc, const uint16_t *a /* [M, lda] bf16 */, int64_t lda,
                         int64_t M, const uint16_t *bp /* [Kp / 2, pw, 2] */, int pw, int64_t Kp,
                         const float *bias /* [pw] or NULL */, int add);

/* ---- linear_bf16.c: products over a weight held only in bf16 (a frozen base) ----------- */
/* wp: w [O, K] in clrt_linear_pack_bf16's panels of bf16 pairs (K even); f32 accumulation.
   Rows [r0, r1) of w (r0 a multiple of 48) widened back to f32, row-major. */
void clrt_linear_unpack_bf16(float *wf /* [r1 - r0, K] */, const uint16_t *wp /* [O * K] panels */,
                             int K, int O, int r0, int r1);
/* y = x w^T + b: the packed bf16 tiles with x rounded to bf16 when dot is set and the CPU has
   AVX512-BF16, else blocks of w widened to f32 and sgemm (x exact). ws: the caller's
   workspace; 0 only when it is short of clrt_linear_bf16_workspace_bytes. */
size_t clrt_linear_bf16_workspace_bytes(int64_t N, int K, int O, int dot);
int clrt_linear_bf16_forward(float *y /* [N, O] */, const float *x /* [N, K] */,
                             const uint16_t *wp /* [O * K] panels */, const float *b /* [O] or NULL */,
                             int64_t N, int K, int O, int dot,
                             void *ws /* x in bf16 [N, K] or a widened block [240, K] f32 */, size_t ws_bytes);
/* dx (+)= dy w: blocks of w widened to f32, then gemm_strided.c's tiles (fast set, AVX-512)
   or sgemm. 0 only when ws is short of clrt_linear_bf16_backward_dx_workspace_bytes. */
size_t clrt_linear_bf16_backward_dx_workspace_bytes(int K, int O);
int clrt_linear_bf16_backward_dx(float *dx /* [N, K] */, const float *dy /* [N, O] */,
                                 const uint16_t *wp /* [O * K] panels */, int64_t N, int K, int O,
                                 int accumulate, int fast, void *ws /* a widened block [240, K] f32 */,
                                 size_t ws_bytes);

/* ---- matrix_unit.c: the unit bf16 products run on, chosen at run time ------------------ */
/* FMA_BF16: no bf16 hardware, bf16 numerics on AVX2's FMA units (panels_avx2.c: vdpbf16ps's
   sums, two FMAs a pair). */
enum { CLRT_UNIT_F32 = 0, CLRT_UNIT_FMA_BF16 = 1, CLRT_UNIT_AVX512BF16 = 2, CLRT_UNIT_AMX = 3 };
/* The best unit this CPU (and OS) offers at the CPU level in use, and the one in use: the
   best, capped by CLRT_MATRIX_UNIT=f32|fma-bf16|avx512-bf16|amx-bf16 or clrt_matrix_unit_cap. */
int clrt_matrix_unit_best(void);
int clrt_matrix_unit(void);
void clrt_matrix_unit_cap(int unit);
const char *clrt_matrix_unit_name(int unit);

/* ---- gemm_bf16.c: c (+)= a b, bf16 inputs, f32 sums, on the matrix unit ---------------- */
/* b(k, j) = src[k rs + j cs] rounded to bf16 into column panels of pairs of k (48 columns a
   panel; element (k, j) at bp[j0 Kp + (k / 2) 2 pw + 2 (j - j0) + k % 2]), Kp >= Kc even,
   zeros past Kc. A weight w [O, K] packed with rs = 1, cs = K is clrt_linear_pack_bf16's
   layout (Kp = K). _part packs only k in [k0, k1) (k0 even) and columns [j0, j1). */
void clrt_pack_pairs(uint16_t *bp /* [Nc * Kp] */, const float *src, int64_t rs, int64_t cs, int64_t Kc, int Nc,
                     int64_t Kp);
void clrt_pack_pairs_part(uint16_t *bp /* [Nc * Kp] */, const float *src, int64_t rs, int64_t cs, int64_t Kc, int Nc,
                          int64_t Kp, int64_t k0, int64_t k1, int j0, int j1);
/* dst[i, k] = bf16(src[i rs + k cs]) for k < Kc, zeros up to ldd. */
void clrt_to_bf16_rows(uint16_t *dst /* [M, ldd] */, int64_t ldd, const float *src, int64_t rs, int64_t cs,
                       int64_t M, int64_t Kc);
/* c (= or +=) a b + bias: a's first Kp columns (zeros past its Kc), b packed as above.
   1 when computed, 0 without a bf16 unit (then multiply in f32). */
int clrt_gemm_bf16(float *c /* [M, ldc] */, int64_t ldc, const uint16_t *a /* [M, lda] bf16 */, int64_t lda,
                   int64_t M, const uint16_t *bp /* [Nc * Kp] */, int Nc, int64_t Kp,
                   const float *bias /* [Nc] or NULL */, int accumulate);
/* gemm_amx.c: one panel (pw <= 48 columns) of the above through AMX tiles; fits: AMX is the
   unit in use and the shape suits it (pw % 16 == 0, Kc % 32 == 0). 0 when it does not. */
int clrt_amx_panel_fits(int pw, int64_t Kc);
int clrt_amx_panel(float *c /* [M, ldc] */, int64_t ldc, const uint16_t *a /* [M, lda] bf16 */, int64_t lda,
                   int64_t M, const uint16_t *bp /* [Kc / 2, pw, 2] bf16 */, int pw, int64_t Kc,
                   const float *bias /* [pw] or NULL */, int add);

/* ---- peak.c: a core's peak per unit (operands in registers), for benchmarks: the flops
   done in iters rounds on the calling thread, 0 without the unit (CLRT_UNIT_F32: the widest f32
   FMA the CPU level has, AVX-512 or AVX2; CLRT_UNIT_FMA_BF16: the same units, two FMAs a pair). */
int64_t clrt_unit_peak_flops(int unit, int64_t iters);
int64_t clrt_amx_peak_flops(int64_t iters);

/* ---- pack_rows.c: rows [r0, r1) of w [O, K] into each layout (the optimizer step keeps the
   copies current so); the bits of clrt_linear_pack, clrt_linear_pack_bf16 and, for the
   transposed one (b(o, k) = w[o, k], pairs of o; O even), clrt_pack_pairs(wt, w, K, 1, O, K, O). */
void clrt_pack_rows_f32(float *wp /* [O * K] */, const float *w /* [O, K] */, int K, int O, int r0, int r1);
void clrt_pack_rows_bf16(uint16_t *wp /* [O * K] */, const float *w /* [O, K] */, int K, int O, int r0, int r1);
void clrt_pack_rows_bf16_t(uint16_t *wt /* [K * O] */, const float *w /* [O, K] */, int K, int O, int r0, int r1);

/* ---- adamw.c: one tensor's span of the AdamW update (clrt_adamw_update's bits, 16 lanes) -- */
void clrt_adamw_span(float *p, float *m, float *v, const float *g /* scaled by gscale */, int64_t n, float gscale,
                     float lr, float beta1, float beta2, float eps, float decay, float bc1, float bc2_sqrt);

/* ---- gemm_narrow.c: c (+)= a b for c of few columns (a LoRA rank), a through two strides as in
   clrt_gemm_strided; 0 when this CPU has no kernel for it (then sgemm). */
int clrt_gemm_narrow(float *c /* [M, ldc] */, int64_t ldc, const float *a, int64_t a_rs, int64_t a_ks,
                     const float *b /* [Kc, ldb] */, int64_t ldb, int64_t M, int Nc, int64_t Kc, int accumulate);

/* ---- gemm_strided.c: the backward products without packing ---------------------------- */
/* c (+)= a b: a(i, k) at a[i a_rs + k a_ks] (i < M, k < Kc), b [Kc, ldb] row-major (Nc columns
   used), c [M, ldc]; accumulate: add onto c, else overwrite. 1 when computed, 0 when this CPU
   has no kernel for it (AVX-512) — then use sgemm. */
int clrt_gemm_strided(float *c /* [M, ldc] */, int64_t ldc, const float *a, int64_t a_rs, int64_t a_ks,
                      const float *b /* [Kc, ldb] */, int64_t ldb, int64_t M, int Nc, int64_t Kc,
                      int accumulate);
/* y = x w^T + b over the same tiles, w's panels transposed on the fly (no packed copy). */
int clrt_linear_forward_strided(float *y /* [N, O] */, const float *x /* [N, K] */, const float *w /* [O, K] */,
                                const float *b /* [O] or NULL */, int64_t N, int K, int O);
/* clrt_linear_backward (dx = dy w, dw += dy^T x, db += sum dy) over clrt_gemm_strided; 0 as above. */
int clrt_linear_backward_strided(float *dx /* [N, K] */, float *dw /* [O, K] */, float *db /* [O] */,
                                 const float *dy /* [N, O] */, const float *x /* [N, K] */,
                                 const float *w /* [O, K] */, int64_t N, int K, int O, int dx_accumulate);

/* ---- rmsnorm.c -------------------------------------------------------------------------- */
void clrt_rmsnorm_forward(float *out /* [N, C] */, float *rstd /* [N] */, const float *x /* [N, C] */,
                          const float *w /* [C] */, int64_t N, int C, float eps);
/* dx +=, dw += */
void clrt_rmsnorm_backward(float *dx /* [N, C] */, float *dw /* [C] */, const float *dout /* [N, C] */,
                           const float *x /* [N, C] */, const float *w /* [C] */,
                           const float *rstd /* [N] */, int64_t N, int C);

/* ---- rope.c ----------------------------------------------------------------------------- */
/* The cos/sin table for positions [0, P) of R rotated dimensions: inv_freq per pair from the
   config (runtime/model/rope.c). */
void clrt_rope_table(float *cos_t /* [P, R/2] */, float *sin_t /* [P, R/2] */,
                     const float *inv_freq /* [R/2] */, int P, int R);
/* In place on x, rows at positions pos0[b] + t (pos0 NULL = 0): each head's first R of its D
   dimensions rotate (R = D unless the config rotates part of the head), the rest pass.
   Backward applies the inverse rotation to the gradient, also in place. */
void clrt_rope_forward(float *x /* [B, T, nh, D] */, const float *cos_t /* [P, R/2] */, const float *sin_t /* [P, R/2] */,
                       const int32_t *pos0 /* [B] or NULL */, int B, int T, int nh, int D, int R);
void clrt_rope_backward(float *dx /* [B, T, nh, D] */, const float *cos_t /* [P, R/2] */, const float *sin_t /* [P, R/2] */,
                        const int32_t *pos0 /* [B] or NULL */, int B, int T, int nh, int D, int R);

/* ---- attention.c: causal grouped-query attention -------------------------------------- */
/* Query t of row b sits at position pos0[b] + t and sees keys at positions 0 .. pos0[b] + t,
   read from k/v whose rows are positions (batch stride kv_bstride elements, row stride KV*D).
   Training passes the freshly projected K/V with pos0 = NULL; a KV-cache decode passes the
   cache [slots, maxT, KV, D] after writing the new positions into it, with kv_row[b] the
   cache slot of row b (NULL: slot b). lse may be NULL (inference). window > 0: sliding-window
   attention, the query at position p sees only keys p - window < j <= p (0: all of them).
   scratch: clrt_attention_scratch_floats(Tq, Tk, nthreads) floats; the kernels use at most
   nthreads OpenMP threads (each its own slice of scratch). */
size_t clrt_attention_scratch_floats(int Tq, int Tk, int nthreads);
void clrt_attention_forward(float *out /* [B, Tq, H, D] */, float *lse /* [B, H, Tq] */,
                            const float *q /* [B, Tq, H, D] */, const float *k /* [B, Tk, KV, D] */,
                            const float *v /* [B, Tk, KV, D] */, int B, int Tq, int H, int KV,
                            int D, const int32_t *pos0 /* [B] or NULL */, int64_t kv_bstride,
                            const int32_t *kv_row /* [B] or NULL */, int window, float *scratch,
                            int nthreads);
/* attention_decode.c: the forward for Tq = 1 (a decode step) without sgemm; q/out rows are
   [B, H, D] and scratch holds scratch_stride floats per thread (>= 4 x the longest key range:
   a tile of four heads keeps a row of scores each).
   scale: the score scale, scale q.k (0: 1/sqrt(D)); cap > 0 soft-caps the scores to
   cap tanh(s / cap) (Gemma 3; 0: none). Returns 1 when it computed out (and lse), 0 when this
   CPU has no kernel for it. */
int clrt_attention_decode_forward(float *out /* [B, H, D] */, float *lse /* [B, H] or NULL */,
                                  const float *q /* [B, H, D] */, const float *k /* [B, Tk, KV, D] */,
                                  const float *v /* [B, Tk, KV, D] */, int B, int H, int KV, int D,
                                  const int32_t *pos0 /* [B] or NULL */, int64_t kv_bstride,
                                  const int32_t *kv_row /* [B] or NULL */, int window, float *scratch,
                                  int64_t scratch_stride, int nthreads, float scale, float cap);
/* The same per-query pass for any Tq, on any CPU: each (query, head) alone, in an order
   fixed by its key range (batch invariance; slower than the sgemm blocks for long rows). Query
   t of row b gets the bits a decode step at position pos0[b] + t gives it. scale, cap: as above. */
void clrt_attention_rows_forward(float *out /* [B, Tq, H, D] */, float *lse /* [B, H, Tq] or NULL */,
                                 const float *q /* [B, Tq, H, D] */, const float *k /* [B, Tk, KV, D] */,
                                 const float *v /* [B, Tk, KV, D] */, int B, int Tq, int H, int KV, int D,
                                 const int32_t *pos0 /* [B] or NULL */, int64_t kv_bstride,
                                 const int32_t *kv_row /* [B] or NULL */, int window, float *scratch,
                                 int64_t scratch_stride, int nthreads, float scale, float cap);
/* 1 when this CPU runs the per-query pass on its AVX-512 kernels (the decode kernel exists),
   0 when clrt_attention_rows_forward falls back to plain loops. */
int clrt_attention_rows_fast(void);
/* Training only (pos0 = 0, Tk = T). dq =, dk =, dv = */
void clrt_attention_backward(float *dq /* [B, T, H, D] */, float *dk /* [B, T, KV, D] */,
                             float *dv /* [B, T, KV, D] */, const float *dout /* [B, T, H, D] */,
                             const float *q, const float *k, const float *v,
                             const float *out /* [B, T, H, D] */, const float *lse /* [B, H, T] */,
                             int B, int T, int H, int KV, int D, int window, float *scratch,
                             int nthreads);

/* The same backward for queries at positions p0 .. p0 + Tq - 1 of every row over keys 0 ..
   p0 + Tq - 1 (a shared prefix's branch: the prefix's keys, then the branch's own); dk/dv
   cover every key. scratch: clrt_attention_scratch_floats(Tq, p0 + Tq, nthreads) floats. */
void clrt_attention_backward_offset(float *dq /* [B, Tq, H, D] */, float *dk /* [B, p0 + Tq, KV, D] */,
                                    float *dv /* [B, p0 + Tq, KV, D] */, const float *dout /* [B, Tq, H, D] */,
                                    const float *q, const float *k, const float *v,
                                    const float *out /* [B, Tq, H, D] */, const float *lse /* [B, H, Tq] */,
                                    int B, int Tq, int p0, int H, int KV, int D, int window, float *scratch,
                                    int nthreads);

/* The same attention (one window convention) with scores scale * q.k in place of 1/sqrt(D)
   and, when cap > 0, soft-capped to cap tanh(s / cap) (Gemma 3; 0: none); one query takes the
   decode kernel, as above. */
void clrt_attention_scaled_forward(float *out /* [B, Tq, H, D] */, float *lse /* [B, H, Tq] */,
                                   const float *q /* [B, Tq, H, D] */, const float *k /* [B, Tk, KV, D] */,
                                   const float *v /* [B, Tk, KV, D] */, int B, int Tq, int H, int KV,
                                   int D, const int32_t *pos0 /* [B] or NULL */, int64_t kv_bstride,
                                   const int32_t *kv_row /* [B] or NULL */, int window, float *scratch,
                                   int nthreads, float scale, float cap);
void clrt_attention_scaled_backward(float *dq /* [B, T, H, D] */, float *dk /* [B, T, KV, D] */,
                                    float *dv /* [B, T, KV, D] */, const float *dout /* [B, T, H, D] */,
                                    const float *q, const float *k, const float *v,
                                    const float *out /* [B, T, H, D] */, const float *lse /* [B, H, T] */,
                                    int B, int T, int H, int KV, int D, int window, float *scratch,
                                    int nthreads, float scale, float cap);

/* ---- swiglu.c: h = silu(g) * u -------------------------------------------------------- */
void clrt_swiglu_forward(float *h /* [N, I] */, const float *g /* [N, I] */, const float *u /* [N, I] */,
                         int64_t n /* N * I */);
/* dg =, du =; dg may alias dh (each element is read before it is written). */
void clrt_swiglu_backward(float *dg /* [N, I] */, float *du /* [N, I] */, const float *dh /* [N, I] */,
                          const float *g, const float *u, int64_t n);

/* ---- gemma3.c: Gemma 3's own element ops ---------------------------------------------- */
/* h = gelu_tanh(g) * u (PyTorch's gelu with approximate="tanh"). */
void clrt_geglu_forward(float *h /* [N, I] */, const float *g /* [N, I] */, const float *u /* [N, I] */,
                        int64_t n /* N * I */);
/* dg =, du =; dg may alias dh. */
void clrt_geglu_backward(float *dg /* [N, I] */, float *du /* [N, I] */, const float *dh /* [N, I] */,
                         const float *g, const float *u, int64_t n);
/* RMSNorm scaled by (1 + w): y = (1 + w) * x / sqrt(mean(x^2) + eps); backward dx +=, dw += as
   clrt_rmsnorm_backward (d(1 + w)/dw = 1). */
void clrt_rmsnorm_unit_forward(float *out /* [N, C] */, float *rstd /* [N] */, const float *x /* [N, C] */,
                               const float *w /* [C] */, int64_t N, int C, float eps);
void clrt_rmsnorm_unit_backward(float *dx /* [N, C] */, float *dw /* [C] */, const float *dout /* [N, C] */,
                                const float *x /* [N, C] */, const float *w /* [C] */,
                                const float *rstd /* [N] */, int64_t N, int C);
/* x *= s over n floats (the embedding's sqrt(hidden) scale and its gradient). */
void clrt_scale_inplace(float *x /* [n] */, float s, int64_t n);

/* ---- residual.c: out = a + b ------------------------------------------------------------ */
void clrt_residual_forward(float *out /* [N, C] */, const float *a, const float *b, int64_t n);
/* da += dout, db += dout (either may be NULL) */
void clrt_residual_backward(float *da, float *db, const float *dout, int64_t n);

/* ---- logsoftmax_gather.c: the output layer, fused ------------------------------------- */
/* lp[n] = logits[n][target[n]] - logsumexp(logits[n]) with logits = x w^T, computed in blocks
   of up to 256 rows by as much of the vocabulary as fits in scratch [chunk, V] floats, so the
   [N, V] logits never exist; keeps lse [N] for backward, which recomputes each block's logits.
   wp: w packed by clrt_linear_pack (the logits then run through linear_packed.c), or NULL.
   fast: bits; CLRT_OUT_FAST: without wp the logits (and backward's products) through
   gemm_strided.c where the CPU has it; CLRT_OUT_ROWWISE: without wp the logits through
   clrt_linear_rowwise_forward, the product a batch-invariant decode step runs. */
enum { CLRT_OUT_FAST = 1, CLRT_OUT_ROWWISE = 2 };
void clrt_logsoftmax_gather_forward(float *lp /* [N] */, float *lse /* [N] or NULL */,
                                    const float *x /* [N, C] */, const float *w /* [V, C] */,
                                    const float *wp /* [V * C] packed, or NULL */,
                                    int fast /* without wp: the logits through gemm_strided.c's forward where the CPU has it */,
                                    const int32_t *target /* [N] */, int64_t N, int C, int V,
                                    float *scratch /* [chunk, V] */, int chunk);
/* dlogits = dlp * (onehot(target) - softmax); dx =, dw +=. logits_ready: scratch still holds
   forward's logits of all N rows (chunk >= N), so the recompute is skipped. */
void clrt_logsoftmax_gather_backward(float *dx /* [N, C] */, float *dw /* [V, C] */,
                                     const float *dlp /* [N] */, const float *x /* [N, C] */,
                                     const float *w /* [V, C] */, const float *wp /* [V * C] packed, or NULL */,
                                     int fast /* dx, dw through gemm_strided.c where the CPU has it */,
                                     const int32_t *target /* [N] */, const float *lse /* [N] */, int64_t N,
                                     int C, int V, float *scratch /* [chunk, V] */, int chunk, int logits_ready);
/* The same with a LoRA adapter beside the output layer (hl: lora_math.h; NULL: none): each
   block's logits gain the adapter's share, and backward fills hl->dxa and adds into hl->dB. */
struct clrt_head_lora;
void clrt_logsoftmax_gather_forward_lora(float *lp, float *lse, const float *x, const float *w, const float *wp,
                                         int fast, const int32_t *target, int64_t N, int C, int V, float *scratch,
                                         int chunk, const struct clrt_head_lora *hl);
void clrt_logsoftmax_gather_backward_lora(float *dx, float *dw, const float *dlp, const float *x, const float *w,
                                          const float *wp, int fast, const int32_t *target, const float *lse,
                                          int64_t N, int C, int V, float *scratch, int chunk, int logits_ready,
                                          const struct clrt_head_lora *hl);
/* The same over soft-capped logits cap tanh(z / cap) (Gemma's final_logit_softcapping; cap > 0),
   z = x w^T (+ the adapter's share); backward's gradient goes through the tanh. */
void clrt_logsoftmax_gather_softcap_forward(float *lp, float *lse, const float *x, const float *w, const float *wp,
                                            int fast, const int32_t *target, int64_t N, int C, int V,
                                            float *scratch, int chunk, const struct clrt_head_lora *hl, float cap);
void clrt_logsoftmax_gather_softcap_backward(float *dx, float *dw, const float *dlp, const float *x, const float *w,
                                             const float *wp, int fast, const int32_t *target, const float *lse,
                                             int64_t N, int C, int V, float *scratch, int chunk, int logits_ready,
                                             const struct clrt_head_lora *hl, float cap);

/* ---- sample.c ----------------------------------------------------------------------------- */
/* One token of a row from temperature / top-k / top-p (temperature <= 0: greedy), u one
   U[0,1) draw; *logprob: the token's log-probability under the distribution sampled (0 for
   greedy). Returns the token, or -1 when no token is allowed. scratch: at least
   clrt_sample_row_scratch(V) bytes. */
size_t clrt_sample_row_scratch(int V);
int32_t clrt_sample_row(const float *logits /* [V] */, int V, float temperature, int top_k,
                        float top_p, double u, const uint8_t *allowed /* [V] or NULL */,
                        void *scratch, float *logprob /* out: scalar */);
/* Log-softmax of the raw logits: of `chosen` into *chosen_lp and the k best (ties: smaller id),
   best first. The caller checks 0 <= chosen < V and 0 <= k <= min(V, 64). */
void clrt_top_logprobs_row(const float *logits /* [V] */, int V, int32_t chosen, int k,
                           int32_t *ids /* out: [k] */, float *lps /* out: [k] */,
                           float *chosen_lp /* out: scalar */);

/* ---- per-kernel timing (CLRT_PROFILE=1) -------------------------------------------------- */
enum { CLRT_K_EMBED, CLRT_K_LINEAR_F, CLRT_K_LINEAR_B, CLRT_K_RMSNORM, CLRT_K_ROPE, CLRT_K_ATTN_F,
       CLRT_K_ATTN_B, CLRT_K_SWIGLU, CLRT_K_RESIDUAL, CLRT_K_OUT_F, CLRT_K_OUT_B, CLRT_K_ADAMW,
       CLRT_K_OTHER, CLRT_K_LORA, CLRT_K_COUNT };
extern double clrt_kernel_seconds[CLRT_K_COUNT];
extern const char *const clrt_kernel_names[CLRT_K_COUNT];

#endif
