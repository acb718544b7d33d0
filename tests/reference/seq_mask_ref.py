"""Writes tests/fixtures/ppo/seq_mask_ref.json: the PPO-clip loss under sequence-level masking
of off-policy rows (train.async.correction=sequence_mask): each row's policy loss times its
sequence ratio w = exp(sum_t mask * (old - rollout)), a constant, and w = 0 for a row whose
ratio exceeds the cap (TRL's vllm_importance_sampling_mode "sequence_mask" with its cap), with
a low-variance KL term; its gradient with respect to the per-token log-probs by PyTorch
autograd, on fixed log-probs. The Lua loss (losses.ppo{correction = "sequence_mask"}) is
checked against it in tests/lua/test_tis.lua.
Run with Debian's python3 (python3-torch): /usr/bin/python3 tests/reference/seq_mask_ref.py"""
import json
import os

import torch

torch.manual_seed(29)


def loss_fn(logp, old, rollout, ref, adv, mask, clip, clip_c, kl_coef, cap):
    ratio = torch.exp(torch.clamp(logp - old, -20, 20))
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1 - clip, 1 + clip)
    pg = torch.maximum(pg1, pg2)
    pg = torch.where(adv < 0, torch.minimum(-adv * clip_c, pg), pg)
    seq = torch.exp(torch.clamp((mask * (old - rollout)).sum(dim=1, keepdim=True), -20, 20)).detach()
    masked = seq > cap
    w = torch.where(masked, torch.zeros_like(seq), seq)
    pg = pg * w
    d = torch.clamp(ref - logp, -20, 20)
    kl = torch.clamp(torch.exp(d) - d - 1, -10, 10)
    n = mask.sum()
    loss = (mask * (pg + kl_coef * kl)).sum() / n
    stats = {
        "pg_loss": float((mask * pg).sum() / n),
        "tis_weight": float((mask * w).sum() / n),
        "logp_mismatch": float((mask * (old - rollout).abs()).sum() / n),
        "mismatch_kl": float((mask * (rollout - old)).sum() / n),
        "seq_masked": float(masked.double().mean()),
    }
    return loss, stats


cases = []
for name, B, T, clip, kl_coef, cap, spread in [
    ("small mismatch: no row masked", 3, 6, 0.2, 0.001, 3.0, 0.05),
    ("wide mismatch: some rows past the cap", 6, 5, 0.2, 0.01, 3.0, 0.6),
    ("cap 1.5", 4, 7, 0.3, 0.0, 1.5, 0.3),
]:
    logp = -torch.rand(B, T, dtype=torch.float64) * 3
    old = logp + torch.randn(B, T, dtype=torch.float64) * 0.3
    rollout = old + torch.randn(B, T, dtype=torch.float64) * spread
    ref = logp + torch.randn(B, T, dtype=torch.float64) * 0.2
    adv = torch.randn(B, 1, dtype=torch.float64).expand(B, T).contiguous()
    mask = (torch.rand(B, T) > 0.25).double()
    mask[:, 0] = 1
    x = logp.clone().requires_grad_(True)
    loss, stats = loss_fn(x, old, rollout, ref, adv, mask, clip, 3.0, kl_coef, cap)
    loss.backward()
    cases.append({
        "name": name, "clip": clip, "kl_coef": kl_coef, "seq_cap": cap,
        "logp": logp.tolist(), "old": old.tolist(), "rollout": rollout.tolist(),
        "ref": ref.tolist(), "adv": adv[:, 0].tolist(), "mask": mask.tolist(),
        "loss": float(loss), "grad": x.grad.tolist(), "stats": stats,
    })

out = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ppo", "seq_mask_ref.json")
with open(out, "w") as f:
    json.dump({"cases": cases}, f, indent=1)
print("wrote", out)
