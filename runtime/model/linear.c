/* linear.c — the layer code's products. A product is the base weight's, through the ops
   table (weights.c's policy picks the copy and kernel for the device and precision), then the
   LoRA adapter beside it when one is attached; forward.c and backward.c call these once per
   product and never name adapters themselves. */
#include "model_internal.h"

void model_linear(clrt_model *m, acts *a, layer_acts *A, int l, int keep, const float *x, int64_t N,
                  int K, const lin_part *parts, int count) {
  const model_ops *op = a->cx->ops;   /* the computation's: quant=int8 decodes with its own */
  if (count == 1)
    PROF(CLRT_K_LINEAR_F, op->linear(m, a, parts[0].y, x, parts[0].w, parts[0].b, N, K, parts[0].O));
  else
    PROF(CLRT_K_LINEAR_F, op->linear_parts(m, a, x, N, K, parts, count));
  if (!m->lora) return;
  PROF(CLRT_K_LORA, {
    for (int i = 0; i < count; i++)
      model_lora_forward(m, a, A, l, parts[i].lora, parts[i].y, x, N, K, parts[i].O, keep);
  });
}

void model_linear_backward(clrt_model *m, acts *a, const layer_acts *A, int l, int target, float *dx,
                           int64_t w, float *db, const float *dy, const float *x, int64_t N, int K,
                           int O, int acc) {
  PROF(CLRT_K_LINEAR_B, a->cx->ops->linear_backward(m, a, dx, w, db, dy, x, N, K, O, acc));
  if (m->lora) PROF(CLRT_K_LORA, model_lora_backward(m, a, A, l, target, dx, dy, x, N, K, O));
}
