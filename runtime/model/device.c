/* device.c — where the model runs: the ops table for its device and precision, and moves of
   its arenas between the CPU and a CUDA device. */
#include "model_internal.h"

#include <stddef.h>

void model_choose_ops(clrt_model *m) {
  if (m->device == CLRT_CPU) m->ops = m->base16 ? &model_cpu_base16_ops : m->bf16 ? &model_cpu_bf16_ops : &model_cpu_ops;
  else m->ops = model_cuda_ops(m->bf16);
}

typedef int (*copy_fn)(void *dst, const void *src, size_t bytes);

/* A copy of s on `device` through copy (NULL: none in this build; the allocator fails first),
   or NULL with the allocator's message. */
static clrt_storage *copy_storage(const clrt_storage *s, int device, copy_fn copy) {
  clrt_storage *n = clrt_storage_new(s->bytes, device);
  if (!n) return NULL;
  if (!copy) clrt_set_error("model: no copy to device %d in this build", device);
  if (!copy || copy(n->data, s->data, s->bytes)) {
    clrt_storage_release(n);
    return NULL;
  }
  return n;
}

int clrt_model_device(const clrt_model *m) { return m->device; }

int clrt_model_to_device(clrt_model *m, int device) {
  if (device != CLRT_CPU && device != CLRT_CUDA) {
    clrt_set_error("model: unknown device %d (cpu, cuda)", device);
    return -1;
  }
  if (device == m->device) return 0;
  if (m->cfg.gemma3 && device == CLRT_CUDA) {
    clrt_set_error("model:to: Gemma3ForCausalLM runs on the cpu only (its (1 + w) norms, GELU-tanh MLP and "
                   "scaled, soft-capped attention have no CUDA kernels yet); use device=cpu");
    return -1;
  }
  if (m->base16) {
    clrt_set_error("model:to: a bf16 base (base_dtype=bf16) runs on the cpu only (the CUDA ops have no "
                   "bf16 base yet); use base_dtype=f32 on cuda");
    return -1;
  }
  /* The copy runs on the device's side: a download from it, or an upload to it. */
  const model_ops *to = device == CLRT_CPU ? &model_cpu_ops : model_cuda_ops(0);
  copy_fn copy = device == CLRT_CPU ? m->ops->download : to ? to->upload : NULL;
  /* Both copies first, so running out of memory leaves the model whole where it was. */
  clrt_storage *np = copy_storage(m->params, device, copy), *ng = NULL, *lp = NULL, *lg = NULL;
  if (!np) return -1;
  if ((m->grads && !(ng = copy_storage(m->grads, device, copy))) ||
      (m->lora && (!(lp = copy_storage(m->lora->params, device, copy)) ||
                   !(lg = copy_storage(m->lora->grads, device, copy))))) {
    clrt_storage_release(np);
    clrt_storage_release(ng);
    clrt_storage_release(lp);
    return -1;
  }
  if (m->lora) {   /* the adapters move with the base */
    clrt_storage_release(m->lora->params);
    clrt_storage_release(m->lora->grads);
    m->lora->params = lp;
    m->lora->grads = lg;
  }
  clrt_storage_release(m->params);
  clrt_storage_release(m->grads);
  m->params = np;
  m->grads = ng;
  /* Activations are rebuilt on the new device by the next call. */
  clrt_storage_release(m->acts);
  m->acts = NULL;
  m->saved = 0;
  m->device = device;
  /* The bf16 and packed copies live beside the weights: a move drops them (set_matmul again;
     the packed copy is remade by the next CPU decode). */
  clrt_storage_release(m->wbf);
  m->wbf = NULL;
  m->bf16 = 0;
  clrt_storage_release(m->wpk);
  m->wpk = NULL;
  model_q8_free(m->q8);   /* int8 copies too (set_quant again) */
  m->q8 = NULL;
  model_choose_ops(m);
  return model_sync_rope(m);
}
