"""Verification, all of it: the target's one forward over each row's uncached tokens and its draft (`verify`), and the
acceptance rule of a call (`accept_rule`: one class per rule, chosen once), over the pure functions each rule applies,
for chains and trees alike (`greedy`, `rejection_sample`, `typical`).

Shapes: a step's draft is `tokens` [B, T] laid out as a `Tree` (a chain is the tree whose node i has parent i - 1);
`valid` [B, T] marks the nodes row b really proposed (a row may propose fewer). The target's scores or probabilities
are [B, T + 1, V]: row 0 follows the root (the last committed token), row i + 1 follows node i. Each rule returns an
`Accepted`: per row the accepted root-to-node path, its length, and the next token, which always comes from the
target, so every verification forward yields at least one token.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from ..drafters.base import Draft
from ..tree import Tree
from ..errors import InputError


@dataclass
class Accepted:
    path: torch.Tensor  # [B, D] the accepted nodes from the root down, -1 padded (D = the tree's depth, at least 1)
    num_accepted: torch.Tensor  # [B]
    next_token: torch.Tensor  # [B] the target's token after the path
    last: torch.Tensor  # [B] the path's last node, -1 when nothing was accepted (its score row is last + 1)


def verify(target, pending: torch.Tensor, pending_valid: torch.Tensor, draft: Draft) -> torch.Tensor:
    """The verification forward: each row's uncached tokens `pending` [B, u] (host mask `pending_valid`), then its
    draft, in ONE target forward. Returns float32 logits [B, T + 1, V] (row 0 after the last pending token, row i + 1
    after node i)."""
    tree = draft.shape
    valid = draft.valid_mask()
    if tree.is_chain:
        nodes = torch.ones(draft.tokens.shape, dtype=torch.bool) if valid is None else valid
        block_valid = torch.cat([pending_valid, nodes], dim=1)
        return target.forward(torch.cat([pending, draft.tokens], dim=1), tree.size + 1, valid=block_valid)
    return target.forward_tree(pending, pending_valid, draft.tokens, tree, valid)


class AcceptRule:
    """The verification rule of a call, one class per rule, chosen once (`accept_rule`): called with a draft and the
    target's processed scores, it returns the accepted path of every row."""

    def __call__(self, draft, scores) -> Accepted:
        valid = draft.valid_mask()
        return self.accept(draft, draft.shape, scores, None if valid is None else valid.to(scores.device))

    def accept(self, draft, tree, scores, valid) -> Accepted:
        raise NotImplementedError


class GreedyRule(AcceptRule):
    """Greedy decoding: the longest path of drafts that are the target's argmax (exact)."""

    def accept(self, draft, tree, scores, valid):
        return greedy(draft.tokens, tree, scores, valid)


class RejectionRule(AcceptRule):
    """Sampling: rejection sampling against the drafter's q, recursively over siblings in a tree (exact)."""

    def accept(self, draft, tree, scores, valid):
        return rejection_sample(draft.tokens, tree, scores.softmax(dim=-1), draft.probs, valid)


@dataclass(frozen=True)
class TypicalRule(AcceptRule):
    """Typical acceptance (Cai et al. 2024): lossy, used only when asked for."""

    threshold: float
    alpha: float

    def accept(self, draft, tree, scores, valid):
        return typical(draft.tokens, tree, scores.softmax(dim=-1), self.threshold, self.alpha, valid)


def accept_rule(verification_mode: str, generation_config, threshold: float, alpha: float) -> AcceptRule:
    if verification_mode == "exact":
        return RejectionRule() if generation_config.do_sample else GreedyRule()
    if verification_mode != "typical":
        raise InputError(f"verification must be 'exact' (the default) or 'typical' (lossy), got {verification_mode!r}.")
    if not generation_config.do_sample:
        raise InputError("verification='typical' is a sampling rule; greedy decoding is always verified exactly "
                         "(drop verification= or pass do_sample=True).")
    if not (0 <= threshold <= 1) or alpha < 0:
        raise InputError(f"typical acceptance needs 0 <= typical_threshold <= 1 and typical_alpha >= 0 "
                         f"(got {threshold}, {alpha}).")
    warnings.warn("verification='typical' is lossy: the output no longer follows the target's distribution exactly "
                  "(typical acceptance). Use the default verification='exact' for exact sampling.", stacklevel=4)
    return TypicalRule(float(threshold), float(alpha))


