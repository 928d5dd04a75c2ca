"""Draft models: a small causal LM (its own, or a token-only `SpecDrafterForCausalLM` that borrows the
target's embeddings and LM head) drafting token by token with a cache of its own.

The files of this kind: `options.py` (its options), `model.py` (config and model), `drafter.py` (decoding),
`training.py` (its training adapter, loaded by `training/distill.py` only), `formats.py` (its serving-engine layout)."""

from .options import LayersOptions, SelfOptions, TokenOptions
from .model import SpecDrafterConfig, SpecDrafterForCausalLM, drafter_config_from_target
from .drafter import DraftModelDrafter, early_layers_draft_model

__all__ = ["TokenOptions", "SelfOptions", "LayersOptions", "SpecDrafterConfig", "SpecDrafterForCausalLM", "drafter_config_from_target", "DraftModelDrafter", "early_layers_draft_model"]
