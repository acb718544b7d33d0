"""gemma3_ref.py — an independent PyTorch implementation of Gemma 3's text decoder
(Gemma3ForCausalLM), restated from the published architecture and transformers' conventions
(`transformers` itself is not installed here), used to make clrt's Gemma 3 fixtures:

  * embeddings times sqrt(hidden_size), that factor rounded to float32 first
  * RMSNorm scaled by (1 + w) everywhere: input, post-attention (on the attention's output,
    before the residual), pre-feedforward, post-feedforward (on the MLP's output), the q/k
    norms per head, the final norm
  * MLP: down(gelu_tanh(gate(x)) * up(x))
  * attention scores times query_pre_attn_scalar ** -0.5; grouped-query; causal; layer l is
    sliding (local) unless (l + 1) % sliding_window_pattern == 0, a local query at position i
    seeing keys j with i - sliding_window < j <= i
  * RoPE (rotate-half): local layers with rope_local_base_freq and no scaling, global layers
    with rope_theta and the config's rope_scaling (linear)
  * tied lm_head unless tie_word_embeddings is false
  * final_logit_softcapping, when set: logits = cap * tanh(logits / cap); attn_logit_softcapping
    the same on the scaled scores, before the mask
"""
import torch

import model_ref as R


def dims(cfg):
    return R.dims(cfg)


def is_local(cfg, l):
    return (l + 1) % cfg["sliding_window_pattern"] != 0


def param_shapes(cfg):
    C, I, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    H, KV, D = dims(cfg)
    out = [("model.embed_tokens.weight", (V, C))]
    for l in range(L):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (C,)),
                (p + "self_attn.q_proj.weight", (H * D, C)),
                (p + "self_attn.k_proj.weight", (KV * D, C)),
                (p + "self_attn.v_proj.weight", (KV * D, C)),
                (p + "self_attn.o_proj.weight", (C, H * D)),
                (p + "self_attn.q_norm.weight", (D,)),
                (p + "self_attn.k_norm.weight", (D,)),
                (p + "post_attention_layernorm.weight", (C,)),
                (p + "pre_feedforward_layernorm.weight", (C,)),
                (p + "post_feedforward_layernorm.weight", (C,)),
                (p + "mlp.gate_proj.weight", (I, C)),
                (p + "mlp.up_proj.weight", (I, C)),
                (p + "mlp.down_proj.weight", (C, I))]
    out += [("model.norm.weight", (C,))]
    if not cfg.get("tie_word_embeddings", True):
        out += [("lm_head.weight", (V, C))]
    return out


def init_params(cfg, seed, dtype=torch.float64):
    """Norm weights around 0 (the (1 + w) convention), so a norm read as w is far off."""
    g = torch.Generator().manual_seed(seed)
    P = {}
    for name, shape in param_shapes(cfg):
        if name.endswith("norm.weight"):
            t = 0.2 * torch.randn(shape, generator=g)
        else:
            t = 0.15 * torch.randn(shape, generator=g)
        P[name] = t.to(torch.float32).to(dtype)
    return P


def rms1p(x, w, eps):
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)) * (1.0 + w)


def gelu_tanh(x):
    return torch.nn.functional.gelu(x, approximate="tanh")   # transformers' gelu_pytorch_tanh


def cos_sin(cfg, positions, local, dtype):
    _, _, D = dims(cfg)
    if local:
        base, scaling = cfg["rope_local_base_freq"], None
    else:
        base, scaling = cfg["rope_theta"], cfg.get("rope_scaling")
    f = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    if scaling:
        assert scaling.get("rope_type", scaling.get("type")) == "linear"
        f = f / scaling["factor"]
    ang = positions.to(torch.float32)[:, None] * f[None, :]
    emb = torch.cat([ang, ang], dim=-1).to(dtype)
    return emb.cos(), emb.sin()


def hidden_states(cfg, P, tokens):
    """tokens: long [B, T] -> the final norm's output [B, T, C]."""
    B, T = tokens.shape
    H, KV, D = dims(cfg)
    eps = cfg["rms_norm_eps"]
    dtype = P["model.embed_tokens.weight"].dtype
    scale = torch.tensor(cfg["hidden_size"] ** 0.5, dtype=torch.float32).to(dtype)
    x = R.embed(cfg, P["model.embed_tokens.weight"], tokens, default_pad=0) * scale
    pos = torch.arange(T)
    causal = pos[None, :] <= pos[:, None]
    window = causal & (pos[None, :] > pos[:, None] - cfg["sliding_window"])
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        local = is_local(cfg, l)
        h = rms1p(x, P[p + "input_layernorm.weight"], eps)
        q = (h @ P[p + "self_attn.q_proj.weight"].T).view(B, T, H, D)
        k = (h @ P[p + "self_attn.k_proj.weight"].T).view(B, T, KV, D)
        v = (h @ P[p + "self_attn.v_proj.weight"].T).view(B, T, KV, D)
        q = rms1p(q, P[p + "self_attn.q_norm.weight"], eps)
        k = rms1p(k, P[p + "self_attn.k_norm.weight"], eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cos, sin = cos_sin(cfg, pos, local, dtype)
        q = q * cos + R.rotate_half(q) * sin
        k = k * cos + R.rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        s = (q @ k.transpose(-1, -2)) * cfg["query_pre_attn_scalar"] ** -0.5
        acap = cfg.get("attn_logit_softcapping")
        if acap:
            s = acap * torch.tanh(s / acap)
        s = s.masked_fill(~(window if local else causal), float("-inf"))
        a = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, H * D)
        o = a @ P[p + "self_attn.o_proj.weight"].T
        x = x + rms1p(o, P[p + "post_attention_layernorm.weight"], eps)
        h = rms1p(x, P[p + "pre_feedforward_layernorm.weight"], eps)
        m = gelu_tanh(h @ P[p + "mlp.gate_proj.weight"].T) * (h @ P[p + "mlp.up_proj.weight"].T)
        m = m @ P[p + "mlp.down_proj.weight"].T
        x = x + rms1p(m, P[p + "post_feedforward_layernorm.weight"], eps)
    return rms1p(x, P["model.norm.weight"], eps)


def logits(cfg, P, tokens):
    head = P.get("lm_head.weight", P["model.embed_tokens.weight"])
    z = hidden_states(cfg, P, tokens) @ head.T
    cap = cfg.get("final_logit_softcapping")
    return cap * torch.tanh(z / cap) if cap else z


def logprobs(cfg, P, tokens, lengths):
    B, T = tokens.shape
    logp = torch.log_softmax(logits(cfg, P, tokens), dim=-1)
    lp = logp[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]
    valid = torch.zeros(B, T - 1, dtype=torch.bool)
    for b, n in enumerate(lengths):
        valid[b, : n - 1] = True
    return torch.where(valid, lp, torch.zeros_like(lp)), valid


def greedy(cfg, P, prompt, n):
    """n greedy tokens after prompt (a list), recomputing the whole prefix each step, and the
    smallest gap between the best and second-best logit (how safe an f32 argmax is)."""
    ids, gap = list(prompt), float("inf")
    for _ in range(n):
        z = logits(cfg, P, torch.tensor([ids]))[0, -1]
        top = torch.topk(z, 2).values
        gap = min(gap, float(top[0] - top[1]))
        ids.append(int(z.argmax()))
    return ids[len(prompt):], gap
