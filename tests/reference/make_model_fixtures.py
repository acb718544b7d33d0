"""make_model_fixtures.py — writes tests/fixtures/model/<config>/ from model_ref.py:
a Hugging Face model folder (config.json + model.safetensors, sharded for one config) and
expected.safetensors holding the token batch, the expected log-probs, a dlogp, every
parameter gradient of sum(lp * dlogp), and the losses of 10 AdamW steps on an SFT loss.
The reference runs in float64, so the fixtures are the exact answer for the f32 weights.
Configs with a sliding window also carry a greedy continuation (greedy_prompt, greedy) longer
than the window.

Run: /usr/bin/python3 tests/reference/make_model_fixtures.py [name ...]   (from the source
root; names: only those configs)
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_ref as R  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "model")

CONFIGS = {
    # Llama 3 style: untied head, grouped-query attention, llama3 RoPE scaling whose
    # wavelength bands (4 and 16 positions) put the head's frequencies in all three regimes.
    "llama_gqa": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
        "attention_bias": False, "hidden_act": "silu",
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    },
    # Qwen2 style: tied embeddings, biases on q/k/v (not o).
    "qwen2_tied": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "vocab_size": 128, "hidden_size": 32, "intermediate_size": 80, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
        "hidden_act": "silu", "rope_scaling": None,
    },
    # Qwen3 style: q/k RMSNorm per head, head_dim (16) != hidden / heads (8); stored sharded.
    "qwen3_qknorm": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu",
    },
    # Odd sizes: hidden 36 (not a multiple of 8), vocab 101 (not a multiple of 64), 3 heads
    # sharing one kv head of dim 12, and Llama attention_bias (biases on q/k/v/o).
    "odd": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": 101, "hidden_size": 36, "intermediate_size": 50, "num_hidden_layers": 2,
        "num_attention_heads": 3, "num_key_value_heads": 1, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "attention_bias": True, "hidden_act": "silu",
    },
    # Mistral: Llama's layers with a sliding window of 4 positions (the batch's rows are 10, 7
    # and 4 long, the greedy sequence 15), GQA.
    "mistral_window": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral",
        "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "max_position_embeddings": 64, "sliding_window": 4, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
    },
    # Phi-3: fused qkv_proj (q, k, v rows of 4, 2 and 2 heads of 12) and gate_up_proj, a window
    # of 6, the keys Phi-3-mini's config.json carries.
    "phi3_fused": {
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
        "vocab_size": 100, "hidden_size": 48, "intermediate_size": 40, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
        "original_max_position_embeddings": 64, "sliding_window": 6, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": False,
        "hidden_act": "silu", "attention_bias": False, "embd_pdrop": 0.0, "resid_pdrop": 0.0,
        "attention_dropout": 0.0, "pad_token_id": 0,
    },
}
GREEDY_PROMPT, GREEDY_STEPS = [3, 17, 5], 12

B, T = 3, 10
LENGTHS = [10, 7, 4]
ADAMW = {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 1.0}


def batch(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)   # padding: random ids
    dlogp = torch.randn(B, T - 1, generator=g, dtype=torch.float64)
    return tokens, dlogp


def write_model(d, cfg, P, dtype="F32", shards=1):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    names = list(P.keys())
    if shards == 1:
        R.save_safetensors(os.path.join(d, "model.safetensors"), P, dtype, {"format": "pt"})
        return
    per = (len(names) + shards - 1) // shards
    wmap, total = {}, 0
    for s in range(shards):
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: P[n] for n in names[s * per:(s + 1) * per]}
        R.save_safetensors(os.path.join(d, fn), part, dtype, {"format": "pt"})
        for n, t in part.items():
            wmap[n] = fn
            total += t.numel() * 4
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2)


def adamw_losses(cfg, P0, tokens, steps=10):
    P = {n: t.clone().requires_grad_(True) for n, t in P0.items()}
    decay = [t for n, t in P.items() if t.dim() == 2]
    no_decay = [t for n, t in P.items() if t.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": ADAMW["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=ADAMW["lr"], betas=tuple(ADAMW["betas"]), eps=ADAMW["eps"])
    losses, norms = [], []
    for _ in range(steps):
        opt.zero_grad()
        lp, valid = R.logprobs(cfg, P, tokens, LENGTHS)
        loss = -lp.sum() / valid.sum()
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(P.values()), ADAMW["grad_clip"])))
        losses.append(float(loss))
        opt.step()
    return losses, norms


def make(name, cfg, seed):
    P = R.init_params(cfg, seed)
    tokens, dlogp = batch(cfg, seed + 1000)
    Pg = {n: t.clone().requires_grad_(True) for n, t in P.items()}
    lp, valid = R.logprobs(cfg, Pg, tokens, LENGTHS)
    dlogp = torch.where(valid, dlogp, torch.zeros_like(dlogp))
    (lp * dlogp).sum().backward()
    losses, norms = adamw_losses(cfg, P, tokens)
    d = os.path.join(OUT, name)
    write_model(d, cfg, P, shards=2 if name == "qwen3_qknorm" else 1)
    exp = {"tokens": tokens.to(torch.int32), "lengths": torch.tensor(LENGTHS, dtype=torch.int32),
           "lp": lp.detach(), "dlogp": dlogp, "losses": torch.tensor(losses),
           "grad_norms": torch.tensor(norms)}
    for n, t in Pg.items():
        exp["grad." + n] = t.grad
    if R.window_of(cfg):
        out, gap = R.greedy(cfg, P, GREEDY_PROMPT, GREEDY_STEPS)
        assert len(GREEDY_PROMPT) + GREEDY_STEPS > R.window_of(cfg)
        assert gap > 1e-3, f"{name}: greedy argmax too close to a tie ({gap})"
        exp["greedy_prompt"] = torch.tensor(GREEDY_PROMPT, dtype=torch.int32)
        exp["greedy"] = torch.tensor(out, dtype=torch.int32)
        print(f"{name}: greedy {out}, smallest top-2 gap {gap:.4f}")
    R.save_safetensors(os.path.join(d, "expected.safetensors"), exp, "F32",
                       {"adamw": json.dumps(ADAMW)})
    print(f"{name}: {sum(t.numel() for t in P.values())} params, lp[0,:3] = {lp[0, :3].tolist()}")
    if name == "odd":
        # The same model stored in BF16 and F16: expected lp from the rounded weights.
        for dt, tdt in (("BF16", torch.bfloat16), ("F16", torch.float16)):
            Pr = {n: t.to(torch.float32).to(tdt).to(torch.float64) for n, t in P.items()}
            lpr, _ = R.logprobs(cfg, Pr, tokens, LENGTHS)
            dd = os.path.join(OUT, "odd_" + dt.lower())
            write_model(dd, cfg, P, dtype=dt)
            R.save_safetensors(os.path.join(dd, "expected.safetensors"),
                               {"tokens": tokens.to(torch.int32),
                                "lengths": torch.tensor(LENGTHS, dtype=torch.int32),
                                "lp": lpr.detach()}, "F32")


if __name__ == "__main__":
    torch.set_num_threads(2)
    for i, (name, cfg) in enumerate(CONFIGS.items()):
        if len(sys.argv) < 2 or name in sys.argv[1:]:
            make(name, cfg, 10 + i)
