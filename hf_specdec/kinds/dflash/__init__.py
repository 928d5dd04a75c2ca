"""DFlash block drafters: transformers' `muse_glimmer_assistant` models (`generate(assistant_model=...,
speculation_type="dflash")`), whose one forward fills a block from the target's states at several layers.

The files of this kind: `options.py` (its options), `drafter.py` (decoding), `training.py` (its training adapter,
loaded by `training/distill.py` only). The model and its config are transformers' own."""

from .options import DFlashOptions
from .drafter import DFlashDrafter

__all__ = ["DFlashOptions", "DFlashDrafter"]
