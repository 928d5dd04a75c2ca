"""Saving a drafter model: its own weights only, in `config.save_dtype`, and the `custom_generate/` folder.

The folder is written by `hf_specdec.hub.bundle`, imported by name at save time, so that these model classes never
import the Hub code: the bundled copy of this module, inside a `custom_generate/` folder, runs without hf_specdec and
writes no bundle.
"""

from __future__ import annotations

import importlib

import torch

#: whether this is the installed package (not the copy inside a drafter's custom_generate/ folder)
IN_PACKAGE = __name__.startswith("hf_specdec.")


class DrafterSaving:
    """`save_pretrained` for drafter models: their own weights only, in `config.save_dtype`, and `custom_generate/`;
    a drafter read from another project's layout (`config.published`) is written in that layout again."""

    def save_pretrained(self, save_directory, *args, state_dict=None, **kwargs):
        published = getattr(self.config, "published", None)
        if IN_PACKAGE and published and (args[0] if args else kwargs.get("is_main_process", True)):
            return importlib.import_module("hf_specdec.formats").write_published(self, save_directory)
        if state_dict is None and self.config.save_dtype:
            dtype = getattr(torch, self.config.save_dtype)
            state_dict = {k: v.to(dtype) if v.is_floating_point() else v for k, v in self.state_dict().items()}
        if IN_PACKAGE and (args[0] if args else kwargs.get("is_main_process", True)):
            # first, so that `push_to_hub=True` uploads it too
            importlib.import_module("hf_specdec.hub.bundle").write_custom_generate(save_directory)
        return super().save_pretrained(save_directory, *args, state_dict=state_dict, **kwargs)


__all__ = ["DrafterSaving"]
