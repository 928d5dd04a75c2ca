"""EAGLE-3-style drafters: one layer reading the states entering the target's low, middle and high layers.

The files of this kind: `options.py` (its options), `model.py` (config and model), `drafter.py` (decoding),
`training.py` (its training adapter, loaded by `training/distill.py` only), `formats.py` (other projects' layouts, read and written)."""

from .options import Eagle3Options
from .model import Eagle3Config, Eagle3DraftModel
from .drafter import Eagle3Drafter

__all__ = ["Eagle3Options", "Eagle3Config", "Eagle3DraftModel", "Eagle3Drafter"]
