/* linear.c — the layer code's products. A product is the base weight's, through the kernels
   of the weight format the context's computation reads (device.c's policy), then the
   LoRA adapter beside it when one is attached; forward.c and backward.c call these once per
   product and never name adapters themselves. */
#include "model_internal.h"

/* Through the context's format: products of one x in one pass where the format has one, else
   each; a product the format declines runs on the master weights. */
static void linear_base(clrt_model *m, acts *a, const float *x, int64_t N, int K, const lin_part *parts,
                        int count) {
  const linear_kernels *f = a->cx->lin, *master = a->cx->master;
  if (count > 1 && f->forward_parts && f->forward_parts(m, a, x, N, K, parts, count)) return;
  for (int i = 0; i < count; i++)
    if (!f->forward(m, a, parts[i].y, x, parts[i].w, parts[i].b, N, K, parts[i].O))
      master->forward(m, a, parts[i].y, x, parts[i].w, parts[i].b, N, K, parts[i].O);
}

void model_linear_head(clrt_model *m, acts *a, float *logits, const float *xn, int64_t B) {
  const clrt_context *cx = a->cx;
  const linear_kernels *f = cx->format->head ? cx->lin : cx->master;
  int C = m->cfg.hidden_size, V = m->cfg.vocab_size;
  if (!f->forward(m, a, logits, xn, m->head, NULL, B, C, V)) cx->master->forward(m, a, logits, xn, m->head, NULL, B, C, V);
}

void model_linear(clrt_model *m, acts *a, layer_acts *A, int l, int keep, const float *x, int64_t N,
                  int K, const lin_part *parts, int count) {
  PROF(CLRT_K_LINEAR_F, linear_base(m, a, x, N, K, parts, count));
  if (!m->lora) return;
  PROF(CLRT_K_LORA, {
    for (int i = 0; i < count; i++)
      model_lora_forward(m, a, A, l, parts[i].lora, parts[i].y, x, N, K, parts[i].O, keep);
  });
}

void model_linear_backward(clrt_model *m, acts *a, const layer_acts *A, int l, int target, float *dx,
                           int64_t w, float *db, const float *dy, const float *x, int64_t N, int K,
                           int O, int acc) {
  const linear_kernels *f = a->cx->lin;
  PROF(CLRT_K_LINEAR_B, {
    if (!f->backward || !f->backward(m, a, dx, w, db, dy, x, N, K, O, acc))
      a->cx->master->backward(m, a, dx, w, db, dy, x, N, K, O, acc);
  });
  if (m->lora) PROF(CLRT_K_LORA, model_lora_backward(m, a, A, l, target, dx, dy, x, N, K, O));
}