def _deepest(tree: Tree, node_ok: torch.Tensor) -> Accepted:
    """The deepest node whose whole path is `node_ok` (the first such node on ties), without its next token."""
    batch = node_ok.shape[0]
    if tree.size == 0:  # nothing drafted: a plain step
        none = torch.full((batch,), -1, dtype=torch.long, device=node_ok.device)
        return Accepted(none[:, None], none + 1, none, none)
    if tree.is_chain:  # (a third of the tree's cost: the accepted prefix is the run of good nodes from the first)
        num_accepted = node_ok.long().cumprod(dim=1).sum(dim=1)
        nodes = torch.arange(tree.size, device=node_ok.device)
        last = num_accepted - 1
        return Accepted(torch.where(nodes < num_accepted[:, None], nodes, -1), num_accepted, last, last)
    t = tree.tensors(node_ok.device)
    # a node's path is good when none of its ancestors (itself included) is bad
    bad_on_path = (~node_ok).to(torch.float32) @ t["ancestors"].T.to(torch.float32)
    depth = torch.where(bad_on_path == 0, t["depth"], 0)  # [B, T]
    last = depth.argmax(dim=-1)  # the first of the deepest
    num_accepted = depth.gather(1, last[:, None]).squeeze(1)
    last = torch.where(num_accepted > 0, last, -1)
    path = torch.where(num_accepted[:, None] > 0, t["path"][last.clamp_min(0)], -1)
    return Accepted(path, num_accepted, last, last)


