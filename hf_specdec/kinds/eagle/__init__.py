"""EAGLE-style drafters: a `SpecDrafterForCausalLM` reading the target's final hidden state.

The files of this kind: `model.py` (config and model), `drafter.py` (decoding), `training.py` (its training
adapter, loaded by `training/distill.py` only), `export.py` (its serving-engine layout)."""

from .drafter import EagleDrafter

__all__ = ["EagleDrafter"]
