"""Verification rules: pure functions on tensors, one per rule.

Shapes: `draft_tokens` is `[batch, k]`; target scores/probabilities cover the k draft positions plus one more (the
"bonus" position), `[batch, k + 1, vocab]`. Each rule returns `(num_accepted, next_token)`, both `[batch]`: the row keeps
`draft_tokens[:num_accepted]` and then appends `next_token`, which always comes from the target, so every target
forward yields at least one token.
"""

from __future__ import annotations

import torch


def _within(num_valid: torch.Tensor | None, batch: int, k: int, device) -> torch.Tensor:
    """[B, k] True where a draft position holds a real proposal (rows of a batch may propose fewer than k)."""
    if num_valid is None:
        return torch.ones(batch, k, dtype=torch.bool, device=device)
    return torch.arange(k, device=device)[None] < num_valid[:, None]


def greedy_accept(
    draft_tokens: torch.Tensor, target_scores: torch.Tensor, num_valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept the longest draft prefix equal to the target's argmax chain, then append the target's own next token.

    `num_valid` ([B], optional): row b proposed only its first `num_valid[b]` drafts; the rest are padding.
    """
    target_choice = target_scores.argmax(dim=-1)  # [B, k+1]
    batch, k = draft_tokens.shape
    agree = (draft_tokens == target_choice[:, :k]) & _within(num_valid, batch, k, draft_tokens.device)
    num_accepted = agree.long().cumprod(dim=-1).sum(dim=-1)
    next_token = target_choice.gather(1, num_accepted[:, None]).squeeze(1)
    return num_accepted, next_token


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): what to sample from after a rejection so that the output is distributed exactly as p."""
    residual = (p - q).clamp_min(0)
    total = residual.sum(dim=-1, keepdim=True)
    # p == q (up to rounding) means a rejection had probability 0; fall back to p rather than divide by zero.
    return torch.where(total > 0, residual / total.clamp_min(torch.finfo(p.dtype).tiny), p)


def rejection_sample(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    num_valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Leviathan et al. 2023 / Chen et al. 2023 speculative sampling.

    Draft token i is accepted with probability min(1, p_i(x) / q_i(x)) while all before it were accepted; at the first
    rejection the next token is drawn from norm(max(0, p_i - q_i)); when all k are accepted, from p_k (the bonus
    position). `draft_probs` (`[B, k, V]`) must be exactly the distribution the drafter sampled from (one-hot for a
    deterministic drafter); `target_probs` (`[B, k+1, V]`) is the target's distribution after all logits processors.
    `num_valid` ([B], optional): positions past it are padding, never accepted, and act like the bonus position (q = 0
    there, so the next token comes from p itself).
    """
    batch, k = draft_tokens.shape
    within = _within(num_valid, batch, k, draft_tokens.device)
    draft_probs = draft_probs * within[..., None]
    p_of_draft = target_probs[:, :k].gather(-1, draft_tokens[..., None]).squeeze(-1)
    q_of_draft = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1)
    accept_prob = (p_of_draft / q_of_draft.clamp_min(torch.finfo(q_of_draft.dtype).tiny)).clamp(max=1.0)
    uniform = torch.rand(batch, k, device=draft_tokens.device, generator=generator, dtype=accept_prob.dtype)
    accepted = ((uniform < accept_prob) & within).long().cumprod(dim=-1)
    num_accepted = accepted.sum(dim=-1)

    # With q padded by zeros at the bonus position, the residual there is p itself: one formula for both cases.
    q_padded = torch.cat([draft_probs, draft_probs.new_zeros(batch, 1, draft_probs.shape[-1])], dim=1)
    index = num_accepted[:, None, None].expand(-1, 1, target_probs.shape[-1])
    p_next = target_probs.gather(1, index).squeeze(1)
    q_next = q_padded.gather(1, index).squeeze(1)
    next_token = torch.multinomial(residual_distribution(p_next, q_next), 1, generator=generator).squeeze(1)
    return num_accepted, next_token


def one_hot_probs(tokens: torch.Tensor, vocab_size: int, dtype=torch.float32) -> torch.Tensor:
    """The distribution of a deterministic drafter: all mass on the proposed token."""
    return torch.nn.functional.one_hot(tokens, vocab_size).to(dtype)


# --- Trees (Medusa-style candidates): node i has token tokens[i] and parent parents[i] (-1 = the root, i.e. the last
# accepted token). Nodes are ordered parents-first (breadth-first), so any root-to-node path runs in increasing index.


def tree_depths(parents: torch.Tensor) -> torch.Tensor:
    """Depth of each node (children of the root have depth 1)."""
    depth = torch.zeros_like(parents)
    for i, parent in enumerate(parents.tolist()):
        if parent >= i:
            raise ValueError("Tree nodes must come after their parents (order them breadth-first).")
        depth[i] = 1 if parent < 0 else depth[parent] + 1
    return depth


def tree_ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """[T, T] bool: node i may attend to node j iff j is i or one of its ancestors (the tree's attention pattern)."""
    size = parents.shape[0]
    mask = torch.eye(size, dtype=torch.bool, device=parents.device)
    for i, parent in enumerate(parents.tolist()):
        if parent >= 0:
            mask[i] |= mask[parent]
    return mask


def greedy_accept_tree(tokens: torch.Tensor, parents: torch.Tensor, target_scores: torch.Tensor):
    """Longest root-to-node path whose every token equals the target's argmax after its parent.

    `target_scores` is `[T + 1, V]`: row 0 follows the root, row i + 1 follows node i. Returns `(path, next_token)`:
    the accepted node indices in order, and the target's own token after the path's last node.
    """
    choice = target_scores.argmax(dim=-1)
    best = _longest_path(parents, tokens == choice[parents + 1])  # row parent + 1 predicted each node's token
    return _path_to(best, parents), int(choice[best + 1])


def _longest_path(parents: torch.Tensor, node_ok: torch.Tensor) -> int:
    """The deepest node whose path from the root is all `node_ok` (-1: none); the first such node on ties."""
    ok, depth, best, best_depth = [], [], -1, 0
    for i, (parent, good) in enumerate(zip(parents.tolist(), node_ok.tolist())):
        ok.append(good and (parent < 0 or ok[parent]))
        depth.append(1 if parent < 0 else depth[parent] + 1)
        if ok[i] and depth[i] > best_depth:
            best, best_depth = i, depth[i]
    return best


def _path_to(node: int, parents: torch.Tensor) -> list[int]:
    up, path = parents.tolist(), []
    while node >= 0:
        path.append(node)
        node = up[node]
    return path[::-1]


def rejection_sample_tree(tokens: torch.Tensor, parents: torch.Tensor, target_probs: torch.Tensor, generator=None):
    """Exact sampling with deterministic tree candidates (recursive rejection over siblings, as in SpecInfer).

    At the root, try its children in order: accept child x with probability p'(x), where p' starts as p and, after
    each rejected candidate, becomes norm(max(0, p' - onehot(x))) (the residual of a one-hot proposal); on acceptance
    descend into x's children with x's target distribution; when every child is rejected, draw the next token from the
    final residual. Each step emits a token with exactly the target's distribution. `target_probs` is `[T + 1, V]`.
    Returns `(path, next_token)`.
    """
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents.tolist()):
        children.setdefault(parent, []).append(i)
    path, node = [], -1
    while True:
        p = target_probs[node + 1].clone()
        for child in children.get(node, []):
            x = int(tokens[child])
            u = torch.rand((), generator=generator, device=p.device)
            if u < p[x]:
                path.append(child)
                node = child
                break
            p = residual_distribution(p[None], one_hot_probs(tokens[child : child + 1], p.shape[-1])[0][None])[0]
        else:
            return path, int(torch.multinomial(p, 1, generator=generator))


# --- Medusa's typical acceptance: LOSSY, only when asked for (`verification="typical"`).


def typical_bar(target_probs: torch.Tensor, threshold: float, alpha: float) -> torch.Tensor:
    """min(threshold, alpha * exp(-entropy)) of each distribution: a token above it counts as 'typical'."""
    entropy = -(target_probs * target_probs.clamp_min(1e-30).log()).sum(dim=-1)
    return torch.minimum(torch.full_like(entropy, threshold), alpha * torch.exp(-entropy))


def typical_accept(draft_tokens, target_probs, threshold: float, alpha: float, generator=None, num_valid=None):
    """Medusa-style typical acceptance (Cai et al. 2024), NOT exact: draft i is accepted when the target gives it
    probability above `typical_bar` and every draft before it was accepted; the next token is drawn from the target's
    distribution after the accepted prefix. The output follows the target only approximately (typical tokens pass
    even when they are unlikely under sampling); use it for speed when exactness is not needed."""
    batch, k = draft_tokens.shape
    p_of_draft = target_probs[:, :k].gather(-1, draft_tokens[..., None]).squeeze(-1)
    ok = (p_of_draft > typical_bar(target_probs[:, :k], threshold, alpha)) & _within(num_valid, batch, k, draft_tokens.device)
    num_accepted = ok.long().cumprod(dim=-1).sum(dim=-1)
    p_next = target_probs.gather(1, num_accepted[:, None, None].expand(-1, 1, target_probs.shape[-1])).squeeze(1)
    return num_accepted, torch.multinomial(p_next, 1, generator=generator).squeeze(1)


def typical_accept_tree(tokens, parents, target_probs, threshold: float, alpha: float, generator=None):
    """`typical_accept` on a tree (LOSSY): the deepest node whose path is all typical, then a draw from the target
    after it. `target_probs` is `[T + 1, V]` (row 0 follows the root). Returns `(path, next_token)`."""
    rows = parents + 1
    p_of_node = target_probs[rows].gather(-1, tokens[:, None]).squeeze(-1)
    best = _longest_path(parents, p_of_node > typical_bar(target_probs, threshold, alpha)[rows])
    return _path_to(best, parents), int(torch.multinomial(target_probs[best + 1], 1, generator=generator))
