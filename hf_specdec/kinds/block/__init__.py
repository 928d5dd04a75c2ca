"""The block drafter: one forward proposes a block of tokens from the target's fused layer states.

The files of this kind: `options.py` (its options), `model.py` (config and model), `drafter.py` (decoding),
`training.py` (its training adapter, loaded by `training/distill.py` only)."""

from .options import BlockOptions
from .model import BlockDrafterConfig, BlockDrafterModel
from .drafter import BlockDrafter

__all__ = ["BlockOptions", "BlockDrafterConfig", "BlockDrafterModel", "BlockDrafter"]
