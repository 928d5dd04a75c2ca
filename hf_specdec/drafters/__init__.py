"""Drafters: the batched protocol (`base.py`), the model-free strategies and the wrappers that combine drafters. The
drafters of trained kinds live with their kind (`hf_specdec/kinds/<kind>/drafter.py`) and are named here too."""

import importlib

from .base import CandidateGeneratorDrafter, Draft, Drafter, DraftSettings, SequenceDrafter, Verified
from .cross_tokenizer import CrossTokenizerDrafter
from .fallback import FallbackDrafter
from .ngram import NgramDrafter
from .per_row import PerRowDrafter
from .plain import PlainDrafter
from .recycle import RecycleDrafter
from .suffix import SuffixDrafter, SuffixIndex

#: self-speculation is a draft model of the target's own first layers: it lives with the draft models
_LAZY = {"SelfSpeculativeDrafter": "hf_specdec.kinds.draft_model.self_speculative"}


def __getattr__(name: str):
    """The drafters that live with their kind (`hf_specdec/kinds/<kind>/drafter.py`), by the registry, on first use
    (the kinds import this package's base)."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    from ..registry import kind_classes

    drafter = kind_classes().get(name)
    if not (isinstance(drafter, type) and issubclass(drafter, Drafter)):
        raise AttributeError(f"module 'hf_specdec.drafters' has no attribute {name!r}")
    return drafter


__all__ = [
    "Draft",
    "Drafter",
    "SequenceDrafter",
    "DraftSettings",
    "Verified",
    "NgramDrafter",
    "FallbackDrafter",
    "PerRowDrafter",
    "PlainDrafter",
    "RecycleDrafter",
    "SuffixDrafter",
    "SuffixIndex",
    "CrossTokenizerDrafter",
    "CandidateGeneratorDrafter",
    *_LAZY,
]
