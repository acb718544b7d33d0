/* test_model_kernels.c — every CPU kernel's backward against central finite differences of
   its forward (loss = sum(out * R) for a random R), plus the attention forward against a
   naive loop, including the KV-cache form (position offsets, keys from a separate buffer). */
#include "clrt.h"
#include "check.h"
#include "cpu/model_kernels.h"
#include "bf16.h"
#include "model_math.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static clrt_rng rng;

static float *randv(size_t n, float scale) {
  float *p = malloc(sizeof(float) * (n ? n : 1));
  for (size_t i = 0; i < n; i++) p[i] = (float)(scale * clrt_rng_normal(&rng));
  return p;
}

static float *zerov(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

static double dotv(const float *a, const float *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

/* The loss as a function of the buffers; the checker perturbs one input element at a time. */
typedef double (*loss_fn)(void *ctx);

/* Compares analytic gradient g of buffer x (n elements, every `stride`-th checked) with
   (L(x+h) - L(x-h)) / 2h; tolerance relative to the gradient's largest magnitude. */
static void fd_check(const char *what, loss_fn L, void *ctx, float *x, const float *g, size_t n,
                     size_t stride, float h, double rtol) {
  double scale = 0, worst = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(g[i]));
  for (size_t i = 0; i < n; i += stride) {
    float x0 = x[i];
    x[i] = x0 + h;
    double lp = L(ctx);
    x[i] = x0 - h;
    double lm = L(ctx);
    x[i] = x0;
    double num = (lp - lm) / (2.0 * h);
    worst = fmax(worst, fabs(num - g[i]));
  }
  if (worst <= rtol * scale + 1e-5 && scale > 0) check_passed++;
  else {
    check_failed++;
    fprintf(stderr, "%s: finite differences differ by %.3g (gradient scale %.3g)\n", what, worst, scale);
  }
}

/* ---- linear ------------------------------------------------------------------------------ */
typedef struct { int N, K, O; float *x, *w, *b, *y, *R; } lin_ctx;
static double lin_loss(void *p) {
  lin_ctx *c = p;
  clrt_linear_forward(c->y, c->x, c->w, c->b, c->N, c->K, c->O);
  return dotv(c->y, c->R, (size_t)c->N * c->O);
}
static void test_linear(void) {
  lin_ctx c = {.N = 5, .K = 7, .O = 6};
  c.x = randv(35, 1); c.w = randv(42, 1); c.b = randv(6, 1); c.y = zerov(30); c.R = randv(30, 1);
  float *dx = randv(35, 1), *dx0 = malloc(35 * 4), *dw = zerov(42), *db = zerov(6);
  memcpy(dx0, dx, 35 * 4);
  clrt_linear_backward(dx, dw, db, c.R, c.x, c.w, 5, 7, 6, 1);   /* accumulate onto dx0 */
  for (int i = 0; i < 35; i++) dx[i] -= dx0[i];
  fd_check("linear dx", lin_loss, &c, c.x, dx, 35, 1, 1e-2f, 1e-3);
  fd_check("linear dw", lin_loss, &c, c.w, dw, 42, 1, 1e-2f, 1e-3);
  fd_check("linear db", lin_loss, &c, c.b, db, 6, 1, 1e-2f, 1e-3);
  free(c.x); free(c.w); free(c.b); free(c.y); free(c.R); free(dx); free(dx0); free(dw); free(db);
}

/* The backward products without packing and the forward packing on the fly (gemm_strided.c)
   against sgemm's (linear.c), over
   shapes with every tail: K and N not multiples of the 48-wide panels or 8-row tiles, O past
   one 256-step k block (dx sums over O, the forward over K) and N past one (dw sums over N), N past one 192-row
   block; dx overwritten and accumulated, dw and db accumulated; one thread and two. */
static void test_linear_backward_strided(void) {
  static const int Ns[] = {1, 7, 9, 200, 300}, Ks[] = {1, 16, 49, 100, 300}, Os[] = {1, 5, 48, 300};
  int ran = 0;
  for (int threads = 1; threads <= 2; threads++) {
    clrt_set_num_threads(threads);
    for (size_t a = 0; a < sizeof Ns / sizeof *Ns; a++)
      for (size_t k = 0; k < sizeof Ks / sizeof *Ks; k++)
        for (size_t o = 0; o < sizeof Os / sizeof *Os; o++)
          for (int acc = 0; acc <= 1; acc++) {
            int N = Ns[a], K = Ks[k], O = Os[o];
            size_t nk = (size_t)N * K, ok = (size_t)O * K;
            float *x = randv(nk, 1), *w = randv(ok, 1), *dy = randv((size_t)N * O, 1);
            float *dx = randv(nk, 1), *dw = randv(ok, 1), *db = randv((size_t)O, 1);
            float *dx2 = malloc(nk * 4), *dw2 = malloc(ok * 4), *db2 = malloc((size_t)O * 4);
            memcpy(dx2, dx, nk * 4), memcpy(dw2, dw, ok * 4), memcpy(db2, db, (size_t)O * 4);
            /* the forward with w packed on the fly, bias on every other shape */
            float *y = zerov((size_t)N * O), *y2 = zerov((size_t)N * O);
            clrt_linear_forward(y, x, w, acc ? db : NULL, N, K, O);
            if (clrt_linear_forward_strided(y2, x, w, acc ? db : NULL, N, K, O)) {
              double worst = 0;
              for (size_t i = 0; i < (size_t)N * O; i++) worst = fmax(worst, fabs(y2[i] - y[i]) / (1 + fabs(y[i])));
              if (worst > 1e-4) {
                check_failed++;
                fprintf(stderr, "strided forward N=%d K=%d O=%d threads=%d: off by %.3g\n", N, K, O, threads, worst);
              }
            }
            free(y), free(y2);
            clrt_linear_backward(dx, dw, db, dy, x, w, N, K, O, acc);
            if (clrt_linear_backward_strided(dx2, dw2, db2, dy, x, w, N, K, O, acc)) {
              ran++;
              double worst = 0;
              for (size_t i = 0; i < nk; i++) worst = fmax(worst, fabs(dx2[i] - dx[i]) / (1 + fabs(dx[i])));
              for (size_t i = 0; i < ok; i++) worst = fmax(worst, fabs(dw2[i] - dw[i]) / (1 + fabs(dw[i])));
              for (int i = 0; i < O; i++) worst = fmax(worst, fabs(db2[i] - db[i]) / (1 + fabs(db[i])));
              if (worst > 1e-4) {
                check_failed++;
                fprintf(stderr, "strided backward N=%d K=%d O=%d acc=%d threads=%d: off by %.3g\n", N,
                        K, O, acc, threads, worst);
              }
            }
            free(x); free(w); free(dy); free(dx); free(dw); free(db); free(dx2); free(dw2); free(db2);
          }
  }
  clrt_set_num_threads(1);
  if (!ran) fprintf(stderr, "strided backward: no AVX-512 here, skipped\n");
  check_passed++;
}

/* The few-row forwards (decode: skinny, bf16 skinny, packed) against a float64 product, over
   shapes that exercise every tail: K not a multiple of 16, O not a multiple of 4 or of the
   48-wide packed panels, N not a multiple of 4 or 8; with and without a bias; one thread and
   two. Skipped (counted as passed by the sgemm fallback's
   own check) on a CPU without its kernel. */
static void test_linear_skinny(void) {
  static const int Ns[] = {1, 2, 3, 4, 5, 9, 32, 33, 100}, Ks[] = {1, 2, 7, 16, 33, 94, 95, 384},
                   Os[] = {1, 3, 4, 9, 48, 70, 100};
  int ran = 0;
  for (int threads = 1; threads <= 2; threads++) {
    clrt_set_num_threads(threads);
    for (size_t a = 0; a < sizeof Ns / sizeof *Ns; a++)
      for (size_t k = 0; k < sizeof Ks / sizeof *Ks; k++)
        for (size_t o = 0; o < sizeof Os / sizeof *Os; o++) {
          int N = Ns[a], K = Ks[k], O = Os[o];
          float *x = randv((size_t)N * K, 1), *w = randv((size_t)O * K, 1), *b = randv((size_t)O, 1);
          float *y = zerov((size_t)N * O);
          /* The bf16 kernel is checked against the product of the bf16-rounded x and weights
             (vdpbf16ps where the CPU has it, widened bf16 elsewhere: the same products). */
          uint16_t *w16 = malloc(sizeof(uint16_t) * (size_t)O * K);
          for (int64_t i = 0; i < (int64_t)O * K; i++) w16[i] = clrt_f32_to_bf16(w[i]);
          float *wp = malloc(sizeof(float) * (size_t)O * K);
          clrt_linear_pack(wp, w, K, O);
          uint16_t *wp16 = malloc(sizeof(uint16_t) * (size_t)O * K);   /* bf16 pairs: K even */
          if (K % 2 == 0) clrt_linear_pack_bf16(wp16, w, K, O);
          for (int variant = 0; variant < 8; variant++) {
            int with_bias = variant & 1, kind = variant >> 1;
            int packed16 = kind == 3, half = kind == 1 || packed16, packed = kind == 2 || packed16;
            const float *bb = with_bias ? b : NULL;
            memset(y, 0xff, sizeof(float) * (size_t)N * O);   /* NaN: an output never written fails */
            clrt_packed_part part = {y, wp16, bb, O};
            /* the bf16 kernels' workspace, exactly what they ask for (one byte less: refused) */
            size_t wsb = packed16 ? clrt_linear_packed_bf16_workspace_bytes(N, K)
                                  : clrt_linear_skinny_bf16_workspace_bytes(N, K);
            void *ws = malloc(wsb ? wsb : 1);
            if (half && wsb)
              CHECK((packed16 ? K % 2 == 0 && clrt_linear_packed_bf16_forward_parts(x, N, K, &part, 1, ws, wsb - 1)
                              : clrt_linear_skinny_forward_bf16(y, x, w16, bb, N, K, O, ws, wsb - 1)) == 0);
            int done = packed16 ? K % 2 == 0 && clrt_linear_packed_bf16_forward_parts(x, N, K, &part, 1, ws, wsb)
                       : half   ? clrt_linear_skinny_forward_bf16(y, x, w16, bb, N, K, O, ws, wsb)
                       : packed ? clrt_linear_packed_forward(y, x, wp, bb, N, K, O)
                                : clrt_linear_skinny_forward(y, x, w, bb, N, K, O);
            free(ws);
            if (!done) continue;
            ran = 1;
            double worst = 0;
            for (int n = 0; n < N; n++)
              for (int j = 0; j < O; j++) {
                double e = bb ? bb[j] : 0;
                for (int i = 0; i < K; i++) {
                  int64_t wi = (int64_t)j * K + i;
                  float xi = x[(int64_t)n * K + i];
                  e += half ? (double)clrt_bf16_to_f32(clrt_f32_to_bf16(xi)) * clrt_bf16_to_f32(w16[wi])
                            : (double)xi * w[wi];
                }
                double err = fabs(y[(int64_t)n * O + j] - e) / sqrt((double)K);
                if (!(err <= worst)) worst = err;   /* NaN sticks */
              }
            /* The packed kernel sums each output in k order in one lane, so its rounding
               grows with K rather than with sqrt(K) as the skinny kernels' 16-lane sums do. */
            double tol = packed ? 1e-6 * sqrt((double)K) : 2e-6;
            if (!(worst <= tol))
              fprintf(stderr, "%s N=%d K=%d O=%d bias=%d: error %g\n",
                      packed16 ? "packed bf16" : half ? "skinny bf16" : packed ? "packed" : "skinny", N, K,
                      O, with_bias, worst);
            CHECK(worst <= tol);
          }
          free(x); free(w); free(w16); free(wp); free(wp16); free(b); free(y);
        }
  }
  clrt_set_num_threads(1);
  /* More rows than the skinny kernels take fall back (the packed one takes any number: 33
     and 100 rows above). */
  float z[1];
  uint16_t z16[1] = {0};
  CHECK(clrt_linear_skinny_forward(z, z, z, NULL, CLRT_SKINNY_MAX_ROWS + 1, 1, 1) == 0);
  static float big[8 * (CLRT_SKINNY_MAX_ROWS + 1)];   /* more workspace than either asks */
  CHECK(clrt_linear_skinny_forward_bf16(z, z, z16, NULL, CLRT_SKINNY_MAX_ROWS + 1, 1, 1, big, sizeof big) == 0);
  clrt_packed_part part16 = {z, z16, NULL, 1};
  CHECK(clrt_linear_packed_bf16_forward_parts(z, CLRT_SKINNY_MAX_ROWS + 1, 2, &part16, 1, big, sizeof big) == 0);
  CHECK(clrt_linear_packed_forward(z, z, z, NULL, 0, 1, 1) == 0);
  if (!ran) fprintf(stderr, "test_linear_skinny: no skinny kernel on this CPU; only the fallback checked\n");
}

/* Several products of one x in one call (q/k/v, gate/up) give each product exactly what its
   own call gives (checked against float64 above): the threads' shares cut across the parts
   (panels 3 + 1 + 1 over two threads) and the prefetch of the next panel crosses them. For
   f32 panels and, where the CPU has AVX512-BF16, bf16 ones (even K). */
static int packed_call(int half, const float *x, int N, int K, const clrt_packed_part *parts, int count) {
  if (!half) return clrt_linear_packed_forward_parts(x, N, K, parts, count);
  size_t wsb = clrt_linear_packed_bf16_workspace_bytes(N, K);
  void *ws = malloc(wsb);
  int done = clrt_linear_packed_bf16_forward_parts(x, N, K, parts, count, ws, wsb);
  free(ws);
  return done;
}

static void test_linear_packed_parts(void) {
  static const int Ns[] = {1, 5, 32}, Ks[] = {33, 384};
  static const int Osets[][3] = {{100, 48, 9}, {1, 70, 48}, {384, 384, 384}};
  if (!clrt_linear_packed_available()) return;
  for (int half = 0; half <= 1; half++)
    for (int threads = 1; threads <= 2; threads++) {
      clrt_set_num_threads(threads);
      for (size_t a = 0; a < 3; a++)
        for (size_t k = 0; k < 2; k++)
          for (size_t s = 0; s < 3; s++) {
            int N = Ns[a], K = Ks[k];
            if (half && (K % 2 || !clrt_linear_packed_bf16_available())) continue;
            const int *Os = Osets[s];
            float *x = randv((size_t)N * K, 1), *w[3], *b[3], *y[3], *want[3];
            void *wp[3];
            clrt_packed_part parts[3];
            for (int i = 0; i < 3; i++) {
              w[i] = randv((size_t)Os[i] * K, 1);
              wp[i] = malloc(sizeof(float) * (size_t)Os[i] * K);
              if (half) clrt_linear_pack_bf16(wp[i], w[i], K, Os[i]);
              else clrt_linear_pack(wp[i], w[i], K, Os[i]);
              b[i] = i == 1 ? NULL : randv((size_t)Os[i], 1);
              y[i] = malloc(sizeof(float) * (size_t)N * Os[i]);
              want[i] = malloc(sizeof(float) * (size_t)N * Os[i]);
              memset(y[i], 0xff, sizeof(float) * (size_t)N * Os[i]);   /* NaN where never written */
              parts[i] = (clrt_packed_part){want[i], wp[i], b[i], Os[i]};
              CHECK(packed_call(half, x, N, K, &parts[i], 1) == 1);
              parts[i].y = y[i];
            }
            CHECK(packed_call(half, x, N, K, parts, 3) == 1);
            for (int i = 0; i < 3; i++) {
              int same = memcmp(y[i], want[i], sizeof(float) * (size_t)N * Os[i]) == 0;
              if (!same)
                fprintf(stderr, "packed%s parts N=%d K=%d part %d (O=%d) differs\n", half ? " bf16" : "", N, K,
                        i, Os[i]);
              CHECK(same);
              free(w[i]); free(wp[i]); free(b[i]); free(y[i]); free(want[i]);
            }
            free(x);
          }
    }
  clrt_set_num_threads(1);
}

/* ---- embedding --------------------------------------------------------------------------- */
typedef struct { int N, C; int32_t *tok; float *w, *out, *R; } emb_ctx;
static double emb_loss(void *p) {
  emb_ctx *c = p;
  clrt_embedding_forward(c->out, c->tok, c->w, c->N, c->C);
  return dotv(c->out, c->R, (size_t)c->N * c->C);
}
static void test_embedding(void) {
  int32_t tok[6] = {3, 1, 3, 0, 4, 3};   /* repeats accumulate */
  emb_ctx c = {.N = 6, .C = 5, .tok = tok};
  c.w = randv(25, 1); c.out = zerov(30); c.R = randv(30, 1);
  float *dw = zerov(25);
  clrt_embedding_backward(dw, c.R, tok, 6, 5);
  fd_check("embedding dw", emb_loss, &c, c.w, dw, 25, 1, 1e-2f, 1e-3);
  free(c.w); free(c.out); free(c.R); free(dw);
}

/* ---- rmsnorm ----------------------------------------------------------------------------- */
typedef struct { int N, C; float *x, *w, *out, *rstd, *R; } rms_ctx;
static double rms_loss(void *p) {
  rms_ctx *c = p;
  clrt_rmsnorm_forward(c->out, c->rstd, c->x, c->w, c->N, c->C, 1e-5f);
  return dotv(c->out, c->R, (size_t)c->N * c->C);
}
static void test_rmsnorm(void) {
  rms_ctx c = {.N = 4, .C = 70};   /* C > 64: the dw column blocks split */
  c.x = randv(280, 1); c.w = randv(70, 1); c.out = zerov(280); c.rstd = zerov(4); c.R = randv(280, 1);
  rms_loss(&c);
  float *dx = zerov(280), *dw = zerov(70);
  clrt_rmsnorm_backward(dx, dw, c.R, c.x, c.w, c.rstd, 4, 70);
  fd_check("rmsnorm dx", rms_loss, &c, c.x, dx, 280, 1, 1e-2f, 2e-3);
  fd_check("rmsnorm dw", rms_loss, &c, c.w, dw, 70, 1, 1e-2f, 2e-3);
  /* forward against the formula */
  double ss = 0;
  for (int i = 0; i < 70; i++) ss += (double)c.x[i] * c.x[i];
  CHECK_NEAR(c.out[3], c.w[3] * c.x[3] / sqrt(ss / 70 + 1e-5), 1e-5);
  free(c.x); free(c.w); free(c.out); free(c.rstd); free(c.R); free(dx); free(dw);
}

/* ---- rope ---------------------------------------------------------------------------------- */
enum { RB = 2, RT = 5, RH = 3, RD = 8 };
typedef struct { float *x, *y, *cs, *sn, *R; int32_t *pos0; int rd; } rope_ctx;
static double rope_loss(void *p) {
  rope_ctx *c = p;
  memcpy(c->y, c->x, sizeof(float) * RB * RT * RH * RD);
  clrt_rope_forward(c->y, c->cs, c->sn, c->pos0, RB, RT, RH, RD, c->rd);
  return dotv(c->y, c->R, RB * RT * RH * RD);
}
/* rd: the rotated dimensions (RD: the whole head; fewer: partial rotary, the rest unchanged). */
static void test_rope_dims(int rd) {
  int n = RB * RT * RH * RD, P = 16, half = rd / 2;
  float inv[RD / 2] = {1.0f, 0.3f, 0.05f, 0.001f};
  int32_t pos0[RB] = {0, 7};
  rope_ctx c = {randv((size_t)n, 1), zerov((size_t)n), zerov((size_t)P * half), zerov((size_t)P * half), randv((size_t)n, 1), pos0, rd};
  clrt_rope_table(c.cs, c.sn, inv, P, rd);
  float *dx = malloc(sizeof(float) * (size_t)n);
  memcpy(dx, c.R, sizeof(float) * (size_t)n);
  clrt_rope_backward(dx, c.cs, c.sn, pos0, RB, RT, RH, RD, rd);
  fd_check(rd == RD ? "rope dx" : "partial rope dx", rope_loss, &c, c.x, dx, (size_t)n, 1, 1e-2f, 1e-3);
  /* rotate-half over the first rd: element i pairs with i + rd/2 at angle pos * inv[i] */
  rope_loss(&c);
  int b = 1, t = 2, h = 1;
  const float *xv = c.x + ((b * RT + t) * RH + h) * RD;
  const float *yv = c.y + ((b * RT + t) * RH + h) * RD;
  for (int i = 0; i < half; i++) {
    double a = (7 + t) * (double)inv[i];
    CHECK_NEAR(yv[i], xv[i] * cos(a) - xv[i + half] * sin(a), 1e-5);
    CHECK_NEAR(yv[i + half], xv[i + half] * cos(a) + xv[i] * sin(a), 1e-5);
  }
  for (int i = rd; i < RD; i++) CHECK(yv[i] == xv[i]);   /* past the rotated dimensions: as they were */
  free(c.x); free(c.y); free(c.cs); free(c.sn); free(c.R); free(dx);
}
static void test_rope(void) {
  test_rope_dims(RD);
  test_rope_dims(RD - 2);   /* Phi-4-mini's kind: 96 of 128 rotate */
}

/* ---- attention ------------------------------------------------------------------------------ */
enum { AB = 2, AT = 70, AH = 4, AKV = 2, AD = 4 };   /* T > the 64-query block */
typedef struct { float *q, *k, *v, *out, *lse, *R, *scratch; } att_ctx;
static double att_loss(void *p) {
  att_ctx *c = p;
  clrt_attention_forward(c->out, c->lse, c->q, c->k, c->v, AB, AT, AH, AKV, AD, NULL,
                         (int64_t)AT * AKV * AD, NULL, 0, c->scratch, 2);
  return dotv(c->out, c->R, AB * AT * AH * AD);
}

/* out[b, t, h] by the definition, in double. */
static void naive_attention(double *o, const float *q, const float *k, const float *v, int b, int t,
                            int h, int Tk_visible, int64_t kv_bstride, int Tq, int H, int KV, int D) {
  double s[512], m = -1e300, l = 0;
  int g = h / (H / KV);
  for (int j = 0; j < Tk_visible; j++) {
    double d = 0;
    for (int e = 0; e < D; e++)
      d += (double)q[(((int64_t)b * Tq + t) * H + h) * D + e] * k[b * kv_bstride + ((int64_t)j * KV + g) * D + e];
    s[j] = d / sqrt((double)D);
    m = fmax(m, s[j]);
  }
  for (int j = 0; j < Tk_visible; j++) l += exp(s[j] - m);
  for (int e = 0; e < D; e++) {
    double acc = 0;
    for (int j = 0; j < Tk_visible; j++) acc += exp(s[j] - m) / l * v[b * kv_bstride + ((int64_t)j * KV + g) * D + e];
    o[e] = acc;
  }
}

static void test_attention(void) {
  int nq = AB * AT * AH * AD, nk = AB * AT * AKV * AD;
  att_ctx c = {randv((size_t)nq, 1), randv((size_t)nk, 1), randv((size_t)nk, 1), zerov((size_t)nq),
               zerov(AB * AH * AT), randv((size_t)nq, 1), zerov(clrt_attention_scratch_floats(AT, AT, 2))};
  att_loss(&c);
  double o[AD];
  for (int b = 0; b < AB; b++)
    for (int t = 0; t < AT; t += 13)
      for (int h = 0; h < AH; h++) {
        naive_attention(o, c.q, c.k, c.v, b, t, h, t + 1, (int64_t)AT * AKV * AD, AT, AH, AKV, AD);
        for (int e = 0; e < AD; e++) CHECK_NEAR(c.out[(((int64_t)b * AT + t) * AH + h) * AD + e], o[e], 2e-5);
      }
  float *dq = zerov((size_t)nq), *dk = zerov((size_t)nk), *dv = zerov((size_t)nk);
  clrt_attention_backward(dq, dk, dv, c.R, c.q, c.k, c.v, c.out, c.lse, AB, AT, AH, AKV, AD, 0, c.scratch, 2);
  fd_check("attention dq", att_loss, &c, c.q, dq, (size_t)nq, 7, 1e-2f, 2e-3);
  fd_check("attention dk", att_loss, &c, c.k, dk, (size_t)nk, 5, 1e-2f, 2e-3);
  fd_check("attention dv", att_loss, &c, c.v, dv, (size_t)nk, 5, 1e-2f, 2e-3);

  /* The decode form: 2 new queries per row at positions pos0[b], pos0[b]+1, keys from a cache
     [B, maxT, KV, D] holding earlier positions; it must equal the full causal computation. */
  int maxT = 80, Tq = 2;
  int32_t pos0[AB] = {10, 67};
  int64_t cbs = (int64_t)maxT * AKV * AD;
  float *kc = randv((size_t)(AB * cbs), 1), *vc = randv((size_t)(AB * cbs), 1);
  float *q2 = randv((size_t)AB * Tq * AH * AD, 1), *o2 = zerov((size_t)AB * Tq * AH * AD);
  float *scr = zerov(clrt_attention_scratch_floats(Tq, maxT, 3));
  clrt_attention_forward(o2, NULL, q2, kc, vc, AB, Tq, AH, AKV, AD, pos0, cbs, NULL, 0, scr, 3);
  for (int b = 0; b < AB; b++)
    for (int t = 0; t < Tq; t++)
      for (int h = 0; h < AH; h++) {
        naive_attention(o, q2, kc, vc, b, t, h, pos0[b] + t + 1, cbs, Tq, AH, AKV, AD);
        for (int e = 0; e < AD; e++) CHECK_NEAR(o2[(((int64_t)b * Tq + t) * AH + h) * AD + e], o[e], 2e-5);
      }
  /* Several threads (each with its own scratch slice) give the same results as one. */
  att_loss(&c);   /* the finite differences left out/lse at a perturbed input */
  float *out2 = zerov((size_t)nq), *lse2 = zerov(AB * AH * AT);
  float *dq2 = zerov((size_t)nq), *dk2 = zerov((size_t)nk), *dv2 = zerov((size_t)nk);
  float *scr2 = zerov(clrt_attention_scratch_floats(AT, AT, 3));
  clrt_set_num_threads(3);
  clrt_attention_forward(out2, lse2, c.q, c.k, c.v, AB, AT, AH, AKV, AD, NULL, (int64_t)AT * AKV * AD, NULL, 0, scr2, 3);
  clrt_attention_backward(dq2, dk2, dv2, c.R, c.q, c.k, c.v, out2, lse2, AB, AT, AH, AKV, AD, 0, scr2, 3);
  clrt_set_num_threads(1);
  int same = 1;
  for (int i = 0; i < nq; i++) same &= out2[i] == c.out[i] && dq2[i] == dq[i];
  for (int i = 0; i < nk; i++) same &= dk2[i] == dk[i] && dv2[i] == dv[i];
  CHECK(same);
  free(out2); free(lse2); free(dq2); free(dk2); free(dv2); free(scr2);
  free(kc); free(vc); free(q2); free(o2); free(scr);
  free(c.q); free(c.k); free(c.v); free(c.out); free(c.lse); free(c.R); free(c.scratch);
  free(dq); free(dk); free(dv);
}

/* Sliding-window attention (Mistral, Phi-3): the query at position p sees keys p - W < j <= p.
   T = 70 > the 64-query block, so the second block starts its products past key 0; forward
   against the definition, backward against finite differences, the cache form (prefill of 2
   new positions and the Tq = 1 decode kernel) against the definition. */
enum { WIN = 20 };
static double att_loss_window(void *p) {
  att_ctx *c = p;
  clrt_attention_forward(c->out, c->lse, c->q, c->k, c->v, AB, AT, AH, AKV, AD, NULL,
                         (int64_t)AT * AKV * AD, NULL, WIN, c->scratch, 2);
  return dotv(c->out, c->R, AB * AT * AH * AD);
}

/* naive_attention over keys first .. last (positions), through k/v shifted to key `first`. */
static void naive_window(double *o, const float *q, const float *k, const float *v, int b, int t, int h,
                         int pos, int64_t kv_bstride, int Tq, int H, int KV, int D) {
  int first = pos - WIN + 1 > 0 ? pos - WIN + 1 : 0;
  naive_attention(o, q, k + (int64_t)first * KV * D, v + (int64_t)first * KV * D, b, t, h, pos + 1 - first,
                  kv_bstride, Tq, H, KV, D);
}

static void test_attention_window(void) {
  int nq = AB * AT * AH * AD, nk = AB * AT * AKV * AD;
  att_ctx c = {randv((size_t)nq, 1), randv((size_t)nk, 1), randv((size_t)nk, 1), zerov((size_t)nq),
               zerov(AB * AH * AT), randv((size_t)nq, 1), zerov(clrt_attention_scratch_floats(AT, AT, 2))};
  att_loss_window(&c);
  double o[AD];
  for (int b = 0; b < AB; b++)
    for (int t = 0; t < AT; t += 3)
      for (int h = 0; h < AH; h++) {
        naive_window(o, c.q, c.k, c.v, b, t, h, t, (int64_t)AT * AKV * AD, AT, AH, AKV, AD);
        for (int e = 0; e < AD; e++) CHECK_NEAR(c.out[(((int64_t)b * AT + t) * AH + h) * AD + e], o[e], 2e-5);
      }
  float *dq = zerov((size_t)nq), *dk = zerov((size_t)nk), *dv = zerov((size_t)nk);
  clrt_attention_backward(dq, dk, dv, c.R, c.q, c.k, c.v, c.out, c.lse, AB, AT, AH, AKV, AD, WIN, c.scratch, 2);
  fd_check("window attention dq", att_loss_window, &c, c.q, dq, (size_t)nq, 7, 1e-2f, 2e-3);
  fd_check("window attention dk", att_loss_window, &c, c.k, dk, (size_t)nk, 5, 1e-2f, 2e-3);
  fd_check("window attention dv", att_loss_window, &c, c.v, dv, (size_t)nk, 5, 1e-2f, 2e-3);
  int maxT = 80;
  int64_t cbs = (int64_t)maxT * AKV * AD;
  float *kc = randv((size_t)(AB * cbs), 1), *vc = randv((size_t)(AB * cbs), 1);
  for (int Tq = 1; Tq <= 2; Tq++) {   /* the decode kernel (Tq = 1) and the blocked path */
    int32_t pos0[AB] = {10, 67};
    float *q2 = randv((size_t)AB * Tq * AH * AD, 1), *o2 = zerov((size_t)AB * Tq * AH * AD);
    float *scr = zerov(clrt_attention_scratch_floats(Tq, maxT, 3));
    clrt_attention_forward(o2, NULL, q2, kc, vc, AB, Tq, AH, AKV, AD, pos0, cbs, NULL, WIN, scr, 3);
    for (int b = 0; b < AB; b++)
      for (int t = 0; t < Tq; t++)
        for (int h = 0; h < AH; h++) {
          naive_window(o, q2, kc, vc, b, t, h, pos0[b] + t, cbs, Tq, AH, AKV, AD);
          for (int e = 0; e < AD; e++) CHECK_NEAR(o2[(((int64_t)b * Tq + t) * AH + h) * AD + e], o[e], 2e-5);
        }
    free(q2); free(o2); free(scr);
  }
  free(kc); free(vc);
  free(c.q); free(c.k); free(c.v); free(c.out); free(c.lse); free(c.R); free(c.scratch);
  free(dq); free(dk); free(dv);
}

/* The decode step (Tq = 1, rows reading their own cache slots) over head sizes that are and
   are not multiples of 16 and key counts that are and are not multiples of 4, with grouped
   heads, on 1 and 2 threads: out and lse against the definition in double. Runs the AVX-512
   kernel where the CPU has it and the sgemm path elsewhere. */
static void test_attention_decode(void) {
  static const int Ds[] = {4, 16, 24, 64, 72, 128};
  const int B = 5, H = 6, KV = 2, maxT = 131, slots = 7;
  const int32_t pos0[5] = {0, 3, 17, 130, 64}, slot_of[5] = {6, 0, 3, 2, 5};
  for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++)
    for (int threads = 1; threads <= 2; threads++) {
      int D = Ds[di];
      int64_t cbs = (int64_t)maxT * KV * D;
      float *kc = randv((size_t)(slots * cbs), 1), *vc = randv((size_t)(slots * cbs), 1);
      float *q = randv((size_t)B * H * D, 2), *o = zerov((size_t)B * H * D), *lse = zerov((size_t)B * H);
      float *scr = zerov(clrt_attention_scratch_floats(1, maxT, threads));
      clrt_set_num_threads(threads);
      clrt_attention_forward(o, lse, q, kc, vc, B, 1, H, KV, D, pos0, cbs, slot_of, 0, scr, threads);
      clrt_set_num_threads(1);
      double ref[128];
      for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
          /* naive_attention reads row b of k/v: point it at slot slot_of[b] */
          naive_attention(ref, q, kc + (slot_of[b] - b) * cbs, vc + (slot_of[b] - b) * cbs, b, 0, h,
                          pos0[b] + 1, cbs, 1, H, KV, D);
          for (int e = 0; e < D; e++) CHECK_NEAR(o[((int64_t)b * H + h) * D + e], ref[e], 2e-5);
          double m = -1e300, l = 0, sc[256];
          const float *kb = kc + slot_of[b] * cbs + (int64_t)(h / (H / KV)) * D;
          for (int j = 0; j <= pos0[b]; j++) {
            double d = 0;
            for (int e = 0; e < D; e++) d += (double)q[((int64_t)b * H + h) * D + e] * kb[(int64_t)j * KV * D + e];
            sc[j] = d / sqrt((double)D);
            m = fmax(m, sc[j]);
          }
          for (int j = 0; j <= pos0[b]; j++) l += exp(sc[j] - m);
          CHECK_NEAR(lse[b * H + h], m + log(l), 2e-5);
        }
      free(kc); free(vc); free(q); free(o); free(lse); free(scr);
    }
}

