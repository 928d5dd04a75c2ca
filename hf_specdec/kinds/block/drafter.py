"""Block drafting: one drafter forward proposes the next `block_size` tokens (see `model.py` beside this file).

Each step the drafter catches up on the tokens verified since its last step (fed with the target's states, as an
EAGLE drafter is) and, in the same forward, runs k - 1 mask positions after each row's newest token; the newest
token's output scores the first draft, mask i the (i + 1)-th. The mask positions leave the drafter's cache at once:
it holds only verified tokens with the target's states. The first step has no target states yet and drafts nothing.
Chains and trees are drafted from the k scored positions as every positionwise drafter's are (`positionwise.py`).
"""

from __future__ import annotations

import torch

from .model import BlockDrafterModel
from ..eagle3.drafter import Eagle3Drafter
from ...drafters.positionwise import PositionwiseDrafter


class BlockDrafter(PositionwiseDrafter, Eagle3Drafter):
    """Drafts a chain (default) or a tree of a `BlockDrafterModel`'s positions, for one row or a batch."""

    what = "A block drafter"

    def __init__(self, model, tree="chain"):
        if not isinstance(model, BlockDrafterModel):
            raise TypeError(f"BlockDrafter needs a BlockDrafterModel, got {type(model).__name__}.")
        self.model = model.eval()
        PositionwiseDrafter.__init__(self, model.config.block_size, model.config.position_accuracy, tree)

    def draft_cost(self, target_model):
        return super().draft_cost(target_model) / self.model.config.block_size  # one forward drafts the block

    def position_logits(self, seqs, k):
        if not self.target_features.ready(seqs):
            return None
        block, features, valid, counts = self.catch_up(seqs)
        batch, masks = seqs.size, k - 1
        device = block.device
        ids = torch.cat([block, block.new_zeros(batch, masks)], dim=1)
        features = torch.cat([features, features.new_zeros(batch, masks, features.shape[-1])], dim=1)
        is_mask = (torch.arange(ids.shape[1], device=device) >= block.shape[1])[None].expand(batch, -1)
        valid = torch.cat([valid, torch.ones(batch, masks, dtype=torch.bool)], dim=1)
        logits = self.kv.forward(ids, ids.shape[1], valid=valid, target_features=features, is_mask=is_mask)
        self.kv.discard_last([masks] * batch)  # the cache keeps verified tokens only
        newest = logits[torch.arange(batch, device=device), torch.tensor(counts, device=device) - 1]
        return torch.cat([newest[:, None], logits[:, block.shape[1] :]], dim=1)


__all__ = ["BlockDrafter"]
