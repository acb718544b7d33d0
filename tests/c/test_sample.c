/* test_sample.c — the sampler against the distribution computed here independently:
   a chi-square goodness-of-fit test per filter setting, greedy = argmax, masks, logprobs. */
#include "clrt.h"
#include "check.h"

#include <math.h>
#include <stdlib.h>

enum { V = 7, N = 60000 };
static const float logits[V] = {1.5f, 0.2f, -0.7f, 2.1f, 0.9f, 0.9f, -2.0f};

/* The reference: probabilities after temperature, top-k, then top-p over the renormalised
   top-k mass (Hugging Face's order), by sorting — the slow, obvious way. */
static void reference(float temp, int top_k, float top_p, const uint8_t *allowed, double *p) {
  int order[V], n = 0;
  for (int i = 0; i < V; i++)
    if (!allowed || allowed[i]) order[n++] = i;
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++)
      if (logits[order[j]] > logits[order[i]] ||
          (logits[order[j]] == logits[order[i]] && order[j] < order[i])) {
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
      }
  if (top_k > 0 && top_k < n) n = top_k;
  double w[V], z = 0;
  for (int i = 0; i < n; i++) z += (w[i] = exp(logits[order[i]] / temp));
  int keep = 0;
  double mass = 0;
  while (keep < n && (keep == 0 || mass < top_p)) mass += w[keep++] / z;
  double zk = 0;
  for (int i = 0; i < keep; i++) zk += w[i];
  for (int i = 0; i < V; i++) p[i] = 0;
  for (int i = 0; i < keep; i++) p[order[i]] = w[i] / zk;
}

static void check_distribution(float temp, int top_k, float top_p, const uint8_t *allowed) {
  double expect[V];
  reference(temp, top_k, top_p, allowed, expect);
  clrt_rng rng;
  clrt_rng_seed(&rng, 1234);
  int counts[V] = {0};
  float *rows = malloc(sizeof(float) * V * 100);
  uint8_t *masks = allowed ? malloc(V * 100) : NULL;
  for (int b = 0; b < 100; b++) {
    for (int i = 0; i < V; i++) rows[b * V + i] = logits[i];
    if (masks)
      for (int i = 0; i < V; i++) masks[b * V + i] = allowed[i];
  }
  clrt_sample_params params[100];
  double u[100];
  int32_t tok[100];
  float lp[100];
  for (int b = 0; b < 100; b++) params[b] = (clrt_sample_params){temp, top_k, top_p};
  for (int it = 0; it < N / 100; it++) {
    for (int b = 0; b < 100; b++) u[b] = clrt_rng_uniform(&rng);
    CHECK(clrt_sample(rows, 100, V, params, u, masks, tok, lp) == 0);
    for (int b = 0; b < 100; b++) {
      counts[tok[b]]++;
      if (expect[tok[b]] > 0) CHECK_NEAR(lp[b], log(expect[tok[b]]), 1e-5);
      else CHECK(0 && "sampled a token of probability 0");
    }
  }
  /* Chi-square over the tokens of nonzero probability; the 0.999 quantile for <= 6 degrees
     of freedom is below 22.5. The seed is fixed, so the outcome is deterministic. */
  double chi2 = 0;
  int dof = -1;
  for (int i = 0; i < V; i++)
    if (expect[i] > 0) {
      double e = expect[i] * N;
      chi2 += (counts[i] - e) * (counts[i] - e) / e;
      dof++;
    }
  if (!(chi2 < 22.5)) fprintf(stderr, "chi2 %.2f with %d dof (temp %g, k %d, p %g)\n", chi2, dof, temp, top_k, top_p);
  CHECK(chi2 < 22.5);
  free(rows);
  free(masks);
}

int main(void) {
  check_distribution(1.0f, 0, 1.0f, NULL);
  check_distribution(0.7f, 0, 1.0f, NULL);
  check_distribution(1.0f, 3, 1.0f, NULL);
  check_distribution(1.0f, 0, 0.8f, NULL);
  check_distribution(1.3f, 5, 0.9f, NULL);
  uint8_t allowed[V] = {0, 1, 1, 0, 1, 1, 1};
  check_distribution(1.0f, 0, 0.95f, allowed);
  check_distribution(1.0f, 0, 1.0f, allowed);

  /* Greedy is the argmax, restricted to the mask, with logprob 0. */
  clrt_sample_params g = {0, 0, 1};
  double u = 0.5;
  int32_t tok;
  float lp;
  CHECK(clrt_sample(logits, 1, V, &g, &u, NULL, &tok, &lp) == 0 && tok == 3 && lp == 0);
  CHECK(clrt_sample(logits, 1, V, &g, &u, allowed, &tok, &lp) == 0 && tok == 4);
  /* Ties in greedy go to the lower id (4 and 5 are equal). */
  uint8_t only45[V] = {0, 0, 0, 0, 1, 1, 0};
  CHECK(clrt_sample(logits, 1, V, &g, &u, only45, &tok, &lp) == 0 && tok == 4);
  uint8_t none[V] = {0};
  CHECK(clrt_sample(logits, 1, V, &g, &u, none, &tok, &lp) == -1);
  CHECK_ERROR("row 0 has no allowed token");

  /* Greedy over wide rows without a mask (16 lanes at a time where the CPU has AVX-512, 8 on AVX2)
     against a plain scan: the first largest logit, NaNs passed over, a NaN at id 0 kept; the
     maximum in the 16-lane body, in the tail, tied, and behind NaNs. */
  static const int widths[] = {16, 17, 33, 1000, 32000};
  uint64_t seed = 7;
  for (size_t w = 0; w < sizeof widths / sizeof *widths; w++)
    for (int pattern = 0; pattern < 7; pattern++) {
      int n = widths[w];
      float *z = malloc(sizeof(float) * (size_t)n);
      for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        z[i] = (float)((seed >> 40) % 2001) / 100.0f - 10.0f;   /* ties happen: 2001 values */
      }
      if (pattern == 1) z[n - 1] = 50.0f;                             /* in the tail */
      if (pattern == 2) z[n / 2] = z[n / 3 + 1] = 50.0f;              /* tied: the lower id */
      if (pattern == 3) z[n / 2] = NAN, z[n - 1] = NAN;               /* passed over */
      if (pattern == 4) z[0] = NAN;                                   /* kept (nothing is greater) */
      if (pattern == 5) z[1] = -INFINITY, z[n / 2] = INFINITY;
      if (pattern == 6) z[9] = z[13] = 50.0f;                         /* tied within one 8- and 16-lane chunk */
      int32_t want = 0;
      for (int i = 1; i < n; i++)
        if (z[i] > z[want]) want = i;
      CHECK(clrt_sample(z, 1, n, &g, &u, NULL, &tok, &lp) == 0);
      if (tok != want) fprintf(stderr, "greedy V=%d pattern %d: %d, want %d\n", n, pattern, tok, want);
      CHECK(tok == want && lp == 0);
      free(z);
    }
  return check_summary();
}
