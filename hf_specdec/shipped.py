"""Drafters that ship inside the package for the default target (SmolLM2-135M-Instruct).

Each lives in `hf_specdec/shipped_drafters/<name>/` as a `save_pretrained` folder; none exists until it is trained with
`training/distill.py` (the exact command is recorded in its model card and in BENCHMARKS.md).
"""

from __future__ import annotations

from pathlib import Path

SHIPPED_DIR = Path(__file__).parent / "shipped_drafters"


def shipped_drafter_names() -> list[str]:
    if not SHIPPED_DIR.is_dir():
        return []
    return sorted(p.name for p in SHIPPED_DIR.iterdir() if (p / "config.json").exists())


def load_shipped_drafter(name: str, target):
    folder = SHIPPED_DIR / name
    if not (folder / "config.json").exists():
        raise ValueError(f"No shipped drafter named {name!r}; available: {shipped_drafter_names() or 'none'}.")
    from .auto_drafter import AutoDrafter

    return AutoDrafter.from_pretrained(folder, target=target)
