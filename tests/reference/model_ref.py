"""model_ref.py — an independent PyTorch implementation of the Llama family (Llama 2/3,
Qwen2, Qwen3) following the Hugging Face `transformers` conventions, used to make the
fixtures clrt's model is tested against. `transformers` itself is not available here, so this
restates its modelling code from the published architecture:

  * RMSNorm: w * x / sqrt(mean(x^2) + eps)
  * RoPE: rotate-half layout, inv_freq = theta^(-2i/D) (computed in f32 as transformers does),
    optional `linear` or `llama3` rope_scaling
  * grouped-query attention with repeat_kv, causal mask, scale 1/sqrt(head_dim)
  * Qwen2: biases on q/k/v; Llama/Qwen3 `attention_bias`: biases on q/k/v/o
  * Qwen3: per-head RMSNorm of q and k (q_norm, k_norm) before RoPE
  * SwiGLU MLP: down(silu(gate(x)) * up(x)); tied or untied lm_head
  * Mistral: Llama's layers; with `sliding_window` W the query at position i sees keys
    i - W < j <= i (transformers' sliding-window causal mask)
  * Phi-3: the same window; q, k, v come from one fused `qkv_proj` (q rows, then k, then v)
    and the MLP from one fused `gate_up_proj` (gate rows, then up: up * silu(gate))

Also a tiny safetensors reader/writer (the `safetensors` package is not installed).
"""
import json
import math
import struct

import numpy as np
import torch


# ---- configuration -------------------------------------------------------------------------

def arch_of(cfg):
    a = (cfg.get("architectures") or [None])[0]
    return {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
            "Qwen3ForCausalLM": "qwen3", "MistralForCausalLM": "mistral",
            "Phi3ForCausalLM": "phi3"}.get(a, cfg.get("model_type", "llama"))


def window_of(cfg):
    """Mistral and Phi-3 read sliding_window (None: the whole causal prefix)."""
    return cfg.get("sliding_window") if arch_of(cfg) in ("mistral", "phi3") else None


def dims(cfg):
    H = cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads") or H
    D = cfg.get("head_dim") or cfg["hidden_size"] // H
    return H, KV, D


def param_shapes(cfg):
    """Hugging Face parameter names and shapes, in a fixed order."""
    arch = arch_of(cfg)
    C, I, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    H, KV, D = dims(cfg)
    bias = cfg.get("attention_bias", False)
    qkv_bias = arch == "qwen2" or bias
    o_bias = arch != "qwen2" and bias
    out = [("model.embed_tokens.weight", (V, C))]
    for l in range(L):
        p = f"model.layers.{l}."
        if arch == "phi3":
            out += [(p + "input_layernorm.weight", (C,)),
                    (p + "self_attn.qkv_proj.weight", ((H + 2 * KV) * D, C)),
                    (p + "self_attn.o_proj.weight", (C, H * D)),
                    (p + "post_attention_layernorm.weight", (C,)),
                    (p + "mlp.gate_up_proj.weight", (2 * I, C)),
                    (p + "mlp.down_proj.weight", (C, I))]
            continue
        out += [(p + "input_layernorm.weight", (C,)),
                (p + "self_attn.q_proj.weight", (H * D, C)),
                (p + "self_attn.k_proj.weight", (KV * D, C)),
                (p + "self_attn.v_proj.weight", (KV * D, C))]
        if qkv_bias:
            out += [(p + "self_attn.q_proj.bias", (H * D,)), (p + "self_attn.k_proj.bias", (KV * D,)),
                    (p + "self_attn.v_proj.bias", (KV * D,))]
        out += [(p + "self_attn.o_proj.weight", (C, H * D))]
        if o_bias:
            out += [(p + "self_attn.o_proj.bias", (C,))]
        if arch == "qwen3":
            out += [(p + "self_attn.q_norm.weight", (D,)), (p + "self_attn.k_norm.weight", (D,))]
        out += [(p + "post_attention_layernorm.weight", (C,)),
                (p + "mlp.gate_proj.weight", (I, C)),
                (p + "mlp.up_proj.weight", (I, C)),
                (p + "mlp.down_proj.weight", (C, I))]
    out += [("model.norm.weight", (C,))]
    if not cfg.get("tie_word_embeddings", False):
        out += [("lm_head.weight", (V, C))]
    return out


