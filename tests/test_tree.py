"""Tree verification rules (Medusa-style candidates) on hand-built trees."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

from hf_specdec import verification
from hf_specdec.verification import greedy_accept_tree, rejection_sample_tree, tree_ancestor_mask, tree_depths

# root -> a(0), b(1); a -> c(2), d(3); b -> e(4); c -> f(5)
PARENTS = torch.tensor([-1, -1, 0, 0, 1, 2])
TOKENS = torch.tensor([5, 6, 7, 8, 9, 3])


def test_depths_and_ancestor_mask_of_a_hand_built_tree():
    assert tree_depths(PARENTS).tolist() == [1, 1, 2, 2, 2, 3]
    mask = tree_ancestor_mask(PARENTS).int()
    assert mask.tolist() == [
        [1, 0, 0, 0, 0, 0],
        [0, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],
        [0, 1, 0, 0, 1, 0],
        [1, 0, 1, 0, 0, 1],
    ]


def scores_choosing(chain: dict[int, int], vocab=12):
    """[T+1, V] scores whose argmax after row r is chain[r] (row 0 = after the root)."""
    scores = torch.zeros(len(PARENTS) + 1, vocab)
    for row, token in chain.items():
        scores[row, token] = 5.0
    return scores


def test_greedy_tree_takes_the_deepest_correct_path():
    # target: after root -> 5 (a), after a -> 8 (d), after d -> 11
    path, nxt = greedy_accept_tree(TOKENS, PARENTS, scores_choosing({0: 5, 1: 8, 4: 11}))
    assert path == [0, 3] and nxt == 11
    # target: after root -> 5, after a -> 7 (c), after c -> 3 (f), after f -> 2: the full depth-3 path
    path, nxt = greedy_accept_tree(TOKENS, PARENTS, scores_choosing({0: 5, 1: 7, 3: 3, 6: 2}))
    assert path == [0, 2, 5] and nxt == 2
    # nothing matches: plain decoding
    path, nxt = greedy_accept_tree(TOKENS, PARENTS, scores_choosing({0: 1}))
    assert path == [] and nxt == 1


def _first_token_counts(monkey=None, n=60_000):
    torch.manual_seed(0)
    p_root = torch.softmax(torch.randn(12) * 1.5, -1)
    probs = torch.softmax(torch.randn(len(PARENTS) + 1, 12), -1)
    probs[0] = p_root
    counts = torch.zeros(12)
    for _ in range(n):
        path, nxt = rejection_sample_tree(TOKENS, PARENTS, probs)
        counts[int(TOKENS[path[0]]) if path else nxt] += 1
    return counts, p_root


def test_tree_sampling_first_token_is_distributed_as_p():
    counts, p = _first_token_counts()
    assert chisquare(counts.numpy(), (p * counts.sum()).numpy()).pvalue > 1e-3


def test_tree_sampling_negative_control(monkeypatch):
    monkeypatch.setattr(verification, "residual_distribution", lambda p, q: p)  # forget rejected siblings
    counts, p = _first_token_counts()
    assert chisquare(counts.numpy(), (p * counts.sum()).numpy()).pvalue < 1e-6
