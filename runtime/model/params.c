/* params.c — the transformer's parameters (Llama 2/3, Qwen2, Qwen3, Mistral, Phi-3, Gemma 3):
   the config's checks, the layout of one f32 arena under Hugging Face names (16-float aligned;
   Phi-3's fused tensors whole), RoPE's inverse frequencies, random initialisation and
   introspection. */
#include <stdint.h>
#include "model_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t add_param(clrt_model *m, int cap, const char *name, int ndim, int64_t d0, int64_t d1) {
  if (m->np >= cap) return -1;
  clrt_param_info *p = &m->p[m->np++];
  snprintf(p->name, sizeof p->name, "%s", name);
  p->ndim = ndim;
  p->shape[0] = d0;
  p->shape[1] = ndim > 1 ? d1 : 0;
  p->numel = ndim > 1 ? d0 * d1 : d0;
  /* 16-float alignment keeps every tensor on its own cache lines. */
  p->offset = m->total;
  m->total += (p->numel + 15) & ~(int64_t)15;
  return p->offset;
}

static int validate_config(const clrt_model_config *c) {
#define POS(f)                                                            \
  if (c->f <= 0) {                                                        \
    clrt_set_error("model: config.json: %s must be positive (got %d)", #f, c->f); \
    return -1;                                                            \
  }
  POS(vocab_size) POS(hidden_size) POS(intermediate_size) POS(num_hidden_layers)
  POS(num_attention_heads) POS(num_key_value_heads) POS(head_dim) POS(max_position_embeddings)
#undef POS
  if (c->num_attention_heads % c->num_key_value_heads) {
    clrt_set_error("model: config.json: num_attention_heads (%d) is not a multiple of "
                   "num_key_value_heads (%d)", c->num_attention_heads, c->num_key_value_heads);
    return -1;
  }
  /* widths the kernels index with int: the products are checked before anything narrows them */
  if ((int64_t)c->num_attention_heads * c->head_dim > INT32_MAX ||
      (int64_t)c->intermediate_size * 2 > INT32_MAX) {
    clrt_set_error("model: config.json: num_attention_heads x head_dim (%lld) or 2 x intermediate_size "
                   "(%lld) exceeds %d",
                   (long long)c->num_attention_heads * c->head_dim,
                   (long long)c->intermediate_size * 2, INT32_MAX);
    return -1;
  }
  if (c->head_dim % 2) {
    clrt_set_error("model: config.json: head_dim (%d) must be even for RoPE", c->head_dim);
    return -1;
  }
  if (c->rope_dim < 0 || c->rope_dim % 2 || c->rope_dim > c->head_dim) {
    clrt_set_error("model: config.json: the rotated dimensions (head_dim x partial_rotary_factor = %d) must be "
                   "even and at most head_dim (%d)", c->rope_dim, c->head_dim);
    return -1;
  }
  if (!(c->rms_norm_eps > 0) || !(c->rope_theta > 0)) {
    clrt_set_error("model: config.json: rms_norm_eps and rope_theta must be positive");
    return -1;
  }
  if (c->sliding_window < 0) {
    clrt_set_error("model: config.json: sliding_window must be positive or absent (got %d)", c->sliding_window);
    return -1;
  }
  if (c->rope_scaling < CLRT_ROPE_DEFAULT || c->rope_scaling > CLRT_ROPE_DYNAMIC) {
    clrt_set_error("model: config.json: unknown rope_scaling kind %d", c->rope_scaling);
    return -1;
  }
  if (c->rope_scaling != CLRT_ROPE_DEFAULT && c->rope_scaling != CLRT_ROPE_LONGROPE && !(c->rope_factor > 0)) {
    clrt_set_error("model: config.json: rope_scaling.factor must be positive");
    return -1;
  }
  if (c->rope_scaling == CLRT_ROPE_LLAMA3 &&
      (!(c->rope_high_freq_factor > c->rope_low_freq_factor) || !(c->rope_low_freq_factor > 0) ||
       c->rope_original_max_position <= 0)) {
    clrt_set_error("model: config.json: llama3 rope_scaling needs high_freq_factor > "
                   "low_freq_factor > 0 and original_max_position_embeddings > 0");
    return -1;
  }
  if ((c->rope_scaling == CLRT_ROPE_YARN || c->rope_scaling == CLRT_ROPE_LONGROPE) &&
      (c->rope_original_max_position <= 0 || c->rope_attention_factor < 0)) {
    clrt_set_error("model: config.json: yarn and longrope rope_scaling need original_max_position_embeddings > 0 "
                   "and attention_factor >= 0");
    return -1;
  }
  int R = c->rope_dim ? c->rope_dim : c->head_dim;
  if (c->rope_scaling == CLRT_ROPE_LONGROPE) {
    if (R / 2 > 256) {
      clrt_set_error("model: config.json: longrope rotates up to 512 dimensions of a head (got %d)", R);
      return -1;
    }
    for (int i = 0; i < R / 2; i++)
      if (!(c->rope_short_factor[i] > 0) || !(c->rope_long_factor[i] > 0)) {
        clrt_set_error("model: config.json: longrope's short_factor and long_factor must be positive (pair %d)", i);
        return -1;
      }
  }
  if (c->gemma3 && (c->rope_scaling == CLRT_ROPE_LONGROPE || c->rope_scaling == CLRT_ROPE_DYNAMIC)) {
    clrt_set_error("model: config.json: Gemma 3 runs default, linear, llama3 or yarn RoPE");
    return -1;
  }
  if (c->has_padding_idx && (c->padding_idx < 0 || c->padding_idx >= c->vocab_size)) {
    clrt_set_error("model: config.json: pad_token_id %d is outside the vocabulary of %d", c->padding_idx, c->vocab_size);
    return -1;
  }
  if (!c->gemma3 && (c->final_logit_softcapping != 0 || c->attn_logit_softcapping != 0)) {
    clrt_set_error("model: config.json: soft-capping is implemented for Gemma 3 only");
    return -1;
  }
  if (c->gemma3 && (!c->qk_norm || c->sliding_window <= 0 || c->sliding_window_pattern <= 0 ||
                    !(c->query_pre_attn_scalar > 0) || !(c->rope_local_theta > 0) || c->final_logit_softcapping < 0 ||
                    c->attn_logit_softcapping < 0)) {
    clrt_set_error("model: config.json: Gemma 3 needs q/k norms, sliding_window > 0, sliding_window_pattern > 0, "
                   "query_pre_attn_scalar > 0 and rope_local_base_freq > 0");
    return -1;
  }
  return 0;
}

clrt_model *model_params_new(const clrt_model_config *cfg) {
  if (validate_config(cfg)) return NULL;
  clrt_model *m = calloc(1, sizeof *m);
  if (!m) goto oom;
  m->cfg = *cfg;
  if (!m->cfg.rope_dim) m->cfg.rope_dim = m->cfg.head_dim;   /* from here on every table is rope_dim / 2 wide */
  if (model_context_init(m)) {
    clrt_model_free(m);
    return NULL;
  }
  m->pack_decode = 1;
  m->share_prefix = 1;
  m->wbf.version = m->wpk.version = COPY_STALE;
  const clrt_model_config *c = &m->cfg;
  int L = c->num_hidden_layers, C = c->hidden_size, I = c->intermediate_size;
  int64_t HD = (int64_t)c->num_attention_heads * c->head_dim, KVD = (int64_t)c->num_key_value_heads * c->head_dim;
  int cap = 18 * L + 4;
  m->p = calloc((size_t)cap, sizeof *m->p);
  m->layer = calloc((size_t)L, sizeof *m->layer);
  m->inv_freq = calloc((size_t)c->rope_dim / 2, sizeof(float));
  if (c->gemma3) m->inv_freq_local = calloc((size_t)c->rope_dim / 2, sizeof(float));
  if (c->rope_scaling == CLRT_ROPE_LONGROPE) m->inv_freq_long = calloc((size_t)c->rope_dim / 2, sizeof(float));
  if (!m->p || !m->layer || !m->inv_freq || (c->gemma3 && !m->inv_freq_local) ||
      (c->rope_scaling == CLRT_ROPE_LONGROPE && !m->inv_freq_long))
    goto oom;
  char name[96];
  m->wte = add_param(m, cap, "model.embed_tokens.weight", 2, c->vocab_size, C);
  for (int l = 0; l < L; l++) {
    clrt_layer_offsets *o = &m->layer[l];
#define P(field, suffix, nd, a, b)                                       \
  snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);          \
  o->field = add_param(m, cap, name, nd, a, b);
    P(ln1, "input_layernorm.weight", 1, C, 0)
    if (c->fused_qkv_gate_up) {   /* Phi-3: q, k, v are row blocks of one tensor */
      P(wq, "self_attn.qkv_proj.weight", 2, HD + 2 * KVD, C)
      o->wk = o->wq + HD * C;
      o->wv = o->wk + KVD * C;
    } else {
      P(wq, "self_attn.q_proj.weight", 2, HD, C)
      P(wk, "self_attn.k_proj.weight", 2, KVD, C)
      P(wv, "self_attn.v_proj.weight", 2, KVD, C)
    }
    o->bq = o->bk = o->bv = o->bo = o->qn = o->kn = -1;
    if (c->qkv_bias) {
      P(bq, "self_attn.q_proj.bias", 1, HD, 0)
      P(bk, "self_attn.k_proj.bias", 1, KVD, 0)
      P(bv, "self_attn.v_proj.bias", 1, KVD, 0)
    }
    P(wo, "self_attn.o_proj.weight", 2, C, HD)
    if (c->o_bias) { P(bo, "self_attn.o_proj.bias", 1, C, 0) }
    if (c->qk_norm) {
      P(qn, "self_attn.q_norm.weight", 1, c->head_dim, 0)
      P(kn, "self_attn.k_norm.weight", 1, c->head_dim, 0)
    }
    o->lpa = o->lpf = -1;
    if (c->gemma3) {   /* a norm after attention, one before and one after the MLP */
      P(lpa, "post_attention_layernorm.weight", 1, C, 0)
      P(ln2, "pre_feedforward_layernorm.weight", 1, C, 0)
      P(lpf, "post_feedforward_layernorm.weight", 1, C, 0)
    } else {
      P(ln2, "post_attention_layernorm.weight", 1, C, 0)
    }
    if (c->fused_qkv_gate_up) {   /* Phi-3: gate rows, then up rows */
      P(wg, "mlp.gate_up_proj.weight", 2, 2 * (int64_t)I, C)
      o->wu = o->wg + (int64_t)I * C;
    } else {
      P(wg, "mlp.gate_proj.weight", 2, I, C)
      P(wu, "mlp.up_proj.weight", 2, I, C)
    }
    P(wd, "mlp.down_proj.weight", 2, C, I)
#undef P
  }
  m->norm = add_param(m, cap, "model.norm.weight", 1, C, 0);
  m->head = c->tie_word_embeddings ? m->wte : add_param(m, cap, "lm_head.weight", 2, c->vocab_size, C);
  m->params = clrt_storage_new(sizeof(float) * (size_t)m->total, CLRT_CPU);
  if (!m->params) {
    clrt_model_free(m);
    return NULL;
  }
  model_rope_inv_freq(c, 0, m->inv_freq);
  m->rope_scale = (float)model_rope_attention_factor(c);
  if (c->rope_scaling == CLRT_ROPE_LONGROPE) model_rope_inv_freq(c, c->rope_original_max_position + 1, m->inv_freq_long);
  if (c->gemma3) {   /* local layers: their own base, never scaled */
    clrt_model_config local = *c;
    local.rope_theta = c->rope_local_theta;
    local.rope_scaling = CLRT_ROPE_DEFAULT;
    model_rope_inv_freq(&local, 0, m->inv_freq_local);
  }
  if (model_prof_on < 0) {
    const char *e = getenv("CLRT_PROFILE");
    model_prof_on = e && *e && strcmp(e, "0") != 0;
  }
  return m;
oom:
  clrt_model_free(m);
  clrt_set_error("model: out of memory");
  return NULL;
}

