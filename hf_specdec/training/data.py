"""Teacher data on disk and in batches: records (tokens, where the answer starts, the target's top-K ids and log-probs
at every answer token, where the text came from) in flat tensors, one safetensors file per set, with the target states
a feature drafter reads beside it as a memory-mapped .npy; and the shuffled, length-grouped batches the training loop
reads. `prepare.py` makes the sets."""

from __future__ import annotations

import enum
import json
import os
from pathlib import Path

import numpy
import torch

DATA_FORMAT_VERSION = 1


class Source(enum.IntEnum):
    """Where a record's text came from (kept per record, as int8, in the teacher data)."""

    SELF_GENERATED = 0  # the target's own greedy answer
    SCORED = 1  # an existing answer (ShareGPT's), scored teacher-forced by the target
    ON_POLICY = 2  # the drafter's own continuation, scored by the target during training


def make_record(tokens, start: int, ids, lps, source: Source) -> dict:
    return {"tokens": torch.as_tensor(tokens, dtype=torch.int32), "start": start, "ids": ids, "lps": lps,
            "source": int(source)}  # a plain int: parts are read with weights_only=True


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
    if "features" in records[0]:  # feature kinds: the target's states at every position, right-padded with zeros
        feats = torch.zeros(len(records), width, records[0]["features"].shape[-1])
        for row, r in enumerate(records):
            feats[row, : len(r["tokens"])] = r["features"].float()
        batch["features"] = feats
    return batch
