"""The target states a feature drafter reads, on disk: [tokens, width] fp16 memory maps beside the teacher data
(bounded by disk, not RAM: a wide target's states do not fit in memory), written by one writer (`StatesFile`) whether
the scoring forward records them, a separate pass computes them, or the parts' files are merged into a set's."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import numpy
import torch
from tqdm.auto import tqdm

from hf_specdec.cache.hidden import HiddenCapture

from .checkpoints import write_atomically
from .data import TeacherData


class StatesFile:
    """A [rows, width] fp16 .npy written through a memory map under NAME.partial, renamed to NAME when `finish`ed:
    a file under the real name is always complete."""

    def __init__(self, path: Path, rows: int, width: int, resume: bool = False):
        self.path, self.partial = path, self.partial_path(path)
        self.array = numpy.lib.format.open_memmap(self.partial, mode="r+" if resume else "w+", dtype=numpy.float16,
                                                  shape=(rows, width))

    @staticmethod
    def partial_path(path: Path) -> Path:
        return path.with_name(path.name + ".partial")

    def flush(self) -> None:
        self.array.flush()

    def finish(self) -> None:
        self.array.flush()
        del self.array
        os.replace(self.partial, self.path)


@torch.no_grad()
def target_states(target, input_ids: torch.Tensor, modules) -> torch.Tensor:
    """The outputs of the target `modules` at every position of a right-padded batch, [B, L, H * n] (--online-features:
    what `attach_target_features` stores, computed where the batch is instead)."""
    capture = HiddenCapture(modules)
    with capture.recording():
        target(input_ids=input_ids, use_cache=False, logits_to_keep=1)  # right padding: no mask needed
    return capture.hidden.float()


@torch.no_grad()
def attach_target_features(target, data: TeacherData, path: Path, modules, show: bool, tokens_per_batch: int = 4096,
                           flush_every: int = 32) -> None:
    """The outputs of the target `modules` (the hidden states a feature drafter reads: the final norm's, or the layers
    a drafter fuses, concatenated) at every token of every record, fp16, written once beside the teacher data
    as a memory-mapped .npy (bounded by disk, not RAM; a wide target's states do not fit in memory). The pass saves
    its progress every `flush_every` batches: a killed run continues where it stopped."""
    if not path.exists():
        lengths, offsets = data.lengths().tolist(), data.t["tok_off"].tolist()
        width = target.config.get_text_config().hidden_size * len(modules)
        progress = path.with_name(path.name + ".progress")
        order = sorted(range(len(data)), key=lambda i: lengths[i])
        partial = StatesFile.partial_path(path)
        done = json.loads(progress.read_text())["records"] if progress.exists() and partial.exists() else 0
        features = StatesFile(path, offsets[-1], width, resume=bool(done))
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
                features.array[offsets[j] : offsets[j + 1]] = hidden[row, : lengths[j]]
            i, batches = i + len(batch), batches + 1
            if batches % flush_every == 0 or i == len(order):
                features.flush()
                write_atomically(progress, json.dumps({"records": i}))
            bar.update(sum(lengths[j] for j in batch))
        bar.close()
        features.finish()
        progress.unlink(missing_ok=True)
    data.features = numpy.load(path, mmap_mode="r")


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
        out, row = StatesFile(path, sum(lengths), width), 0
        for (name, first), n in zip(where, lengths):
            out.array[row : row + n] = sources[name][first : first + n]
            row += n
        out.finish()
