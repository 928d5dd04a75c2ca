"""Drafters that ship inside the package for the default target (SmolLM2-135M-Instruct).

Each lives in `hf_specdec/shipped_drafters/<name>/` as a `save_pretrained` folder, trained with `training/distill.py`
(the exact command is in its model card and in BENCHMARKS.md). `AutoDrafter.from_pretrained("<name>")` loads one.
Its model card (`README.md`, in the checkout a link to `model_cards/<name>.md`) is rendered from the measurements its
config.json keeps (`hf_specdec.hub.card.write_shipped_cards()` writes them again after a measurement changes).
"""

from __future__ import annotations

import json
from pathlib import Path

SHIPPED_DIR = Path(__file__).resolve().parents[1] / "shipped_drafters"


def shipped_drafter_names() -> list[str]:
    if not SHIPPED_DIR.is_dir():
        return []
    return sorted(p.name for p in SHIPPED_DIR.iterdir() if (p / "config.json").exists())


def shipped_folder(name: str) -> Path | None:
    """The folder of the shipped drafter `name`, or None."""
    return SHIPPED_DIR / name if name in shipped_drafter_names() else None



def shipped_default(sampling: bool = False) -> str | None:
    """The assistant name measured fastest for the default target, greedy or `sampling` (`shipped_drafters/
    default.json` says why), or None where the shipped drafters are absent."""
    path = SHIPPED_DIR / "default.json"
    return json.loads(path.read_text())["sampling" if sampling else "greedy"] if path.is_file() else None
