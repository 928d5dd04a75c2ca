"""Uploading a drafter folder to the Hub in one commit, with the token huggingface_hub already knows (none written).

A push uploads an explicit list of what a drafter folder holds (weights, configs, tokenizer, card, `custom_generate/`,
the training run's summary and log), never symlinks, checkpoints or stray files, and deletes from the repo the files
an earlier push left that this folder no longer has. A folder whose training run has not finished (a training log but
no `training_summary.json`, which the trainer writes last) is refused.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

from huggingface_hub import HfApi, get_token
from huggingface_hub.utils import HFValidationError, validate_repo_id

from .bundle import CUSTOM_GENERATE_DIR
from ..errors import InputError, one_line

COMMIT_MESSAGE = "Upload hf_specdec drafter"


class PushError(InputError):
    """An upload that failed (network, token, Hub): one line on the command line, as the user's mistakes are."""


#: written last by training.distill: a run folder without it is unfinished
RUN_COMPLETE = "training_summary.json"
RUN_LOG = "training_log.jsonl"
#: what a drafter folder holds that a push uploads (top level)
UPLOADED = ("*.safetensors", "model.safetensors.index.json", "config.json", "generation_config.json", "README.md",
            "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
            "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json", RUN_COMPLETE, RUN_LOG)
UPLOADED_BUNDLE = ("*.py", "requirements.txt")  # in custom_generate/


def files_to_upload(folder) -> list[str]:
    """What a push uploads from `folder`, as posix paths relative to it (plain files only, no symlinks)."""
    folder = Path(folder)
    chosen = [p for p in folder.iterdir() if any(fnmatch.fnmatch(p.name, pattern) for pattern in UPLOADED)]
    bundle = folder / CUSTOM_GENERATE_DIR
    if bundle.is_dir() and not bundle.is_symlink():
        chosen += [p for p in bundle.iterdir() if any(fnmatch.fnmatch(p.name, pattern) for pattern in UPLOADED_BUNDLE)]
    return sorted(p.relative_to(folder).as_posix() for p in chosen if p.is_file() and not p.is_symlink())


def check_pushable(folder, repo_id: str) -> Path:
    """Raise `InputError` (naming the fix) unless `folder` is a finished drafter folder and `repo_id` a valid id."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: no such folder; pass a drafter folder (written by save_pretrained or training.distill).")
    config = folder / "config.json"
    if not config.is_file():
        raise InputError(f"{folder} holds no config.json: pass a folder written by `save_pretrained` or training.distill.")
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise InputError(f"{config}: not a readable JSON config ({error}); save the drafter again.") from None
    if (folder / RUN_LOG).is_file() and not (folder / RUN_COMPLETE).is_file():
        raise InputError(f"{folder} holds a training run that has not finished (no {RUN_COMPLETE}): let it finish, "
                         "or continue it with --resume, before pushing.")
    if not any(name.endswith(".safetensors") for name in files_to_upload(folder)):
        raise InputError(f"{folder} holds no weights (*.safetensors); save the drafter with save_pretrained first.")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise InputError(f"--repo-id {repo_id!r} is not a Hub repo id ({str(error).splitlines()[0]}); use 'owner/name'.") from None
    return folder


def push_folder(folder, repo_id: str, *, private: bool = False, api: HfApi | None = None,
                commit_message: str = COMMIT_MESSAGE) -> str:
    """Upload a drafter folder in one commit; returns the repo URL.

    Uses the token huggingface_hub already knows (HF_TOKEN or `hf auth login`) and never writes one.
    """
    folder = check_pushable(folder, repo_id)
    api = api or HfApi()
    if api.token is None and get_token() is None:
        raise InputError("No Hugging Face token: run `hf auth login` (or set HF_TOKEN) and push again.")
    try:
        url = api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=str(folder),
                          allow_patterns=files_to_upload(folder), delete_patterns=["*"],  # stale files of earlier pushes
                          commit_message=commit_message)
    except Exception as error:  # the network, the token, the Hub: whatever failed, the push is one commit or none
        raise PushError(f"Could not push {folder} to {repo_id} ({type(error).__name__}: {one_line(error)[:300]}). "
                        "Check the network and the token (`hf auth login` or HF_TOKEN), then push again: a push is "
                        "one commit, so nothing was half uploaded.") from error
    return str(url)


__all__ = ["push_folder", "files_to_upload", "check_pushable", "COMMIT_MESSAGE", "RUN_COMPLETE", "UPLOADED"]