/* The per-query pass tiles the heads of a KV group (up to four share each key load), with
   fewer heads per tile when threads outnumber the work. A query's bits must not depend on that:
   7 heads of one KV head (tiles of 4 + 3, or smaller on more threads), 6 new positions, equal
   bit for bit to each head alone (a tile of one) and to each position as its own decode step
   (Tq = 1), with soft-capped scores too (Gemma 3), within 2e-5 of the definition. */
static void test_attention_rows_tiles(void) {
  enum { H = 7, D = 64, Tq = 6, P0 = 37, MAXT = 48 };
  const int32_t pos0[1] = {P0};
  const int64_t cbs = (int64_t)MAXT * D;
  float *kc = randv((size_t)cbs, 1), *vc = randv((size_t)cbs, 1), *q = randv((size_t)Tq * H * D, 2);
  float *scr = zerov(clrt_attention_scratch_floats(Tq, MAXT, 4));
  const int64_t stride = (int64_t)clrt_attention_scratch_floats(Tq, MAXT, 1);
  for (int capped = 0; capped <= 1; capped++) {
    float cap = capped ? 3.0f : 0.0f;
    float *ref = zerov((size_t)Tq * H * D), *ref_lse = zerov((size_t)H * Tq);
    clrt_attention_rows_forward(ref, ref_lse, q, kc, vc, 1, Tq, H, 1, D, pos0, cbs, NULL, 0, scr, stride, 1, 0, cap);
    for (int threads = 2; threads <= 4; threads += 2) {
      float *o = zerov((size_t)Tq * H * D), *lse = zerov((size_t)H * Tq);
      clrt_set_num_threads(threads);
      clrt_attention_rows_forward(o, lse, q, kc, vc, 1, Tq, H, 1, D, pos0, cbs, NULL, 0, scr, stride, threads, 0, cap);
      clrt_set_num_threads(1);
      CHECK(memcmp(o, ref, sizeof(float) * Tq * H * D) == 0);
      CHECK(memcmp(lse, ref_lse, sizeof(float) * H * Tq) == 0);
      free(o), free(lse);
    }
    int alone_ok = 1, decode_ok = 1;
    float one[D], one_lse;
    for (int t = 0; t < Tq; t++)
      for (int h = 0; h < H; h++) {
        const float *qh = q + ((int64_t)t * H + h) * D, *rh = ref + ((int64_t)t * H + h) * D;
        int32_t p = P0 + t;
        clrt_attention_rows_forward(one, &one_lse, qh, kc, vc, 1, 1, 1, 1, D, &p, cbs, NULL, 0, scr, stride, 1, 0, cap);
        alone_ok &= memcmp(one, rh, sizeof one) == 0 && one_lse == ref_lse[h * Tq + t];
        if (!capped) {
          double want[D];
          naive_attention(want, qh, kc, vc, 0, 0, 0, p + 1, cbs, 1, 1, 1, D);
          for (int e = 0; e < D; e++) CHECK_NEAR(rh[e], want[e], 2e-5);
        }
      }
    /* each position as a decode step of all 7 heads */
    for (int t = 0; t < Tq; t++) {
      float o7[H * D];
      int32_t p = P0 + t;
      int threads = t % 2 ? 4 : 1;   /* 4 threads on one unit of work: tiles of 2 heads */
      clrt_set_num_threads(threads);
      clrt_attention_rows_forward(o7, NULL, q + (int64_t)t * H * D, kc, vc, 1, 1, H, 1, D, &p, cbs, NULL, 0, scr, stride,
                                  threads, 0, cap);
      clrt_set_num_threads(1);
      decode_ok &= memcmp(o7, ref + (int64_t)t * H * D, sizeof o7) == 0;
    }
    CHECK(alone_ok);
    CHECK(decode_ok);
    free(ref), free(ref_lse);
  }
  free(kc), free(vc), free(q), free(scr);
}