def greedy(tokens: torch.Tensor, tree: Tree, scores: torch.Tensor, valid: torch.Tensor | None = None) -> Accepted:
    """The longest path whose every token is the target's argmax after its parent; then the target's own token."""
    choice = scores.argmax(dim=-1)  # [B, T + 1]
    node_ok = tokens == choice[:, tree.tensors(tokens.device)["parents"] + 1]
    if valid is not None:
        node_ok &= valid
    accepted = _deepest(tree, node_ok)
    accepted.next_token = choice.gather(1, (accepted.last + 1)[:, None]).squeeze(1)
    return accepted


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): what to sample from after a rejection so that the output is distributed exactly as p."""
    residual = (p - q).clamp_min(0)
    total = residual.sum(dim=-1, keepdim=True)
    # p == q (up to rounding) means a rejection had probability 0; fall back to p rather than divide by zero.
    return torch.where(total > 0, residual / total.clamp_min(torch.finfo(p.dtype).tiny), p)


def rejection_sample(tokens: torch.Tensor, tree: Tree, probs: torch.Tensor, q: torch.Tensor | None = None,
                     valid: torch.Tensor | None = None, generator: torch.Generator | None = None) -> Accepted:
    """Exact speculative sampling over a tree (Leviathan et al. 2023 / Chen et al. 2023 for a chain; recursive
    rejection over siblings, as in SpecInfer, for a tree).

    From the root, try the current node's children in order: accept child x with probability min(1, p'(x) / q_x(x)),
    where p' starts as the target's distribution after the current node and, after each rejected child, becomes the
    residual norm(max(0, p' - q_x)); on acceptance descend into x with the target's distribution after x. When every
    child is rejected (or there is none: a leaf, or a node the row did not propose), draw the next token from p'.
    Every emitted token then has exactly the target's distribution. `q` [B, T, V] is each node's draft distribution;
    None means deterministic nodes (one-hot q: the child is accepted with probability p'(x)). Siblings with a
    stochastic q must be independent draws from the same q.
    """
    batch, size = tokens.shape
    t = tree.tensors(tokens.device)
    rows = torch.arange(batch, device=tokens.device)
    node = torch.full((batch,), -1, dtype=torch.long, device=tokens.device)
    p = probs[:, 0].clone()
    alive = torch.ones(batch, dtype=torch.bool, device=tokens.device)
    path = torch.full((batch, max(tree.max_depth, 1)), -1, dtype=torch.long, device=tokens.device)
    for depth in range(tree.max_depth):
        moved = torch.zeros_like(alive)
        for rank in range(t["children"].shape[1]):
            child = t["children"][node + 1, rank]  # [B], -1 where there is no such child
            index = child.clamp_min(0)
            trying = alive & ~moved & (child >= 0)
            if valid is not None:
                trying &= valid[rows, index]
            x = tokens[rows, index]
            p_x = p.gather(1, x[:, None]).squeeze(1)
            q_x = torch.ones_like(p_x) if q is None else q[rows, index].gather(1, x[:, None]).squeeze(1)
            u = torch.rand(batch, device=tokens.device, generator=generator, dtype=p.dtype)
            accept = trying & (u * q_x < p_x)  # u < min(1, p(x) / q(x))
            reject = trying & ~accept
            q_child = torch.nn.functional.one_hot(x, p.shape[-1]).to(p.dtype) if q is None else q[rows, index]
            p = torch.where(reject[:, None], residual_distribution(p, q_child), p)
            p = torch.where(accept[:, None], probs[rows, index + 1], p)
            node = torch.where(accept, child, node)
            path[:, depth] = torch.where(accept, child, path[:, depth])
            moved |= accept
        alive &= moved
    num_accepted = (path >= 0).sum(dim=1)
    next_token = torch.multinomial(p, 1, generator=generator).squeeze(1)
    return Accepted(path, num_accepted, next_token, node)


def one_hot_probs(tokens: torch.Tensor, vocab_size: int, dtype=torch.float32) -> torch.Tensor:
    """The distribution of a deterministic drafter: all mass on the proposed token."""
    return torch.nn.functional.one_hot(tokens, vocab_size).to(dtype)


# --- typical acceptance: LOSSY, only when asked for (`verification="typical"`).


def typical_bar(target_probs: torch.Tensor, threshold: float, alpha: float) -> torch.Tensor:
    """min(threshold, alpha * exp(-entropy)) of each distribution: a token above it counts as 'typical'."""
    entropy = -(target_probs * target_probs.clamp_min(1e-30).log()).sum(dim=-1)
    return torch.minimum(torch.full_like(entropy, threshold), alpha * torch.exp(-entropy))


def typical(tokens: torch.Tensor, tree: Tree, probs: torch.Tensor, threshold: float, alpha: float,
            valid: torch.Tensor | None = None, generator: torch.Generator | None = None) -> Accepted:
    """Typical acceptance (Cai et al. 2024), NOT exact: the deepest node whose path is all 'typical'
    (the target gives each token more than `typical_bar` after its parent), then a draw from the target after it.
    The output follows the target only approximately; use it for speed when exactness is not needed."""
    rows = tree.tensors(tokens.device)["parents"] + 1
    p_of_node = probs[:, rows].gather(-1, tokens[..., None]).squeeze(-1)  # [B, T]
    node_ok = p_of_node > typical_bar(probs, threshold, alpha)[:, rows]
    if valid is not None:
        node_ok &= valid
    accepted = _deepest(tree, node_ok)
    after = probs.gather(1, (accepted.last + 1)[:, None, None].expand(-1, 1, probs.shape[-1])).squeeze(1)
    accepted.next_token = torch.multinomial(after, 1, generator=generator).squeeze(1)
    return accepted

__all__ = ["verify", "accept_rule", "AcceptRule", "GreedyRule", "RejectionRule", "TypicalRule", "Accepted", "greedy",
           "rejection_sample", "typical", "residual_distribution", "one_hot_probs", "typical_bar"]
