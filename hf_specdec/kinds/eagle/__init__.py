"""EAGLE-style drafters: a `SpecDrafterForCausalLM` reading the target's final hidden state.

The files of this kind: `options.py` (its options), the model: `draft_model/`'s, `drafter.py` (decoding),
`training.py` (its training adapter, loaded by `training/distill.py` only), `formats.py` (SafeAILab's and vLLM's layout, read and written)."""

from .options import EagleOptions
from .drafter import EagleDrafter

__all__ = ["EagleOptions", "EagleDrafter"]
