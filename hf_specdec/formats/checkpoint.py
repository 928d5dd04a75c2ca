"""A checkpoint folder or Hub repo as the published-format readers see it: its config.json, its file names, the names
of its tensors and the tensors themselves, read only from safetensors or, for pickled files, with
`torch.load(weights_only=True)`: no code from a checkpoint ever runs."""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

import torch

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


class Checkpoint:
    """`source`: a local folder or a Hub id; `hub`: where to read it on the Hub (revision, token, cache_dir, ...)."""

    def __init__(self, source, config: dict | None = None, **hub):
        self.source, self.hub = str(source), hub
        self.local = Path(self.source).is_dir()
        if config is not None:
            self.__dict__["config"] = config

    @cached_property
    def config(self) -> dict:
        return json.loads(self.path("config.json").read_text(encoding="utf-8"))

    def has(self, name: str) -> bool:
        """Whether the checkpoint holds this file (on the Hub: fetched into its cache, as loading would)."""
        if self.local:
            return (Path(self.source) / name).is_file()
        if name not in self._found:
            from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

            try:
                self._found[name] = self.path(name)
            except (EntryNotFoundError, LocalEntryNotFoundError):
                self._found[name] = None
        return self._found[name] is not None

    @cached_property
    def _found(self) -> dict:
        return {}

    def path(self, name: str) -> Path:
        """The local path of one file (downloaded from the Hub once, into its cache)."""
        if self.local:
            return Path(self.source) / name
        if self._found.get(name) is not None:
            return self._found[name]
        from huggingface_hub import hf_hub_download

        hub = {k: self.hub[k] for k in ("revision", "token", "cache_dir", "local_files_only", "force_download",
                                         "proxies", "subfolder") if k in self.hub}
        return Path(hf_hub_download(self.source, name, **hub))

    def weight_files(self, names=WEIGHT_FILES) -> list[str]:
        """The files holding the weights: the first of `names` present (an index's shards included)."""
        found = next((name for name in names if self.has(name)), None)
        if found is None:
            return []
        if found.endswith(".index.json"):
            index = json.loads(self.path(found).read_text(encoding="utf-8"))
            return sorted(set(index["weight_map"].values()))
        return [found]

    def tensor_names(self, names=WEIGHT_FILES) -> set[str]:
        keys = set()
        for name in self.weight_files(names):
            keys |= set(_open(self.path(name)).keys())
        return keys

    def tensors(self, names=WEIGHT_FILES, prefix: str = "") -> dict[str, torch.Tensor]:
        """The tensors whose names start with `prefix` (the prefix removed): a full model's checkpoint is read only as
        far as those go when its files are safetensors."""
        out = {}
        for name in self.weight_files(names):
            opened = _open(self.path(name))
            out.update({key[len(prefix):]: opened.get_tensor(key) for key in opened.keys() if key.startswith(prefix)})
        return out


class _Pickled:
    """A pickled state dict read as safetensors' `safe_open` reads a file (loaded with weights_only=True)."""

    def __init__(self, path: Path):
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise ValueError(f"{path} holds no state dict of tensors.")
        self.state = state

    def keys(self):
        return self.state.keys()

    def get_tensor(self, key):
        return self.state[key]


def _open(path: Path):
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        return safe_open(str(path), framework="pt")
    return _Pickled(path)


__all__ = ["Checkpoint", "WEIGHT_FILES"]