void model_lora_free(model_lora *lo) {
  if (!lo) return;
  clrt_storage_release(lo->params);
  clrt_storage_release(lo->grads);
  free(lo->p);
  free(lo->ab);
  free(lo);
}

void clrt_model_free(clrt_model *m) {
  if (!m) return;
  clrt_storage_release(m->params);
  clrt_storage_release(m->grads);
  model_context_fini(m);
  free(m->p);
  free(m->layer);
  free(m->inv_freq);
  free(m->inv_freq_local);
  free(m->inv_freq_long);
  free(m->rope_cos_long);
  free(m->rope_sin_long);
  free(m->rope_cos_local);
  free(m->rope_sin_local);
  free(m->rope_cos);
  free(m->rope_sin);
  clrt_storage_release(m->rope_dev);
  model_retired_free(m);
  model_copy_drop(&m->wbf);
  model_copy_drop(&m->wpk);
  clrt_storage_release(m->b16);
  model_q8_free(m->q8);
  model_lora_free(m->lora);
  free(m);
}


void clrt_model_params_changed(clrt_model *m) { clrt_storage_written(m->params); }

int model_ensure_grads(clrt_model *m) {
  if (m->grads || m->lora) return 0;   /* adapters: the base is frozen */
  m->grads = clrt_storage_new(sizeof(float) * (size_t)m->total, m->device);
  return m->grads ? 0 : -1;
}

