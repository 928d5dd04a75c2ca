"""`export_drafter`: write a drafter in the layout a serving engine loads, by its kind's registered exporter.

    hf-specdec export runs/drafter --format vllm-draft --target default --out runs/drafter-vllm

The layouts themselves, and how to serve each, are in `hf_specdec/serving.py`.
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import torch

from .auto_drafter import AutoDrafter
from .kinds import export_formats, kind_of
from .serving import TOKENIZER_FILES


def export_drafter(drafter_path, target, out, format: str) -> Path:
    """Write the drafter at `drafter_path` (folder, Hub id or shipped name) for a serving engine into `out`."""
    formats = export_formats()
    if format not in formats:
        raise ValueError(f"Unknown export format {format!r}; choose one of {sorted(formats)}.")
    drafter = AutoDrafter.from_pretrained(drafter_path, target=target, dtype=torch.float32)
    kind = kind_of(drafter.config)
    if kind is None or not kind.exporters:
        raise ValueError(f"{drafter_path} is already a standalone {type(drafter).__name__}: serve the folder as it is.")
    if format not in kind.exporters:
        right = ", ".join(f"--format {name}" for name in kind.exporters)
        raise ValueError(f"{drafter_path} is {kind.description}: export it with {right}.")
    out = Path(out)
    dtype = getattr(torch, getattr(drafter.config, "save_dtype", None) or "float32")
    exporter(kind.exporters[format])(drafter, target, out, dtype)
    for name in TOKENIZER_FILES:  # engines load the draft's tokenizer from its folder when given one
        if Path(drafter_path, name).is_file():
            shutil.copy2(Path(drafter_path, name), out / name)
    return out


def exporter(spec):
    """A registered exporter: the callable itself, or the one its "module:name" names."""
    if callable(spec):
        return spec
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


__all__ = ["export_drafter", "exporter"]
