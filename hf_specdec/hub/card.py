"""Model cards of drafters: a `huggingface_hub.ModelCard` from the template (`model_cards/template.md` in the checkout,
`hub/templates/drafter.md` in the package), with Hub metadata (library, base model = the target, tags with the drafter
kind, datasets, license), the measured acceptance and speed, usage, training and limits."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch
from huggingface_hub import ModelCard, ModelCardData
from huggingface_hub.utils import HFValidationError, validate_repo_id

from .. import default_model
from ..default_model import DEFAULT_TARGET_NAME
from ..registry import drafter_config, kind_of
from ..models.borrowed import BorrowsFromTarget
from ..assistants.shipped import shipped_drafter_names, shipped_folder
from .bundle import CUSTOM_GENERATE_DIR

TEMPLATE = Path(__file__).resolve().parent / "templates" / "drafter.md"
DEFAULT_TARGET_HUB_ID = f"HuggingFaceTB/{DEFAULT_TARGET_NAME}"


QUANTIZATION_CODE = {
    "8bit": "BitsAndBytesConfig(load_in_8bit=True)",
    "4bit": 'BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)',
}


def drafter_kind(config) -> str:
    """The Hub tag of a drafter's kind: its registered name (`registry.py`), e.g. 'draft-model'."""
    kind = kind_of(config)
    return kind.hub_tag if kind is not None else "draft-model"


def is_hub_id(name: str | None) -> bool:
    """A valid Hub repo id ("owner/name") rather than a local folder (what a card may name as its base model)."""
    if not name or not default_model.is_hub_id(name):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def hardware_description() -> str:
    """This machine, for the results table (the card is written where the evaluation ran)."""
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__})"
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads (torch {torch.__version__})"


def render_model_card(folder, config, *, repo_id: str | None = None, target: str | None = None,
                      datasets: list[str] | None = None, license: str = "apache-2.0", hardware: str | None = None,
                      template_path=None) -> ModelCard:
    """The model card of the drafter saved in `folder` (save it as `folder/README.md`).

    target: the target's Hub id or folder (default: `config.target_name_or_path`); a Hub id becomes `base_model`.
    datasets: the Hub ids of the training data (default: `config.training["datasets"]`).
    hardware: where the figures in `config.measured` were measured (default: `measured["hardware"]`, else
    "not recorded").
    """
    folder = Path(folder)
    template_path = Path(template_path or TEMPLATE)
    if not template_path.exists():
        raise FileNotFoundError(f"No model card template at {template_path}: pass template_path= (hf_specdec ships "
                                "its own in hf_specdec/hub/templates/).")
    target_id = target or getattr(config, "target_name_or_path", None) or "TARGET"
    kind = drafter_kind(config)
    registered = kind_of(config)
    training = getattr(config, "training", None) or {}
    measured = getattr(config, "measured", None) or {}
    has_custom_generate = (folder / CUSTOM_GENERATE_DIR / "generate.py").exists()
    tags = ["speculative-decoding", kind, *(["distillation"] if training else []), "hf-specdec",
            *(["custom_generate"] if has_custom_generate else [])]
    quantization = getattr(config, "target_quantization", None) or "none"
    datasets = datasets if datasets is not None else training.get("datasets")
    card_data = ModelCardData(library_name="hf-specdec", base_model=target_id if is_hub_id(target_id) else None,
                              license=license, datasets=datasets or None, tags=tags, pipeline_tag="text-generation")
    return ModelCard.from_template(
        card_data,
        template_path=str(template_path),
        repo_id=repo_id or folder.name,
        target_id=target_id,
        target_is_default=target_id == DEFAULT_TARGET_HUB_ID,
        kind=kind,
        borrows_target=registered is not None and issubclass(registered.model_class, BorrowsFromTarget),
        has_custom_generate=has_custom_generate,
        quantization=quantization,
        quantization_code=QUANTIZATION_CODE.get(quantization, "None"),
        hardware=hardware or measured.get("hardware") or "not recorded",
        config=config,
        measured=measured,
        # a drafter with heads proposes at most one token per head
        num_draft_tokens=measured.get("num_draft_tokens") or getattr(config, "num_heads", None) or 5,
        training=training,
        benchmarks=getattr(config, "benchmarks", None) or [],
        size_mb=round(sum(p.stat().st_size for p in folder.glob("*.safetensors")) / 2**20, 2),
    )


def shipped_card(name: str) -> str:
    """The model card of the drafter shipped as `name` (`hf_specdec/shipped_drafters/`), rendered from its saved config
    alone: its measurements, its benchmark rows, its training command."""
    folder = shipped_folder(name)
    return str(render_model_card(folder, drafter_config(folder), repo_id=name)) + "\n"


def write_shipped_cards() -> list[Path]:
    """Render every shipped drafter's card into its folder's README.md (in a checkout, `model_cards/<name>.md`), after
    its measurements change."""
    written = []
    for name in shipped_drafter_names():
        card = shipped_folder(name) / "README.md"
        card.write_text(shipped_card(name))
        written.append(card.resolve())
    return written


__all__ = ["render_model_card", "shipped_card", "write_shipped_cards", "drafter_kind", "hardware_description", "is_hub_id", "DEFAULT_TARGET_HUB_ID"]
