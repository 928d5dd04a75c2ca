"""What a verification forward costs on this machine, measured once per target and batch size before a call decodes,
so that a draft-length policy can decide from the run's own outcomes alone (`CalibratedDraftLength`): a seed then
reproduces its sample, which lengths timed during the call would not let it.

A calibration times the target's forward of n new tokens per row (n = 1 ... the widths a step can verify) on a scratch
cache of `CONTEXT` tokens, through the same CPU matmul path the loop verifies with: `ROUNDS` rounds over every width,
interleaved (a round visits each width once, in alternating order), keeping each width's fastest sample (noise on a
shared machine only ever adds time). A burst of load then inflates a few samples of several widths, not every sample of
one width, and the widths keep their true shape, which is all the policy compares (a steady load slows every width
alike). The result is kept for the process and in the cache folder (`costs_file()`: per CPU or GPU model, torch
version, thread count, the target's shape and dtype), stamped with when and under what load average it was measured,
so that later processes on the same machine decide alike without measuring again; the first process that reads it
re-checks it cheaply (the widest width against one token, a few interleaved forwards) and measures again if its shape
has moved by more than `RECHECK` (calibrated under a load the figures do not show, or another machine behind the same
name). `hf-specdec calibrate` measures again on demand; `forget()` drops what this process holds.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import weakref
from pathlib import Path

import torch
from transformers import DynamicCache

from ..cache.keyword import cache_keyword
from ..speed.cpu_matmul import routed, verifying
from ..speed.machine import cache_dir, cpu_name, stamp, write_cache_file

CONTEXT = 64  # scratch tokens in the cache while timing: a short chat turn's worth
ROUNDS = 5  # timed forwards per width, interleaved across widths, after one untimed (a width's first forward may
#   choose its matmul paths)
RECHECK = 1.3  # a kept calibration whose widest-to-one-token ratio is off by more than this factor is measured again
RECHECK_ABOVE = 2e-3  # ... when a one-token forward takes at least this long (below, timer noise decides ratios)

_KEPT: dict[str, dict[int, float]] = {}  # machine-and-target key -> {tokens per row: seconds}
_SHAPES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> the hash of its class, config and dtype
_LOCK = threading.Lock()


def verify_seconds(model, batch_size: int, widths: int, fast_cpu_verify: bool = True) -> dict[int, float]:
    """Seconds of the target's forward of n tokens per row at `batch_size` rows, for n = 1 ... `widths` (every width
    up to 9, then a sparser grid up to `widths`: the policy interpolates between them); measured the first time
    they are asked for on this machine, then read back."""
    fast = fast_cpu_verify and model.device.type == "cpu"
    key = _key(model, batch_size, fast)
    grid = _grid(widths)
    with _LOCK:
        known = _KEPT.get(key)
        if known is None:
            known = _KEPT[key] = _read(key)
            if known and not _still_true(model, batch_size, known, fast):
                known.clear()  # (measured again below, every width)
        missing = [n for n in grid if n not in known]
        if missing:
            known.update(_measure(model, batch_size, missing, fast))
            _write(key, known)
        return {n: known[n] for n in grid}


def _still_true(model, batch_size: int, known: dict[int, float], fast: bool) -> bool:
    """Whether a kept calibration's shape holds on this machine now: one token against its widest width, timed
    interleaved (a load that slows both alike leaves the ratio alone)."""
    widest = max(known)
    if widest == 1 or known[1] < RECHECK_ABOVE:
        return True
    now = _measure(model, batch_size, [1, widest], fast, rounds=3)
    ratio = (now[widest] / now[1]) / (known[widest] / known[1])
    return 1 / RECHECK <= ratio <= RECHECK


def _grid(widths: int) -> list[int]:
    """1 ... 9, then four widths per doubling (10, 12, 14, 16, 20, 24, ...), and `widths` itself."""
    return [n for n in range(1, widths + 1) if n <= 9 or n == widths or n % (2 ** ((n - 1).bit_length() - 3)) == 0]


@torch.no_grad()
def _measure(model, batch_size: int, widths: list[int], fast: bool, rounds: int = ROUNDS) -> dict[int, float]:
    vocab = model.get_output_embeddings().weight.shape[0] if model.get_output_embeddings() is not None else 100
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (batch_size, CONTEXT + max(widths)), generator=generator).to(model.device)
    keyword = cache_keyword(model) or "cache"
    keep_logits = model._supports_logits_to_keep()  # (the verification forward asks for its n logits only)
    cuda = model.device.type == "cuda"
    samples = {n: [] for n in widths}
    with routed(model, fast), verifying(fast), torch.inference_mode():
        cache = DynamicCache(config=model.config)
        cache.activate_past_recording()  # (so that a sliding-window layer can be cropped back too)
        model(input_ids=ids[:, :CONTEXT], use_cache=True, **{keyword: cache})

        def forward(n: int) -> float:
            block = ids[:, CONTEXT : CONTEXT + n]
            positions = torch.arange(CONTEXT, CONTEXT + n, device=model.device)[None].expand(batch_size, -1)
            if cuda:
                torch.cuda.synchronize(model.device)
            start = time.perf_counter()
            model(input_ids=block, position_ids=positions, use_cache=True, **{keyword: cache},
                  **({"logits_to_keep": n} if keep_logits else {}))
            if cuda:
                torch.cuda.synchronize(model.device)
            seconds = time.perf_counter() - start
            cache.crop(-n)
            return seconds

        for n in widths:  # untimed: a width's first forward may choose its matmul paths
            forward(n)
        for round in range(rounds):
            for n in widths if round % 2 == 0 else widths[::-1]:
                samples[n].append(forward(n))
    return {n: min(times) for n, times in samples.items()}


def _key(model, batch_size: int, fast: bool) -> str:
    shape = _SHAPES.get(model)
    if shape is None:  # (once per model: every call asks)
        config = model.config.to_json_string(use_diff=False)
        shape = _SHAPES[model] = hashlib.sha256(f"{type(model).__name__}|{config}|{model.dtype}".encode()).hexdigest()[:16]
    device = torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else cpu_name()
    return re.sub(r"[^A-Za-z0-9.+|=-]+", "_", f"{device}|torch{torch.__version__}|threads={torch.get_num_threads()}|"
                  f"fast={fast}|{shape}|batch={batch_size}")


def costs_file() -> Path:
    return cache_dir() / "step_costs.json"


def _read(key: str) -> dict[int, float]:
    try:
        saved = json.loads(costs_file().read_text()).get(key, {})
        saved = saved.get("seconds", {}) if "seconds" in saved else saved  # (files before stamps: the figures alone)
        return {int(n): float(s) for n, s in saved.items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _write(key: str, seconds: dict[int, float]) -> None:
    path = costs_file()
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = {}
    saved[key] = {"seconds": {str(n): s for n, s in sorted(seconds.items())}, "measured": {**stamp(), "rounds": ROUNDS}}
    write_cache_file(path, json.dumps(saved, indent=0))  # (a read-only folder: this process keeps its own figures)


def forget_saved(model=None) -> int:
    """Drop this machine's saved calibrations (of `model`'s shape only, if given) from the cache folder and from this
    process; returns how many were dropped (`hf-specdec calibrate` measures them again)."""
    forget()
    path = costs_file()
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0
    machine = re.sub(r"[^A-Za-z0-9.+|=-]+", "_", cpu_name())
    shape = None if model is None else _key(model, 1, False).split("|")[4]
    dropped = [key for key in saved if key.startswith(machine) and (shape is None or f"|{shape}|" in f"|{key}|")]
    for key in dropped:
        del saved[key]
    write_cache_file(path, json.dumps(saved, indent=0))
    return len(dropped)


def forget() -> None:
    """Drop what this process measured or read (tests; a machine whose load changed for good)."""
    with _LOCK:
        _KEPT.clear()


__all__ = ["verify_seconds", "costs_file", "forget", "forget_saved", "CONTEXT", "ROUNDS"]
