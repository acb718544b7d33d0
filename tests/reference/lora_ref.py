"""lora_ref.py — an independent PyTorch LoRA over model_ref.py's transformer, and the fixtures
tests/lua/test_lora.lua checks clrt against: tests/fixtures/lora/<name>/ holds a PEFT adapter
folder (adapter_config.json + adapter_model.safetensors, PEFT's tensor names and shapes) over
the base of tests/fixtures/model/<base>/, and expected.safetensors with the token batch, the
adapted model's log-probs, a dlogp and the gradient of sum(lp * dlogp) for every adapter
tensor (lora_A [r, in], lora_B [out, r]), plus the base's log-probs.

Targets: the blocks' projections, and the output layer and the embedding (names and shapes as
PEFT's LoRA layers hold them, read from peft/tuners/lora/layer.py: a Linear's lora_A.weight
[r, in] / lora_B.weight [out, r], so base_model.model.lm_head.lora_A.weight [r, hidden] and
lora_B.weight [vocab, r]; an Embedding's lora_embedding_A [r, vocab] and lora_embedding_B
[hidden, r], no ".weight", out = E[x] + scale (A^T[x]) B^T, no dropout).

LoRA here is the adapted weight W + (alpha / r) B A (no dropout: dropout is checked in clrt by
determinism and finite differences), differentiated by autograd in float64 — a different
computation from clrt's two products beside the frozen layer, with the same answer. The
embedding's adapted table is E + scale A^T B^T; with a tied base an adapter on either side
unties it (the other side keeps the base's E), as a merged model does.

Run: /usr/bin/python3 tests/reference/lora_ref.py [case ...]   (from the source root; all
cases without arguments)
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model_ref as R  # noqa: E402

FIX = os.path.join(HERE, "..", "fixtures")

# name: (base fixture, r, alpha, target modules, seed)
CASES = {
    "qwen2_all": ("qwen2_tied", 4, 8.0, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                         "up_proj", "down_proj"], 31),
    "qwen3_some": ("qwen3_qknorm", 3, 5.0, ["q_proj", "v_proj", "down_proj"], 32),
    # the output layer and the embedding: over a tied base and an untied one
    "qwen2_head_embed": ("qwen2_tied", 4, 8.0, ["v_proj", "lm_head", "embed_tokens"], 33),
    "qwen3_head_embed": ("qwen3_qknorm", 3, 5.0, ["lm_head", "embed_tokens", "down_proj"], 34),
    # Phi-3's fused layers carry one adapter each (B spans the q, k, v or gate, up rows);
    # Mistral's sliding window under adapters
    "phi3_fused_all": ("phi3_fused", 4, 8.0, ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], 35),
    "mistral_some": ("mistral_window", 3, 6.0, ["q_proj", "v_proj", "up_proj"], 36),
}
GROUP = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
         "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp",
         "qkv_proj": "self_attn", "gate_up_proj": "mlp"}
B, T = 3, 10
LENGTHS = [10, 7, 4]


def load_base(base):
    d = os.path.join(FIX, "model", base)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    P = {}
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    for s in shards:
        P.update(R.load_safetensors(os.path.join(d, s)))
    return cfg, {n: t.to(torch.float64) for n, t in P.items()}


def adapter_tensors(cfg, P, r, targets, seed):
    """PEFT's names and shapes; random A and B (B nonzero, so every gradient is exercised)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for l in range(cfg["num_hidden_layers"]):
        for t in targets:
            if t not in GROUP:
                continue
            w = P[f"model.layers.{l}.{GROUP[t]}.{t}.weight"]
            o, i = w.shape
            pre = f"base_model.model.model.layers.{l}.{GROUP[t]}.{t}"
            out[pre + ".lora_A.weight"] = (torch.rand(r, i, generator=g, dtype=torch.float64) * 2 - 1) / i ** 0.5
            out[pre + ".lora_B.weight"] = torch.randn(o, r, generator=g, dtype=torch.float64) * 0.05
    V, C = cfg["vocab_size"], cfg["hidden_size"]
    if "lm_head" in targets:
        out["base_model.model.lm_head.lora_A.weight"] = (torch.rand(r, C, generator=g, dtype=torch.float64) * 2 - 1) / C ** 0.5
        out["base_model.model.lm_head.lora_B.weight"] = torch.randn(V, r, generator=g, dtype=torch.float64) * 0.5
    if "embed_tokens" in targets:
        out["base_model.model.model.embed_tokens.lora_embedding_A"] = torch.randn(r, V, generator=g, dtype=torch.float64) * 0.5
        out["base_model.model.model.embed_tokens.lora_embedding_B"] = torch.randn(C, r, generator=g, dtype=torch.float64) * 0.05
    # f32 on disk: the reference computes with exactly the values clrt reads
    return {n: t.to(torch.float32).to(torch.float64) for n, t in out.items()}


