"""Sharing drafters on the Hugging Face Hub: the `custom_generate/` bundle (`bundle.py`), model cards (`card.py`),
uploads (`push.py`). Importing this package registers the save hook that writes `custom_generate/` into every saved
drafter folder (the drafter models themselves never import it)."""

from ..models.saving import register_save_hook
from .bundle import CUSTOM_GENERATE_DIR, bundle_sources, write_custom_generate
from .card import drafter_kind, hardware_description, render_model_card
from .push import files_to_upload, push_folder

register_save_hook(write_custom_generate)

__all__ = ["write_custom_generate", "bundle_sources", "render_model_card", "drafter_kind", "hardware_description",
           "files_to_upload", "push_folder", "CUSTOM_GENERATE_DIR"]