/* ---- swiglu and residual --------------------------------------------------------------------- */
typedef struct { int n; float *g, *u, *h, *R; } sw_ctx;
static double sw_loss(void *p) {
  sw_ctx *c = p;
  clrt_swiglu_forward(c->h, c->g, c->u, c->n);
  return dotv(c->h, c->R, (size_t)c->n);
}
static void test_swiglu_residual(void) {
  sw_ctx c = {40, randv(40, 2), randv(40, 1), zerov(40), randv(40, 1)};
  float *dg = malloc(160), *du = zerov(40);
  memcpy(dg, c.R, 160);
  clrt_swiglu_backward(dg, du, dg, c.g, c.u, 40);   /* dg aliases dh */
  fd_check("swiglu dg", sw_loss, &c, c.g, dg, 40, 1, 1e-2f, 1e-3);
  fd_check("swiglu du", sw_loss, &c, c.u, du, 40, 1, 1e-2f, 1e-3);
  CHECK_NEAR(clrt_swiglu(1.5f, 2.0f), 1.5 / (1 + exp(-1.5)) * 2.0, 1e-6);
  free(c.g); free(c.u); free(c.h); free(c.R); free(dg); free(du);

  /* The backward in spans, on two threads: every element of two whole spans and a tail
     against the derivative in double (dg = dh u s (1 + g (1 - s)), du = dh g s). */
  {
    int n = 2 * CLRT_SPAN + 100;
    float *g = randv((size_t)n, 3), *u = randv((size_t)n, 1), *dh = randv((size_t)n, 1);
    float *dg2 = zerov((size_t)n), *du2 = zerov((size_t)n);
    clrt_set_num_threads(2);
    clrt_swiglu_backward(dg2, du2, dh, g, u, n);
    clrt_set_num_threads(1);
    double worst = 0;
    for (int i = 0; i < n; i++) {
      double s = 1 / (1 + exp(-(double)g[i]));
      double eg = fabs(dg2[i] - dh[i] * (double)u[i] * s * (1 + g[i] * (1 - s)));
      double eu = fabs(du2[i] - dh[i] * (double)g[i] * s);
      worst = fmax(worst, fmax(eg, eu));
    }
    CHECK_NEAR(worst, 0, 1e-5);
    free(g); free(u); free(dh); free(dg2); free(du2);
  }

  float a[3] = {1, 2, 3}, b[3] = {10, 20, 30}, o[3], da[3] = {1, 1, 1}, db[3] = {0}, d[3] = {0.5f, -1, 2};
  clrt_residual_forward(o, a, b, 3);
  CHECK_NEAR(o[2], 33, 0);
  clrt_residual_backward(da, db, d, 3);
  CHECK_NEAR(da[1], 0, 0);
  CHECK_NEAR(db[2], 2, 0);
}

