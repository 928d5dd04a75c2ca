"""Drafters whose one forward scores several positions ahead at once (heads on the target's state, block drafters).

Such a drafter gives, per row, a distribution for each of the next k positions, none of them conditioned on the
tokens drafted before it in the step. From these the step drafts either

- a chain (`tree="chain"`): each position's top token (sampling: one draw from each position's processed
  distribution, reported as q, so the usual rejection rule stays exact). With `draft_length="adaptive"` a row stops
  at the first position whose top probability is under the confidence threshold (decided before drawing); or
- a static tree: node (r1, ..., rd) is the r_d-th most likely token at position d under node (r1, ..., r_{d-1}); the
  loop verifies the whole tree in ONE target forward with a tree attention mask and keeps the longest accepted path
  (greedy) or runs recursive rejection over siblings (sampling: exact). `tree=N` builds the N nodes most likely to
  be accepted from the positions' measured accuracy (written by training; Cai et al. 2024's way), `tree="default"`
  is the 7-node one of them (or `DEFAULT_TREE` without measurements), or pass your own list of paths. Bigger trees
  accept more per forward but make that forward wider: on a CPU a 64-node forward costs several decode steps, on a
  GPU about one.

A subclass says how many positions it scores (`num_positions`), what was measured (`accuracy`), and computes the
scores (`position_logits`).
"""

from __future__ import annotations

import heapq

import torch

from ..cache.ragged import check_tree_attention
from ..errors import InputError
from ..tree import Tree
from .base import Draft, Drafter, Drafting

#: top-k ranks per depth: 3 first tokens, 2 continuations of the best, 1 of the second, the top-1 chain to depth 3.
#: Seven nodes: with the root, an 8-row verification forward, the largest the CPU small-M path speeds up.
DEFAULT_TREE = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0))


def best_tree(head_accuracy, num_nodes: int) -> list[tuple[int, ...]]:
    """The `num_nodes` paths most likely to be accepted, taking heads as independent: node (r1..rd) is accepted with
    probability prod_i head_accuracy[i][r_i]. Best-first search, so every path's parent is in the tree."""
    if not isinstance(num_nodes, int) or num_nodes < 1:
        raise InputError(f"A draft tree needs at least one node, got {num_nodes!r}.")
    acc = [list(map(float, row)) for row in head_accuracy]
    frontier = [(-p, (r,)) for r, p in enumerate(acc[0])]
    heapq.heapify(frontier)
    tree = []
    while frontier and len(tree) < num_nodes:
        neg_p, path = heapq.heappop(frontier)
        tree.append(path)
        if len(path) < len(acc):
            for r, p in enumerate(acc[len(path)]):
                heapq.heappush(frontier, (neg_p * p, path + (r,)))
    return tree


def tree_parents(paths) -> tuple[Tree, list[tuple[int, ...]]]:
    """Paths of ranks -> (the Tree, the paths in verification order). Their order is kept when every path comes after
    its parent (`best_tree`'s is likeliest first, so cutting the tree to its first n nodes keeps the likeliest);
    otherwise they are sorted breadth first. Every path's prefix must be in the tree."""
    unique = list(dict.fromkeys(tuple(p) for p in paths))
    position = {p: i for i, p in enumerate(unique)}
    parents_first = all(len(p) == 1 or position.get(p[:-1], len(unique)) < position[p] for p in unique)
    ordered = unique if parents_first else sorted(unique, key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(ordered)}
    if not ordered or any(len(p) == 0 or min(p) < 0 for p in ordered):
        raise InputError("A draft tree is a non-empty list of non-empty paths of ranks >= 0, e.g. [[0], [1], [0, 0]].")
    missing = [p for p in ordered if len(p) > 1 and p[:-1] not in index]
    if missing:
        raise InputError(f"Draft tree paths {missing} lack their parent path (add {[list(p[:-1]) for p in missing]}).")
    return Tree([index[p[:-1]] if len(p) > 1 else -1 for p in ordered]), ordered


