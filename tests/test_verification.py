"""The verification rules as pure functions on chains: hand-made cases and vectorised distribution checks."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

from hf_specdec.generation import verification
from hf_specdec.tree import Tree
from hf_specdec.generation.verification import greedy, one_hot_probs, rejection_sample, residual_distribution, typical, typical_bar


def test_greedy_accepts_the_prefix_then_the_targets_token():
    scores = torch.full((2, 4, 10), -1.0)
    chain = torch.tensor([[3, 5, 7, 9], [3, 5, 7, 9]])
    scores.scatter_(2, chain[..., None], 1.0)
    drafts = torch.tensor([[3, 5, 1], [3, 5, 7]])
    accepted = greedy(drafts, Tree.chain(3), scores)
    assert accepted.num_accepted.tolist() == [2, 3]
    assert accepted.next_token.tolist() == [7, 9]  # first row: the target's own token at the mismatch; second: the bonus
    assert accepted.path.tolist() == [[0, 1, -1], [0, 1, 2]]


def test_greedy_respects_rows_that_proposed_fewer():
    scores = torch.full((1, 4, 10), -1.0)
    scores.scatter_(2, torch.tensor([[[3], [5], [7], [9]]]), 1.0)
    valid = torch.tensor([[True, False, False]])  # the row proposed one token; the rest is padding
    accepted = greedy(torch.tensor([[3, 5, 7]]), Tree.chain(3), scores, valid)
    assert accepted.num_accepted.tolist() == [1] and accepted.next_token.tolist() == [5]


def test_chain_shortcut_agrees_with_the_tree_rule():
    # a chain takes its own shortcut (the run of good nodes from the first); the tree rule must give the same answer
    chain = Tree.chain(5)
    general = Tree(chain.parents)
    general.is_chain = False  # the same shape, taken through the tree rule
    node_ok = torch.rand(64, 5, generator=torch.Generator().manual_seed(0)) < 0.7
    fast, slow = verification._deepest(chain, node_ok), verification._deepest(general, node_ok)
    for name in ("path", "num_accepted", "last"):
        assert torch.equal(getattr(fast, name), getattr(slow, name)), name
    assert set(fast.num_accepted.tolist()) >= {0, 1, 5}  # the cases that matter all occurred


def test_no_drafts_is_plain_decoding():
    scores = torch.randn(1, 1, 10)
    accepted = greedy(torch.zeros(1, 0, dtype=torch.long), Tree.chain(0), scores)
    assert accepted.num_accepted.tolist() == [0] and accepted.next_token.item() == scores[0, 0].argmax().item()
    sampled = rejection_sample(torch.zeros(1, 0, dtype=torch.long), Tree.chain(0), scores.softmax(-1))
    assert sampled.num_accepted.tolist() == [0]


def test_residual_is_normalised_and_falls_back_to_p():
    p = torch.tensor([[0.5, 0.3, 0.2]])
    q = torch.tensor([[0.2, 0.6, 0.2]])
    r = residual_distribution(p, q)
    assert torch.allclose(r, torch.tensor([[1.0, 0.0, 0.0]]))
    assert torch.allclose(residual_distribution(p, p), p)


def _emitted_counts(p, q, rows=200_000, k=2, position=0, seed=0):
    """Run the rule on `rows` independent copies of one step and count the emitted token at `position`."""
    torch.manual_seed(seed)
    vocab = p.shape[-1]
    q_rows = q.expand(rows, k, vocab)
    drafts = torch.multinomial(q_rows.reshape(-1, vocab), 1).view(rows, k)
    accepted = rejection_sample(drafts, Tree.chain(k), p.expand(rows, k + 1, vocab), q_rows)
    n = accepted.num_accepted
    if position == 0:
        token = torch.where(n > 0, drafts[:, 0], accepted.next_token)
        return torch.bincount(token, minlength=vocab).double(), torch.ones(rows, dtype=torch.bool)
    # the second token, among rows whose first token was the first draft (p does not depend on it here)
    reached = n > 0
    token = torch.where(n > 1, drafts[:, 1], accepted.next_token)[reached]
    return torch.bincount(token, minlength=vocab).double(), reached


def _matches(counts, probs):
    expected = probs.double() * counts.sum()
    keep = expected > 5
    return chisquare(counts[keep], expected[keep] * counts[keep].sum() / expected[keep].sum()).pvalue


def test_rejection_sampling_emits_p_at_every_position():
    torch.manual_seed(1)
    p = torch.softmax(torch.randn(1, 3, 12) * 2, -1)
    q = torch.softmax(torch.randn(1, 2, 12) * 2, -1)
    assert _matches(_emitted_counts(p, q)[0], p[0, 0]) > 1e-3
    assert _matches(_emitted_counts(p, q, position=1)[0], p[0, 1]) > 1e-3


def test_negative_control_resampling_from_p_is_detected(monkeypatch):
    torch.manual_seed(1)
    p = torch.softmax(torch.randn(1, 3, 12) * 2, -1)
    q = torch.softmax(torch.randn(1, 2, 12) * 2, -1)
    monkeypatch.setattr(verification, "residual_distribution", lambda p, q: p)  # the classic bug
    assert _matches(_emitted_counts(p, q)[0], p[0, 0]) < 1e-6


def test_deterministic_drafter_one_hot_is_exact():
    torch.manual_seed(2)
    p = torch.softmax(torch.randn(1, 2, 8) * 2, -1)
    rows = 200_000
    drafts = torch.full((rows, 1), 3)
    for q in (None, one_hot_probs(drafts, 8)):  # None: the rule's one-hot q for deterministic drafts
        accepted = rejection_sample(drafts, Tree.chain(1), p.expand(rows, 2, 8), q)
        first = torch.where(accepted.num_accepted > 0, drafts[:, 0], accepted.next_token)
        assert _matches(torch.bincount(first, minlength=8).double(), p[0, 0]) > 1e-3


def test_typical_acceptance_rule_follows_its_definition():
    # position 0: peaked distribution (low entropy, so the bar is the threshold); position 1: flat (bar = alpha e^-H)
    p = torch.zeros(1, 3, 4)
    p[0, 0] = torch.tensor([0.85, 0.1, 0.04, 0.01])
    p[0, 1] = torch.full((4,), 0.25)
    p[0, 2] = torch.tensor([0.0, 0.0, 1.0, 0.0])
    bar = typical_bar(p[0], threshold=0.09, alpha=0.3)
    assert abs(bar[0] - 0.09) < 1e-6 and abs(bar[1] - 0.3 * 0.25) < 1e-6  # H(uniform on 4) = log 4
    # token 1 (p = 0.1 > 0.09) is typical at position 0, token 3 (0.25 > 0.075) at position 1: both accepted,
    # then the next token is drawn from position 2, where all mass is on token 2
    accepted = typical(torch.tensor([[1, 3]]), Tree.chain(2), p, threshold=0.09, alpha=0.3)
    assert accepted.num_accepted.tolist() == [2] and accepted.next_token.tolist() == [2]
    accepted = typical(torch.tensor([[2, 3]]), Tree.chain(2), p, threshold=0.09, alpha=0.3)  # p = 0.04 < 0.09
    assert accepted.num_accepted.tolist() == [0]
    # tree: root children 2 (atypical) and 1 (typical); node 1's child 3 is typical -> path [1, 2]
    tree_p = torch.stack([p[0, 0], p[0, 0], p[0, 1], p[0, 2]])[None]  # row 0 follows the root, row i + 1 node i
    accepted = typical(torch.tensor([[2, 1, 3]]), Tree([-1, -1, 1]), tree_p, threshold=0.09, alpha=0.3)
    assert accepted.path.tolist() == [[1, 2]] and accepted.next_token.tolist() == [2]