/* ---- fused output layer ----------------------------------------------------------------------- */
enum { LN = 7, LC = 6, LV = 11 };
typedef struct { float *x, *w, *lp, *lse, *R, *scratch; int32_t *tgt; } ls_ctx;
static double ls_loss(void *p) {
  ls_ctx *c = p;
  clrt_logsoftmax_gather_forward(c->lp, c->lse, c->x, c->w, NULL, 0, c->tgt, LN, LC, LV, c->scratch, 3);
  return dotv(c->lp, c->R, LN);
}
static void test_logsoftmax_gather(void) {
  int32_t tgt[LN] = {0, 10, 5, 5, 3, 1, 9};
  ls_ctx c = {randv(LN * LC, 1), randv(LV * LC, 1), zerov(LN), zerov(LN), randv(LN, 1), zerov(LN * LV), tgt};
  ls_loss(&c);
  /* lp against a naive log-softmax in double */
  for (int n = 0; n < LN; n++) {
    double z[LV], m = -1e300, l = 0;
    for (int v = 0; v < LV; v++) {
      z[v] = 0;
      for (int k = 0; k < LC; k++) z[v] += (double)c.x[n * LC + k] * c.w[v * LC + k];
      m = fmax(m, z[v]);
    }
    for (int v = 0; v < LV; v++) l += exp(z[v] - m);
    CHECK_NEAR(c.lp[n], z[tgt[n]] - m - log(l), 1e-5);
  }
  float *dx = zerov(LN * LC), *dw = zerov(LV * LC);
  clrt_logsoftmax_gather_backward(dx, dw, c.R, c.x, c.w, NULL, 1, tgt, c.lse, LN, LC, LV, c.scratch, 3, 0);
  fd_check("logsoftmax_gather dx", ls_loss, &c, c.x, dx, LN * LC, 1, 1e-2f, 1e-3);
  fd_check("logsoftmax_gather dw", ls_loss, &c, c.w, dw, LV * LC, 1, 1e-2f, 1e-3);
  /* all rows in one chunk, logits kept from forward: the same gradients without a recompute */
  float *dx2 = zerov(LN * LC), *dw2 = zerov(LV * LC);
  clrt_logsoftmax_gather_forward(c.lp, c.lse, c.x, c.w, NULL, 0, tgt, LN, LC, LV, c.scratch, LN);
  clrt_logsoftmax_gather_backward(dx2, dw2, c.R, c.x, c.w, NULL, 1, tgt, c.lse, LN, LC, LV, c.scratch, LN, 1);
  for (int i = 0; i < LN * LC; i++) CHECK_NEAR(dx2[i], dx[i], 1e-5);
  for (int i = 0; i < LV * LC; i++) CHECK_NEAR(dw2[i], dw[i], 1e-5);
  free(dx2);
  free(dw2);
  free(c.x); free(c.w); free(c.lp); free(c.lse); free(c.R); free(c.scratch); free(dx); free(dw);
}

