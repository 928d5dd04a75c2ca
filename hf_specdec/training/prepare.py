"""Prepare the teacher data: the target's own greedy answers and/or the target scoring existing assistant turns, per
token its top-K log-probs (and, for feature drafters, the hidden states they read, recorded by the scoring forward
itself), in resumable parts, cached on disk under a key of everything they depend on. On its own:

    python training/distill.py --prepare-only --drafter eagle --teacher-data generate --num-generate 1024
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import LogitsProcessor, LogitsProcessorList

from hf_specdec.speed.machine import cache_dir
from hf_specdec.errors import InputError

from .arguments import Args
from .checkpoints import write_atomically
from .data import DATA_FORMAT_VERSION, Source, TeacherData, make_record
from .states import PartStates, StatesFile, attach_target_features
from .sources import describe_skips, exclusion_file, load_examples, render, sharegpt_path
from .target import (cut_after_eos, eos_ids, greedy_generation_config, target_folder, target_id, teacher_dtype,
                     topk_logprobs)


class TopKRecorder(LogitsProcessor):
    """Keeps each decoding step's top-K ids and log-probs, taken where the logits are: K numbers per row and step, not
    the vocabulary-wide logits of every step that `output_logits` holds until the call ends (in a GPU batch of a
    thousand rows, 200 MB a step). Greedy decoding has no other processor, so it sees the raw logits."""

    def __init__(self, k: int):
        self.k, self.steps = k, []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        values, ids = scores.float().log_softmax(-1).topk(self.k, dim=-1)
        self.steps.append((ids.to(torch.int32), values.to(torch.float16)))
        return scores

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, steps, K] ids and log-probs, on the host."""
        return torch.stack([i for i, _ in self.steps], 1).cpu(), torch.stack([v for _, v in self.steps], 1).cpu()


@torch.no_grad()
def self_generate(target, tokenizer, prompts: list[list[int]], args: Args, source: Source, show: bool) -> tuple[list[dict], dict]:
    """The target answers each prompt greedily (batched, left padding); per new token its top-K log-probs."""
    pad, eos = tokenizer.pad_token_id, eos_ids(target, tokenizer)
    config = greedy_generation_config(target, args.max_new_tokens, pad)
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
        recorder = TopKRecorder(args.top_k)
        out = target.generate(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                              generation_config=config, logits_processor=LogitsProcessorList([recorder]))
        new = out[:, width:].cpu()
        top_ids, top_lps = recorder.result()
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
        states = StatesFile(features[1], rows[-1], target.config.get_text_config().hidden_size * len(features[0]))
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
                states.array[rows[i] : rows[i + 1]] = capture.hidden[row, : len(tokens)].half().cpu().numpy()
            targets += len(tokens) - start
            seen += len(tokens)
        bar.update(len(batch))
        bar.set_postfix(tok_s=f"{targets / (time.perf_counter() - t0):.0f}")
    bar.close()
    if features is not None:
        states.finish()
    return records, {"tokens": targets, "forward_tokens": seen, "seconds": time.perf_counter() - t0}


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
    so a larger set reuses the parts a smaller one made (a data curve grows across sittings). The prompts to answer
    are prefix-stable too, so without scoring (whose texts skip the answered prompts) it omits --num-generate."""
    source = sharegpt_path() if args.data == "sharegpt" else Path(args.data)
    grows = ("num_score",) if args.teacher_data != "generate" else ("num_score", "num_generate")
    exclusions = exclusion_file(args.exclude_ids)
    key = {
        "version": DATA_FORMAT_VERSION, "target": target_id(args), "target_files": file_fingerprint(Path(target_folder(args))),
        "quantization": args.target_quantization, **({"dtype": teacher_dtype(args)} if teacher_dtype(args) != "float32" else {}),
        "data": args.data, "data_files": file_fingerprint(source),
        "split": args.data_split, "exclusions": file_fingerprint(exclusions) if exclusions else None,
        **{k: getattr(args, k) for k in ("teacher_data", "num_generate", "num_score", "heldout_prompts", "max_prompt_tokens",
                                         "max_new_tokens", "max_seq_len", "top_k", "seed") if not (parts and k in grows)},
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
        held_records, _, _ = in_parts(  # (in a part too: a larger set made later answers them once)
            parts / f"held-{rank}", mine([p for _, p, _ in heldout]), args.prepare_part_size,
            lambda part, _: self_generate(target, tokenizer, part, args, Source.SELF_GENERATED, show))
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


def load_teacher_data(args: Args, accelerator, adapter, teacher, tokenizer, continue_from: str | None
                      ) -> tuple[TeacherData, TeacherData]:
    """The training and held-out sets the run reads: prepared (or found), with the `--extra-data` folders added, the
    states the drafter kind reads attached, and cut to `--max-train-tokens`."""
    features = adapter.feature_modules(teacher, continue_from) if adapter.reads_target_features else None
    train, heldout = prepare_data(args, accelerator, teacher, tokenizer, None if args.online_features else features)
    folders = [f for f in args.extra_data.split(",") if f]
    extra = [TeacherData.load(Path(f) / "train.safetensors") for f in folders]
    for part, folder in zip(extra, folders):
        part.meta = {**json.loads((Path(folder) / "meta.json").read_text()), "cache_folder": folder}
    if adapter.reads_target_features:  # the target's hidden states, cached beside each teacher-data folder
        with accelerator.main_process_first():
            for part in [heldout] if args.online_features else [train, heldout] + extra:
                name = "heldout" if part is heldout else "train"
                attach_target_features(teacher, part, Path(part.meta["cache_folder"]) / f"features-{name}-{features[1]}.npy",
                                       features[0], accelerator.is_main_process)
    if extra:
        meta = train.meta
        train = TeacherData.concat([train] + extra)
        train.meta = {**meta, "extra_data": args.extra_data}
    if args.max_train_tokens and not args.prepare_only:
        full = train
        train = full.subset(args.max_train_tokens, args.seed)
        train.meta = {**full.meta, "train_records": len(train), "train_target_tokens": int(train.t["tgt_off"][-1]),
                      "subset_of": {"records": len(full), "target_tokens": int(full.t["tgt_off"][-1])}}
    return train, heldout
