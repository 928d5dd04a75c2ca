"""`AutoDrafter.from_pretrained(name, target=None)`: load any drafter the project makes, by reading its config.

    drafter = hf_specdec.AutoDrafter.from_pretrained("someone/smollm2-drafter", target=target)
    drafter = hf_specdec.AutoDrafter.from_pretrained("distilled", target=target)   # shipped for the default target
    target.generate(**inputs, custom_generate=hf_specdec.speculative_generate, assistant=drafter)

`name` is a shipped drafter's name, a folder or a Hub id. The config's kind (see `registry.py`) says which class loads
it; with `target` the drafter is moved to the target's device and bound to it (drafters that borrow the target's
embeddings or LM head).

This module is also bundled into every saved drafter's `custom_generate/` folder (see `hf_specdec.hub`), where it
runs without hf_specdec installed: it imports only transformers and its sibling modules.
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedConfig

from ..default_model import is_hub_id
from ..models.borrowed import bind_if_borrowing
from ..registry import kind_of, loading_kinds, published_reader
from .grammar import UnknownDrafterError, known_names
from .shipped import shipped_folder

#: from_pretrained arguments that say WHERE to read (Hub revision, token, cache): the config is read the same way
HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "force_download", "proxies", "subfolder")


class AutoDrafter:
    """Loads a drafter folder, Hub repo or shipped drafter of any registered kind; not instantiable itself."""

    def __init__(self):
        raise OSError("AutoDrafter is not instantiable: use `AutoDrafter.from_pretrained(name, target=...)`.")

    @classmethod
    def from_pretrained(cls, name, target=None, **kwargs):
        """The drafter `name` in eval mode; with `target`, moved to its device and bound to it. Extra kwargs go to the
        kind's `from_pretrained`."""
        source = str(name)
        if shipped_folder(source) is not None:  # (a shipped name wins over a folder of that name: "./<name>" is the folder)
            source = str(shipped_folder(source))
        elif not (Path(source).exists() or is_hub_id(source)):
            raise UnknownDrafterError(f"Unknown drafter {source!r}: not a folder, a shipped drafter or a Hub id "
                                      f"('owner/name'). Known: {known_names()}.")
        try:
            config, _ = PreTrainedConfig.get_config_dict(source, **{k: kwargs[k] for k in HUB_KWARGS if k in kwargs})
        except OSError as error:
            raise UnknownDrafterError(f"Could not read the drafter {source!r} ({str(error).splitlines()[0]}). "
                                      f"Known names: {known_names()}.") from error
        kind = kind_of(config)
        read_published = published_reader()  # (None in a custom_generate/ copy: it loads its own folder's drafter)
        if read_published is not None and (kind is None or kind.config_class is None):  # (a published layout may
            hub = {k: kwargs[k] for k in HUB_KWARGS if k in kwargs}                       # say "llama": asked first)
            model = read_published(source, config, target, dtype=kwargs.get("dtype"), **hub)
            if model is not None:
                return model
        if kind is None:
            kinds = "; ".join(f"{k.name}: {k.description}" + (f" (model_type {k.config_class.model_type!r})"
                                                               if k.config_class is not None else "")
                              for k in loading_kinds())
            raise ValueError(f"{source!r} holds a model of type {config.get('model_type')!r}, which is not a drafter. "
                             f"AutoDrafter loads these kinds: {kinds}.")
        model = kind.model_class.from_pretrained(source, **kwargs).eval()
        if target is not None:
            model.to(target.device)
            bind_if_borrowing(model, target)
        return model


__all__ = ["AutoDrafter", "HUB_KWARGS"]
