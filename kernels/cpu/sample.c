/* sample.c — temperature / top-k / top-p sampling of a batch of logit rows.
 *
 * Candidates come out of a max-heap in decreasing order, so a row costs O(V) to build the
 * heap plus O(m log V) for the m tokens the filters keep — no full sort of a 150k vocabulary.
 * The returned log-probability is that of the token under the distribution actually sampled
 * (after temperature and the filters; 0 for greedy), which is what a caller can check. */
#include "model_kernels.h"
#include "sampling.h"
#include "simd512.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  float logit;
  int32_t id;
} cand;

/* Larger logit first; ties by smaller id, so results never depend on heap layout. */
static int better(cand a, cand b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); }

static void sift_down(cand *h, int n, int i) {
  for (;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < n && better(h[l], h[m])) m = l;
    if (r < n && better(h[r], h[m])) m = r;
    if (m == i) return;
    cand t = h[i];
    h[i] = h[m];
    h[m] = t;
    i = m;
  }
}

#if CLRT_AVX512
/* The greedy token of a row without a mask, as the loop in sample_row finds it (the largest
   logit, the smallest id among equals, NaNs passed over) but 16 lanes at a time: a running
   max per lane, then the first place that holds it. _mm512_max_ps(z, m) is z > m ? z : m, the
   loop's own test, so a NaN never enters a lane. -1 leaves the row to that loop: z[0] is NaN
   or V < 16. A batch-32 step of a 32k vocabulary spent 0.3 ms in the loop. */
CLRT_TARGET_AVX512 static int32_t argmax_row(const float *z /* [V] */, int V) {
  if (V < 16 || z[0] != z[0]) return -1;
  __m512 m = _mm512_set1_ps(z[0]);
  int i = 0;
  for (; i + 16 <= V; i += 16) m = _mm512_max_ps(_mm512_loadu_ps(z + i), m);
  float mx = _mm512_reduce_max_ps(m);
  for (; i < V; i++) mx = z[i] > mx ? z[i] : mx;
  __m512 target = _mm512_set1_ps(mx);
  for (i = 0; i + 16 <= V; i += 16) {
    __mmask16 hit = _mm512_cmpeq_ps_mask(_mm512_loadu_ps(z + i), target);
    if (hit) return i + __builtin_ctz(hit);
  }
  for (; i < V; i++)
    if (z[i] == mx) return i;
  return -1;
}
#endif

#if CLRT_AVX2
/* The same greedy scan 8 lanes wide (AVX2): _mm256_max_ps(z, m) is z > m ? z : m too. */
CLRT_TARGET_AVX2 static int32_t argmax_row_avx2(const float *z /* [V] */, int V) {
  if (V < 8 || z[0] != z[0]) return -1;
  __m256 m = _mm256_set1_ps(z[0]);
  int i = 0;
  for (; i + 8 <= V; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(z + i), m);
  float lanes[8], mx = z[0];
  _mm256_storeu_ps(lanes, m);
  for (int l = 0; l < 8; l++) mx = lanes[l] > mx ? lanes[l] : mx;
  for (; i < V; i++) mx = z[i] > mx ? z[i] : mx;
  __m256 target = _mm256_set1_ps(mx);
  for (i = 0; i + 8 <= V; i += 8) {
    int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(z + i), target, _CMP_EQ_OQ));
    if (hit) return i + __builtin_ctz((unsigned)hit);
  }
  for (; i < V; i++)
    if (z[i] == mx) return i;
  return -1;
}
#endif

