"""The shape of a step's draft candidates: a tree, of which a chain is the special case.

Node i holds a drafted token and has parent `parents[i]` (-1: the root, i.e. the row's last committed token). Nodes
are ordered parents-first, so a root-to-node path runs in increasing index and the first n nodes form a tree too. A
chain of k drafts is the tree whose node i has parent i - 1: the loop verifies chains and trees with the same step.

Everything a step needs is computed here once per shape (host lists for the loop's bookkeeping, device tensors for
the verification rules and the attention mask) and cached, so no step rebuilds a tree node by node.
"""

from __future__ import annotations

import functools

import torch


class Tree:
    def __init__(self, parents):
        parents = [int(p) for p in parents]
        depth = []
        for i, parent in enumerate(parents):
            if not -1 <= parent < i:
                raise ValueError("Tree nodes must come after their parents (order them breadth-first), got "
                                 f"parents={parents}.")
            depth.append(1 if parent < 0 else depth[parent] + 1)
        self.parents = parents
        self.depth = depth  # children of the root have depth 1
        self.size = len(parents)
        self.max_depth = max(depth, default=0)
        self.is_chain = parents == list(range(-1, self.size - 1))
        self.children = [[] for _ in range(self.size + 1)]  # children[node + 1]: node's children (node -1: the root)
        for i, parent in enumerate(parents):
            self.children[parent + 1].append(i)
        self._device_tensors = {}

    def __repr__(self) -> str:
        return f"Tree.chain({self.size})" if self.is_chain else f"Tree({self.parents})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Tree) and other.parents == self.parents

    def __hash__(self) -> int:
        return hash(tuple(self.parents))

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def chain(length: int) -> "Tree":
        return Tree(range(-1, length - 1))

    def prefix(self, size: int) -> "Tree":
        """The first `size` nodes (a tree too: parents come first)."""
        return self if size >= self.size else _cached_tree(tuple(self.parents[:size]))

    def path_to(self, node: int) -> list[int]:
        """The nodes from the root's child down to `node` (empty for the root, -1)."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def tensors(self, device) -> dict[str, torch.Tensor]:
        """Device tensors of this shape, built once per device:
        parents [T]; depth [T]; ancestors [T, T] bool (j is i or an ancestor of i); path [T, D] (node i's path from
        the root, -1 padded); children [T + 1, W] (each node's children, the root first, -1 padded)."""
        key = str(device)
        if key not in self._device_tensors:
            size, width = self.size, max(len(c) for c in self.children)
            ancestors = torch.zeros(size, size, dtype=torch.bool)
            path = torch.full((size, max(self.max_depth, 1)), -1, dtype=torch.long)
            for i in range(size):
                nodes = self.path_to(i)
                ancestors[i, nodes] = True
                path[i, : len(nodes)] = torch.tensor(nodes)
            children = torch.full((size + 1, max(width, 1)), -1, dtype=torch.long)
            for n, kids in enumerate(self.children):
                children[n, : len(kids)] = torch.tensor(kids, dtype=torch.long)
            self._device_tensors[key] = {
                "parents": torch.tensor(self.parents, dtype=torch.long).to(device),
                "depth": torch.tensor(self.depth, dtype=torch.long).to(device),
                "ancestors": ancestors.to(device),
                "path": path.to(device),
                "children": children.to(device),
            }
        return self._device_tensors[key]


@functools.lru_cache(maxsize=64)
def _cached_tree(parents: tuple) -> Tree:
    return Tree(parents)


__all__ = ["Tree"]