/* The output layer's blocks at a shape with several 48-aligned vocabulary blocks (N = 300 rows
   past one 256-row block, V = 1000 in blocks of 240 from a 64-row scratch), with the logits
   through sgemm, through the packed head and through gemm_strided.c's forward (dx, dw
   through gemm_strided.c), against one
   block holding all logits, all through sgemm: the same lp, lse, dx, dw. */
static void test_logsoftmax_gather_blocks(void) {
  enum { N = 300, C = 40, V = 1000 };
  float *x = randv(N * C, 1), *w = randv((size_t)V * C, 1), *dlp = randv(N, 1);
  float *wp = malloc(sizeof(float) * V * C), *big = zerov((size_t)N * V), *small = zerov(64 * V);
  clrt_linear_pack(wp, w, C, V);
  int32_t tgt[N];
  for (int n = 0; n < N; n++) tgt[n] = (n * 337) % V;
  float *lp[4], *lse[4], *dx[4], *dw[4];
  for (int run = 0; run < 4; run++) {
    lp[run] = zerov(N), lse[run] = zerov(N), dx[run] = zerov(N * C), dw[run] = zerov((size_t)V * C);
    const float *pk = run == 2 ? wp : NULL;
    float *scr = run == 0 ? big : small;
    int chunk = run == 0 ? N : 64;
    clrt_logsoftmax_gather_forward(lp[run], lse[run], x, w, pk, run == 3, tgt, N, C, V, scr, chunk);
    clrt_logsoftmax_gather_backward(dx[run], dw[run], dlp, x, w, pk, run > 0, tgt, lse[run], N, C, V, scr, chunk, 0);
  }
  for (int run = 1; run < 4; run++) {
    double worst = 0;
    for (int i = 0; i < N; i++) worst = fmax(worst, fabs(lp[run][i] - lp[0][i]) + fabs(lse[run][i] - lse[0][i]));
    for (int i = 0; i < N * C; i++) worst = fmax(worst, fabs(dx[run][i] - dx[0][i]));
    for (int i = 0; i < V * C; i++) worst = fmax(worst, fabs(dw[run][i] - dw[0][i]));
    if (worst <= 1e-3) check_passed++;
    else {
      check_failed++;
      fprintf(stderr, "logsoftmax_gather blocks (%s): off by %.3g\n", run == 3 ? "strided logits" : run == 2 ? "packed" : "sgemm logits", worst);
    }
  }
  for (int run = 0; run < 4; run++) free(lp[run]), free(lse[run]), free(dx[run]), free(dw[run]);
  free(x); free(w); free(dlp); free(wp); free(big); free(small);
}

