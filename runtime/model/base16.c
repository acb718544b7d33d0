/* base16.c — train.base_dtype=bf16: a base frozen under LoRA adapters keeps its blocks' linear
   weights (q, k, v, o, gate, up, down) only in bf16, and their f32 master copy is freed: the
   adapters train in f32 over it, and the RL reference (the same model with its adapters off)
   reads the same bf16 copy. Products accumulate in f32 (kernels/cpu/linear_bf16.c):
   forward through the packed bf16 tiles on a CPU with AVX512-BF16, backward dx = dy W over
   widened blocks; no dW (frozen). Embeddings (and a tied or untied head), norms and biases
   stay f32: the head's products are the loss's, and at Qwen2.5's vocabulary a bf16 head
   would save 270 MB of 1.3 GB at 0.5B for a second output kernel.
   The weights cannot change once converted: loading, saving, merging, initialising, moving
   and params() views of a bf16 weight are refused with an error saying so. CPU only: the
   CUDA ops have no bf16 base. */
#include "model_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 1 when param p is one of the blocks' linear weights. */
static int is_block_linear(const clrt_model *m, const clrt_param_info *p) {
  if (p->ndim != 2) return 0;
  for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
    const clrt_layer_offsets *o = &m->layer[l];
    int64_t w[7] = {o->wq, o->wk, o->wv, o->wo, o->wg, o->wu, o->wd};
    for (int i = 0; i < 7; i++)
      if (w[i] == p->offset) return 1;
  }
  return 0;
}

/* old offsets -> new ones: the same place in the param that held `old` (a fused tensor's k,
   v or up block lies inside it; -1 stays -1). */
static int64_t remap(const clrt_model *m, const int64_t *old_off, int64_t old) {
  if (old < 0) return old;
  for (int i = 0; i < m->np; i++)
    if (old >= old_off[i] && old < old_off[i] + m->p[i].numel) return m->p[i].offset + (old - old_off[i]);
  return old;   /* unreachable: every offset is a param's */
}

/* Packs a block linear weight [rows, K] into bf16 panels, each row block of a fused tensor on
   its own (the kernels read each block as its own weight). */
void model_base16_pack(const clrt_model *m, const clrt_param_info *p, uint16_t *dst, const float *src) {
  int64_t rows[3], done = 0, K = p->shape[1];
  int nb = model_param_row_blocks(m, p, rows);
  for (int i = 0; i < nb; i++) {
    clrt_linear_pack_bf16(dst + done * K, src + done * K, (int)K, (int)rows[i]);
    done += rows[i];
  }
}

int model_base16_convert(clrt_model *m) {
  const clrt_model_config *c = &m->cfg;
  int64_t *old_off = malloc(sizeof(int64_t) * (size_t)m->np);
  if (!old_off) {
    clrt_set_error("base_dtype=bf16: out of memory");
    return -1;
  }
  int64_t n32 = 0, n16 = 0;
  for (int i = 0; i < m->np; i++) {
    old_off[i] = m->p[i].offset;
    int64_t *n = is_block_linear(m, &m->p[i]) ? &n16 : &n32;
    *n += (m->p[i].numel + 15) & ~(int64_t)15;
  }
  clrt_storage *p32 = clrt_storage_new(sizeof(float) * (size_t)(n32 ? n32 : 1), CLRT_CPU),
               *p16 = p32 ? clrt_storage_new(sizeof(uint16_t) * (size_t)(n16 ? n16 : 1), CLRT_CPU) : NULL;
  if (!p16) {
    clrt_storage_release(p32);
    free(old_off);
    return -1;
  }
  const float *src = m->params->data;
  /* A model not yet loaded nor initialised (clrt.model.load with base_dtype = "bf16" converts
     before reading the file, which then fills the new arenas directly): nothing to copy. */
  int blank = m->params->version == 0;
  for (int i = 0; blank && i < m->np; i++) blank = !m->p[i].loaded;
  /* The old arena is given back behind the copy (clrt_give_back_pages) when the params lie in
     it in order, and the new arenas fill as they are written (clrt_storage_new does not touch
     a large arena's pages): the conversion then peaks at about the f32 arena, not the f32
     arena plus the new ones. */
  int in_order = 1;
  for (int i = 1; i < m->np; i++) in_order &= old_off[i] > old_off[i - 1];
  const void *done = src;   /* given back from its 2 MiB page up to here */
  n32 = n16 = 0;
  for (int i = 0; i < m->np; i++) {
    clrt_param_info *p = &m->p[i];
    const float *from = src + old_off[i];
    if ((p->in16 = is_block_linear(m, p))) {
      /* packed while p and the layer offsets still agree (fused blocks are found by them) */
      if (!blank) model_base16_pack(m, p, (uint16_t *)p16->data + n16, from);
      p->offset = n16;
      n16 += (p->numel + 15) & ~(int64_t)15;
    } else if (blank) {
      p->offset = n32;
      n32 += (p->numel + 15) & ~(int64_t)15;
      continue;
    } else {
      p->offset = n32;
      /* in chunks: a 545 MB embedding copied whole would sit twice in memory */
      for (int64_t k = 0; k < p->numel; k += (int64_t)1 << 22) {
        int64_t len = p->numel - k < ((int64_t)1 << 22) ? p->numel - k : (int64_t)1 << 22;
        memcpy((float *)p32->data + n32 + k, from + k, sizeof(float) * (size_t)len);
        if (in_order) done = clrt_give_back_pages(done, from + k + len);
      }
      n32 += (p->numel + 15) & ~(int64_t)15;
    }
    if (in_order) done = clrt_give_back_pages(done, from + p->numel);
  }
  for (int l = 0; l < c->num_hidden_layers; l++) {
    int64_t *f = &m->layer[l].ln1;   /* the struct is int64_t fields only */
    for (size_t k = 0; k < sizeof(clrt_layer_offsets) / sizeof(int64_t); k++) f[k] = remap(m, old_off, f[k]);
  }
  m->wte = remap(m, old_off, m->wte);
  m->norm = remap(m, old_off, m->norm);
  m->head = remap(m, old_off, m->head);
  free(old_off);
  /* The f32 weights and every copy made from them go. */
  clrt_storage_release(m->params);
  model_copy_drop(&m->wpk);
  model_copy_drop(&m->wbf);
  m->bf16 = 0;
  m->params = p32;
  m->total = n32;
  m->b16 = p16;
  m->base16 = 1;
  m->base16_blank = blank;
  model_forget_contexts(m, 0);
  return 0;
}