/* ---- introspection ----------------------------------------------------------------------- */

int clrt_model_num_tensors(const clrt_model *m) { return m->np; }

const char *clrt_model_tensor_name(const clrt_model *m, int i) {
  if (i < 0 || i >= m->np) {
    clrt_set_error("model: tensor index %d out of range (%d tensors)", i, m->np);
    return NULL;
  }
  return m->p[i].name;
}

int clrt_model_tensor_is_matrix(const clrt_model *m, int i) {
  return i >= 0 && i < m->np && m->p[i].ndim == 2;
}

clrt_tensor *model_param_view(clrt_storage *s, const clrt_param_info *p) {
  return clrt_tensor_over(s, CLRT_F32, p->ndim, p->shape, NULL, p->offset);
}

clrt_tensor *clrt_model_param(clrt_model *m, int i) {
  if (!clrt_model_tensor_name(m, i)) return NULL;
  if (m->p[i].in16) {
    clrt_set_error("model: '%s' is held in bf16 (base_dtype=bf16) and has no f32 view", m->p[i].name);
    return NULL;
  }
  return model_param_view(m->params, &m->p[i]);
}

clrt_tensor *clrt_model_grad(clrt_model *m, int i) {
  if (!clrt_model_tensor_name(m, i) || model_ensure_grads(m)) return NULL;
  if (m->lora) {
    clrt_set_error("model: '%s' is frozen under LoRA adapters and has no gradient", m->p[i].name);
    return NULL;
  }
  return model_param_view(m->grads, &m->p[i]);
}

