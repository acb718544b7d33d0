"""train_step_torch.py — the PyTorch peer of bench/train_step.lua: the same model
(tests/reference/model_ref.py, float32, 2 threads unless told), forward + backward + AdamW on B x T random
tokens. Prints one line: `torch tokens_per_s=<median step> peak_rss_mb=<y> best_tokens_per_s=<fastest step>`.
An optional 6th argument `cuda` runs it on the GPU (float32, TF32 off, as clrt's CUDA path).
Optional 7th and 8th: a LoRA rank r (0: full fine-tune) and the base's dtype (f32 or bf16):
the peer is then a LoRA of its own (no peft here) — the base frozen (no gradients, no optimizer
state), y = x W^T + b + (2r / r) (x A^T) B^T on the seven projections of every layer, A, B
trained by AdamW; a bf16 base holds those seven weights in bf16 and multiplies bf16 inputs
(F.linear in bf16, f32 out), as a bf16 base under peft does; embeddings and head stay f32.
Optional 9th: `bf16` runs forward and backward under bf16 autocast (f32 master weights), the
peer of clrt's m:set_matmul("bf16")."""
import contextlib
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import model_ref as R  # noqa: E402
import json  # noqa: E402


class OnDevice:
    """model_ref builds helper tensors (RoPE angles, masks) with torch factories; this stand-in
    for its `torch` puts them on the benchmark's device."""

    FACTORIES = ("arange", "ones", "zeros", "full", "empty", "tensor", "randn", "rand")

    def __init__(self, dev):
        self.dev = dev

    def __getattr__(self, name):
        f = getattr(torch, name)
        if name in self.FACTORIES:
            return lambda *a, **k: f(*a, **{"device": self.dev, **k})
        return f


def main():
    cfg = json.loads(sys.argv[1])
    B, T, steps = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(int(sys.argv[5]) if len(sys.argv) > 5 else 2)
    dev = sys.argv[6] if len(sys.argv) > 6 else "cpu"
    if dev == "cuda" and not torch.cuda.is_available():
        print("torch error=no CUDA in this PyTorch build or no GPU")
        return
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    r = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    base_dtype = sys.argv[8] if len(sys.argv) > 8 else "f32"
    autocast = (torch.autocast(device_type=dev, dtype=torch.bfloat16)
                if len(sys.argv) > 9 and sys.argv[9] == "bf16" else contextlib.nullcontext())
    P = {n: t.to(dev).requires_grad_(r == 0) for n, t in R.init_params(cfg, 0, torch.float32).items()}
    if dev == "cuda":
        # after init_params: its weights come from a cpu generator (the same values as clrt's)
        R.torch = OnDevice(dev)
    linear, trained = None, list(P.values())
    if r > 0:
        targets = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                   "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
        A, Bm, g = {}, {}, torch.Generator().manual_seed(1)
        for l in range(cfg["num_hidden_layers"]):
            for t in targets:
                name = f"model.layers.{l}.{t}"
                o, i = P[name + ".weight"].shape
                A[name] = ((torch.rand(r, i, generator=g) * 2 - 1) / i ** 0.5).to(dev).requires_grad_(True)
                Bm[name] = torch.zeros(o, r, device=dev).requires_grad_(True)
                if base_dtype == "bf16":
                    P[name + ".weight"] = P[name + ".weight"].detach().to(torch.bfloat16)
        scale = 2.0   # alpha = 2r

        def linear(name, inp):
            W, b = P[name + ".weight"], P.get(name + ".bias")
            y = torch.nn.functional.linear(inp.to(W.dtype), W).to(inp.dtype)
            if b is not None:
                y = y + b
            return y + scale * ((inp @ A[name].T) @ Bm[name].T)
        trained = list(A.values()) + list(Bm.values())
    opt = torch.optim.AdamW(trained, lr=1e-4, weight_decay=0.1)
    tokens = torch.randint(0, cfg["vocab_size"], (B, T)).to(dev)
    lengths = [T] * B

    def step():
        opt.zero_grad(set_to_none=False)
        with autocast:
            lp, valid = R.logprobs(cfg, P, tokens, lengths, linear)
            loss = -lp.float().sum() / valid.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        if dev == "cuda":
            torch.cuda.synchronize()

    step()   # warm-up
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"torch tokens_per_s={B * T / times[len(times) // 2]:.1f} peak_rss_mb={rss:.1f} "
          f"best_tokens_per_s={B * T / times[0]:.1f}")


if __name__ == "__main__":
    main()
