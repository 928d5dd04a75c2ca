"""Token recycling (Luo et al. 2024): draft a tree from the target's own recent predictions, with no model and no
training.

The drafter keeps an adjacency table: for every token id, the top-k next tokens the target predicted the last time it
read that token. Every verification forward already computed those predictions, for the row's pending token and for
every draft node (a rejected node's prediction is still the target's, for that prefix), so the table is refreshed
after each step from the step's processed scores at no extra forward (`accepted`). To draft, a static tree of ranks is
unrolled from the row's last token: node (r1, ..., rd) is the r_d-th successor of its parent's token in the table.
Tokens the target has not read yet propose their table row's initial guess (rejected, at no extra cost). The table
persists across `generate()` calls of one drafter object (the paper's "recycling" across queries); `reset()` clears it.

The drafts are deterministic (q one-hot), so greedy and sampled decoding stay exact. The tree is verified in one
forward with a tree attention mask; `max_tokens` caps its nodes (the first nodes of the tree, which is ordered from the
likeliest to be accepted, parents first), so the adaptive policy can size it by measured cost.
"""

from __future__ import annotations

import torch

from .base import Draft, Drafter
from ..cache.ragged import check_tree_attention
from ..tree import Tree

#: ranks of the successors per node, in the order to verify them (parents first, likeliest first: what a budget of n
#: nodes keeps is the first n): the best chain deepest, then the runners-up at each depth. 15 nodes, depth 4.
DEFAULT_TREE = ((0,), (0, 0), (1,), (0, 0, 0), (0, 1), (2,), (1, 0), (0, 0, 0, 0), (0, 0, 1), (3,), (0, 1, 0), (1, 1),
                (2, 0), (0, 2), (1, 0, 0))


class RecycleDrafter(Drafter):
    """Drafts a tree from the target's own top-k successors of each token (see the module docstring).

    Args:
        top_k: successors kept per token id (the table is vocab x top_k ids: 1.5 MB for 49,152 tokens and k = 8).
        tree: a list of rank paths, parents first in the order they should be verified (the default: 15 nodes).
    """

    def __init__(self, top_k: int = 8, tree=DEFAULT_TREE):
        paths = [tuple(p) for p in tree]
        if not paths or any(not p or min(p) < 0 or max(p) >= top_k for p in paths):
            raise ValueError(f"tree paths need ranks in 0..top_k-1 (top_k={top_k}), e.g. [[0], [1], [0, 0]].")
        index = {p: i for i, p in enumerate(paths)}
        missing = [p for p in paths if len(p) > 1 and index.get(p[:-1], len(paths)) >= index[p]]
        if missing:
            raise ValueError(f"tree paths {missing} must come after their parent path.")
        self.top_k, self.paths = top_k, paths
        self.tree = Tree([index[p[:-1]] if len(p) > 1 else -1 for p in paths])
        self.default_num_draft_tokens = len(paths)
        self.table: torch.Tensor | None = None  # [vocab, top_k] successor ids, kept across calls

    def __repr__(self) -> str:
        return f"RecycleDrafter(top_k={self.top_k}, nodes={len(self.paths)})"

    def reset(self) -> None:
        self.table = None

    def start(self, target, seqs, settings):
        super().start(target, seqs, settings)
        check_tree_attention(target.model, "Token recycling", target.cache)
        vocab = target.model.config.get_text_config().vocab_size
        device = seqs.ids(0).device
        if self.table is None or self.table.shape[0] != vocab or self.table.device != device:
            # an unseen token's initial guess: tokens 0..k-1 (rejected when wrong; the target's own row replaces it)
            self.table = torch.arange(self.top_k, device=device).expand(vocab, -1).clone()
        t = self.tree.tensors(device)
        self.parent_rows = t["parents"]  # node -> its parent node (-1: the root)
        self.ranks = torch.tensor([p[-1] for p in self.paths], device=device)

    def propose(self, seqs, max_tokens):
        size = min(max_tokens, len(self.paths))
        last = torch.stack([seqs.ids(b)[-1] for b in range(seqs.size)])  # [B] each row's root token
        tokens = torch.empty(seqs.size, size, dtype=torch.long, device=last.device)
        for i in range(size):  # parents first: a node's parent token is already known
            parent = self.tree.parents[i]
            source = last if parent < 0 else tokens[:, parent]
            tokens[:, i] = self.table[source, self.paths[i][-1]]
        return Draft(tokens, tree=self.tree.prefix(size))

    def accepted(self, seqs, verified):
        """Refresh the table from the step's processed scores: the successors of every token the target just read."""
        if verified.scores is None:
            return
        self.table[verified.read_tokens.flatten()] = verified.scores.topk(self.top_k, dim=-1).indices.flatten(0, 1)


__all__ = ["RecycleDrafter", "DEFAULT_TREE"]
