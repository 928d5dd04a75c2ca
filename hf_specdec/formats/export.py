"""`export_drafter`: write a drafter in the layout a serving engine loads, by its kind's registered exporter.

    hf-specdec export runs/drafter --format vllm-draft --target default --out runs/drafter-vllm

Each kind's exporter (`hf_specdec/kinds/<kind>/formats.py`) writes its layout and says how to serve it; what they share
is `serving.py`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from ..assistants.auto_drafter import AutoDrafter
from ..registry import export_formats, kind_of, kind_of_folder, resolved as exporter
from ..assistants.shipped import shipped_folder
from ..errors import InputError
from .serving import TOKENIZER_FILES


def check_exportable(drafter_path, format: str, config=None) -> None:
    """Raise `InputError` (naming the fix) when `format` is unknown or cannot hold the drafter's kind; reads only
    config.json (a local folder or shipped drafter; a Hub id is checked when it loads)."""
    formats = export_formats()
    if format not in formats:
        raise InputError(f"Unknown export format {format!r}; choose one of {sorted(formats)}.")
    if config is None:
        folder = Path(drafter_path) if Path(drafter_path).exists() else shipped_folder(str(drafter_path))
        if folder is None:
            return
        if not (Path(folder) / "config.json").is_file():
            raise InputError(f"{drafter_path} holds no config.json: pass a drafter folder (written by save_pretrained or "
                             "training.distill), a shipped drafter's name or a Hub id.")
        kind = kind_of_folder(folder, json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")))
    else:
        kind = kind_of(config)
    if kind is None:
        raise InputError(f"{drafter_path} is not a drafter of any kind hf_specdec knows; pass a drafter folder.")
    if not kind.exporters:
        raise InputError(f"{drafter_path} is already a standalone model ({kind.description}): serve the folder as it is.")
    if format not in kind.exporters:
        right = ", ".join(f"--format {name}" for name in kind.exporters)
        raise InputError(f"{drafter_path} is {kind.description}, which {format} cannot hold: export it with {right}.")


def export_drafter(drafter_path, target, out, format: str) -> Path:
    """Write the drafter at `drafter_path` (folder, Hub id or shipped name) for a serving engine into `out`."""
    check_exportable(drafter_path, format)
    drafter = AutoDrafter.from_pretrained(drafter_path, target=target, dtype=torch.float32)
    check_exportable(drafter_path, format, config=drafter.config)
    kind = kind_of(drafter.config)
    out = Path(out)
    dtype = getattr(torch, getattr(drafter.config, "save_dtype", None) or "float32")
    exporter(kind.exporters[format])(drafter, target, out, dtype)
    for name in TOKENIZER_FILES:  # engines load the draft's tokenizer from its folder when given one
        if Path(drafter_path, name).is_file():
            shutil.copy2(Path(drafter_path, name), out / name)
    return out


__all__ = ["export_drafter", "check_exportable", "exporter"]
