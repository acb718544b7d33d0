/* shared_prefix.c — a forward (and its backward) over rows that share their leading context
   runs that context once. An RL step scores each prompt's n responses, every row the same
   ~400-token prompt and a ~100-token answer: unpacked, the prompt passes through every layer
   n times forward and n times backward, most of the update's work. Packed, the step's one row
   holds each group's context once and then each member's continuation (a "branch"):

     [ ctx A | A1's branch | A2's branch | ... | ctx B | B1's branch | ... ]

   Every per-token op (embedding, norms, products, the MLP) runs over the packed row as over
   any other; only positions and attention know the segments. A branch's tokens sit at
   positions plen, plen + 1, ... and its queries see the context's keys, then their own, in
   that order: the keys a row's query sees unpacked, at the same positions and in the same
   order. The keys are gathered into one [plen + len] buffer per branch (the workspace), so a
   branch runs the kernels a KV-cache prefill of the same row would run. In backward each
   branch's gradient for the context's keys and values adds into the context's rows, and the
   context runs its backward once with the sum.
   On a batch-invariant model a packed row's log-probabilities are the unpacked row's bits;
   otherwise they agree within the kernels' rounding (tests/lua/test_shared_prefix.lua). */
#include "model_internal.h"

#include <stdlib.h>
#include <string.h>

int clrt_model_set_share_prefix(clrt_model *m, int on) {
  m->share_prefix = on != 0;
  return 0;
}

int clrt_model_share_prefix(const clrt_model *m) { return m->share_prefix; }

void model_kept_layout(const clrt_context *x, int *B, int *T) {
  *B = x->packed ? 1 : x->B;
  *T = x->packed ? x->pack.N : x->T;
}

int64_t clrt_model_logprobs_positions(const clrt_model *m) {
  int B, T;
  model_kept_layout(m->ctx, &B, &T);
  return (int64_t)B * T;
}

int model_pack_wanted(const clrt_model *m) {
  return m->share_prefix && m->ops->attention_backward_offset && !m->cfg.gemma3;
}

static int grow(void **p, int *cap, int n, size_t size) {
  if (n <= *cap) return 0;
  void *q = realloc(*p, size * (size_t)n);
  if (!q) {
    clrt_set_error("logprobs: out of host memory for the shared-prefix layout");
    return -1;
  }
  *p = q;
  *cap = n;
  return 0;
}

static int add_seg(model_pack *pk, int start, int len, int prefix, int plen) {
  if (grow((void **)&pk->seg, &pk->seg_cap, pk->nseg + 1, sizeof(pack_seg))) return -1;
  pk->seg[pk->nseg++] = (pack_seg){start, len, prefix, plen};
  return 0;
}

/* The context a row can share: its leading context tokens when some of the row follows them
   (a row that is all context has nothing to score: it is left out of the packed row). */
static int row_context(const int32_t *lengths, const int32_t *context, int T, int b, int *len) {
  *len = lengths ? lengths[b] : T;
  int c = context[b] < *len ? context[b] : *len;
  return c;
}

