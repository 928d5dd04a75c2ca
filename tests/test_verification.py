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


def test_typical_acceptance_rule_follows_its_definition():
    from hf_specdec.verification import typical_accept, typical_accept_tree, typical_bar

    # position 0: peaked distribution (low entropy, so the bar is the threshold); position 1: flat (bar = alpha e^-H)
    p = torch.zeros(1, 3, 4)
    p[0, 0] = torch.tensor([0.85, 0.1, 0.04, 0.01])
    p[0, 1] = torch.full((4,), 0.25)
    p[0, 2] = torch.tensor([0.0, 0.0, 1.0, 0.0])
    bar = typical_bar(p[0], threshold=0.09, alpha=0.3)
    assert abs(bar[0] - 0.09) < 1e-6 and abs(bar[1] - 0.3 * 0.25) < 1e-6  # H(uniform on 4) = log 4
    # token 1 (p = 0.1 > 0.09) is typical at position 0, token 3 (0.25 > 0.075) at position 1: both accepted,
    # then the next token is drawn from position 2, where all mass is on token 2
    n, nxt = typical_accept(torch.tensor([[1, 3]]), p, threshold=0.09, alpha=0.3)
    assert n.tolist() == [2] and nxt.tolist() == [2]
    n, _ = typical_accept(torch.tensor([[2, 3]]), p, threshold=0.09, alpha=0.3)  # p = 0.04 < 0.09: rejected
    assert n.tolist() == [0]
    # tree: root children 2 (atypical) and 1 (typical); node 1's child 3 is typical -> path [1, 2]
    parents = torch.tensor([-1, -1, 1])
    tree_p = torch.stack([p[0, 0], p[0, 0], p[0, 1], p[0, 2]])  # row 0 follows the root, row i + 1 follows node i
    path, nxt = typical_accept_tree(torch.tensor([2, 1, 3]), parents, tree_p, threshold=0.09, alpha=0.3)
    assert path == [1, 2] and nxt == 2
