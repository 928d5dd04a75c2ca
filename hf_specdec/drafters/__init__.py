"""Drafters: one file per drafting strategy, all behind the batched protocol in `base.py`."""

from .base import CandidateGeneratorDrafter, Draft, Drafter, DraftSettings, SequenceDrafter, Verified
from .block import BlockDrafter
from .cross_tokenizer import CrossTokenizerDrafter
from .draft_model import DraftModelDrafter
from .eagle import EagleDrafter
from .eagle3 import Eagle3Drafter
from .fallback import FallbackDrafter
from .medusa import MedusaDrafter
from .ngram import NgramDrafter
from .per_row import PerRowDrafter
from .plain import PlainDrafter
from .recycle import RecycleDrafter
from .self_speculative import SelfSpeculativeDrafter
from .suffix import SuffixDrafter, SuffixIndex

__all__ = [
    "Draft",
    "Drafter",
    "SequenceDrafter",
    "DraftSettings",
    "Verified",
    "DraftModelDrafter",
    "NgramDrafter",
    "SelfSpeculativeDrafter",
    "EagleDrafter",
    "Eagle3Drafter",
    "BlockDrafter",
    "MedusaDrafter",
    "FallbackDrafter",
    "PerRowDrafter",
    "PlainDrafter",
    "RecycleDrafter",
    "SuffixDrafter",
    "SuffixIndex",
    "CrossTokenizerDrafter",
    "CandidateGeneratorDrafter",
]
