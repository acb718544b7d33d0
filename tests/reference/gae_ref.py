"""Writes tests/fixtures/ppo/gae_ref.json: PPO with a learned value as TRL's PPOTrainer
(trl <= 0.10.1, the CollabLLM authors' scripts/train/ppo.py) states it, computed with PyTorch on
padded [B, L] batches with a mask: per-token rewards (-kl_coef * (logprob - ref_logprob), the
score added on the last response token), GAE over the padded length, masked whitening of the
advantages, the clipped value loss 0.5 * masked_mean(max(vf1, vf2)) and its gradient by
autograd, the value clip fraction, the explained variance, the policy loss
masked_mean(max(-A r, -A clip(r))) and its gradient, and the adaptive KL coefficient. The Lua
side (lua/clrt/train/gae.lua, losses.ppo with clip_c = false) is checked against it in
tests/lua/test_ppo_value.lua.
Run with Debian's python3 (python3-torch): /usr/bin/python3 tests/reference/gae_ref.py"""
import json
import os

import torch

torch.manual_seed(11)
D = torch.float64


def masked_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def masked_var(x, mask):
    mean = masked_mean(x, mask)
    centered = x - mean
    var = masked_mean(centered ** 2, mask)
    n = mask.sum()
    return var * n / (n - 1)   # unbiased, as TRL's masked_var(unbiased=True)


def whiten(x, mask):
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    return (x - mean) * torch.rsqrt(var + 1e-8)


def case(name, lens, gamma, lam, kl_coef, cliprange, cliprange_value, vf_coef, target, horizon, spread):
    B, L = len(lens), max(lens)
    mask = torch.zeros(B, L, dtype=D)
    for b, n in enumerate(lens):
        mask[b, :n] = 1
    old = -torch.rand(B, L, dtype=D) * 3 * mask
    ref = (old + torch.randn(B, L, dtype=D) * 0.3) * mask
    values = torch.randn(B, L, dtype=D) * spread * mask
    scores = torch.randn(B, dtype=D) * spread
    # rewards: the KL penalty per token, the score on the last response token
    kl = (old - ref) * mask
    rewards = -kl_coef * kl
    for b, n in enumerate(lens):
        rewards[b, n - 1] += scores[b]
    # GAE over the padded length (masked entries are zero, as TRL multiplies by the mask)
    lastgaelam = torch.zeros(B, dtype=D)
    rev = []
    for t in reversed(range(L)):
        nextvalues = values[:, t + 1] if t < L - 1 else torch.zeros(B, dtype=D)
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lam * lastgaelam
        rev.append(lastgaelam)
    adv_raw = torch.stack(rev[::-1]).transpose(0, 1) * mask
    returns = adv_raw + values
    adv = whiten(adv_raw, mask) * mask
    # the value loss on new predictions, some far enough to be clipped
    vpred = (values + torch.randn(B, L, dtype=D) * 0.4 * spread) * mask
    vpred.requires_grad_(True)
    vclip = torch.max(torch.min(vpred, values + cliprange_value), values - cliprange_value)
    vf1, vf2 = (vpred - returns) ** 2, (vclip - returns) ** 2
    vf_loss = 0.5 * masked_mean(torch.max(vf1, vf2), mask)
    vf_clipfrac = masked_mean(torch.gt(vf2, vf1).double(), mask)
    (vf_coef * vf_loss).backward()
    # the policy loss on new log-probs
    logp = (old + torch.randn(B, L, dtype=D) * 0.2) * mask
    logp.requires_grad_(True)
    ratio = torch.exp(logp - old)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1 - cliprange, 1 + cliprange)
    pg_loss = masked_mean(torch.max(pg1, pg2), mask)
    pg_loss.backward()
    ev = 1 - masked_var(returns - values, mask) / masked_var(returns, mask)
    mean_kl = kl.sum(-1).mean()
    err = torch.clamp(mean_kl / target - 1, -0.2, 0.2)
    next_coef = kl_coef * (1 + err * B / horizon)

    def rows(x):
        return [x[b, :n].tolist() for b, n in enumerate(lens)]

    return {
        "name": name, "gamma": gamma, "lam": lam, "kl_coef": kl_coef, "cliprange": cliprange,
        "cliprange_value": cliprange_value, "vf_coef": vf_coef, "kl_target": target, "kl_horizon": horizon,
        "scores": scores.tolist(), "old": rows(old), "ref": rows(ref), "values": rows(values),
        "rewards": rows(rewards), "advantages_raw": rows(adv_raw), "advantages": rows(adv), "returns": rows(returns),
        "vpred": rows(vpred.detach()), "vf_loss": vf_loss.item(), "vf_clipfrac": vf_clipfrac.item(),
        "dvpred": rows(vpred.grad), "logp": rows(logp.detach()), "pg_loss": pg_loss.item(), "dlogp": rows(logp.grad),
        "explained_variance": ev.item(), "next_kl_coef": next_coef.item(),
    }


cases = [
    case("TRL defaults", [5, 3, 7, 1], 1.0, 0.95, 0.2, 0.2, 0.2, 0.1, 6.0, 10000.0, 1.0),
    case("discounted, large values (value clip active)", [9, 4, 6], 0.9, 0.8, 0.05, 0.2, 0.2, 0.5, 6.0, 10000.0, 4.0),
    case("lam 1, gamma 1 (Monte-Carlo returns), small KL target", [2, 8, 5, 5, 3], 1.0, 1.0, 0.3, 0.1, 0.5, 1.0, 0.5, 100.0, 0.5),
    case("lam 0 (one-step TD)", [6, 6], 0.99, 0.0, 0.0, 0.3, 0.1, 0.1, 6.0, 10000.0, 2.0),
]
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "ppo", "gae_ref.json")
with open(out, "w") as f:
    json.dump({"torch": torch.__version__, "cases": cases}, f, indent=1)
print("wrote", out)
