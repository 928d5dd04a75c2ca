"""Medusa heads on the target's final hidden state (chains and trees).

The files of this kind: `options.py` (its options), `model.py` (config and model), `drafter.py` (decoding),
`training.py` (its training adapter, loaded by `training/distill.py` only), `formats.py` (other projects' layouts, read and written)."""

from .options import MedusaOptions
from .model import MedusaConfig, MedusaHeads
from .drafter import MedusaDrafter

__all__ = ["MedusaOptions", "MedusaConfig", "MedusaHeads", "MedusaDrafter"]
