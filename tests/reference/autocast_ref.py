"""autocast_ref.py — PyTorch's autocast(bfloat16) over a model's linear projections, the peer
of clrt's train.precision=bf16 (tests/lua/test_train_bf16.lua).

    autocast_ref.py MODEL_DIR TOKENS_JSON OUT.safetensors

Loads MODEL_DIR (config.json, model.safetensors, f32), runs model_ref.logprobs on the rows of
TOKENS_JSON (a list of equal-length token lists) with the blocks' seven projections computed
by torch.nn.functional.linear under torch.autocast("cpu", dtype=torch.bfloat16) — bf16
inputs and weights, f32 sums rounded to a bf16 output, and autocast's bf16 backward — and the
rest (norms, attention, the output layer, the loss) in f32, as clrt's bf16 mode scopes it.
The loss is sum(logprobs) * -1/count (clrt's test's dlogp). Writes "logprobs" [B, T-1] and
every parameter's gradient under its own name (f32)."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_ref as R  # noqa: E402


def main():
    model_dir, tokens_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    P = {n: t.to(torch.float32).requires_grad_(True)
         for n, t in R.load_safetensors(os.path.join(model_dir, "model.safetensors")).items()}
    with open(tokens_path) as f:
        rows = json.load(f)
    tokens = torch.tensor(rows, dtype=torch.long)
    B, T = tokens.shape

    def linear(name, inp):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.nn.functional.linear(inp, P[name + ".weight"], P.get(name + ".bias"))
        return y.float()

    lp, _ = R.logprobs(cfg, P, tokens, [T] * B, linear=linear)
    (lp.sum() * (-1.0 / (B * (T - 1)))).backward()
    outs = {"logprobs": lp.detach()}
    for n, t in P.items():
        if t.grad is not None:
            outs[n] = t.grad.detach()
    R.save_safetensors(out, outs)


if __name__ == "__main__":
    main()
