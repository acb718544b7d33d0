/* optim.c — fused AdamW over a model's parameter arena: global-norm clipping, then one pass
   per tensor updating parameters and both moments (math in kernels/model_math.h). */
#include "model_internal.h"
#include "cpu/model_kernels.h"
#include "model_math.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

struct clrt_adamw {
  clrt_model *m;
  clrt_storage *m1, *m2;   /* exp_avg, exp_avg_sq: laid out like the params arena */
  uint8_t *decay;          /* [np] */
  int64_t step;
  int device;              /* where the moments live: the model's device at creation */
  int lora;                /* walks the model's LoRA adapters (the base is frozen) */
  clrt_storage *gpu;       /* on a device: the ops' tensor table for its fused step */
};

clrt_adamw *clrt_adamw_new(clrt_model *m, const uint8_t *decay) {
  clrt_adamw *o = calloc(1, sizeof *o);
  if (!o) goto oom;
  o->m = m;
  o->lora = m->lora != NULL;
  param_set ps = model_param_set(m, o->lora);
  o->decay = calloc((size_t)ps.np, 1);
  if (!o->decay) goto oom;
  for (int i = 0; i < ps.np; i++) o->decay[i] = decay ? decay[i] != 0 : ps.p[i].ndim == 2;
  size_t bytes = sizeof(float) * (size_t)ps.total;
  o->device = clrt_model_device(m);
  if (!(o->m1 = clrt_storage_new(bytes, o->device)) || !(o->m2 = clrt_storage_new(bytes, o->device))) {
    clrt_adamw_free(o);
    return NULL;
  }
  if (m->ops->adamw_table && !(o->gpu = m->ops->adamw_table(ps.p, ps.np, o->decay))) {
    clrt_adamw_free(o);
    return NULL;
  }
  return o;
oom:
  clrt_adamw_free(o);
  clrt_set_error("adamw: out of memory");
  return NULL;
}

void clrt_adamw_free(clrt_adamw *o) {
  if (!o) return;
  clrt_storage_release(o->m1);
  clrt_storage_release(o->m2);
  clrt_storage_release(o->gpu);
  free(o->decay);
  free(o);
}

int64_t clrt_adamw_get_step(const clrt_adamw *o) { return o->step; }
void clrt_adamw_set_step(clrt_adamw *o, int64_t step) { o->step = step; }

size_t clrt_adamw_memory(const clrt_adamw *o) { return o->m1->bytes + o->m2->bytes; }

clrt_tensor *clrt_adamw_moment(clrt_adamw *o, int which, int i) {
  param_set ps = model_param_set(o->m, o->lora);
  if (i < 0 || i >= ps.np || which < 0 || which > 1) {
    clrt_set_error("adamw: moment %d of tensor %d out of range", which, i);
    return NULL;
  }
  const clrt_param_info *p = &ps.p[i];
  return clrt_tensor_over(which ? o->m2 : o->m1, CLRT_F32, p->ndim, p->shape, NULL, p->offset);
}

/* The model, the hyperparameters and the devices suit a step: 0, or -1 with the error set. */
static int step_check(clrt_adamw *o, param_set *ps, float lr, float beta1, float beta2, float eps) {
  clrt_model *m = o->m;
  if (o->lora != (m->lora != NULL)) {
    clrt_set_error("adamw: the optimizer was made %s LoRA adapters and the model now has %s "
                   "(create the optimizer after add_lora)", o->lora ? "for" : "before", o->lora ? "none" : "them");
    return -1;
  }
  *ps = model_param_set(m, o->lora);
  if (!ps->grads) {
    clrt_set_error("adamw: the model has no gradients yet (run backward first)");
    return -1;
  }
  if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1 && eps >= 0 && lr >= 0)) {
    clrt_set_error("adamw: need 0 <= betas < 1, eps >= 0 and lr >= 0 (lr %g, betas %g %g, eps %g)",
                   lr, beta1, beta2, eps);
    return -1;
  }
  if (clrt_model_device(m) != o->device) {
    clrt_set_error("adamw: the optimizer's moments are on %s but the model is on %s (create the "
                   "optimizer after moving the model)", o->device ? "cuda" : "cpu",
                   clrt_model_device(m) ? "cuda" : "cpu");
    return -1;
  }
  return 0;
}

/* Once a host step knows the gradient norm: a non-finite one skips the step (an error),
   else the step is counted and its clip scale and bias corrections are given. */