int clrt_model_base_bf16(const clrt_model *m) { return m->base16; }

static const uint16_t *W16(const clrt_model *m, int64_t w) { return (const uint16_t *)m->b16->data + w; }

/* ---- the bf16 base format: its products ------------------------------------------------------- */

/* The layer code has no error path through a product: a short workspace fails the step
   (model_workspace), which its entry point reports. w: a b16 offset (the head is no bf16 base
   weight: it stays f32, and its product reads the master's). */
static int base_forward(clrt_model *m, acts *a, float *y, const float *x, int64_t w, const float *b, int64_t N,
                        int K, int O) {
  int fast = model_fast_kernels(m);
  if (!model_workspace(a->cx, clrt_linear_bf16_workspace_bytes(N, K, O, fast), "bf16 base forward"))
    clrt_linear_bf16_forward(y, x, W16(m, w), b, N, K, O, fast, a->cx->ws, a->cx->ws_bytes);
  return 1;
}

/* Products of the same x (q, k, v; gate, up): one parallel pass over all their panels. */
static int base_forward_parts(clrt_model *m, acts *a, const float *x, int64_t N, int K, const lin_part *parts,
                              int count) {
  clrt_packed_part packed[3] = {{0}};
  if (!model_fast_kernels(m) || count > 3) return 0;
  for (int i = 0; i < count; i++) packed[i] = (clrt_packed_part){parts[i].y, W16(m, parts[i].w), parts[i].b, parts[i].O};
  if (model_workspace(a->cx, clrt_linear_packed_bf16_workspace_bytes(N, K), "bf16 base forward")) return 1;
  return clrt_linear_packed_bf16_forward_rows(x, N, K, packed, count, a->cx->ws, a->cx->ws_bytes);
}

/* dx (+)= dy W only: the weight is frozen (GW is NULL under LoRA); a bias's gradient would be
   one too, so db is NULL here as well. */
static int base_backward(clrt_model *m, acts *a, float *dx, int64_t w, float *db, const float *dy, const float *x,
                         int64_t N, int K, int O, int acc) {
  (void)db, (void)x;
  if (dx && !model_workspace(a->cx, clrt_linear_bf16_backward_dx_workspace_bytes(K, O), "bf16 base backward"))
    clrt_linear_bf16_backward_dx(dx, dy, W16(m, w), N, K, O, acc, model_fast_kernels(m), a->cx->ws, a->cx->ws_bytes);
  return 1;
}

/* Made by model_base16_convert (each row block of a fused tensor on its own), never refreshed:
   the base is frozen. Its kernels take the bf16 tiles where the CPU has them, f32 loops else. */
static const linear_kernels base = {"bf16 base", base_forward, base_forward_parts, base_backward};
const weight_format model_bf16_base = {"bf16 base: panels of pairs along K per row block (b16)", 0, NULL, NULL,
                                       FORMAT_LEVELS(&base, &base)};
