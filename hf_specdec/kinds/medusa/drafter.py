"""Medusa drafting: the heads read the target's hidden state that the last verification forward produced.

At each step, with `f` the target's final hidden state at the position just before the newest token (the one whose
LM-head output chose that token), head i proposes the token i + 1 positions after the newest one. No extra target
call and no KV cache of its own. The first step has no hidden state yet, so it proposes nothing. Chains and trees of
the heads' candidates are drafted as for every drafter that scores several positions at once (`positionwise.py`);
`tree="default"` is a 7-node tree.
"""

from __future__ import annotations

import torch

from ...cache.hidden import final_norm
from .model import MedusaHeads
from ...drafters.base import check_device, share_of_target
from ...drafters.features import TargetFeatures
from ...drafters.positionwise import PositionwiseDrafter


class MedusaDrafter(PositionwiseDrafter):
    what = "A Medusa drafter"

    def __init__(self, heads, tree="default"):
        if not isinstance(heads, MedusaHeads):
            raise TypeError(f"MedusaDrafter needs MedusaHeads, got {type(heads).__name__}.")
        self.heads = heads.eval()
        super().__init__(heads.config.num_heads, heads.config.head_accuracy, tree)

    def vocab_size(self) -> int:
        return self.heads.config.vocab_size

    def start(self, target, seqs, settings):
        super().start(target, seqs, settings)
        check_device(self.heads, target.model, "Medusa heads")
        self.heads.bind_target(target.model)
        self.target_features = TargetFeatures(target, [final_norm(target.model)], seqs.size)

    def draft_cost(self, target_model):
        head = target_model.get_output_embeddings() if self.heads.config.share_lm_head else self.heads.lm_heads[0]
        return share_of_target(target_model, self.heads.heads[0], head)

    def accepted(self, seqs, verified):
        self.target_features.extend(verified)

    def select_rows(self, rows):
        self.target_features.select(rows)

    def position_logits(self, seqs, k):
        if not self.target_features.ready(seqs):
            return None
        # the hidden state that chose each row's newest token
        last = torch.stack([f[n - 2] for f, n in zip(self.target_features.features, seqs.lengths())])  # [B, H]
        return self.heads(last, heads=list(range(min(k, self.heads.config.num_heads))))  # (only the heads asked for)
