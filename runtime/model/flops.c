/* flops.c — achieved-throughput bookkeeping: FLOPs of a training step and the GPU's peak, so
   benchmarks and training logs can print TFLOP/s and MFU. */
#include "model_internal.h"

#include <stdlib.h>
#include <string.h>

double clrt_model_train_flops(const clrt_model *m, int B, int T) {
  const clrt_model_config *c = &m->cfg;
  /* Every parameter that multiplies activations: all but an untied embedding (a lookup). */
  double n = (double)clrt_model_num_params(m);
  if (!c->tie_word_embeddings) n -= (double)c->vocab_size * c->hidden_size;
  double tokens = (double)B * T;
  /* q k^T and p v over the keys a query sees: T, or a sliding window's W when shorter */
  double attn = 0;
  for (int l = 0; l < c->num_hidden_layers; l++) {
    int W = model_layer_window(m, l), keys = W > 0 && W < T ? W : T;
    attn += 6.0 * (double)c->num_attention_heads * c->head_dim * (double)T * keys * B;
  }
  const model_lora *lo = m->lora;
  if (!lo || !lo->enabled) return 6.0 * n * tokens + attn;
  /* LoRA: a frozen weight needs its forward and input-gradient products (4 per parameter and
     token), never its weight gradient; an adapter's parameters need all 6, except the
     embedding adapter's A, which is a lookup. */
  double adapters = (double)lo->total;
  if (lo->emb[0] >= 0) adapters -= (double)lo->r * c->vocab_size;
  return 4.0 * n * tokens + 6.0 * adapters * tokens + attn;
}

/* Dense bf16 tensor-core peaks (no sparsity), TFLOP/s, matched by name; first match wins. */
static const struct {
  const char *name;
  double tflops;
} peaks[] = {
    {"H100 PCIe", 756}, {"H100 NVL", 835}, {"H100", 989}, {"H200", 989}, {"GH200", 989},
    {"H800", 989},      {"A100", 312},     {"A800", 312}, {"L40S", 362}, {"L4", 121},
    {"A10", 125},       {"RTX 4090", 165}, {"RTX 3090", 71},
};

double clrt_cuda_peak_tflops(void) {
  const char *env = getenv("CLRT_PEAK_TFLOPS");
  if (env && *env) {
    double v = atof(env);
    if (v > 0) return v;
  }
  const char *name = clrt_cuda_device_name_str();
  if (!name || !*name) return 0;
  for (size_t i = 0; i < sizeof peaks / sizeof peaks[0]; i++)
    if (strstr(name, peaks[i].name)) return peaks[i].tflops;
  return 0;
}
