"""Writes tests/fixtures/ppo/tis_ref.json: the PPO-clip loss with truncated importance
sampling (verl's TIS: each token's policy loss times min(exp(old - rollout), C), a constant)
and a low-variance KL term, and its gradient with respect to the per-token log-probs, by
PyTorch autograd from the formula as verl's compute_policy_loss (vanilla, dual clip) and
kl_penalty state it, on fixed log-probs. The Lua loss (lua/clrt/train/losses.lua,
losses.ppo with batch.rollout) is checked against it in tests/lua/test_tis.lua.
Run with Debian's python3 (python3-torch): /usr/bin/python3 tests/reference/tis_ref.py"""
import json
import os

import torch

torch.manual_seed(11)


def loss_fn(logp, old, rollout, ref, adv, mask, clip, clip_c, kl_coef, cap):
    ratio = torch.exp(torch.clamp(logp - old, -20, 20))
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1 - clip, 1 + clip)
    pg = torch.maximum(pg1, pg2)
    pg = torch.where(adv < 0, torch.minimum(-adv * clip_c, pg), pg)
    tis = torch.clamp(torch.exp(old - rollout), max=cap).detach()
    pg = pg * tis
    d = torch.clamp(ref - logp, -20, 20)
    kl = torch.clamp(torch.exp(d) - d - 1, -10, 10)
    n = mask.sum()
    loss = (mask * (pg + kl_coef * kl)).sum() / n
    stats = {
        "pg_loss": float((mask * pg).sum() / n),
        "tis_weight": float((mask * tis).sum() / n),
        "tis_capped": float((mask * (tis >= cap).double()).sum() / n),
        "logp_mismatch": float((mask * (old - rollout).abs()).sum() / n),
    }
    return loss, stats


cases = []
for name, B, T, clip, kl_coef, cap, spread, on_policy in [
    ("on-policy, small mismatch", 2, 6, 0.2, 0.001, 2.0, 0.05, True),
    ("off-policy, mismatch past the cap", 3, 5, 0.2, 0.01, 2.0, 1.0, False),
    ("cap 1.2, wide clip", 2, 7, 0.3, 0.0, 1.2, 0.5, False),
]:
    logp = -torch.rand(B, T, dtype=torch.float64) * 3
    old = logp.clone() if on_policy else logp + torch.randn(B, T, dtype=torch.float64) * 0.3
    rollout = old + torch.randn(B, T, dtype=torch.float64) * spread
    ref = logp + torch.randn(B, T, dtype=torch.float64) * 0.2
    adv = torch.randn(B, 1, dtype=torch.float64).expand(B, T).contiguous()
    mask = (torch.rand(B, T) > 0.25).double()
    mask[:, 0] = 1
    x = logp.clone().requires_grad_(True)
    old_in = x.detach() if on_policy else old
    loss, stats = loss_fn(x, old_in, rollout, ref, adv, mask, clip, 3.0, kl_coef, cap)
    loss.backward()
    cases.append({
        "name": name, "clip": clip, "kl_coef": kl_coef, "tis_cap": cap, "on_policy": on_policy,
        "logp": logp.tolist(), "old": None if on_policy else old.tolist(), "rollout": rollout.tolist(),
        "ref": ref.tolist(), "adv": adv[:, 0].tolist(), "mask": mask.tolist(),
        "loss": float(loss), "grad": x.grad.tolist(), "stats": stats,
    })

out = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ppo", "tis_ref.json")
with open(out, "w") as f:
    json.dump({"cases": cases}, f, indent=1)
print("wrote", out)
