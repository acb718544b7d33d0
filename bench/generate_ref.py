"""The PyTorch peer of bench/generate.lua: a KV-cache greedy decode loop over the reference
model of tests/reference/model_ref.py (same architecture and shapes), float32 (or the whole
model in bfloat16 with a 6th argument "bf16"; "int8": PyTorch's dynamic int8 linear layers,
torch.ops.quantized.linear_dynamic over per-output-channel qint8 weights, activations
quantized per call, as clrt's quant=int8), 2 threads; the median of BENCH_REPS runs.
Prints one JSON line: {"prefill_s", "decode_s", "tokens_per_s"}."""
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "reference"))
import model_ref as ref  # noqa: E402


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def int8_linears(P):
    """Every 2-D weight prepacked for torch.ops.quantized.linear_dynamic (qint8, per channel)."""
    packed = {}
    for n, w in P.items():
        if w.dim() == 2:
            scale = (w.abs().amax(1) / 127).clamp(min=1e-12).double()
            q = torch.quantize_per_channel(w, scale, torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
            packed[n] = torch.ops.quantized.linear_prepack(q, None)
    return packed


def decode_loop(cfg, P, B, prompt_len, new_tokens, dev="cpu", dtype=torch.float32, q8=None):
    H, KV, D = ref.dims(cfg)
    eps = cfg["rms_norm_eps"]
    L = cfg["num_hidden_layers"]
    total = prompt_len + new_tokens
    cos, sin = ref.rope_cos_sin(cfg, total, torch.float32)
    cos, sin = cos.to(dev, dtype), sin.to(dev, dtype)
    head_name = "lm_head.weight" if "lm_head.weight" in P else "model.embed_tokens.weight"

    def lin(x, name):
        if q8 is None:
            return x @ P[name].T
        return torch.ops.quantized.linear_dynamic(x.reshape(-1, x.shape[-1]), q8[name]).view(*x.shape[:-1], -1)
    kc = [torch.zeros(B, KV, total, D, device=dev, dtype=dtype) for _ in range(L)]
    vc = [torch.zeros(B, KV, total, D, device=dev, dtype=dtype) for _ in range(L)]

    def step(tokens, pos):
        T = tokens.shape[1]
        x = P["model.embed_tokens.weight"][tokens]
        c, s = cos[pos:pos + T], sin[pos:pos + T]
        for l in range(L):
            p = f"model.layers.{l}."
            h = ref.rmsnorm(x, P[p + "input_layernorm.weight"], eps)
            q = lin(h, p + "self_attn.q_proj.weight").view(B, T, H, D).transpose(1, 2)
            k = lin(h, p + "self_attn.k_proj.weight").view(B, T, KV, D).transpose(1, 2)
            v = lin(h, p + "self_attn.v_proj.weight").view(B, T, KV, D).transpose(1, 2)
            q = q * c + ref.rotate_half(q) * s
            k = k * c + ref.rotate_half(k) * s
            kc[l][:, :, pos:pos + T] = k
            vc[l][:, :, pos:pos + T] = v
            kk = kc[l][:, :, :pos + T].repeat_interleave(H // KV, dim=1)
            vv = vc[l][:, :, :pos + T].repeat_interleave(H // KV, dim=1)
            sc = (q @ kk.transpose(-1, -2)) / math.sqrt(D)
            if T > 1:
                mask = torch.ones(T, pos + T, dtype=torch.bool, device=dev).tril(pos)
                sc = sc.masked_fill(~mask, float("-inf"))
            a = (torch.softmax(sc, dim=-1) @ vv).transpose(1, 2).reshape(B, T, H * D)
            x = x + lin(a, p + "self_attn.o_proj.weight")
            h = ref.rmsnorm(x, P[p + "post_attention_layernorm.weight"], eps)
            m = torch.nn.functional.silu(lin(h, p + "mlp.gate_proj.weight")) * lin(h, p + "mlp.up_proj.weight")
            x = x + lin(m, p + "mlp.down_proj.weight")
        x = ref.rmsnorm(x[:, -1], P["model.norm.weight"], eps)
        return lin(x, head_name).argmax(-1, keepdim=True)

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg["vocab_size"], (B, prompt_len), generator=g).to(dev)
    sync(dev)
    t0 = time.perf_counter()
    tok = step(prompt, 0)
    sync(dev)
    t1 = time.perf_counter()
    for i in range(new_tokens - 1):
        tok = step(tok, prompt_len + i)
    sync(dev)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def main():
    cfg = json.loads(sys.argv[1])
    B, prompt_len, new_tokens = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    dev = sys.argv[5] if len(sys.argv) > 5 else "cpu"   # "cuda": on the GPU, TF32 off
    if dev == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA in this PyTorch build or no GPU"}))
        return
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    kind = sys.argv[6] if len(sys.argv) > 6 else "f32"
    if kind == "int8" and dev != "cpu":
        print(json.dumps({"error": "int8 linear layers run on the cpu only"}))
        return
    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    P = {n: t.to(dev, dtype) for n, t in ref.init_params(cfg, 0, dtype=torch.float32).items()}
    q8 = int8_linears(P) if kind == "int8" else None
    with torch.inference_mode():
        decode_loop(cfg, P, B, prompt_len, 4, dev, dtype, q8)   # warm-up
        # The median of BENCH_REPS timed loops, as bench/generate.lua takes its own.
        runs = sorted(decode_loop(cfg, P, B, prompt_len, new_tokens, dev, dtype, q8)
                      for _ in range(int(os.environ.get("BENCH_REPS", "1"))))
        pre, dec = runs[len(runs) // 2]
    print(json.dumps({"prefill_s": pre, "decode_s": dec,
                      "tokens_per_s": B * (new_tokens - 1) / dec}))


if __name__ == "__main__":
    main()
