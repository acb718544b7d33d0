/* device.c — where the model runs and at what precision: the ops table for its device and
   precision (a new model, set_matmul, set_base_dtype), the weight format each computation's
   linear products read (the one policy), and moves of its arenas between the CPU and a CUDA
   device. */
#include "model_internal.h"

#include <stddef.h>

void model_choose_ops(clrt_model *m) {
  if (m->device == CLRT_CPU) m->ops = &model_cpu_ops;
  else m->ops = model_cuda_ops(m->bf16);
}

/* A new model starts on the CPU in f32: params.c lays it out, its ops are chosen here. */
clrt_model *clrt_model_new(const clrt_model_config *cfg) {
  clrt_model *m = model_params_new(cfg);
  if (m) model_choose_ops(m);
  return m;
}

/* The precision switches: the bf16 base (base16.c converts) and bf16 products (weights.c's
   copies), each with the ops that run it. */
int clrt_model_set_base_bf16(clrt_model *m) {
  if (m->base16) return 0;
  if (model_mode_allows(m, MODE_BF16_BASE, "base_dtype=bf16") || model_base16_convert(m)) return -1;
  model_choose_ops(m);
  return 0;
}

int clrt_model_set_matmul_bf16(clrt_model *m, int on) {
  if (on && model_mode_allows(m, MODE_F32_WEIGHTS, "set_matmul(\"bf16\")")) return -1;
  if (!on) {
    model_copy_drop(&m->wbf);
    m->bf16 = 0;
    model_choose_ops(m);
    return 0;
  }
  /* On a CPU with a matrix unit every product runs in bf16: the transposed panels too. */
  const clrt_model_config *c = &m->cfg;
  int t = m->device == CLRT_CPU && m->pack_decode && clrt_matrix_unit() != CLRT_UNIT_F32 &&
          c->num_key_value_heads * c->head_dim % 2 == 0 && c->intermediate_size % 2 == 0 &&
          c->hidden_size % 2 == 0 && c->num_attention_heads * c->head_dim % 2 == 0;
  size_t need = sizeof(uint16_t) * (size_t)m->total * (t ? 2 : 1);
  if (m->wbf.s && m->wbf.s->bytes != need) model_copy_drop(&m->wbf);
  if (!m->wbf.s && !(m->wbf.s = clrt_storage_new(need, m->device))) return -1;
  /* bf16 decode reads the bf16 copies: the packed f32 ones would only take memory. */
  model_copy_drop(&m->wpk);
  /* The activation layout gains the bf16 scratch: rebuild it on the next call. */
  model_forget_contexts(m, 1);
  m->bf16 = 1;
  m->wbf.version = COPY_STALE;
  model_choose_ops(m);
  return 0;
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
  if (device == CLRT_CUDA && model_mode_allows(m, MODE_ON_CUDA, "model:to")) return -1;
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
  model_forget_contexts(m, 1);
  m->device = device;
  /* The bf16 and packed copies live beside the weights: a move drops them (set_matmul again;
     the packed copy is remade by the next CPU decode). */
  model_copy_drop(&m->wbf);
  m->bf16 = 0;
  model_copy_drop(&m->wpk);
  model_q8_free(m->q8);   /* int8 copies too (set_quant again) */
  m->q8 = NULL;
  model_choose_ops(m);
  return model_sync_rope(m);
}

/* ---- the products' policy: which weight format a computation reads ----------------------------- */

/* CPU f32: f32 panels when the packed copy is current (weights.c), else f32 rows (the tiles
   past a decode step's rows, sgemm with set_decode_pack(false), row-wise when batch
   invariant). CPU bf16: the bf16 copy in the format it was made in (bf16 pairs where the CPU
   takes panels, with the transposed half where a matrix unit runs bf16 backward too, else
   bf16 rows). A bf16 base: its panels; a quant=int8 decode step: int8 blocks; CUDA: cuBLAS.
   The master is f32 rows in the model's kernel set. The copies' kernels were chosen when they
   were made; the others' are looked up here, once per computation. */

void model_context_choose(clrt_context *x, int decode) {
  clrt_model *m = x->m;
  if (m->device != CLRT_CPU) {   /* cuBLAS takes every shape: nothing falls back */
    x->format = model_cuda_format(m->bf16);
    x->lin = x->master = model_format_kernels(x->format);
    return;
  }
  int fast = model_fast_kernels(m);
  const weight_format *master = &model_f32_rows[m->batch_invariant ? (fast ? F32_TILES_INVARIANT : F32_BLAS_INVARIANT)
                                                                   : (fast ? F32_TILES : F32_BLAS)];
  x->master = model_format_kernels(master);
  weight_copy *copy = m->bf16                            ? &m->wbf
                      : model_copy_current(m, &m->wpk) ? &m->wpk
                                                         : NULL;
  if (m->base16) x->format = &model_bf16_base, x->lin = model_format_kernels(x->format);
  else if (decode && model_q8_active(m)) x->format = &model_int8_blocks, x->lin = model_format_kernels(x->format);
  else if (copy) x->format = copy->format, x->lin = model_copy_kernels(copy);
  else x->format = master, x->lin = x->master;
  if (!x->lin) x->lin = x->master;   /* the format has no kernels at the level now in use */
}

const char *clrt_model_products(const clrt_model *m, int which) {
  const clrt_context *x = m->ctx;
  if (!x->format) return NULL;
  return which == 0 ? x->format->name : which == 1 ? x->lin->name : which == 2 ? x->master->name : NULL;
}