int64_t clrt_model_num_params(const clrt_model *m) {
  int64_t n = 0;
  for (int i = 0; i < m->np; i++) n += m->p[i].numel;
  return n;
}

size_t clrt_model_memory(const clrt_model *m, int arena) {
  switch (arena) {
    case CLRT_ARENA_PARAMS:   /* with the bf16 and packed copies made from them */
      return (m->params ? m->params->bytes : 0) + (m->wbf.s ? m->wbf.s->bytes : 0) + (m->wpk.s ? m->wpk.s->bytes : 0) +
             (m->b16 ? m->b16->bytes : 0) +
             (m->lora ? m->lora->params->bytes : 0);
    case CLRT_ARENA_GRADS: return (m->grads ? m->grads->bytes : 0) + (m->lora ? m->lora->grads->bytes : 0);
    case CLRT_ARENA_ACTIVATIONS:
      return (m->ctx && m->ctx->acts ? m->ctx->acts->bytes : 0) +
             (m->cfg.gemma3 ? 4 : 2) * sizeof(float) * (size_t)m->rope_len * (size_t)(m->cfg.rope_dim / 2);
    default: return 0;
  }
}

int clrt_model_zero_grad(clrt_model *m) {
  if (m->lora) {
    m->ops->zero(m->lora->grads->data, (size_t)m->lora->total);
    return 0;
  }
  if (model_ensure_grads(m)) return -1;
  m->ops->zero(m->grads->data, m->grads->bytes / sizeof(float));
  return 0;
}


/* ---- architecture variants: sliding window (Mistral, Phi-3, Gemma 3's local layers), fused
   projections (Phi-3) ---- */

int model_layer_window(const clrt_model *m, int l) {
  const clrt_model_config *c = &m->cfg;
  /* Gemma 3: layer l is global (no window) when l + 1 is a multiple of sliding_window_pattern */
  if (c->gemma3 && (c->sliding_window_pattern <= 0 || (l + 1) % c->sliding_window_pattern == 0)) return 0;
  return c->sliding_window;
}

int model_param_row_blocks(const clrt_model *m, const clrt_param_info *p, int64_t rows[3]) {
  rows[0] = p->ndim == 2 ? p->shape[0] : p->numel;
  if (!m->cfg.fused_qkv_gate_up || p->ndim != 2) return 1;
  const clrt_model_config *c = &m->cfg;
  int64_t HD = (int64_t)c->num_attention_heads * c->head_dim, KVD = (int64_t)c->num_key_value_heads * c->head_dim;
  for (int l = 0; l < c->num_hidden_layers; l++) {
    if (p->offset == m->layer[l].wq) {
      rows[0] = HD;
      rows[1] = rows[2] = KVD;
      return 3;
    }
    if (p->offset == m->layer[l].wg) {
      rows[0] = rows[1] = c->intermediate_size;
      return 2;
    }
  }
  return 1;
}
