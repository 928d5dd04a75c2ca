"""hf_specdec: exact speculative decoding for Hugging Face transformers' `model.generate()`.

The names below load on first use (as transformers' own do), so that `import hf_specdec` and the `hf-specdec`
command's argument errors cost no torch import. Using a drafter class, `AutoDrafter` or `enable()` registers the
drafter kinds with transformers' Auto classes.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    "speculative_generate": ".generation.loop",
    "enable": ".integrations.enable",
    "disable": ".integrations.enable",
    "get_assistant": ".assistants",
    "SpeculationStats": ".generation.stats",
    "SpeculativeDecoderOnlyOutput": ".generation.stats",
    "Drafter": ".drafters",
    "SequenceDrafter": ".drafters",
    "Draft": ".drafters",
    "DraftModelDrafter": ".drafters",
    "NgramDrafter": ".drafters",
    "as_drafter": ".assistants",
    "load_default_target": ".default_model",
    "SpecDrafterConfig": ".kinds.draft_model",
    "SpecDrafterForCausalLM": ".kinds.draft_model",
    "Eagle3Config": ".kinds.eagle3",
    "Eagle3DraftModel": ".kinds.eagle3",
    "BlockDrafterConfig": ".kinds.block",
    "BlockDrafterModel": ".kinds.block",
    "MedusaConfig": ".kinds.medusa",
    "MedusaHeads": ".kinds.medusa",
    "AutoDrafter": ".auto_drafter",
    "DrafterKind": ".registry",
    "register_drafter_kind": ".registry",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hf_specdec' has no attribute {name!r}")
    importlib.import_module(".kinds", __name__)  # every drafter kind registered before any of them is used
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