static int begin_host_step(clrt_adamw *o, double norm, float grad_clip, float beta1, float beta2,
                           float *gscale, float *bc1, float *bc2_sqrt) {
  if (!isfinite(norm)) {
    clrt_set_error("adamw: gradient norm is %g; the step was skipped", norm);
    return -1;
  }
  *gscale = clrt_clip_scale(norm, grad_clip);
  o->step++;
  *bc1 = (float)(1.0 - pow(beta1, (double)o->step));
  *bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)o->step));
  return 0;
}

/* 1 when param p is one linear weight, or consecutive row blocks that each are one. */
static int linear_blocks(const clrt_model *m, const clrt_param_info *p) {
  int64_t base = 0;
  int K, O;
  while (base < p->numel && model_linear_dims(m, p->offset + base, &K, &O)) base += (int64_t)O * K;
  return base == p->numel && p->numel > 0;
}

int clrt_adamw_step(clrt_adamw *o, float lr, float beta1, float beta2, float eps,
                    float weight_decay, float grad_clip, double *grad_norm) {
  clrt_model *m = o->m;
  param_set ps;
  if (step_check(o, &ps, lr, beta1, beta2, eps)) return -1;
  float *P = ps.params->data, *G = ps.grads->data, *M1 = o->m1->data, *M2 = o->m2->data;
  if (o->gpu) {
    /* Norm, clip and update all on the device; the norm comes back once, after the update
       (which the device step itself skips when the norm is not finite). */
    float bc1 = (float)(1.0 - pow(beta1, (double)(o->step + 1)));
    float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)(o->step + 1)));
    double norm = 0;
    if (m->ops->adamw_step(o->gpu, ps.np, P, M1, M2, G, ps.total, lr, beta1, beta2, eps, weight_decay, grad_clip,
                           bc1, bc2_sqrt, &norm))
      return -1;
    if (grad_norm) *grad_norm = norm;
    if (!isfinite(norm)) {
      clrt_set_error("adamw: gradient norm is %g; the step was skipped", norm);
      return -1;
    }
    o->step++;
    /* the bf16 and packed copies follow the weights; the adapters' writes must show too: the
       prefix cache keys its blocks by the storages' versions (clrt_model_weights_stamp) */
    if (o->lora) clrt_storage_written(m->lora->params);
    else clrt_model_params_changed(m);
    return 0;
  }
  /* The padding between tensors stays zero in grads, so the whole arena sums correctly. */
  double ss = 0;
#pragma omp parallel for reduction(+ : ss) schedule(static)
  for (int64_t k = 0; k < ps.total; k++) ss += (double)G[k] * G[k];
  double norm = sqrt(ss);
  if (grad_norm) *grad_norm = norm;
  float gscale, bc1, bc2_sqrt;
  if (begin_host_step(o, norm, grad_clip, beta1, beta2, &gscale, &bc1, &bc2_sqrt)) return -1;
  /* The weight copies the products read (packed f32, bf16 panels) are refreshed here, each
     thread packing the rows it has just updated while they are in cache: no repack of the
     whole model after the step. A linear weight is then split in whole 48-row panels (a
     multiple of 16 elements, so the update's bits are those of any other split). */
  int keep = o->lora ? 0 : model_copies_to_keep(m);
  int keep8 = !o->lora && model_q8_current(m);   /* quant=int8's copies, refreshed the same way */
  /* a tensor that starts a linear weight but is not wholly made of them: its copies cannot
     be refreshed row by row, so the whole copies are remade when next needed */
  for (int i = 0; (keep || keep8) && i < ps.np; i++) {
    int K, O;
    if (model_linear_dims(m, ps.p[i].offset, &K, &O) && !linear_blocks(m, &ps.p[i])) keep = keep8 = 0;
  }
  /* One parallel region for all tensors: many are tiny (norms, biases), and a fork/join per
     tensor costs more than their update. */
