"""make_rope_fixtures.py — writes tests/fixtures/model/rope_{yarn,longrope,dynamic,partial}/
(tiny models whose RoPE is yarn, longrope, dynamic NTK and longrope over part of the head, from
model_ref.py with rope_ref.py's frequencies) and tests/fixtures/model/rope_variants.json (the inverse frequencies and
attention factors of more configs, real published RoPE settings among them, at a short and a
long call length).

Each model folder: config.json, model.safetensors, expected.safetensors with a batch within
original_max_position_embeddings (short_*) and one row past it (long_*; for dynamic past
max_position_embeddings): tokens, log-probs, a dlogp and every parameter gradient of
sum(lp * dlogp).

Run: /usr/bin/python3 tests/reference/make_rope_fixtures.py   (from the source root)
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_ref as R  # noqa: E402
import rope_ref  # noqa: E402
from make_model_fixtures import write_model  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "model")

BASE = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False}

# Pair factors of a real-looking shape (rising with the pair), head_dim 8: 4 pairs.
SHORT, LONG_F = [1.0, 1.05, 1.3, 2.1], [1.0, 1.9, 6.5, 14.0]

MODELS = {
    # Qwen2.5/Qwen3's long-context form: factor 4 over an original 32 (here max 128)
    "rope_yarn": dict(BASE, architectures=["Qwen2ForCausalLM"], max_position_embeddings=128, rope_theta=10000.0,
                      rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
    # Phi-3.5/Phi-4-mini's form: top-level original_max_position_embeddings, factor max / original
    "rope_longrope": dict(BASE, architectures=["Phi3ForCausalLM"], max_position_embeddings=128,
                          original_max_position_embeddings=32, rope_theta=10000.0, pad_token_id=0,
                          rope_scaling={"type": "longrope", "short_factor": SHORT, "long_factor": LONG_F}),
    # Phi-4-mini's form with its partial rotary: 6 of head_dim 8 rotate (its 96 of 128), 3 pairs
    "rope_partial": dict(BASE, architectures=["Phi3ForCausalLM"], max_position_embeddings=128,
                         original_max_position_embeddings=32, rope_theta=10000.0, pad_token_id=0,
                         partial_rotary_factor=0.75,
                         rope_scaling={"type": "longrope", "short_factor": SHORT[:3], "long_factor": LONG_F[:3]}),
    "rope_dynamic": dict(BASE, architectures=["LlamaForCausalLM"], max_position_embeddings=48, rope_theta=10000.0,
                         rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
}
SHORT_T, LONG_T = 20, 72

# inverse frequencies only: more of transformers' branches
VARIANTS = {
    "yarn_no_original": dict(BASE, head_dim=16, max_position_embeddings=64, rope_theta=1000000.0,
                             rope_scaling={"rope_type": "yarn", "factor": 4.0}),
    "yarn_mscale": dict(BASE, head_dim=16, max_position_embeddings=256, rope_theta=10000.0,
                        rope_scaling={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
                                      "mscale": 1.0, "mscale_all_dim": 0.707, "beta_fast": 16, "beta_slow": 2}),
    "yarn_untruncated_af": dict(BASE, head_dim=16, max_position_embeddings=64, rope_theta=500000.0,
                                rope_scaling={"rope_type": "yarn", "factor": 2.0, "truncate": False,
                                              "attention_factor": 1.25}),
    "longrope_factor_only": dict(BASE, head_dim=8, max_position_embeddings=64, rope_theta=10000.0,
                                 rope_scaling={"type": "su", "factor": 8.0, "short_factor": SHORT,
                                               "long_factor": LONG_F}),
    "dynamic_128": dict(BASE, head_dim=128, hidden_size=512, max_position_embeddings=4096, rope_theta=500000.0,
                        rope_scaling={"rope_type": "dynamic", "factor": 4.0}),
}
VARIANT_LENGTHS = [0, 16, 40, 300, 4097, 32768, 131072]


def batch(cfg, P, B, T, g):
    tokens = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
    tokens[0, 3] = 0   # the pad row (longrope's pad_token_id 0) is looked up
    dlogp = torch.randn(B, T - 1, generator=g, dtype=torch.float64)
    Pg = {n: t.clone().requires_grad_(True) for n, t in P.items()}
    lp, _ = R.logprobs(cfg, Pg, tokens, [T] * B)
    (lp * dlogp).sum().backward()
    return tokens, lp.detach(), dlogp, {n: t.grad for n, t in Pg.items()}


def make(name, cfg):
    P = R.init_params(cfg, 45)
    g = torch.Generator().manual_seed(4500)
    d = os.path.join(OUT, name)
    write_model(d, cfg, P)
    exp = {}
    for tag, B, T in (("short", 2, SHORT_T), ("long", 1, LONG_T)):
        tokens, lp, dlogp, grads = batch(cfg, P, B, T, g)
        exp.update({tag + "_tokens": tokens.to(torch.int32), tag + "_lp": lp, tag + "_dlogp": dlogp})
        for n, t in grads.items():
            exp[f"{tag}_grad.{n}"] = t
    R.save_safetensors(os.path.join(d, "expected.safetensors"), exp, "F32")
    print(f"{name}: lp short[0,:3] {exp['short_lp'][0, :3].tolist()}, long[0,-3:] {exp['long_lp'][0, -3:].tolist()}")


HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "hf_configs")


def published():
    """The published configs of tests/fixtures/hf_configs, and Qwen3's documented long-context
    edit (its model card's rope_scaling for 131072 tokens)."""
    out = {}
    for name in sorted(os.listdir(HF)):
        path = os.path.join(HF, name, "config.json")
        if os.path.exists(path):
            with open(path) as fh:
                cfg = json.load(fh)
            out["hf:" + name] = cfg
    q3 = dict(out["hf:Qwen3-0.6B"], rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 32768})
    out["hf:Qwen3-0.6B+yarn"] = q3
    return out


def variants():
    out = {}
    for name, cfg in list(VARIANTS.items()) + list(MODELS.items()) + list(published().items()):
        rows = []
        for n in VARIANT_LENGTHS:
            f, att = rope_ref.inv_freq_for_call(cfg, n or None)
            rows.append({"seq_len": n, "inv_freq": ["%.9g" % float(v) for v in f], "attention_factor": att})
        out[name] = {"config": cfg, "calls": rows}
    with open(os.path.join(OUT, "rope_variants.json"), "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    torch.set_num_threads(2)
    for k, v in MODELS.items():
        make(k, v)
    variants()
