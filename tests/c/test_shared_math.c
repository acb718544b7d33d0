/* test_shared_math.c — the per-element math shared by the CPU and CUDA kernels
   (kernels/model_math.h, kernels/sampling.h, kernels/bf16.h) against straightforward
   double-precision formulas. Runs everywhere: the GPU executes these same functions. */
#include "check.h"
#include "model_math.h"
#include "sampling.h"

#include <stdint.h>
#include <stdlib.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) {   /* xorshift64*, uniform [0, 1) */
  rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
  return (double)((rng * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}
static double nrand(double lo, double hi) { return lo + (hi - lo) * urand(); }

static double relerr(double a, double e) { return fabs(a - e) / (fabs(e) > 1e-30 ? fabs(e) : 1e-30); }

static void test_expf(void) {
  double worst = 0;
  for (int i = 0; i < 200000; i++) {
    float x = (float)nrand(-87.0, 88.0);
    double r = relerr(clrt_expf(x), exp((double)x));
    if (r > worst) worst = r;
  }
  CHECK(worst < 4e-7);   /* ~2 ulp of float */
  CHECK(clrt_expf(0.0f) == 1.0f);
  CHECK(clrt_expf(-1000.0f) >= 0 && clrt_expf(-1000.0f) < 1e-37f);   /* clamped, never NaN */
}

static void test_rmsnorm(void) {
  for (int trial = 0; trial < 20; trial++) {
    int n = 1 + (int)(urand() * 37);
    float x[64], w[64], dy[64];
    double ss = 0, dot = 0;
    for (int i = 0; i < n; i++) {
      x[i] = (float)nrand(-2, 2), w[i] = (float)nrand(-1, 1), dy[i] = (float)nrand(-1, 1);
      ss += (double)x[i] * x[i];
      dot += (double)w[i] * dy[i] * x[i];
    }
    float eps = 1e-5f;
    double r = 1.0 / sqrt(ss / n + eps);
    float rf = clrt_rms_rstd((float)ss, n, eps);
    CHECK_NEAR(rf, r, 1e-5 * r);
    /* dx_i = d/dx_i sum_j dy_j w_j x_j r(x): compare with the analytic double formula */
    for (int i = 0; i < n; i++) {
      double e = r * w[i] * dy[i] - x[i] * r * r * r * dot / n;
      CHECK_NEAR(clrt_rms_dx(x[i], w[i] * dy[i], (float)r, (float)dot, n), e, 1e-4 * (1 + fabs(e)));
    }
  }
}

static void test_rope(void) {
  for (int i = 0; i < 100; i++) {
    double a = nrand(-50, 50), x1 = nrand(-3, 3), x2 = nrand(-3, 3);
    float c = (float)cos(a), s = (float)sin(a), y1, y2, b1, b2;
    clrt_rope_rotate(&y1, &y2, (float)x1, (float)x2, c, s);
    CHECK_NEAR(y1, x1 * c - x2 * s, 1e-5);
    CHECK_NEAR(y2, x2 * c + x1 * s, 1e-5);
    clrt_rope_rotate_back(&b1, &b2, y1, y2, c, s);   /* the transpose undoes the rotation */
    CHECK_NEAR(b1, x1, 1e-5);
    CHECK_NEAR(b2, x2, 1e-5);
  }
  CHECK(clrt_rope_angle(7, 0.25f) == 1.75f);
  CHECK(clrt_rope_angle(100000, 1e-4f) == (float)(100000.0f * 1e-4f));
}

static void test_swiglu(void) {
  for (int i = 0; i < 1000; i++) {
    double g = nrand(-20, 20), u = nrand(-3, 3), dh = nrand(-2, 2);
    double s = 1 / (1 + exp(-g));
    CHECK_NEAR(clrt_sigmoid((float)g), s, 1e-6);
    CHECK_NEAR(clrt_swiglu((float)g, (float)u), g * s * u, 1e-5 * (1 + fabs(g * u)));
    float dg, du;
    clrt_swiglu_back(&dg, &du, (float)g, (float)u, (float)dh);
    double edg = dh * u * (s + g * s * (1 - s)), edu = dh * g * s;
    CHECK_NEAR(dg, edg, 1e-5 * (1 + fabs(edg)));
    CHECK_NEAR(du, edu, 1e-5 * (1 + fabs(edu)));
  }
}

/* logsumexp and the online softmax, folded serially and merged in parts as a GPU reduction does */
static void test_softmax(void) {
  for (int trial = 0; trial < 50; trial++) {
    int n = 1 + (int)(urand() * 300);
    float x[300], v[300];
    double mx = -INFINITY, z = 0, num = 0;
    for (int i = 0; i < n; i++) {
      x[i] = (float)nrand(-30, 30), v[i] = (float)nrand(-1, 1);
      if (x[i] > mx) mx = x[i];
    }
    for (int i = 0; i < n; i++) z += exp(x[i] - mx), num += exp(x[i] - mx) * v[i];
    double lse = mx + log(z), avg = num / z;
    float m = -INFINITY, l = 0;
    for (int i = 0; i < n; i++) clrt_lse_step(&m, &l, x[i]);
    CHECK_NEAR(clrt_lse_value(m, l), lse, 1e-5 * (1 + fabs(lse)));
    /* four interleaved partial states merged, plus an empty one */
    float pm[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY}, pl[5] = {0};
    for (int i = 0; i < n; i++) clrt_lse_step(&pm[i % 4], &pl[i % 4], x[i]);
    for (int p = 1; p < 5; p++) clrt_lse_merge(&pm[0], &pl[0], pm[p], pl[p]);
    CHECK_NEAR(clrt_lse_value(pm[0], pl[0]), lse, 1e-5 * (1 + fabs(lse)));
    /* online weighted average (attention's acc = acc * corr + p * v) */
    float om = -INFINITY, ol = 0, acc = 0, corr, p;
    for (int i = 0; i < n; i++) {
      clrt_online_softmax_step(&om, &ol, x[i], &corr, &p);
      acc = acc * corr + p * v[i];
    }
    CHECK_NEAR(acc / ol, avg, 1e-5);
    CHECK_NEAR(clrt_lse_value(om, ol), lse, 1e-5 * (1 + fabs(lse)));
    /* softmax backward pieces */
    int j = (int)(urand() * n);
    double pj = exp(x[j] - lse), g = nrand(-2, 2), dp = nrand(-1, 1), Di = nrand(-1, 1), sc = 0.125;
    CHECK_NEAR(clrt_attn_prob(x[j], (float)lse), pj, 1e-5 * (1 + pj));
    CHECK_NEAR(clrt_attn_dscore((float)pj, (float)dp, (float)Di, (float)sc), pj * (dp - Di) * sc, 1e-6);
    CHECK_NEAR(clrt_lsm_dlogit(x[j], (float)lse, (float)g), -g * pj, 1e-5 * (1 + fabs(g * pj)));
  }
}

static void test_adamw(void) {
  /* Ten steps of one element against the textbook formula in double. */
  for (int trial = 0; trial < 20; trial++) {
    double lr = nrand(1e-4, 1e-2), b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = nrand(0, 0.1);
    double p = nrand(-1, 1), m = 0, v = 0;
    float pf = (float)p, mf = 0, vf = 0;
    for (int t = 1; t <= 10; t++) {
      double g = nrand(-1, 1);
      p -= lr * wd * p;
      m = b1 * m + (1 - b1) * g;
      v = b2 * v + (1 - b2) * g * g;
      double mh = m / (1 - pow(b1, t)), vh = v / (1 - pow(b2, t));
      p -= lr * mh / (sqrt(vh) + eps);
      clrt_adamw_update(&pf, &mf, &vf, (float)g, (float)lr, (float)b1, (float)b2, (float)eps,
                        (float)(lr * wd), (float)(1 - pow(b1, t)), (float)sqrt(1 - pow(b2, t)));
    }
    CHECK_NEAR(pf, p, 1e-5);
    CHECK_NEAR(mf, m, 1e-6);
    CHECK_NEAR(vf, v, 1e-7);
  }
  CHECK(clrt_clip_scale(10.0, 1.0f) > 0.0999f && clrt_clip_scale(10.0, 1.0f) < 0.1f);
  CHECK(clrt_clip_scale(0.5, 1.0f) == 1.0f);
  CHECK(clrt_clip_scale(1e9, 0.0f) == 1.0f);
}

static void test_sampling(void) {
  for (int i = 0; i < 200; i++) {
    double x = nrand(-20, 20), mx = x + nrand(0, 10), t = nrand(0.1, 2);
    CHECK_NEAR(clrt_tempered_weight((float)x, (float)mx, (float)t), exp((x - mx) / t),
               1e-5 * exp((x - mx) / t) + 1e-30);
  }
  CHECK(clrt_nucleus_keeps(0.0, 0.5) && clrt_nucleus_keeps(0.49, 0.5) && !clrt_nucleus_keeps(0.5, 0.5));
  /* Keys order exactly as the CPU sampler's `better`: larger logit, then smaller id. */
  float vals[] = {-INFINITY, -1e30f, -2.5f, -1.0f, -0.0f, 0.0f, 1e-30f, 1.0f, 3.5f, 1e30f, INFINITY};
  int nv = (int)(sizeof vals / sizeof vals[0]);
  for (int a = 0; a < nv; a++)
    for (int b = 0; b < nv; b++)
      for (int ia = 0; ia < 3; ia++)
        for (int ib = 0; ib < 3; ib++) {
          float la = vals[a], lb = vals[b];
          int32_t ida = ia * 70000, idb = ib * 70000 + 1;
          int better = la > lb || (la == lb && ida < idb);
          /* -0 and +0 compare equal as floats but not as bits: only strict order matters */
          if (la == lb && ((a == 4 && b == 5) || (a == 5 && b == 4))) continue;
          CHECK((clrt_sample_key(la, ida) > clrt_sample_key(lb, idb)) == better);
        }
  for (int32_t id = 0; id < 200000; id += 999) CHECK(clrt_sample_key_id(clrt_sample_key(1.5f, id)) == id);
}

static void test_bf16(void) {
  for (int i = 0; i < 100000; i++) {
    float f = (float)(nrand(-1, 1) * pow(2.0, nrand(-30, 30)));
    float r = clrt_bf16_to_f32(clrt_f32_to_bf16(f));
    /* nearest bf16: the two neighbours by truncation, pick the closer (ties to even) */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
    float flo, fhi;
    memcpy(&flo, &lo, 4);
    memcpy(&fhi, &hi, 4);
    double dlo = fabs((double)f - flo), dhi = fabs((double)f - fhi);
    float e = dlo < dhi ? flo : dhi < dlo ? fhi : ((lo >> 16) & 1) ? fhi : flo;
    CHECK(r == e);
    if (r != e) break;
  }
  CHECK(isnan(clrt_bf16_to_f32(clrt_f32_to_bf16(NAN))));
}

int main(void) {
  test_expf();
  test_rmsnorm();
  test_rope();
  test_swiglu();
  test_softmax();
  test_adamw();
  test_sampling();
  test_bf16();
  return check_summary();
}
