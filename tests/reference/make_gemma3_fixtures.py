"""make_gemma3_fixtures.py — writes tests/fixtures/model/gemma3_tiny/ (and gemma3_softcap/, the
same with final_logit_softcapping and attn_logit_softcapping) from gemma3_ref.py: a
Hugging Face folder (config.json, model.safetensors with Gemma3ForCausalLM's names) and
expected.safetensors with a token batch longer than the sliding window, its log-probs, a
dlogp, every parameter gradient of sum(lp * dlogp), the same for one row of 150 tokens, and a
greedy continuation (float64) that runs past the window, with the smallest top-2 logit gap.

Run: /usr/bin/python3 tests/reference/make_gemma3_fixtures.py   (from the source root)
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemma3_ref as G  # noqa: E402
import model_ref as R  # noqa: E402
from make_model_fixtures import write_model  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "model")

# 4 layers, every third global: layers 0, 1 and 3 local (window 5), layer 2 global with linear
# RoPE scaling; local base 100 against global 10000 so a swapped base moves every score;
# query_pre_attn_scalar 24 against head_dim 16.
CONFIG = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
    "vocab_size": 96, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "rope_local_base_freq": 100.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    "sliding_window": 5, "sliding_window_pattern": 3, "query_pre_attn_scalar": 24,
    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
    "final_logit_softcapping": None, "attn_logit_softcapping": None, "attention_bias": False,
}
B, T = 3, 12
LENGTHS = [12, 9, 4]
PROMPT = [3, 17, 42]
NEW = 20
LONG = 150


def make(name, cfg):
    P = G.init_params(cfg, 36)
    g = torch.Generator().manual_seed(1036)
    tokens = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
    dlogp = torch.randn(B, T - 1, generator=g, dtype=torch.float64)
    Pg = {n: t.clone().requires_grad_(True) for n, t in P.items()}
    lp, valid = G.logprobs(cfg, Pg, tokens, LENGTHS)
    dlogp = torch.where(valid, dlogp, torch.zeros_like(dlogp))
    (lp * dlogp).sum().backward()
    with torch.no_grad():
        cont, gap = G.greedy(cfg, P, PROMPT, NEW)
    d = os.path.join(OUT, name)
    write_model(d, cfg, P)
    exp = {"tokens": tokens.to(torch.int32), "lengths": torch.tensor(LENGTHS, dtype=torch.int32),
           "lp": lp.detach(), "dlogp": dlogp, "prompt": torch.tensor(PROMPT, dtype=torch.int32),
           "greedy": torch.tensor(cont, dtype=torch.int32), "greedy_gap": torch.tensor([gap])}
    for n, t in Pg.items():
        exp["grad." + n] = t.grad
    # one row of 150 tokens: the attention kernels' query blocks (64 rows) past the first
    long = torch.randint(0, cfg["vocab_size"], (1, LONG), generator=g)
    dlong = torch.randn(1, LONG - 1, generator=g, dtype=torch.float64)
    Pl = {n: t.clone().requires_grad_(True) for n, t in P.items()}
    lpl, _ = G.logprobs(cfg, Pl, long, [LONG])
    (lpl * dlong).sum().backward()
    exp.update({"long_tokens": long.to(torch.int32), "long_lp": lpl.detach(), "long_dlogp": dlong})
    for n, t in Pl.items():
        exp["long_grad." + n] = t.grad
    R.save_safetensors(os.path.join(d, "expected.safetensors"), exp, "F32")
    print(f"{name}: {sum(t.numel() for t in P.values())} params, lp[0,:3] = {lp[0, :3].tolist()}, "
          f"greedy {cont}, smallest top-2 gap {gap:.4g}")


if __name__ == "__main__":
    torch.set_num_threads(2)
    make("gemma3_tiny", CONFIG)
    # a cap of 2 bends logits of this model's size (|z| up to ~6) well into the tanh
    # and a cap of 1 on the attention scores (this model's reach ~3)
    make("gemma3_softcap", dict(CONFIG, final_logit_softcapping=2.0, attn_logit_softcapping=1.0))
