"""Trees of candidates: the shape (`Tree`) and the verification rules on hand-built trees, vectorised over rows."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from hf_specdec.generation import verification
from hf_specdec.tree import Tree
from hf_specdec.generation.verification import greedy, rejection_sample

# root -> a(0), b(1); a -> c(2), d(3); b -> e(4); c -> f(5)
TREE = Tree([-1, -1, 0, 0, 1, 2])
TOKENS = torch.tensor([[5, 6, 7, 8, 9, 3]])


def test_the_shape_of_a_hand_built_tree():
    assert TREE.depth == [1, 1, 2, 2, 2, 3] and TREE.max_depth == 3 and not TREE.is_chain
    t = TREE.tensors("cpu")
    assert t["ancestors"].int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [0, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],
        [0, 1, 0, 0, 1, 0],
        [1, 0, 1, 0, 0, 1],
    ]
    assert t["path"][5].tolist() == [0, 2, 5] and t["path"][4].tolist() == [1, 4, -1]
    assert t["children"][0].tolist()[:2] == [0, 1] and TREE.children[1] == [2, 3]
    assert Tree.chain(3).is_chain and Tree.chain(3).parents == [-1, 0, 1] and TREE.prefix(3) == Tree([-1, -1, 0])
    with pytest.raises(ValueError, match="after their parents"):
        Tree([-1, 2, 0])


def scores_choosing(chain: dict[int, int], vocab=12):
    """[1, T+1, V] scores whose argmax after row r is chain[r] (row 0 = after the root)."""
    scores = torch.zeros(1, TREE.size + 1, vocab)
    for row, token in chain.items():
        scores[0, row, token] = 5.0
    return scores


def test_greedy_tree_takes_the_deepest_correct_path():
    # target: after root -> 5 (a), after a -> 8 (d), after d -> 11
    accepted = greedy(TOKENS, TREE, scores_choosing({0: 5, 1: 8, 4: 11}))
    assert accepted.path.tolist() == [[0, 3, -1]] and accepted.next_token.tolist() == [11]
    # target: after root -> 5, after a -> 7 (c), after c -> 3 (f), after f -> 2: the full depth-3 path
    accepted = greedy(TOKENS, TREE, scores_choosing({0: 5, 1: 7, 3: 3, 6: 2}))
    assert accepted.path.tolist() == [[0, 2, 5]] and accepted.next_token.tolist() == [2]
    # nothing matches: plain decoding
    accepted = greedy(TOKENS, TREE, scores_choosing({0: 1}))
    assert accepted.num_accepted.tolist() == [0] and accepted.next_token.tolist() == [1]


def _emitted(n=60_000, depth=1):
    """Many independent rows through one tree step; the emitted token at `depth` among rows that went through node
    `a` (0) when depth = 2."""
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(TREE.size + 1, 12) * 1.5, -1)
    accepted = rejection_sample(TOKENS.expand(n, -1), TREE, probs.expand(n, -1, -1))
    first = torch.where(accepted.num_accepted > 0, TOKENS[0, accepted.path[:, 0].clamp_min(0)], accepted.next_token)
    if depth == 1:
        return torch.bincount(first, minlength=12).double(), probs[0]
    through_a = accepted.path[:, 0] == 0
    second = torch.where(accepted.num_accepted > 1, TOKENS[0, accepted.path[:, 1].clamp_min(0)], accepted.next_token)
    return torch.bincount(second[through_a], minlength=12).double(), probs[1]  # row 1 follows node a


def _pvalue(counts, p):
    expected = p.double() * counts.sum() / p.double().sum()
    return chisquare(counts.numpy(), expected.numpy()).pvalue


@pytest.mark.parametrize("depth", [1, 2])
def test_tree_sampling_emits_p_after_every_node(depth):
    assert _pvalue(*_emitted(depth=depth)) > 1e-3


def test_tree_sampling_negative_control(monkeypatch):
    monkeypatch.setattr(verification, "residual_distribution", lambda p, q: p)  # forget rejected siblings
    for depth in (1, 2):
        assert _pvalue(*_emitted(depth=depth)) < 1e-6
