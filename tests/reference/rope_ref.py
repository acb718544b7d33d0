"""rope_ref.py — transformers' long-context RoPE (modeling_rope_utils: the rope_init functions
and dynamic_rope_update) restated in PyTorch from its published formulas, independently of
clrt's C: the inverse frequencies and the attention factor (the scale of cos and sin) for
yarn, longrope (su) and dynamic NTK, for one forward whose positions reach seq_len.

  * yarn: pos_freqs = theta^(2i/D) (f32); extrapolation 1/pos_freqs, interpolation
    1/(factor pos_freqs), blended by a ramp over pairs between the correction dims of
    beta_fast (32) and beta_slow (1) rotations within original_max_position_embeddings
    (floored/ceiled unless truncate is false; original_max_position_embeddings, else
    max_position_embeddings); the explicit factor (transformers 4.5x; one transformers 5
    snapshot used max_position_embeddings / original instead). Attention factor: attention_factor, else
    mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are set, else
    0.1 ln(factor) + 1 (1 when factor <= 1).
  * longrope: 1 / (ext_i theta^(2i/D)) with ext the long factors when seq_len >
    original_max_position_embeddings (the top-level key; without it max_position_embeddings),
    else the short ones; factor = max_position_embeddings / original when the top-level key is
    there; attention factor sqrt(1 + ln(factor) / ln(original)) (1 when factor <= 1).
  * dynamic: past max_position_embeddings, theta' = theta ((factor seq_len / max_pos) -
    (factor - 1))^(D / (D - 2)) in f32 (the forward passes seq_len as a tensor); attention 1.

Run as a script it prints the RoPE inverse-frequency precision figures of docs/models.md.
"""
import math

import torch


def _dim(cfg):
    """The rotated dimensions: transformers' int(head_dim * partial_rotary_factor)."""
    H = cfg["num_attention_heads"]
    prf = (cfg.get("rope_parameters") or {}).get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    return int((cfg.get("head_dim") or cfg["hidden_size"] // H) * prf)


def _scaling(cfg):
    rs = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    return rs, rs.get("rope_type", rs.get("type"))


def _theta(cfg):
    rp = cfg.get("rope_parameters")
    return (rp or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))


def yarn(cfg):
    rs, _ = _scaling(cfg)
    base, D = _theta(cfg), _dim(cfg)
    factor = rs["factor"]   # explicit, as transformers' yarn check says it uses
    orig = rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    att = rs.get("attention_factor")
    if att is None:
        if rs.get("mscale") and rs.get("mscale_all_dim"):
            att = mscale(factor, rs["mscale"]) / mscale(factor, rs["mscale_all_dim"])
        else:
            att = mscale(factor)
    fast, slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

    def corr_dim(rot):
        return D * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = corr_dim(fast), corr_dim(slow)
    if rs.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, D - 1)
    if lo == hi:
        hi += 0.001
    pos_freqs = base ** (torch.arange(0, D, 2).to(torch.float32) / D)
    extrap, interp = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ramp = ((torch.arange(D // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
    w_extrap = 1 - ramp
    return interp * (1 - w_extrap) + extrap * w_extrap, float(att)


def longrope(cfg, seq_len):
    rs, _ = _scaling(cfg)
    base, D = _theta(cfg), _dim(cfg)
    factor = rs.get("factor")
    orig = cfg.get("original_max_position_embeddings")
    if orig:
        factor = cfg["max_position_embeddings"] / orig
    else:
        orig = cfg["max_position_embeddings"]
    att = rs.get("attention_factor")
    if att is None:
        att = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
    ext = torch.tensor(rs["long_factor"] if seq_len and seq_len > orig else rs["short_factor"], dtype=torch.float32)
    shape = torch.arange(0, D, 2, dtype=torch.int64).float() / D
    return 1.0 / (ext * base ** shape), float(att)


def dynamic(cfg, seq_len):
    rs, _ = _scaling(cfg)
    base, D = _theta(cfg), _dim(cfg)
    maxpos, factor = cfg["max_position_embeddings"], rs["factor"]
    if seq_len is not None and seq_len > maxpos:
        s = torch.tensor(seq_len)   # a tensor, as in the forward's update: f32 arithmetic
        base = base * ((factor * s / maxpos) - (factor - 1)) ** (D / (D - 2))
    return 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D)), 1.0


def inv_freq_for_call(cfg, seq_len):
    """(inv_freq f32 [R/2], attention factor) of a forward over positions [0, seq_len); R the
    rotated dimensions (_dim)."""
    _, kind = _scaling(cfg)
    if kind == "yarn":
        return yarn(cfg)
    if kind in ("longrope", "su"):
        return longrope(cfg, seq_len)
    if kind == "dynamic":
        return dynamic(cfg, seq_len)
    import model_ref   # default, linear, llama3: no length dependence, no attention factor
    return model_ref.inv_freq(cfg), 1.0


def precision_figures(theta=500000.0, D=128, pos=32767):
    """The largest angle (radians) between inverse frequencies made in f32 (transformers') and
    in double rounded to f32 (clrt before issue 45), at position pos."""
    e = torch.arange(0, D, 2, dtype=torch.int64).float() / D
    f32 = 1.0 / (theta ** e)
    f64 = (1.0 / (theta ** e.double())).float()
    ang32 = pos * f32
    ang64 = pos * f64
    return float((ang32.double() - ang64.double()).abs().max()), int((f32 != f64).sum())


if __name__ == "__main__":
    for theta, D in ((10000.0, 64), (500000.0, 128), (1000000.0, 128)):
        d, n = precision_figures(theta, D)
        print(f"theta {theta:g}, head_dim {D}: {n} of {D // 2} inverse frequencies differ; "
              f"largest angle difference at position 32767: {d:.3g} rad")
