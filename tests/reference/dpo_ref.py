"""Writes tests/fixtures/dpo/dpo_ref.json: the DPO sigmoid loss (with label smoothing) and its
gradient with respect to the per-token log-probs, computed by PyTorch autograd from the
formula as TRL's DPOTrainer states it (loss_type "sigmoid"), on fixed log-probs. The Lua
loss (lua/clrt/train/losses.lua, losses.dpo) is checked against it in tests/lua/test_dpo.lua.
Run with Debian's python3 (python3-torch): /usr/bin/python3 tests/reference/dpo_ref.py"""
import json
import os

import torch
import torch.nn.functional as F

torch.manual_seed(7)


def dpo(logp, mask, ref_c, ref_r, beta, ls):
    # logp, mask: [2P, T]; rows 2k (chosen) and 2k+1 (rejected) in 0-based order.
    seq = (logp * mask).sum(-1)
    pi_c, pi_r = seq[0::2], seq[1::2]
    logits = (pi_c - ref_c) - (pi_r - ref_r)
    losses = -F.logsigmoid(beta * logits) * (1 - ls) - F.logsigmoid(-beta * logits) * ls
    return losses.mean(), beta * (pi_c - ref_c), beta * (pi_r - ref_r)


cases = []
for name, pairs, T, beta, ls, spread in [
    ("one pair", 1, 5, 0.1, 0.0, 1.0),
    ("three pairs, label smoothing", 3, 7, 0.5, 0.2, 1.0),
    ("large margins (saturated sigmoid)", 2, 6, 2.0, 0.1, 30.0),
    ("four pairs, beta 0.05", 4, 9, 0.05, 0.0, 3.0),
]:
    B = 2 * pairs
    logp = (-torch.rand(B, T, dtype=torch.float64) * 3).requires_grad_(True)
    mask = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        first = int(torch.randint(0, T - 2, (1,)))
        last = int(torch.randint(first + 1, T + 1, (1,)))
        mask[b, first:last] = 1
    ref_c = -torch.rand(pairs, dtype=torch.float64) * spread * T
    ref_r = -torch.rand(pairs, dtype=torch.float64) * spread * T
    loss, rc, rr = dpo(logp, mask, ref_c, ref_r, beta, ls)
    loss.backward()
    cases.append({
        "name": name, "beta": beta, "label_smoothing": ls,
        "logp": logp.detach().tolist(), "mask": mask.tolist(),
        "ref_chosen": ref_c.tolist(), "ref_rejected": ref_r.tolist(),
        "loss": loss.item(), "grad": logp.grad.tolist(),
        "reward_chosen": rc.mean().item(), "reward_rejected": rr.mean().item(),
        "reward_accuracy": (rc > rr).double().mean().item(),
    })

here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "..", "fixtures", "dpo", "dpo_ref.json")
with open(out, "w") as f:
    json.dump({"generator": "tests/reference/dpo_ref.py", "torch": torch.__version__, "cases": cases}, f, indent=1)
    f.write("\n")
print(len(cases), "cases ->", out)
