/* context.c — contexts: one computation's state over a shared model (model_internal.h's
   struct clrt_context), the weights' version a computation reads, and the model's epoch that
   voids every context's activations after a change of layout. The model stays read-only
   while contexts run; what a call needs made from the weights (RoPE tables, packed, bf16 and
   int8 copies) its entry point makes under m->copies_lock before the first product, then
   device.c's policy picks the formats its products read. Calls no other model file. */
#include "model_internal.h"

#include <stdlib.h>

clrt_context *clrt_context_new(clrt_model *m) {
  clrt_context *x = calloc(1, sizeof *x);
  if (!x) {
    clrt_set_error("context: out of host memory");
    return NULL;
  }
  x->m = m;
  x->epoch = m->epoch;
  return x;
}

/* What a context holds, released (the struct itself stays: the default context's is reused). */
void model_context_release(clrt_context *x) {
  clrt_storage_release(x->acts);
  x->acts = NULL;
  x->saved = 0;
  free(x->hidx);
  x->hidx = NULL;
  x->hidx_cap = 0;
  free(x->pack.seg);   /* shared_prefix.c's layout; pre's block holds plen and br too */
  free(x->pack.pre);
  free(x->pack.tok);
  x->pack = (model_pack){0};
  free(x->ws);
  x->ws = NULL;
  x->ws_bytes = 0;
  free(x->xq);
  free(x->xs);
  x->xq = NULL;
  x->xs = NULL;
  x->xq_cap = x->xs_cap = 0;
  free(x->rope_dyn);
  clrt_storage_release(x->rope_dyn_dev);
  x->rope_dyn = NULL;
  x->rope_dyn_dev = NULL;
  x->rope_dyn_len = 0;
}

void clrt_context_free(clrt_context *x) {
  if (!x) return;
  model_context_release(x);
  free(x);
}

clrt_context *clrt_model_context(clrt_model *m) { return m->ctx; }

int model_context_init(clrt_model *m) {
  if (pthread_mutex_init(&m->copies_lock, NULL)) {
    clrt_set_error("model: cannot make the lock of its weight copies");
    return -1;
  }
  if ((m->ctx = clrt_context_new(m))) return 0;
  pthread_mutex_destroy(&m->copies_lock);
  return -1;
}

void model_context_fini(clrt_model *m) {
  if (!m->ctx) return;   /* the lock was made with it */
  clrt_context_free(m->ctx);
  m->ctx = NULL;
  pthread_mutex_destroy(&m->copies_lock);
}

uint64_t model_weights_version(const clrt_model *m) {
  return (m->params ? m->params->version : 0) + (m->b16 ? m->b16->version : 0) +
         (m->lora ? m->lora->params->version : 0);
}

void model_context_begin(clrt_context *x) {
  if (x->epoch != x->m->epoch) {   /* its kept forward is the model's old layout's */
    x->saved = 0;
    if (x->acts && x->acts->device != x->m->device) {   /* moved: the next call makes a new arena */
      clrt_storage_release(x->acts);
      x->acts = NULL;
    }
    x->epoch = x->m->epoch;
  }
}


int model_context_check_version(const clrt_context *x, uint64_t started, const char *who) {
  uint64_t now = model_weights_version(x->m);
  if (now == started) return 0;
  clrt_set_error("%s: the weights changed while it ran (version %llu, now %llu): an optimizer step or "
                 "load ran beside this context; run it again", who, (unsigned long long)started,
                 (unsigned long long)now);
  return -1;
}

void model_forget_contexts(clrt_model *m, int drop_arena) {
  m->epoch++;
  if (!m->ctx) return;
  m->ctx->saved = 0;
  if (drop_arena) {
    clrt_storage_release(m->ctx->acts);
    m->ctx->acts = NULL;
  }
}

uint64_t clrt_context_weights_version(const clrt_context *x) { return x->saved ? x->version : 0; }