/* The 16-lane AdamW span (optim.c's update) equals clrt_adamw_update element by element, bit
   for bit, over full vectors and a tail (n = 37), with decay and a clip scale. */
static void test_adamw_span(void) {
  enum { n = 37 };
  float p[n], m[n], v[n], g[n], p2[n], m2[n], v2[n];
  for (int i = 0; i < n; i++) {
    p[i] = p2[i] = 0.3f * sinf((float)i), m[i] = m2[i] = 0.01f * cosf(3.0f * i);
    v[i] = v2[i] = 1e-4f * (1 + i % 5), g[i] = 0.2f * cosf(1.7f * i);
  }
  clrt_adamw_span(p, m, v, g, n, 0.5f, 1e-3f, 0.9f, 0.95f, 1e-8f, 1e-4f, 0.271f, 0.3f);
  int same = 1;
  for (int i = 0; i < n; i++) {
    clrt_adamw_update(&p2[i], &m2[i], &v2[i], g[i] * 0.5f, 1e-3f, 0.9f, 0.95f, 1e-8f, 1e-4f, 0.271f, 0.3f);
    same &= memcmp(&p[i], &p2[i], 4) == 0 && memcmp(&m[i], &m2[i], 4) == 0 && memcmp(&v[i], &v2[i], 4) == 0;
  }
  CHECK(same);
}