def init_params(cfg, seed, dtype=torch.float64):
    """Random weights with non-trivial norms and biases (so their gradients are tested)."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in param_shapes(cfg):
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith(".bias"):
            t = 0.1 * torch.randn(shape, generator=g)
        else:
            t = 0.15 * torch.randn(shape, generator=g)
        params[name] = t.to(torch.float32).to(dtype)
    return params


# ---- RoPE ------------------------------------------------------------------------------------

def inv_freq(cfg):
    import rope_ref
    D = rope_ref._dim(cfg)   # the rotated dimensions (partial_rotary_factor)
    theta = cfg.get("rope_theta", 10000.0)
    f = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    rs = cfg.get("rope_scaling")
    if rs:
        kind = rs.get("rope_type", rs.get("type"))
        if kind == "linear":
            f = f / rs["factor"]
        elif kind == "llama3":
            factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
            old = rs["original_max_position_embeddings"]
            lo_wl, hi_wl = old / lo, old / hi
            wavelen = 2 * math.pi / f
            scaled = torch.where(wavelen > lo_wl, f / factor, f)
            smooth = (old / wavelen - lo) / (hi - lo)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = ~(wavelen < hi_wl) & ~(wavelen > lo_wl)
            f = torch.where(medium, smoothed, scaled)
        elif kind not in (None, "default"):
            raise ValueError(f"unsupported rope_scaling {kind}")
    return f


def rope_cos_sin(cfg, T, dtype):
    """cos, sin [T, D] of a forward over positions [0, T). The scaling kinds whose frequencies
    depend on the call's length (longrope, dynamic) or that scale cos and sin (yarn, longrope)
    come from rope_ref.py, transformers' modeling_rope_utils restated."""
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind in ("yarn", "longrope", "su", "dynamic"):
        import rope_ref
        f, scale = rope_ref.inv_freq_for_call(cfg, T)
    else:
        f, scale = inv_freq(cfg), 1.0
    ang = torch.arange(T, dtype=torch.float32)[:, None] * f[None, :]   # f32 product, as HF
    emb = torch.cat([ang, ang], dim=-1).to(dtype)
    return emb.cos() * scale, emb.sin() * scale


def embed(cfg, E, tokens, default_pad=None):
    """E[tokens], with nn.Embedding(padding_idx=pad_token_id)'s gradient: none for the pad row
    (the class's default pad where config.json has no pad_token_id)."""
    pad = cfg.get("pad_token_id", default_pad) if "pad_token_id" in cfg else default_pad
    x = E[tokens]
    if pad is not None and 0 <= pad < E.shape[0]:
        x = torch.where((tokens == pad)[..., None], E.detach()[tokens], x)
    return x


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


# ---- the model ---------------------------------------------------------------------------

def rmsnorm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def logprobs(cfg, P, tokens, lengths, linear=None):
    """tokens: long [B, T]; lengths: list. Returns lp [B, T-1] with padded positions 0.
    linear(name, inp), when given, computes the blocks' projections instead (name without
    ".weight"; bench/train_step_torch.py's LoRA peer)."""
    B, T = tokens.shape
    logp = log_softmax_all(cfg, P, tokens, linear)
    lp = logp[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]
    valid = torch.zeros(B, T - 1, dtype=torch.bool)
    for b, n in enumerate(lengths):
        valid[b, : n - 1] = True
    return torch.where(valid, lp, torch.zeros_like(lp)), valid


def greedy(cfg, P, prompt, steps):
    """Greedy continuation by full recompute; also the smallest gap between the best and the
    second-best log-probability on the way (how safe the argmax is against f32 rounding)."""
    seq, gap = list(prompt), float("inf")
    with torch.no_grad():
        for _ in range(steps):
            logp = log_softmax_all(cfg, P, torch.tensor([seq]))[0, -1]
            top = torch.topk(logp, 2).values
            gap = min(gap, float(top[0] - top[1]))
            seq.append(int(torch.argmax(logp)))
    return seq[len(prompt):], gap


