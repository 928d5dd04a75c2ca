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

#: the drafters that live with their kind (self-speculation is a draft model of the target's own first layers), loaded
#: on first use (the kinds import this package's base)
_LAZY = {"DraftModelDrafter": "hf_specdec.kinds.draft_model.drafter", "EagleDrafter": "hf_specdec.kinds.eagle.drafter",
         "Eagle3Drafter": "hf_specdec.kinds.eagle3.drafter", "BlockDrafter": "hf_specdec.kinds.block.drafter",
         "MedusaDrafter": "hf_specdec.kinds.medusa.drafter",
         "SelfSpeculativeDrafter": "hf_specdec.kinds.draft_model.self_speculative"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'hf_specdec.drafters' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


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
