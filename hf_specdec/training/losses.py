"""Divergences between the target's distribution (its top-K log-probs, kept in the teacher data) and a drafter's."""

from __future__ import annotations

import math

import torch

from .arguments import LOSSES  # the names live with the options (parsed before torch loads)


def distill_loss(logits: torch.Tensor, tgt_ids: torch.Tensor, tgt_lps: torch.Tensor, cols: torch.Tensor | None,
                 kind: str) -> torch.Tensor:
    """Mean over tokens of a divergence between the target p and the drafter q.

    Both distributions are coarsened to K+1 buckets: the target's top-K tokens (those the drafter can propose) and
    "everything else". That is exact bookkeeping (no renormalisation): the rest bucket holds the target's tail mass and
    the drafter's mass outside the top-K, so each divergence lower-bounds the full-vocabulary one. `ce` is
    cross-entropy on the target's own (argmax) token.

    The LK losses (Samarin et al., arXiv 2602.23881) aim at acceptance itself: a draft token is accepted with
    probability alpha = sum min(p, q) = 1 - TV(p, q). `lk-alpha` is -log(alpha); `lk-hybrid` is
    lambda * KL(p || q) + (1 - lambda) * TV with lambda = exp(-3 alpha), alpha detached: KL's strong gradients while the
    drafter is far off, the acceptance objective once it is close. (On the K+1 buckets alpha is an upper bound.)
    """
    logq_all = logits.float().log_softmax(-1)
    col = tgt_ids if cols is None else cols[tgt_ids]
    valid = col >= 0
    col = col.clamp_min(0)
    logq = logq_all.gather(-1, col)
    if kind == "ce":
        return -(logq[:, 0] * valid[:, 0]).sum() / valid[:, 0].sum().clamp_min(1)
    in_topk = torch.zeros_like(logq_all).scatter_add_(-1, col, valid.float()) > 0
    logq_rest = logq_all.masked_fill(in_topk, float("-inf")).logsumexp(-1, keepdim=True)
    p = tgt_lps.exp() * valid
    p_rest = (1 - p.sum(-1, keepdim=True)).clamp_min(0)
    P = torch.cat([p, p_rest], -1)
    logP = torch.cat([tgt_lps.masked_fill(~valid, -1e4), p_rest.clamp_min(1e-12).log()], -1)
    logQ = torch.cat([logq.masked_fill(~valid, -1e4), logq_rest], -1).clamp_min(-1e4)
    Q = logQ.exp() * torch.cat([valid, torch.ones_like(valid[:, :1])], -1)
    if kind == "fkl":
        per_token = (P * (logP - logQ)).sum(-1)
    elif kind == "rkl":
        per_token = (Q * (logQ - logP)).sum(-1)
    elif kind == "tvd":
        per_token = 0.5 * (P - Q).abs().sum(-1)
    elif kind in ("lk-alpha", "lk-hybrid"):
        tv = 0.5 * (P - Q).abs().sum(-1)
        alpha = (1 - tv).clamp_min(1e-6)
        if kind == "lk-alpha":
            per_token = -alpha.log()
        else:
            weight = torch.exp(-3 * alpha.detach())
            per_token = weight * (P * (logP - logQ)).sum(-1) + (1 - weight) * tv
    elif kind == "jsd":
        logM = torch.logaddexp(logP, logQ) - math.log(2)
        per_token = 0.5 * (P * (logP - logM)).sum(-1) + 0.5 * (Q * (logQ - logM)).sum(-1)
    else:
        raise ValueError(f"unknown loss {kind!r}; the losses are {', '.join(LOSSES)}")
    return per_token.mean()


def token_loss(logits: torch.Tensor, batch: dict, cols, kind: str) -> torch.Tensor:
    """A divergence to the target's distribution, or (`ce`) plain next-token cross-entropy on the training text."""
    if kind != "ce":
        return distill_loss(logits, batch["tgt_ids"], batch["tgt_lps"], cols, kind)
    next_ids = batch["input_ids"].roll(-1, dims=1)[batch["positions"]]
    col = next_ids if cols is None else cols[next_ids]
    valid = col >= 0  # a token outside the draft vocabulary cannot be learnt
    logq = logits.float().log_softmax(-1).gather(-1, col.clamp_min(0)[:, None])[:, 0]
    return -(logq * valid).sum() / valid.sum().clamp_min(1)
