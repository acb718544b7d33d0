// sample.cu — kernels/cpu/sample.c's sampler on the device, a block per row. Instead of a
// heap, the sets sample.c builds (top-k, the nucleus, the inverse-CDF pick) are found by
// bisection on clrt_sample_key, a total order equal to the CPU's (logit desc, id asc): each
// probe is one block-wide sum over the row, so a row costs O(64 V) work and no sorting.
// Weights come from sampling.h and sum in double as on the CPU; results can differ from the
// CPU only where a cumulative sum lands within rounding (~1e-16 relative) of a boundary.
#include "common.cuh"
#include "sampling.h"

enum { THREADS = 512 };

struct Row {
  const float *z;
  const uint8_t *allowed;
  int V;
  float mx, temp;
};

__device__ __forceinline__ bool ok(const Row &r, int i) { return !r.allowed || r.allowed[i]; }
__device__ __forceinline__ double wt(const Row &r, int i) {
  return (double)clrt_tempered_weight(r.z[i], r.mx, r.temp);
}

__device__ uint64_t block_max_u64(uint64_t v, uint64_t *sh) {
  for (int o = 16; o > 0; o >>= 1) {
    uint64_t u = __shfl_xor_sync(0xffffffffu, v, o);
    v = u > v ? u : v;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  uint64_t m = 0;
  for (int w = 0; w < (int)(blockDim.x >> 5); w++) m = sh[w] > m ? sh[w] : m;
  return m;
}

// Weight mass of allowed tokens with key >= t (or, by index, with i <= t when by_index).
__device__ double mass_from(const Row &r, uint64_t t, double *sh) {
  double s = 0;
  for (int i = threadIdx.x; i < r.V; i += blockDim.x)
    if (ok(r, i) && clrt_sample_key(r.z[i], i) >= t) s += wt(r, i);
  return clrt_block_sum(s, sh);
}

__device__ double mass_upto(const Row &r, int t, double *sh) {
  double s = 0;
  for (int i = threadIdx.x; i <= t; i += blockDim.x)
    if (ok(r, i)) s += wt(r, i);
  return clrt_block_sum(s, sh);
}

__device__ int count_from(const Row &r, uint64_t t, int *sh) {
  int c = 0;
  for (int i = threadIdx.x; i < r.V; i += blockDim.x)
    if (ok(r, i) && clrt_sample_key(r.z[i], i) >= t) c++;
  return clrt_block_sum(c, sh);
}

static __global__ void sample_rows(const float *logits, int V, const float *temperature, const int32_t *top_k,
                                   const float *top_p, const double *uniforms, const uint8_t *allowed,
                                   int32_t *tokens, float *logprobs) {
  __shared__ double shd[32];
  __shared__ int shi[32];
  __shared__ uint64_t shk[32];
  int b = blockIdx.x;
  Row r;
  r.z = logits + (int64_t)b * V;
  r.allowed = allowed ? allowed + (int64_t)b * V : NULL;
  r.V = V;
  float temp = temperature[b], tp = top_p[b];
  int tk = top_k[b];
  double u = uniforms[b];

  uint64_t best = 0;   // valid keys are > 0: their low word ~id is >= 2^31
  for (int i = threadIdx.x; i < V; i += blockDim.x)
    if (ok(r, i)) {
      uint64_t key = clrt_sample_key(r.z[i], i);
      best = key > best ? key : best;
    }
  best = block_max_u64(best, shk);
  bool lead = threadIdx.x == 0;
  if (best == 0) {
    if (lead) tokens[b] = -1, logprobs[b] = -INFINITY;
    return;
  }
  int arg = clrt_sample_key_id(best);
  if (temp <= 0) {   // greedy: a point mass
    if (lead) tokens[b] = arg, logprobs[b] = 0;
    return;
  }
  r.mx = r.z[arg];
  r.temp = temp;
  double z = mass_from(r, 1, shd);
  bool filtered = (tk > 0 && tk < V) || tp < 1;
  if (!filtered) {
    // First index (in index order) whose running sum exceeds u z; the last allowed if none.
    double target = u * z;
    int lo = 0, hi = V - 1;
    if (mass_upto(r, hi, shd) <= target) {
      int last = -1;
      for (int i = threadIdx.x; i < V; i += blockDim.x)
        if (ok(r, i)) last = i > last ? i : last;
      for (int o = 16; o > 0; o >>= 1) last = max(last, __shfl_xor_sync(0xffffffffu, last, o));
      __syncthreads();
      if ((threadIdx.x & 31) == 0) shi[threadIdx.x >> 5] = last;
      __syncthreads();
      for (int w = 0; w < (int)(blockDim.x >> 5); w++) last = max(last, shi[w]);
      lo = last;
    } else {
      while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (mass_upto(r, mid, shd) > target) hi = mid;
        else lo = mid + 1;
      }
    }
    if (lead) {
      tokens[b] = lo;
      logprobs[b] = (float)(log((double)clrt_tempered_weight(r.z[lo], r.mx, temp)) - log(z));
    }
    return;
  }
  // Top-k: the k-th largest key is the largest t with at least k keys >= t.
  int n = count_from(r, 1, shi);
  int k = (tk > 0 && tk < n) ? tk : n;
  uint64_t kth = 1;
  if (k < n) {
    uint64_t lo = 1, hi = best;
    while (lo < hi) {
      uint64_t mid = lo + (hi - lo) / 2 + 1;
      if (count_from(r, mid, shi) >= k) lo = mid;
      else hi = mid - 1;
    }
    kth = lo;
  }
  double zk = tk > 0 ? mass_from(r, kth, shd) : z;
  // Nucleus: token j is kept while the mass before it (keys > key_j) is below top_p, so the
  // kept set is {key >= t*} with t* the smallest t whose mass strictly above... computed as
  // mass(keys >= t + 1) / zk < top_p; the top token is always kept.
  uint64_t keep_from = best;
  if (tp > 0) {
    uint64_t lo = kth, hi = best;
    while (lo < hi) {   // smallest t in [kth, best] with mass(keys > t) / zk < top_p
      uint64_t mid = lo + (hi - lo) / 2;
      if (mass_from(r, mid + 1, shd) / zk < (double)tp) hi = mid;
      else lo = mid + 1;
    }
    keep_from = lo;
  }
  double zkeep = mass_from(r, keep_from, shd);
  // The pick: the largest key t whose mass of kept keys >= t exceeds u zkeep (the smallest
  // kept key when rounding leaves none).
  double target = u * zkeep;
  uint64_t lo = keep_from, hi = best;
  if (mass_from(r, lo, shd) > target) {
    while (lo < hi) {
      uint64_t mid = lo + (hi - lo) / 2 + 1;
      if (mass_from(r, mid, shd) > target) lo = mid;
      else hi = mid - 1;
    }
  } else {
    // smallest kept key: the largest t with every kept key >= t
    int all = count_from(r, keep_from, shi);
    uint64_t a = keep_from, c = best;
    while (a < c) {
      uint64_t mid = a + (c - a) / 2 + 1;
      if (count_from(r, mid, shi) >= all) a = mid;
      else c = mid - 1;
    }
    lo = a;
  }
  if (lead) {
    int id = clrt_sample_key_id(lo);
    tokens[b] = id;
    logprobs[b] = (float)(log((double)clrt_tempered_weight(r.z[id], r.mx, temp)) - log(zkeep));
  }
}

extern "C" void clrt_cuda_sample(const float *logits, int B, int V, const float *temperature,
                                 const int32_t *top_k, const float *top_p, const double *uniforms,
                                 const uint8_t *allowed, int32_t *tokens, float *logprobs) {
  if (B <= 0) return;
  sample_rows<<<B, THREADS, 0, clrt_cuda_cstream()>>>(logits, V, temperature, top_k, top_p, uniforms,
                                                      allowed, tokens, logprobs);
  CLRT_LAUNCHED("sample");
}
