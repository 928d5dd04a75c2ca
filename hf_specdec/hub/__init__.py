"""Sharing drafters on the Hugging Face Hub: the `custom_generate/` bundle (`bundle.py`), model cards (`card.py`),
uploads (`push.py`). Every drafter's `save_pretrained` writes `custom_generate/` with `bundle.write_custom_generate`
(the drafter models import it by name, so that their bundled copies never do)."""

from .bundle import CUSTOM_GENERATE_DIR, bundle_sources, write_custom_generate
from .card import drafter_kind, hardware_description, render_model_card
from .push import files_to_upload, push_folder

__all__ = ["write_custom_generate", "bundle_sources", "render_model_card", "drafter_kind", "hardware_description",
           "files_to_upload", "push_folder", "CUSTOM_GENERATE_DIR"]