def log_softmax_all(cfg, P, tokens, linear=None):
    """log p(v | tokens[b, :t+1]) for every position and vocabulary entry: [B, T, V]."""
    arch = arch_of(cfg)
    B, T = tokens.shape
    H, KV, D = dims(cfg)
    eps = cfg["rms_norm_eps"]
    dtype = P["model.embed_tokens.weight"].dtype
    cos, sin = rope_cos_sin(cfg, T, dtype)
    x = embed(cfg, P["model.embed_tokens.weight"], tokens, default_pad=32000 if cfg.get("architectures", [""])[0] == "Phi3ForCausalLM" else None)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    W = window_of(cfg)
    if W is not None:   # keys more than W - 1 positions back are out of the window
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        mask = mask & (i - j < W)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rmsnorm(x, P[p + "input_layernorm.weight"], eps)

        def proj(name, inp):
            if linear is not None:
                return linear(p + name, inp)
            y = inp @ P[p + name + ".weight"].T
            b = P.get(p + name + ".bias")
            return y + b if b is not None else y

        if arch == "phi3":
            qkv = proj("self_attn.qkv_proj", h)
            q, k, v = torch.split(qkv, [H * D, KV * D, KV * D], dim=-1)
            q, k, v = q.reshape(B, T, H, D), k.reshape(B, T, KV, D), v.reshape(B, T, KV, D)
        else:
            q = proj("self_attn.q_proj", h).view(B, T, H, D)
            k = proj("self_attn.k_proj", h).view(B, T, KV, D)
            v = proj("self_attn.v_proj", h).view(B, T, KV, D)
        if arch == "qwen3":
            q = rmsnorm(q, P[p + "self_attn.q_norm.weight"], eps)
            k = rmsnorm(k, P[p + "self_attn.k_norm.weight"], eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        R = cos.shape[-1]   # partial rotary: the first R dimensions rotate, the rest pass
        q = torch.cat([q[..., :R] * cos + rotate_half(q[..., :R]) * sin, q[..., R:]], dim=-1)
        k = torch.cat([k[..., :R] * cos + rotate_half(k[..., :R]) * sin, k[..., R:]], dim=-1)
        k = k.repeat_interleave(H // KV, dim=1)   # repeat_kv
        v = v.repeat_interleave(H // KV, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        s = s.masked_fill(~mask, float("-inf"))
        a = torch.softmax(s, dim=-1) @ v
        a = a.transpose(1, 2).reshape(B, T, H * D)
        x = x + proj("self_attn.o_proj", a)
        h = rmsnorm(x, P[p + "post_attention_layernorm.weight"], eps)
        if arch == "phi3":
            gate, up = proj("mlp.gate_up_proj", h).chunk(2, dim=-1)
            m = up * torch.nn.functional.silu(gate)
        else:
            m = torch.nn.functional.silu(proj("mlp.gate_proj", h)) * proj("mlp.up_proj", h)
        x = x + proj("mlp.down_proj", m)
    x = rmsnorm(x, P["model.norm.weight"], eps)
    head = P.get("lm_head.weight", P["model.embed_tokens.weight"])
    return torch.log_softmax(x @ head.T, dim=-1)


# ---- safetensors -------------------------------------------------------------------------

_DT = {"F32": (np.float32, 4), "F16": (np.float16, 2), "I32": (np.int32, 4), "F64": (np.float64, 8)}


def _bytes_of(t, dtype):
    if dtype == "BF16":
        return t.detach().to(torch.float32).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    return t.detach().cpu().numpy().astype(_DT[dtype][0]).tobytes()


def save_safetensors(path, tensors, dtype="F32", metadata=None):
    """tensors: dict name -> torch tensor (ints are written as I32)."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        dt = "I32" if not t.is_floating_point() else dtype
        b = _bytes_of(t, dt)
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        if e["dtype"] == "BF16":
            raw = np.frombuffer(data[a:b], dtype=np.int16).copy()
            t = torch.from_numpy(raw).view(torch.bfloat16).to(torch.float32)
        else:
            t = torch.from_numpy(np.frombuffer(data[a:b], dtype=_DT[e["dtype"]][0]).copy())
        out[name] = t.reshape(e["shape"])
    return out