/* ---- shared math ------------------------------------------------------------------------------ */
static void test_math(void) {
  /* online logsumexp equals the direct one, merged in any split */
  float xs[5] = {0.5f, -3, 7, 2, 7.5f};
  float m = -INFINITY, l = 0, m2 = -INFINITY, l2 = 0;
  double direct = 0;
  for (int i = 0; i < 5; i++) direct += exp(xs[i]);
  for (int i = 0; i < 2; i++) clrt_lse_step(&m, &l, xs[i]);
  for (int i = 2; i < 5; i++) clrt_lse_step(&m2, &l2, xs[i]);
  clrt_lse_merge(&m, &l, m2, l2);
  CHECK_NEAR(clrt_lse_value(m, l), log(direct), 1e-5);
  /* one AdamW element against the textbook formula at step 3 */
  float p = 0.7f, mm = 0.1f, v = 0.02f, g = -0.3f;
  double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  double pe = 0.7 * (1 - lr * wd), me = 0.9 * 0.1 + 0.1 * g, ve = 0.95 * 0.02 + 0.05 * g * g;
  pe -= lr / (1 - pow(b1, 3)) * me / (sqrt(ve) / sqrt(1 - pow(b2, 3)) + eps);
  clrt_adamw_update(&p, &mm, &v, g, (float)lr, (float)b1, (float)b2, (float)eps, (float)(lr * wd),
                    (float)(1 - pow(b1, 3)), (float)sqrt(1 - pow(b2, 3)));
  CHECK_NEAR(p, pe, 1e-6);
  CHECK_NEAR(mm, me, 1e-7);
  CHECK_NEAR(v, ve, 1e-7);
}

