"""The target's logits processors (warpers included), applied to a whole verification block as `generate()` would.

Score row r of row b follows the root (r = 0) or node r - 1; its processors must see the exact prefix that position is
conditioned on: the row as `generate()` sees it (prompt with its padding, then its tokens) plus the draft path down
to that node. Processors whose output depends on the scores alone (temperature, top-k, top-p, ...) run once over every
row; the others run once per group of prefixes of equal length (equal-length prefixes stack into one batch, exactly as
`generate()` would call them), not once per row and position.
"""

from __future__ import annotations

import torch
from transformers import generation as tg

from ..drafters.base import for_rows

#: processors whose output, row by row, depends on the scores alone (exact classes: a subclass may read input_ids)
SCORES_ONLY = tuple(getattr(tg, name) for name in (
    "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper", "TypicalLogitsWarper",
    "EpsilonLogitsWarper", "EtaLogitsWarper", "TopHLogitsWarper",
) if hasattr(tg, name))


def prefix_groups(seqs, draft) -> list[tuple[list[tuple[int, int]], torch.Tensor]]:
    """[(the (row, score row) pairs, their stacked prefixes [n, L])] grouped by prefix length."""
    tree = draft.shape
    groups: dict[int, list] = {}
    for b in range(seqs.size):
        full = seqs.full(b)
        for r in range(tree.size + 1):
            path = tree.path_to(r - 1) if r else []
            groups.setdefault(full.shape[0] + len(path), []).append((b, r, full, path))
    out = []
    for members in groups.values():
        ids = torch.stack([torch.cat([full, draft.tokens[b, path]]) if path else full for b, r, full, path in members])
        out.append(([(b, r) for b, r, _, _ in members], ids))
    return out


def process_block(processors, seqs, draft, logits: torch.Tensor) -> torch.Tensor:
    """`logits` [B, T + 1, V] -> the scores `generate()` would compute at each of those positions."""
    if not processors:
        return logits
    scores = logits.clone()
    batch, rows, vocab = scores.shape
    groups = None
    for processor in processors:
        if type(processor) in SCORES_ONLY:
            flat = scores.view(batch * rows, vocab)
            scores = processor(flat.new_zeros(flat.shape[0], 1, dtype=torch.long), flat).view(batch, rows, vocab)
            continue
        groups = groups if groups is not None else prefix_groups(seqs, draft)
        for members, ids in groups:
            b, r = (torch.tensor(i, device=scores.device) for i in zip(*members))
            scores[b, r] = for_rows(processor, [seqs.index[row] for row, _ in members])(ids, scores[b, r])
    return scores


__all__ = ["process_block", "SCORES_ONLY"]