int model_pack_plan(clrt_context *x, const int32_t *tokens, int B, int T, const int32_t *lengths,
                    const int32_t *context) {
  model_pack *pk = &x->pack;
  if (grow((void **)&pk->pre, &pk->row_cap, B, 4 * sizeof(int))) return -1;   /* pre, plen, br, lead */
  pk->plen = pk->pre + B;
  pk->br = pk->pre + 2 * B;
  int *lead = pk->pre + 3 * B;   /* the first row with b's context (b itself when none before it) */
  int shared = 0, total = 0;
  for (int b = 0; b < B; b++) {
    int len, c = row_context(lengths, context, T, b, &len);
    lead[b] = b;
    total += len;
    if (c <= 0 || c >= len) continue;
    for (int r = 0; r < b; r++) {
      int rlen, cr = row_context(lengths, context, T, r, &rlen);
      if (lead[r] == r && cr == c && cr < rlen &&
          memcmp(tokens + (int64_t)r * T, tokens + (int64_t)b * T, sizeof(int32_t) * (size_t)c) == 0) {
        lead[b] = r;
        shared = 1;
        break;
      }
    }
  }
  if (!shared) return 0;
  if (grow((void **)&pk->tok, &pk->tok_cap, total, sizeof(int32_t))) return -1;
  /* In the leaders' order: a group's context, then each member's branch. */
  int N = 0;
  pk->nseg = 0;
  for (int b = 0; b < B; b++) {
    if (lead[b] != b) continue;
    int len, c = row_context(lengths, context, T, b, &len);
    pk->pre[b] = pk->br[b] = -1;
    pk->plen[b] = 0;
    if (c >= len) continue;   /* all context: nothing to score, nothing to run */
    int p = c > 0 ? c : len;   /* a row without context is one segment from position 0 */
    memcpy(pk->tok + N, tokens + (int64_t)b * T, sizeof(int32_t) * (size_t)p);
    if (add_seg(pk, N, p, -1, 0)) return -1;
    pk->pre[b] = N;
    pk->plen[b] = p;
    N += p;
    if (c == 0) continue;
    for (int r = b; r < B; r++) {
      if (lead[r] != b) continue;
      int rlen;
      row_context(lengths, context, T, r, &rlen);
      memcpy(pk->tok + N, tokens + (int64_t)r * T + c, sizeof(int32_t) * (size_t)(rlen - c));
      if (add_seg(pk, N, rlen - c, pk->pre[b], c)) return -1;
      pk->pre[r] = pk->pre[b];
      pk->plen[r] = c;
      pk->br[r] = N;
      N += rlen - c;
    }
  }
  pk->N = N;
  return 1;
}

int64_t model_pack_index(const model_pack *pk, int b, int t) {
  return t < pk->plen[b] ? (int64_t)pk->pre[b] + t : (int64_t)pk->br[b] + (t - pk->plen[b]);
}

size_t model_step_workspace_bytes(const clrt_model *m, int64_t N, const model_pack *pk) {
  size_t products = model_workspace_bytes(m, N);
  int64_t tk = 0, kvd = (int64_t)m->cfg.num_key_value_heads * m->cfg.head_dim;
  for (int i = 0; pk && i < pk->nseg; i++)
    if (pk->seg[i].plen + pk->seg[i].len > tk) tk = pk->seg[i].plen + pk->seg[i].len;
  size_t gathered = sizeof(float) * 4 * (size_t)(tk * kvd);   /* keys, values and their gradients */
  return products > gathered ? products : gathered;
}

void model_pack_rope(const clrt_context *x, const model_pack *pk, float *q, float *k, int backward) {
  const clrt_model *m = x->m;
  const model_ops *op = m->ops;
  int H = m->cfg.num_attention_heads, KV = m->cfg.num_key_value_heads, D = m->cfg.head_dim;
  for (int i = 0; i < pk->nseg; i++) {
    const pack_seg *s = &pk->seg[i];
    int32_t p0 = s->plen;
    const int32_t *pos = s->prefix >= 0 ? &p0 : NULL;
    float *qs = q + (int64_t)s->start * H * D, *ks = k + (int64_t)s->start * KV * D;
    if (backward) {
      op->rope_backward(qs, x->rope_c, x->rope_s, pos, 1, s->len, H, D, m->cfg.rope_dim);
      op->rope_backward(ks, x->rope_c, x->rope_s, pos, 1, s->len, KV, D, m->cfg.rope_dim);
    } else {
      op->rope(qs, x->rope_c, x->rope_s, pos, 1, s->len, H, D, m->cfg.rope_dim);
      op->rope(ks, x->rope_c, x->rope_s, pos, 1, s->len, KV, D, m->cfg.rope_dim);
    }
  }
}