class PositionChain:
    """Each position's top token (or a draw from its processed distribution), one after the other."""

    tree = None

    def default_budget(self, num_positions: int) -> int:
        return num_positions

    def check(self, target, what: str) -> None:
        """Chains run on every target."""

    def positions(self, max_tokens: int, num_positions: int) -> tuple[int, int]:
        """(the draft budget, the positions it needs)."""
        return max_tokens, min(max_tokens, num_positions)

    def draft(self, logits: torch.Tensor, settings, seqs, max_tokens: int) -> Draft:
        if not (settings.do_sample or settings.logits_processor or settings.confidence_threshold is not None):
            return Draft(logits.argmax(dim=-1))  # greedy, nothing reshapes the scores, no row stops: one argmax
        drafting = Drafting(settings, seqs, logits.device)
        for i in range(logits.shape[1]):  # position i's token; rows stop at a position less confident than the threshold
            if not drafting.step(logits[:, i]):
                break
        return drafting.draft()


class PositionTree:
    """A static tree: node (r1..rd) is the r_d-th best token of position d, verified in one forward."""

    def __init__(self, paths, num_positions: int, what: str):
        self.tree = tree_parents(paths)
        if self.tree[0].max_depth > num_positions:
            raise InputError(f"The tree is deeper than the {num_positions} positions {what.lower()} drafts.")

    def default_budget(self, num_positions: int) -> int:
        return self.tree[0].size  # a tree's budget is its nodes (what the verification forward's width costs)

    def check(self, target, what: str) -> None:
        check_tree_attention(target.model, f"{what}'s tree", target.cache, chain="draft a chain (tree='chain')")

    def positions(self, max_tokens: int, num_positions: int) -> tuple[int, int]:
        budget = min(max_tokens, self.tree[0].size)
        return budget, self.tree[0].prefix(budget).max_depth

    def draft(self, logits: torch.Tensor, settings, seqs, max_tokens: int) -> Draft:
        """The tree's first `max_tokens` nodes (a tree too)."""
        tree, paths = self.tree
        tree, paths = tree.prefix(max_tokens), paths[:max_tokens]
        width = max(max(p) for p in paths) + 1
        top = logits.topk(width, dim=-1).indices  # [B, k, width]
        depth = torch.tensor([len(p) - 1 for p in paths], device=logits.device)
        rank = torch.tensor([p[-1] for p in paths], device=logits.device)
        return Draft(top[:, depth, rank], tree=tree)


class PositionwiseDrafter(Drafter):
    """The chain or tree drafting of a drafter that scores `num_positions` positions ahead in one forward: the shape
    (`PositionChain` or `PositionTree`) is chosen once, here."""

    what = "A drafter"  # how errors name it

    def __init__(self, num_positions: int, accuracy: list | None, tree="default"):
        self.num_positions = num_positions
        if tree == "default":
            tree = len(DEFAULT_TREE) if accuracy else [p for p in DEFAULT_TREE if len(p) <= num_positions]
        if isinstance(tree, int) and not isinstance(tree, bool):
            if not accuracy:
                raise InputError(f"tree={tree} builds a tree from the measured accuracy of each position, which this "
                                 "drafter lacks; pass a list of paths instead, or retrain with training/distill.py.")
            tree = best_tree(accuracy, tree)
        self.shape = PositionChain() if tree == "chain" else PositionTree(tree, num_positions, self.what)
        self.default_num_draft_tokens = self.shape.default_budget(num_positions)

    @property
    def tree(self):
        """(the Tree, its paths) of a tree-drafting drafter; None for a chain."""
        return self.shape.tree

    def start(self, target, seqs, settings):
        super().start(target, seqs, settings)
        self.shape.check(target, self.what)

    def position_logits(self, seqs, k: int) -> torch.Tensor | None:
        """[B, k, V] scores of the next k positions of every row (None: nothing to draft from yet)."""
        raise NotImplementedError

    @torch.no_grad()
    def propose(self, seqs, max_tokens):
        """A chain of at most `max_tokens` positions' tokens, or the first `max_tokens` nodes of the tree."""
        budget, k = self.shape.positions(max_tokens, self.num_positions)
        logits = self.position_logits(seqs, k) if k > 0 else None
        if logits is None:
            return Draft.empty(seqs.size, seqs.ids(0).device)
        return self.shape.draft(logits.float(), self.settings, seqs, budget)


__all__ = ["PositionwiseDrafter", "PositionChain", "PositionTree", "DEFAULT_TREE", "best_tree", "tree_parents"]