/* linear_bf16.c: products over a weight held only in bf16 panels, against sgemm over the same
   (bf16-rounded) weights in f32. Widened (forward with dot off, dx always) the numbers are the
   same and only the summation order differs: 1e-4 relative, as the strided test (sums of 500
   unit terms in another order differ by ~2e-5). The AVX512-BF16 forward also
   rounds x: each term then errs by <= u = 2^-9 relative with random signs, so the output errs
   by ~u sqrt(sum (x w)^2) <= u |x| |w|: asserted per output against 2u |x_n| |w_o| + 1e-6.
   Shapes cover the narrow last panel (O = 300 = 6 x 48 + 12), several 240-row blocks (O 500),
   one row and odd row counts, both accumulate modes and 1-2 threads. */
static void test_linear_bf16_weights(void) {
  static const int Ns[] = {1, 9, 130}, Ks[] = {2, 64, 98}, Os[] = {5, 48, 300, 500};
  for (int threads = 1; threads <= 2; threads++) {
    clrt_set_num_threads(threads);
    for (size_t a = 0; a < sizeof Ns / sizeof *Ns; a++)
      for (size_t k = 0; k < sizeof Ks / sizeof *Ks; k++)
        for (size_t o = 0; o < sizeof Os / sizeof *Os; o++) {
          int N = Ns[a], K = Ks[k], O = Os[o];
          size_t nk = (size_t)N * K, ok = (size_t)O * K, no = (size_t)N * O;
          float *x = randv(nk, 1), *w = randv(ok, 1), *dy = randv(no, 1), *b = randv((size_t)O, 1);
          for (size_t i = 0; i < ok; i++) w[i] = clrt_bf16_to_f32(clrt_f32_to_bf16(w[i]));
          uint16_t *wp = malloc(ok * sizeof *wp);
          clrt_linear_pack_bf16(wp, w, K, O);
          float *wf = malloc(ok * sizeof *wf);   /* the widening gives back w exactly */
          clrt_linear_unpack_bf16(wf, wp, K, O, 0, O);
          CHECK(memcmp(wf, w, ok * sizeof *wf) == 0);
          float *y = zerov(no), *y2 = zerov(no);
          clrt_linear_forward(y, x, w, b, N, K, O);
          for (int dot = 0; dot <= 1; dot++) {
            size_t wsb = clrt_linear_bf16_workspace_bytes(N, K, O, dot);
            void *ws = malloc(wsb);
            CHECK(clrt_linear_bf16_forward(y2, x, wp, b, N, K, O, dot, ws, wsb - 1) == 0);   /* short: refused */
            CHECK(clrt_linear_bf16_forward(y2, x, wp, b, N, K, O, dot, ws, wsb) == 1);
            free(ws);
            int bad = 0;
            for (int n = 0; n < N; n++)
              for (int j = 0; j < O; j++) {
                double xn = 0, wn = 0, e = y[(size_t)n * O + j];
                for (int i = 0; i < K; i++) xn += (double)x[(size_t)n * K + i] * x[(size_t)n * K + i], wn += (double)w[(size_t)j * K + i] * w[(size_t)j * K + i];
                double tol = dot ? 2.0 / 512 * sqrt(xn * wn) + 1e-6 : 1e-4 * (1 + fabs(e));
                bad += !(fabs(y2[(size_t)n * O + j] - e) <= tol);
              }
            if (bad) {
              check_failed++;
              fprintf(stderr, "bf16-weight forward dot=%d N=%d K=%d O=%d threads=%d: %d outputs off\n", dot, N, K, O, threads, bad);
            } else check_passed++;
          }
          for (int acc = 0; acc <= 1; acc++)
            for (int fast = 0; fast <= 1; fast++) {
              float *dx = randv(nk, 1), *dx2 = malloc(nk * sizeof *dx2);
              memcpy(dx2, dx, nk * sizeof *dx2);
              clrt_linear_backward(dx, NULL, NULL, dy, x, w, N, K, O, acc);
              size_t wsb = clrt_linear_bf16_backward_dx_workspace_bytes(K, O);
              void *ws = malloc(wsb);
              CHECK(clrt_linear_bf16_backward_dx(dx2, dy, wp, N, K, O, acc, fast, ws, wsb - 1) == 0);
              CHECK(clrt_linear_bf16_backward_dx(dx2, dy, wp, N, K, O, acc, fast, ws, wsb) == 1);
              free(ws);
              double worst = 0;
              for (size_t i = 0; i < nk; i++) worst = fmax(worst, fabs(dx2[i] - dx[i]) / (1 + fabs(dx[i])));
              if (worst > 1e-4) {
                check_failed++;
                fprintf(stderr, "bf16-weight dx N=%d K=%d O=%d acc=%d fast=%d threads=%d: off by %.3g\n", N, K, O, acc, fast, threads, worst);
              } else check_passed++;
              free(dx), free(dx2);
            }
          free(x), free(w), free(dy), free(b), free(wp), free(wf), free(y), free(y2);
        }
  }
  clrt_set_num_threads(1);
}

int main(void) {
  /* Finite differences run each forward thousands of times: one thread keeps that fast on a
     busy machine; test_attention checks several threads against one. */
  clrt_set_num_threads(1);
  clrt_rng_seed(&rng, 42);
  test_linear();
  test_linear_skinny();
  test_linear_packed_parts();
  test_embedding();
  test_rmsnorm();
  test_rope();
  test_attention();
  test_attention_decode();
  test_attention_window();
  test_attention_rows_tiles();
  test_swiglu_residual();
  test_logsoftmax_gather();
  test_logsoftmax_gather_blocks();
  test_linear_backward_strided();
  test_linear_bf16_weights();
  test_math();
  test_adamw_span();
  return check_summary();
}
