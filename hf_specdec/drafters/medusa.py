"""Medusa drafting: the heads read the target's hidden state that the last verification forward produced.

At each step, with `f` the target's final hidden state at the position just before the newest token (the one whose
LM-head output chose that token), head i proposes the token i + 1 positions after the newest one. No extra target
call and no KV cache of its own. The first step has no hidden state yet, so it proposes nothing.

- `tree="chain"`: the heads' top-1 tokens (sampling: one draw from each head's processed distribution, reported as q,
  so the usual rejection rule stays exact). With `draft_length="adaptive"` a row stops at the first head whose top
  probability is under the confidence threshold (decided from that head's distribution, before drawing).
- a tree: node (r1, ..., rd) is the r_d-th most likely token of head d under node (r1, ..., r_{d-1}); the loop
  verifies the whole tree in ONE target forward with a tree attention mask and keeps the longest accepted path
  (greedy) or runs recursive rejection over siblings (sampling: exact). `tree=N` builds the N nodes most likely to be
  accepted from the heads' measured accuracy (`config.head_accuracy`, written by training; as Medusa builds its
  trees), `tree="default"` is the 7-node one of them (or `DEFAULT_TREE` for heads without measurements), or pass your
  own list of paths. Bigger trees accept more per forward but make that forward wider: on a CPU a 64-node forward
  costs several decode steps, on a GPU about one.
"""

from __future__ import annotations

import heapq

import torch

from ..cache.hidden import final_norm
from ..cache.ragged import check_tree_attention, has_sliding_window
from ..models.medusa import MedusaHeads
from ..tree import Tree
from .base import Draft, Drafter, Drafting, check_device
from .features import TargetFeatures
from ..errors import InputError


#: top-k ranks per depth: 3 first tokens, 2 continuations of the best, 1 of the second, the top-1 chain to depth 3.
#: Seven nodes: with the root, an 8-row verification forward, the largest the CPU small-M path speeds up.
DEFAULT_TREE = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0))


def best_tree(head_accuracy, num_nodes: int) -> list[tuple[int, ...]]:
    """The `num_nodes` paths most likely to be accepted, taking heads as independent: node (r1..rd) is accepted with
    probability prod_i head_accuracy[i][r_i]. Best-first search, so every path's parent is in the tree."""
    if not isinstance(num_nodes, int) or num_nodes < 1:
        raise InputError(f"A Medusa tree needs at least one node, got {num_nodes!r}.")
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
        raise InputError("A Medusa tree is a non-empty list of non-empty paths of ranks >= 0, e.g. [[0], [1], [0, 0]].")
    missing = [p for p in ordered if len(p) > 1 and p[:-1] not in index]
    if missing:
        raise InputError(f"Medusa tree paths {missing} lack their parent path (add {[list(p[:-1]) for p in missing]}).")
    return Tree([index[p[:-1]] if len(p) > 1 else -1 for p in ordered]), ordered


class MedusaDrafter(Drafter):
    def __init__(self, heads, tree="default"):
        if not isinstance(heads, MedusaHeads):
            raise TypeError(f"MedusaDrafter needs MedusaHeads, got {type(heads).__name__}.")
        self.heads = heads.eval()
        self.default_num_draft_tokens = heads.config.num_heads
        accuracy = heads.config.head_accuracy
        if tree == "default":
            tree = len(DEFAULT_TREE) if accuracy else [p for p in DEFAULT_TREE if len(p) <= heads.config.num_heads]
        if isinstance(tree, int) and not isinstance(tree, bool):
            if not accuracy:
                raise InputError(f"tree={tree} builds a tree from the heads' measured accuracy, which these heads lack "
                                 "(config.head_accuracy); pass a list of paths instead, or retrain with training/distill.py.")
            tree = best_tree(accuracy, tree)
        self.tree = None if tree == "chain" else tree_parents(tree)
        if self.tree is not None and self.tree[0].max_depth > heads.config.num_heads:
            raise InputError(f"The tree is deeper than the {heads.config.num_heads} Medusa heads.")
        if self.tree is not None:  # a tree's budget is its nodes (what the verification forward's width costs)
            self.default_num_draft_tokens = self.tree[0].size

    def vocab_size(self) -> int:
        return self.heads.config.vocab_size

    def start(self, target, seqs, settings):
        super().start(target, seqs, settings)
        check_device(self.heads, target.model, "Medusa heads")
        if self.tree is not None:
            check_tree_attention(target.model, "A Medusa tree", target.cache)
        if self.tree is not None and has_sliding_window(target.model.config):
            raise InputError("A tree of Medusa candidates needs full attention in every layer (its 4-D mask would "
                             "cross the sliding window); use MedusaDrafter(heads, tree='chain') with this target.")
        self.heads.bind_target(target.model)
        self.target_features = TargetFeatures(target, [final_norm(target.model)], seqs.size)

    def accepted(self, seqs, verified):
        self.target_features.extend(verified)

    def select_rows(self, rows):
        self.target_features.select(rows)

    @torch.no_grad()
    def propose(self, seqs, max_tokens):
        """A chain of at most `max_tokens` heads' tokens, or the first `max_tokens` nodes of the tree."""
        if self.tree is not None:
            max_tokens = min(max_tokens, self.tree[0].size)
            k = self.tree[0].prefix(max_tokens).max_depth  # the heads that tree needs
        else:
            k = min(max_tokens, self.heads.config.num_heads)
        if k <= 0 or not self.target_features.ready(seqs):
            return Draft.empty(seqs.size, self.heads.device)
        # the hidden state that chose each row's newest token
        last = torch.stack([f[n - 2] for f, n in zip(self.target_features.features, seqs.lengths())])  # [B, H]
        logits = self.heads(last)[:, :k].float()  # [B, k, V]
        if self.tree is not None:
            return self._tree(logits, max_tokens)
        drafting = Drafting(self.settings, [seqs.full(b) for b in range(seqs.size)], logits.device)
        for i in range(k):  # head i's token; rows stop at a head less confident than the threshold (adaptive length)
            if not drafting.step(logits[:, i]):
                break
        return drafting.draft()

    def _tree(self, logits: torch.Tensor, size: int) -> Draft:
        """The static tree's first `size` nodes (a tree too): node (r1..rd) is the r_d-th best token of head d."""
        tree, paths = self.tree
        tree, paths = tree.prefix(size), paths[:size]
        width = max(max(p) for p in paths) + 1
        top = logits.topk(width, dim=-1).indices  # [B, k, width]
        depth = torch.tensor([len(p) - 1 for p in paths], device=logits.device)
        rank = torch.tensor([p[-1] for p in paths], device=logits.device)
        return Draft(top[:, depth, rank], tree=tree)