def adapted(P, A, scale):
    """The base with each target weight replaced by W + scale * B A."""
    Q = dict(P)
    E = P["model.embed_tokens.weight"]
    head = P.get("lm_head.weight", E)
    EMB = "base_model.model.model.embed_tokens.lora_embedding_"
    if "base_model.model.lm_head.lora_A.weight" in A:
        Q["lm_head.weight"] = head + scale * (A["base_model.model.lm_head.lora_B.weight"]
                                              @ A["base_model.model.lm_head.lora_A.weight"])
    if EMB + "A" in A:
        Q["lm_head.weight"] = Q.get("lm_head.weight", head)   # a tied head keeps the base's E
        Q["model.embed_tokens.weight"] = E + scale * (A[EMB + "A"].T @ A[EMB + "B"].T)
    for n in A:
        if n.endswith(".lora_A.weight") and ".layers." in n:
            pre = n[: -len(".lora_A.weight")]
            base = "model." + pre[len("base_model.model.model."):] + ".weight"
            Q[base] = P[base] + scale * (A[pre + ".lora_B.weight"] @ A[n])
    return Q


def make(name, base, r, alpha, targets, seed):
    cfg, P = load_base(base)
    A = adapter_tensors(cfg, P, r, targets, seed)
    g = torch.Generator().manual_seed(seed + 1000)
    tokens = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
    dlogp = torch.randn(B, T - 1, generator=g, dtype=torch.float64)
    Ag = {n: t.clone().requires_grad_(True) for n, t in A.items()}
    lp, valid = R.logprobs(cfg, adapted(P, Ag, alpha / r), tokens, LENGTHS)
    dlogp = torch.where(valid, dlogp, torch.zeros_like(dlogp))
    (lp * dlogp).sum().backward()
    lp_base, _ = R.logprobs(cfg, P, tokens, LENGTHS)
    d = os.path.join(FIX, "lora", name)
    os.makedirs(d, exist_ok=True)
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
        "r": r, "lora_alpha": alpha, "lora_dropout": 0.0, "target_modules": targets,
        "bias": "none", "fan_in_fan_out": False, "inference_mode": True, "use_rslora": False,
        "use_dora": False, "modules_to_save": None, "init_lora_weights": True,
        "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {},
        "alpha_pattern": {}, "revision": None,
    }
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    R.save_safetensors(os.path.join(d, "adapter_model.safetensors"), A, "F32", {"format": "pt"})
    exp = {"tokens": tokens.to(torch.int32), "lengths": torch.tensor(LENGTHS, dtype=torch.int32),
           "lp": lp.detach(), "lp_base": lp_base, "dlogp": dlogp}
    for n, t in Ag.items():
        exp["grad." + n] = t.grad
    R.save_safetensors(os.path.join(d, "expected.safetensors"), exp, "F32", {"base": base})
    print(f"{name}: {len(A)} adapter tensors, lp[0,:3] = {lp[0, :3].tolist()}, "
          f"max |lp - lp_base| = {float((lp - lp_base).abs().max()):.3g}")


if __name__ == "__main__":
    torch.set_num_threads(2)
    for name in sys.argv[1:] or list(CASES):
        make(name, *CASES[name])