static int32_t sample_row(const float *logits /* [V] */, int V, float temperature, int top_k,
                          float top_p, double u, const uint8_t *allowed /* [V] or NULL */,
                          cand *heap /* [V] scratch */, float *logprob /* out: scalar */) {
  if (temperature <= 0 && !allowed) {
    int32_t g = -1;
#if CLRT_AVX512
    if (clrt_have_avx512()) g = argmax_row(logits, V);
    else
#endif
#if CLRT_AVX2
    if (clrt_have_avx2()) g = argmax_row_avx2(logits, V);
#endif
    if (g >= 0) {
      *logprob = 0;
      return g;
    }
  }
  float mx = -FLT_MAX;
  int32_t arg = -1;
  for (int i = 0; i < V; i++)
    if ((!allowed || allowed[i]) && (arg < 0 || logits[i] > mx)) {
      mx = logits[i];
      arg = i;
    }
  if (arg < 0) {
    *logprob = -INFINITY;
    return -1;
  }
  if (temperature <= 0) {   /* greedy: a point mass */
    *logprob = 0;
    return arg;
  }
  double z = 0;
  for (int i = 0; i < V; i++)
    if (!allowed || allowed[i]) z += clrt_tempered_weight(logits[i], mx, temperature);
  int filtered = (top_k > 0 && top_k < V) || top_p < 1;
  if (!filtered) {   /* inverse CDF over the whole row */
    double target = u * z, cum = 0;
    int32_t pick = arg;
    for (int i = 0; i < V; i++) {
      if (allowed && !allowed[i]) continue;
      cum += clrt_tempered_weight(logits[i], mx, temperature);
      pick = i;
      if (cum > target) break;
    }
    *logprob = (float)(log(clrt_tempered_weight(logits[pick], mx, temperature)) - log(z));
    return pick;
  }
  int n = 0;
  for (int i = 0; i < V; i++)
    if (!allowed || allowed[i]) heap[n++] = (cand){logits[i], i};
  for (int i = n / 2 - 1; i >= 0; i--) sift_down(heap, n, i);
  /* Pop candidates best-first into the heap's tail (position n-1-j holds the j-th best). With
     top-k the nucleus is taken over the renormalised top-k mass, so all k are popped first;
     without it the nucleus is over z and popping stops as soon as it is complete. */
  int k = (top_k > 0 && top_k < n) ? top_k : n;
  double zk = 0, mass = 0;
  int popped = 0, size = n;
  while (popped < k) {
    cand top = heap[0];
    heap[0] = heap[--size];
    sift_down(heap, size, 0);
    heap[n - 1 - popped++] = top;
    double w = clrt_tempered_weight(top.logit, mx, temperature);
    zk += w;
    if (top_k <= 0) {
      mass += w / z;
      if (!clrt_nucleus_keeps(mass, top_p)) break;
    }
  }
  if (top_k <= 0) zk = z;
  int keep = 0;
  double zkeep = 0;
  mass = 0;
  for (int j = 0; j < popped; j++) {
    if (j > 0 && !clrt_nucleus_keeps(mass, top_p)) break;
    double w = clrt_tempered_weight(heap[n - 1 - j].logit, mx, temperature);
    mass += w / zk;
    zkeep += w;
    keep++;
  }
  double target = u * zkeep, cum = 0;
  cand pick = heap[n - 1];
  for (int j = 0; j < keep; j++) {
    pick = heap[n - 1 - j];
    cum += clrt_tempered_weight(pick.logit, mx, temperature);
    if (cum > target) break;
  }
  *logprob = (float)(log(clrt_tempered_weight(pick.logit, mx, temperature)) - log(zkeep));
  return pick.id;
}

size_t clrt_sample_row_scratch(int V) { return sizeof(cand) * (size_t)(V > 0 ? V : 1); }

int32_t clrt_sample_row(const float *logits /* [V] */, int V, float temperature, int top_k,
                        float top_p, double u, const uint8_t *allowed /* [V] or NULL */,
                        void *scratch, float *logprob /* out: scalar */) {
  return sample_row(logits, V, temperature, top_k, top_p, u, allowed, (cand *)scratch, logprob);
}

void clrt_top_logprobs_row(const float *logits /* [V] */, int V, int32_t chosen, int k,
                           int32_t *ids /* out: [k] */, float *lps /* out: [k] */,
                           float *chosen_lp /* out: scalar */) {
  float mx = logits[0];
  for (int i = 1; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
  double z = 0;
  for (int i = 0; i < V; i++) z += exp((double)logits[i] - mx);
  double lz = mx + log(z);
  /* k is small: keep the best k in a sorted list, entering only logits above its last. */
  int n = 0;
  for (int i = 0; i < V && k > 0; i++) {
    float x = logits[i];
    if (n == k && !(x > logits[ids[n - 1]])) continue;
    int j = n < k ? n++ : n - 1;
    while (j > 0 && x > logits[ids[j - 1]]) {
      ids[j] = ids[j - 1];
      j--;
    }
    ids[j] = i;
  }
  for (int j = 0; j < n; j++) lps[j] = (float)(logits[ids[j]] - lz);
  *chosen_lp = (float)(logits[chosen] - lz);
}
