/* load_save.c — the parameters in and out of safetensors files (one file or a sharded set,
   each tensor checked against the config's shape; saving copies a GPU model's arena to the
   host once), or drawn from a seed. */
#include "model_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int find_param(const clrt_model *m, const char *name) {
  for (int i = 0; i < m->np; i++)
    if (strcmp(m->p[i].name, name) == 0) return i;
  return -1;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < ndim && k < n; d++)
    k += (size_t)snprintf(buf + k, n - k, d ? ", %lld" : "%lld", (long long)shape[d]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

/* A bf16 base converted before its first tensor was read (clrt.model.load with base_dtype =
   "bf16") takes its files (one, or the shards) here until every tensor is in. */
static int loading_into_base16(const clrt_model *m) {
  if (!m->base16 || !m->base16_blank) return 0;
  for (int i = 0; i < m->np; i++)
    if (!m->p[i].loaded) return 1;
  return 0;
}

/* A block linear weight of a bf16 base: read as f32 into a buffer the size of the largest such
   weight (kept across the file's tensors: *buf, *cap), then packed into the bf16 arena, so the
   f32 copy of the weights exists one tensor at a time. */
static int read_into_base16(clrt_model *m, clrt_safetensors *st, int i, const clrt_param_info *p, float **buf,
                            int64_t *cap) {
  if (p->numel > *cap) {
    free(*buf);
    if (!(*buf = malloc(sizeof(float) * (size_t)p->numel))) {
      *cap = 0;
      clrt_set_error("safetensors: out of memory reading '%s' for the bf16 base", p->name);
      return -1;
    }
    *cap = p->numel;
  }
  if (clrt_safetensors_read_f32(st, i, *buf, p->numel)) return -1;
  model_base16_pack(m, p, (uint16_t *)m->b16->data + p->offset, *buf);
  return 0;
}

int clrt_model_load_safetensors(clrt_model *m, const char *path) {
  if (!loading_into_base16(m) && model_mode_allows(m, MODE_F32_WEIGHTS, "model load")) return -1;
  if (m->device != CLRT_CPU) {
    clrt_set_error("safetensors %s: load the model on the cpu, then move it with to(\"cuda\")", path);
    return -1;
  }
  clrt_safetensors *st = clrt_safetensors_open(path);
  if (!st) return -1;
  int n = clrt_safetensors_count(st), rc = -1;
  float *buf16 = NULL;   /* read_into_base16's buffer */
  int64_t cap16 = 0;
  for (int i = 0; i < n; i++) {
    const char *name = clrt_safetensors_name(st, i);
    int j = find_param(m, name);
    if (j < 0) {
      size_t len = strlen(name);
      /* Tied checkpoints sometimes also store the head; old Llama ones store inv_freq. */
      if ((m->cfg.tie_word_embeddings && strcmp(name, "lm_head.weight") == 0) ||
          (len > 19 && strcmp(name + len - 19, "rotary_emb.inv_freq") == 0))
        continue;
      clrt_set_error("safetensors %s: unexpected tensor '%s': not a parameter of this model "
                     "(does config.json match the checkpoint?)", path, name);
      goto done;
    }
    clrt_param_info *p = &m->p[j];
    if (p->loaded) {
      clrt_set_error("safetensors %s: tensor '%s' was already loaded from another file", path, name);
      goto done;
    }
    int nd = clrt_safetensors_ndim(st, i);
    int64_t shape[CLRT_MAX_DIMS];
    for (int d = 0; d < nd; d++) shape[d] = clrt_safetensors_dim(st, i, d);
    int same = nd == p->ndim;
    for (int d = 0; same && d < nd; d++) same = shape[d] == p->shape[d];
    if (!same) {
      char have[128], want[128];
      shape_str(have, sizeof have, nd, shape);
      shape_str(want, sizeof want, p->ndim, p->shape);
      clrt_set_error("safetensors %s: tensor '%s' has shape %s but config.json implies %s", path,
                     name, have, want);
      goto done;
    }
    if (p->in16 ? read_into_base16(m, st, i, p, &buf16, &cap16)
                : clrt_safetensors_read_f32(st, i, PW(m, p->offset), p->numel))
      goto done;
    p->loaded = 1;
  }
  clrt_model_params_changed(m);
  rc = 0;
done:
  free(buf16);
  clrt_safetensors_close(st);
  return rc;
}

int clrt_model_check_loaded(const clrt_model *m, const char *where) {
  for (int i = 0; i < m->np; i++)
    if (!m->p[i].loaded) {
      clrt_set_error("model %s: tensor '%s' is missing from the checkpoint", where, m->p[i].name);
      return -1;
    }
  return 0;
}

int clrt_model_save_safetensors(const clrt_model *m, const char *path) {
  if (model_mode_allows(m, MODE_F32_WEIGHTS, "model save")) return -1;
  const char **names = calloc((size_t)m->np, sizeof *names);
  const clrt_tensor **ts = calloc((size_t)m->np, sizeof *ts);
  int rc = -1, made = 0;
  clrt_storage *src = m->params, *host = NULL;
  if (!names || !ts) {
    clrt_set_error("model: out of memory saving %s", path);
    goto done;
  }
  if (m->device != CLRT_CPU) {   /* one copy of the arena to the host, written from there */
    if (!(host = clrt_storage_new(m->params->bytes, CLRT_CPU)) ||
        m->ops->download(host->data, m->params->data, m->params->bytes))
      goto done;
    src = host;
  }
  for (; made < m->np; made++) {
    names[made] = m->p[made].name;
    if (!(ts[made] = model_param_view(src, &m->p[made]))) goto done;
  }
  const char *mk[1] = {"format"}, *mv[1] = {"pt"};
  rc = clrt_safetensors_write(path, m->np, names, ts, 1, mk, mv);
done:
  for (int i = 0; i < made; i++) clrt_tensor_free((clrt_tensor *)ts[i]);
  clrt_storage_release(host);
  free(names);
  free(ts);
  return rc;
}

/* Weights from a seed instead of a file: normal(0, 0.02) matrices (0.02 / sqrt(2 L) for the
   projections into the residual stream), norms at their identity, biases zero. */
int clrt_model_init_random(clrt_model *m, uint64_t seed) {
  if (model_mode_allows(m, MODE_F32_WEIGHTS, "model init")) return -1;
  clrt_rng r;
  clrt_rng_seed(&r, seed);
  /* On the GPU the values are drawn on the host (the same stream as on the CPU) and copied. */
  float *w = m->device != CLRT_CPU ? calloc((size_t)m->total, sizeof(float)) : m->params->data;
  if (!w) {
    clrt_set_error("model: out of host memory initialising %lld parameters", (long long)m->total);
    return -1;
  }
  double std = 0.02, proj_std = 0.02 / sqrt(2.0 * m->cfg.num_hidden_layers);
  for (int i = 0; i < m->np; i++) {
    clrt_param_info *p = &m->p[i];
    float *d = w + p->offset;
    const char *n = p->name;
    size_t len = strlen(n);
    int is_bias = len > 5 && strcmp(n + len - 5, ".bias") == 0;
    if (p->ndim == 1) {
      /* Gemma 3's norms scale by (1 + w): 0 is the identity */
      for (int64_t k = 0; k < p->numel; k++) d[k] = is_bias || m->cfg.gemma3 ? 0.0f : 1.0f;
      continue;
    }
    double s = (strstr(n, "o_proj") || strstr(n, "down_proj")) ? proj_std : std;
    for (int64_t k = 0; k < p->numel; k++) d[k] = (float)(s * clrt_rng_normal(&r));
  }
  clrt_model_params_changed(m);
  if (m->device == CLRT_CPU) return 0;
  int rc = m->ops->upload(m->params->data, w, sizeof(float) * (size_t)m->total);
  free(w);
  return rc;
}
