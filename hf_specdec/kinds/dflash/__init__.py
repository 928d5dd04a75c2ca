"""DFlash block drafters: transformers' `muse_glimmer_assistant` models (`generate(assistant_model=...,
speculation_type="dflash")`), whose one forward fills a block from the target's states at several layers.

The files of this kind: `drafter.py` (decoding). The model and its config are transformers' own."""

from .drafter import DFlashDrafter

__all__ = ["DFlashDrafter"]
