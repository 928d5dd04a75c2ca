"""Uploading a drafter folder to the Hub in one commit, with the token huggingface_hub already knows (none written)."""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import HfApi
from huggingface_hub.utils import validate_repo_id

from .bundle import CUSTOM_GENERATE_DIR

COMMIT_MESSAGE = "Upload hf_specdec drafter"


def files_to_upload(folder) -> list[str]:
    """What a push uploads: the folder's files and its custom_generate/ (never checkpoints/, hidden files, caches)."""
    folder = Path(folder)
    files = [p for p in folder.iterdir() if p.is_file()]
    if (folder / CUSTOM_GENERATE_DIR).is_dir():
        files += [p for p in (folder / CUSTOM_GENERATE_DIR).iterdir() if p.is_file() and p.suffix != ".pyc"]
    return sorted(p.relative_to(folder).as_posix() for p in files if not p.name.startswith("."))


def push_folder(folder, repo_id: str, *, private: bool = False, api: HfApi | None = None,
                commit_message: str = COMMIT_MESSAGE) -> str:
    """Upload a drafter folder in one commit; returns the repo URL.

    Uses the token huggingface_hub already knows (HF_TOKEN or `hf auth login`) and never writes one.
    """
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} holds no config.json: pass a folder written by `save_pretrained` or distill.py.")
    validate_repo_id(repo_id)  # a clear error before any request
    api = api or HfApi()
    url = api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=True)
    api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=str(folder),
                      allow_patterns=files_to_upload(folder), commit_message=commit_message)
    return str(url)


__all__ = ["push_folder", "files_to_upload", "COMMIT_MESSAGE"]