/* A branch's keys (or values): its context's rows, then its own, into buf [plen + len, KV, D]. */
static void gather(float *buf, const float *x, const pack_seg *s, int64_t kvd) {
  memcpy(buf, x + (int64_t)s->prefix * kvd, sizeof(float) * (size_t)((int64_t)s->plen * kvd));
  memcpy(buf + (int64_t)s->plen * kvd, x + (int64_t)s->start * kvd, sizeof(float) * (size_t)((int64_t)s->len * kvd));
}

void model_pack_attention(clrt_model *m, acts *a, const model_pack *pk, float *out, float *lse,
                          const float *q, const float *k, const float *v, int window) {
  const clrt_model_config *c = &m->cfg;
  int H = c->num_attention_heads, KV = c->num_key_value_heads, D = c->head_dim;
  int64_t kvd = (int64_t)KV * D;
  for (int i = 0; i < pk->nseg; i++) {
    const pack_seg *s = &pk->seg[i];
    int32_t p0 = s->plen;
    attn_args at = {1, s->len, H, KV, D, window, NULL, NULL, (int64_t)s->len * kvd};
    const float *ks = k + s->start * kvd, *vs = v + s->start * kvd;
    if (s->prefix >= 0) {
      int64_t tk = (int64_t)s->plen + s->len;
      if (model_workspace(a->cx, sizeof(float) * 2 * (size_t)(tk * kvd), "logprobs (shared prefix)")) return;
      float *kb = a->cx->ws, *vb = kb + tk * kvd;
      gather(kb, k, s, kvd);
      gather(vb, v, s, kvd);
      ks = kb;
      vs = vb;
      at.pos0 = &p0;
      at.kv_bstride = tk * kvd;
    }
    m->ops->attention(m, a, out + (int64_t)s->start * H * D, lse ? lse + (int64_t)s->start * H : NULL,
                      q + (int64_t)s->start * H * D, ks, vs, &at);
  }
}

void model_pack_attention_backward(clrt_model *m, acts *a, const model_pack *pk, const layer_acts *A, int window) {
  const clrt_model_config *c = &m->cfg;
  const model_ops *op = m->ops;
  int H = c->num_attention_heads, KV = c->num_key_value_heads, D = c->head_dim;
  int64_t kvd = (int64_t)KV * D, hd = (int64_t)H * D;
  /* a context's segment comes before its branches: it writes its rows of dk/dv, they add */
  for (int i = 0; i < pk->nseg; i++) {
    const pack_seg *s = &pk->seg[i];
    int64_t q0 = s->start * hd, k0 = s->start * kvd;
    const float *lse = A->lse + (int64_t)s->start * H;
    if (s->prefix < 0) {
      op->attention_backward_offset(m, a, a->dq + q0, a->dk + k0, a->dv + k0, a->datt + q0, A->q + q0,
                                    A->k + k0, A->v + k0, A->att + q0, lse, s->len, 0, window);
      continue;
    }
    int64_t tk = (int64_t)s->plen + s->len, pk0 = (int64_t)s->prefix * kvd, np = (int64_t)s->plen * kvd;
    if (model_workspace(a->cx, sizeof(float) * 4 * (size_t)(tk * kvd), "backward (shared prefix)")) return;
    float *kb = a->cx->ws, *vb = kb + tk * kvd, *dkb = vb + tk * kvd, *dvb = dkb + tk * kvd;
    gather(kb, A->k, s, kvd);
    gather(vb, A->v, s, kvd);
    op->attention_backward_offset(m, a, a->dq + q0, dkb, dvb, a->datt + q0, A->q + q0, kb, vb, A->att + q0, lse,
                                  s->len, s->plen, window);
    op->add(a->dk + pk0, a->dk + pk0, dkb, np);
    op->add(a->dv + pk0, a->dv + pk0, dvb, np);
    memcpy(a->dk + k0, dkb + np, sizeof(float) * (size_t)(s->len * kvd));
    memcpy(a->dv + k0, dvb + np, sizeof(float) * (size_t)(s->len * kvd));
  }
}
