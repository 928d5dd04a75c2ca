"""The verification rules as pure functions: hand-made cases and vectorised distribution checks."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

from hf_specdec import verification
from hf_specdec.verification import greedy_accept, one_hot_probs, rejection_sample, residual_distribution


def test_greedy_accept_prefix_and_bonus():
    scores = torch.full((2, 4, 10), -1.0)
    chain = torch.tensor([[3, 5, 7, 9], [3, 5, 7, 9]])
    scores.scatter_(2, chain[..., None], 1.0)
    drafts = torch.tensor([[3, 5, 1], [3, 5, 7]])
    num_accepted, next_token = greedy_accept(drafts, scores)
    assert num_accepted.tolist() == [2, 3]
    assert next_token.tolist() == [7, 9]  # first row: the target's own token at the mismatch; second: the bonus


def test_greedy_accept_no_drafts_is_plain_decoding():
    scores = torch.randn(1, 1, 10)
    num_accepted, next_token = greedy_accept(torch.zeros(1, 0, dtype=torch.long), scores)
    assert num_accepted.tolist() == [0] and next_token.item() == scores[0, 0].argmax().item()


def test_residual_is_normalised_and_falls_back_to_p():
    p = torch.tensor([[0.5, 0.3, 0.2]])
    q = torch.tensor([[0.2, 0.6, 0.2]])
    r = residual_distribution(p, q)
    assert torch.allclose(r, torch.tensor([[1.0, 0.0, 0.0]]))
    assert torch.allclose(residual_distribution(p, p), p)


def _first_token_counts(p, q, rows=200_000, k=1, seed=0):
    """Run the rule on `rows` independent copies of one step and count the first emitted token."""
    torch.manual_seed(seed)
    vocab = p.shape[-1]
    q_rows = q.expand(rows, k, vocab)
    drafts = torch.multinomial(q_rows.reshape(-1, vocab), 1).view(rows, k)
    n, nxt = rejection_sample(drafts, q_rows, p.expand(rows, k + 1, vocab))
    first = torch.where(n > 0, drafts[:, 0], nxt)
    return torch.bincount(first, minlength=vocab).double()


def _matches(counts, probs):
    expected = probs.double() * counts.sum()
    keep = expected > 5
    return chisquare(counts[keep], expected[keep] * counts[keep].sum() / expected[keep].sum()).pvalue


def test_rejection_sampling_first_token_is_distributed_as_p():
    torch.manual_seed(1)
    p = torch.softmax(torch.randn(1, 3, 12) * 2, -1)
    q = torch.softmax(torch.randn(1, 2, 12) * 2, -1)
    assert _matches(_first_token_counts(p, q, k=2), p[0, 0]) > 1e-3


def test_negative_control_resampling_from_p_is_detected(monkeypatch):
    torch.manual_seed(1)
    p = torch.softmax(torch.randn(1, 3, 12) * 2, -1)
    q = torch.softmax(torch.randn(1, 2, 12) * 2, -1)
    monkeypatch.setattr(verification, "residual_distribution", lambda p, q: p)  # the classic bug
    assert _matches(_first_token_counts(p, q, k=2), p[0, 0]) < 1e-6


def test_deterministic_drafter_one_hot_is_exact():
    torch.manual_seed(2)
    p = torch.softmax(torch.randn(1, 2, 8) * 2, -1)
    rows = 200_000
    drafts = torch.full((rows, 1), 3)
    n, nxt = rejection_sample(drafts, one_hot_probs(drafts, 8), p.expand(rows, 2, 8))
    first = torch.where(n > 0, drafts[:, 0], nxt)
    assert _matches(torch.bincount(first, minlength=8).double(), p[0, 0]) > 1e-3
