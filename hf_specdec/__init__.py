"""hf_specdec: exact speculative decoding for Hugging Face transformers' `model.generate()`.

The names below, and each drafter kind's options, config, model and drafter classes (named by the registry:
`hf_specdec.<ClassName>`), load on first use (as transformers' own do), so that `import hf_specdec` and the
`hf-specdec` command's argument errors cost no torch import. Using a drafter class, `AutoDrafter` or `enable()`
registers the drafter kinds with transformers' Auto classes.
"""

from __future__ import annotations

import importlib

from . import registry  # (light: no torch)

registry.register_kinds_from(f"{__name__}.kinds")  # the built-in kinds, imported at the registry's first lookup

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    "speculative_generate": ".generation.loop",
    "enable": ".integrations.enable",
    "disable": ".integrations.enable",
    "get_assistant": ".assistants.resolve",
    "SpeculationStats": ".generation.stats",
    "SpeculativeDecoderOnlyOutput": ".generation.stats",
    "Drafter": ".drafters",
    "SequenceDrafter": ".drafters",
    "Draft": ".drafters",
    "DraftModelDrafter": ".drafters",
    "NgramDrafter": ".drafters",
    "as_drafter": ".assistants.resolve",
    "load_default_target": ".default_model",
    "AutoDrafter": ".assistants.auto_drafter",
    "DrafterKind": ".registry",
    "register_drafter_kind": ".registry",
    "KindOptions": ".kind_options",
    "option": ".kind_options",
}



def __getattr__(name: str):
    if name.startswith("__") and name != "__all__":
        raise AttributeError(f"module 'hf_specdec' has no attribute {name!r}")
    registry.drafter_kinds()  # every drafter kind registered (its package imported) before any of them is used
    if name == "__all__":  # (for `from hf_specdec import *`)
        return [*_EXPORTS, *sorted(registry.kind_classes())]
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    elif name in registry.kind_classes():
        value = registry.kind_classes()[name]
    else:
        raise AttributeError(f"module 'hf_specdec' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS) | set(registry.kind_classes()))
