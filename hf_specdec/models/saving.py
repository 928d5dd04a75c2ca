"""Saving a drafter model: its own weights only, in `config.save_dtype`, and whatever the save hooks add.

`hf_specdec.hub` registers a hook that writes the `custom_generate/` folder into every saved drafter, so that these
model classes never import the Hub code (the bundled copy of this module, inside a `custom_generate/` folder, has no
hook and writes none).
"""

from __future__ import annotations

from typing import Callable

import torch

#: called with the folder after a drafter's save_pretrained has written it (main process only)
SAVE_HOOKS: list[Callable] = []


def register_save_hook(hook: Callable) -> None:
    if hook not in SAVE_HOOKS:
        SAVE_HOOKS.append(hook)


class DrafterSaving:
    """`save_pretrained` for drafter models: their own weights only, in `config.save_dtype`, then the save hooks."""

    def save_pretrained(self, save_directory, *args, state_dict=None, **kwargs):
        if state_dict is None and self.config.save_dtype:
            dtype = getattr(torch, self.config.save_dtype)
            state_dict = {k: v.to(dtype) if v.is_floating_point() else v for k, v in self.state_dict().items()}
        if args[0] if args else kwargs.get("is_main_process", True):
            for hook in SAVE_HOOKS:  # first, so that `push_to_hub=True` uploads what they write too
                hook(save_directory)
        return super().save_pretrained(save_directory, *args, state_dict=state_dict, **kwargs)


__all__ = ["DrafterSaving", "register_save_hook", "SAVE_HOOKS"]
