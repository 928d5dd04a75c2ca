"""EAGLE-3-style drafting: the drafting of `EagleDrafter`, reading the states entering three of the target's layers.

The verification forward records the outputs of the target layers before `config.target_layer_ids` (the state
entering layer i is layer i - 1's output); the drafter fuses the three into its input (`Eagle3DraftModel.fuse`) when
it catches up on verified tokens, and feeds back its own layer output while drafting ahead. No extra target call.
"""

from __future__ import annotations

import torch

from ...cache.hidden import entering_layers
from .model import Eagle3DraftModel
from ..eagle.drafter import EagleDrafter


class Eagle3Drafter(EagleDrafter):
    """Drafts k tokens with an `Eagle3DraftModel`, for one row or a batch."""

    def __init__(self, model):
        if not isinstance(model, Eagle3DraftModel):
            raise TypeError("Eagle3Drafter needs an Eagle3DraftModel.")
        self.model = model.eval()
        self.default_num_draft_tokens = model.config.num_draft_tokens_eval or 5

    def feature_modules(self, target) -> list:
        return entering_layers(target, self.model.config.target_layer_ids)

    def input_features(self, features: torch.Tensor) -> torch.Tensor:
        return self.model.fuse(features)
