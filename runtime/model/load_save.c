/* load_save.c — the parameters in and out of safetensors files (one file or a sharded set,
   each tensor checked against the config's shape; saving copies a GPU model's arena to the
   host once). */
#include "model_internal.h"

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

int clrt_model_load_safetensors(clrt_model *m, const char *path) {
  if (model_refuse_base16(m, "model load")) return -1;
  if (m->device != CLRT_CPU) {
    clrt_set_error("safetensors %s: load the model on the cpu, then move it with to(\"cuda\")", path);
    return -1;
  }
  clrt_safetensors *st = clrt_safetensors_open(path);
  if (!st) return -1;
  int n = clrt_safetensors_count(st), rc = -1;
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
    if (clrt_safetensors_read_f32(st, i, PW(m, p->offset), p->numel)) goto done;
    p->loaded = 1;
  }
  clrt_model_params_changed(m);
  rc = 0;
done:
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
  if (model_refuse_base16(m, "model save")) return -1;
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