#pragma omp parallel
  for (int i = 0; i < ps.np; i++) {
    const clrt_param_info *p = &ps.p[i];
    float decay = o->decay[i] ? lr * weight_decay : 0.0f;
    float *pp = P + p->offset, *gg = G + p->offset, *m1 = M1 + p->offset, *m2 = M2 + p->offset;
    int64_t nth = omp_get_num_threads(), th = omp_get_thread_num(), k0, k1;
    int K, O;
    if ((keep || keep8) && linear_blocks(m, p)) {
      /* each linear weight the tensor holds (a fused one, as Phi-3's qkv_proj, holds several
         consecutive row blocks, each packed on its own) */
      for (int64_t base = 0; base < p->numel && model_linear_dims(m, p->offset + base, &K, &O); base += (int64_t)O * K) {
        int64_t panels = (O + 47) / 48;
        int r0 = (int)(48 * (panels * th / nth)), r1 = (int)(48 * (panels * (th + 1) / nth));
        if (r1 > O) r1 = O;
        for (int a = r0; a < r1; a += 4 * 48) {   /* four panels at a time: packed from cache */
          int b = r1 - a < 4 * 48 ? r1 : a + 4 * 48;
          k0 = base + (int64_t)a * K, k1 = base + (int64_t)b * K;
          clrt_adamw_span(pp + k0, m1 + k0, m2 + k0, gg + k0, k1 - k0, gscale, lr, beta1, beta2, eps, decay, bc1,
                          bc2_sqrt);
          model_copy_rows(m, keep, p->offset + base, K, O, a, b);
          if (keep8) model_q8_copy_rows(m, p->offset + base, K, O, a, b);
        }
      }
      continue;
    }
    /* this thread's share, 16-aligned (kernels/cpu/adamw.c: 16 lanes, clrt_adamw_update's bits) */
    int64_t blocks = (p->numel + 15) / 16;
    k0 = 16 * (blocks * th / nth), k1 = 16 * (blocks * (th + 1) / nth);
    if (k1 > p->numel) k1 = p->numel;
    if (k1 > k0)
      clrt_adamw_span(pp + k0, m1 + k0, m2 + k0, gg + k0, k1 - k0, gscale, lr, beta1, beta2, eps, decay, bc1,
                      bc2_sqrt);
  }
  /* adapters: the base and its copies stand, the adapters' storage counts the write (the
     prefix cache keys its blocks by it) */
  if (o->lora) {
    clrt_storage_written(m->lora->params);
  } else {
    clrt_model_params_changed(m);
    model_copies_kept(m, keep);
    if (keep8) model_q8_kept(m);
  }
  return 0;
}

int clrt_adamw_step_range(clrt_adamw *o, int64_t lo, int64_t hi, double grad_norm, float lr, float beta1,
                          float beta2, float eps, float weight_decay, float grad_clip) {
  param_set ps;
  if (step_check(o, &ps, lr, beta1, beta2, eps)) return -1;
  if (o->device != CLRT_CPU) {
    clrt_set_error("adamw: a step over a slice of the parameters runs in host memory only");
    return -1;
  }
  if (lo < 0 || hi < lo || hi > ps.total) {
    clrt_set_error("adamw: slice [%lld, %lld) is outside the %lld parameters", (long long)lo, (long long)hi,
                   (long long)ps.total);
    return -1;
  }
  float gscale, bc1, bc2_sqrt;
  if (begin_host_step(o, grad_norm, grad_clip, beta1, beta2, &gscale, &bc1, &bc2_sqrt)) return -1;
  float *P = ps.params->data, *G = ps.grads->data, *M1 = o->m1->data, *M2 = o->m2->data;
  /* the tensors' parts inside [lo, hi): the same update, element by element, as the whole step */
#pragma omp parallel
  for (int i = 0; i < ps.np; i++) {
    const clrt_param_info *p = &ps.p[i];
    int64_t a = p->offset > lo ? p->offset : lo, b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
    if (b <= a) continue;
    float decay = o->decay[i] ? lr * weight_decay : 0.0f;
#pragma omp for schedule(static) nowait
    for (int64_t k = a; k < b; k++)
      clrt_adamw_update(&P[k], &M1[k], &M2[k], G[k] * gscale, lr, beta1, beta2, eps, decay, bc1, bc2_sqrt);
  }
  if (o->lora) clrt_storage_written(o->m->lora->params);   /* as above */
  else clrt_model_params_changed(o->m);
  return 0;
}

int clrt_adamw_keep_slice(clrt_adamw *o, int64_t lo, int64_t hi) {
  int64_t n = model_param_set(o->m, o->lora).total;
  if (o->device != CLRT_CPU) {
    clrt_set_error("adamw: keep_slice runs in host memory only");
    return -1;
  }
  if (lo < 0 || hi < lo || hi > n) {
    clrt_set_error("adamw: slice [%lld, %lld) is outside the %lld parameters", (long long)lo, (long long)hi,
                   (long long)n);
    return -1;
  }
  clrt_storage *ms[2] = {o->m1, o->m2};
  for (int i = 0; i < 2; i++) {
    const float *d = ms[i]->data;
    clrt_give_back_pages(d, d + lo);
    clrt_give_back_pages(d + hi, d + n);
  }
  return 0;
}

int64_t clrt_adamw_numel(clrt_adamw *o) { return model_param_set(o->m, o->lora).total; }
