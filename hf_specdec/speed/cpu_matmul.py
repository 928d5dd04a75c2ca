"""A CPU-only speed lever for the target's verification forwards: each of the target's own `nn.Linear` products takes
the fastest path for its row count, as measured on the machine it runs on.

On CPU, `F.linear(x, W)` with a handful of rows (M = 2..8, the shape of a verification forward) runs far below the
one-row rate, while `W @ x.T` runs them at about the cost of one; and at one row (a plain step) a weight packed once
for oneDNN (`torch.utils.mkldnn`) reads the weights about twice as fast as `F.linear` (measured on this project's
2-core machine for SmolLM2's 49152x576 LM head: F.linear 10.9 ms at M = 1 and 17-24 ms at M = 2..16; W @ x.T 3.6 ms
at M = 2, 7.9 at 8; oneDNN 5.1 ms at M = 1, 13.4 at 16). Same math; rounding differs at the 1e-6 level, like any
batched forward.

Scope. `routed(model)` gives the model's own `nn.Linear` layers (that exact class: quantized layers keep theirs; and
of at least `MIN_WEIGHTS` weights) a forward of their own for the span of a `generate()` call; it takes the fast path
only inside `verifying()`, in the thread that entered it. No other model, and no other thread's forward through this
one (a plain `generate()` in parallel), is touched.

Choices. The first product of each shape and row count times the paths on that layer against the prior rule
(`W @ x.T` for 2..8 rows, `F.linear` otherwise), each path's sample next to the prior's in the same round, over several
rounds, and keeps a path only when the median of those paired ratios says it is clearly faster: a burst of load
during the timing spoils a round or two, not the choice. The choices are saved per CPU model, thread count and torch
version under hf_specdec's cache folder (`choices_file()`), each stamped with when, under what load average and by
what ratio it won, so that a later process takes them without timing anything; the first time a process uses a kept
choice other than the prior path, it times the two once more, and a choice found slower than the prior path is timed
again from scratch. `hf-specdec calibrate` measures again on demand; `fast_cpu_verify=False` turns the lever off.
A oneDNN-packed weight is a second copy of the layer's weights, kept while the layer lives (`packed_bytes`).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import re
import statistics
import threading
import time
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

MAX_ROWS = 32  # above this the ordinary GEMM path is the one to take
PROBE_ROWS = 16384  # a wider layer's paths are timed on its first PROBE_ROWS outputs
# a smaller layer keeps its own forward: its product takes a few microseconds on every path (the measured choices
# among them flip with timer noise), about what routing each call costs
MIN_WEIGHTS = 1 << 16
PATHS = ("linear", "weight_first", "onednn")
# the paths are timed on weights read from memory, as a forward reads each layer's (after some hundred MB of other
# layers): over this many bytes of copies of the layer (or of two slices of a wide one), at most `MAX_COPIES` copies;
# timed on one copy, kept in the caches, a small layer ranks the paths wrongly (a 576x576 layer at one row: F.linear
# 28 us against W @ x.T's 37 in the cache, 114 us against 60 from memory, on an AMD EPYC here)
COLD_BYTES = 64 << 20
MAX_COPIES = 64

_linear_forward = nn.Linear.forward
#: (out_features, in_features, rows, dtype name, torch threads) -> the fastest path measured on this machine
CHOICES: dict[tuple, str] = {}
STAMPS: dict[tuple, dict] = {}  # the same keys -> when, under what load and by what ratio the choice was made
_UNCHECKED: set = set()  # kept choices (read from the file) not yet re-checked in this process
_PACKED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # layer -> (its weight's version, packed layer)
_ACTIVE = contextvars.ContextVar("hf_specdec_fast_linear", default=False)
_LOCK = threading.RLock()
_ROUTED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> how many calls route it now
_OURS: "weakref.WeakSet" = weakref.WeakSet()  # the layers whose forward `routed` set (and only these it removes)
_STORE = {"loaded": None, "dirty": False}  # which choices file was read; whether new choices wait to be saved


def _onednn(layer: nn.Linear):
    entry = _PACKED.get(layer)
    version = (layer.weight.data_ptr(), layer.weight._version)
    if entry is None or entry[0] != version:
        from torch.utils import mkldnn

        copy = _linear_over(layer.weight, layer.bias)
        entry = _PACKED[layer] = (version, mkldnn.to_mkldnn(copy))
    return entry[1]


def _linear_over(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """An `nn.Linear` holding these tensors, made without initialising weights of its own: initialising would draw
    from the global random generator, and a caller's seeded sampling must not depend on what hf_specdec measured."""
    layer = torch.nn.utils.skip_init(nn.Linear, weight.shape[1], weight.shape[0], bias=bias is not None,
                                     device="meta")
    layer.weight = nn.Parameter(weight, requires_grad=False)
    layer.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
    return layer


def _run(path: str, layer: nn.Linear, x2d: torch.Tensor) -> torch.Tensor:
    if path == "weight_first":
        if x2d.shape[0] == 1:  # one row as two: a matrix-vector product streams the weights at half the speed or less
            out = (layer.weight @ x2d.repeat(2, 1).T)[:, :1].T.contiguous()
        else:
            out = (layer.weight @ x2d.T).T.contiguous()  # contiguous: some models view the result as complex numbers
        return out if layer.bias is None else out + layer.bias
    if path == "onednn":
        return _onednn(layer)(x2d)
    return _linear_forward(layer, x2d)


def prior_path(rows: int) -> str:
    """The path to keep unless a measurement clearly beats it: `W @ x.T` for the 2..8 rows of a verification forward
    (it wins there on every CPU measured so far), `F.linear` otherwise."""
    return "weight_first" if 2 <= rows <= 8 else "linear"


def _key(layer: nn.Linear, x2d: torch.Tensor) -> tuple:
    return layer.out_features, layer.in_features, x2d.shape[0], str(x2d.dtype), torch.get_num_threads()


def _probes(layer: nn.Linear) -> list[nn.Linear]:
    """The layers its paths are timed on, one after the other, so that each product reads its weights from memory (see
    `COLD_BYTES`): copies of a small layer; two slices of `PROBE_ROWS` outputs of a wide one (an LM head), at a third of
    the cost (16384 rows of SmolLM2's head ranked the paths as the whole does; a 4096-row slice, cache-resident, did
    not)."""
    weight, bias = layer.weight, layer.bias
    if layer.out_features > PROBE_ROWS:
        count = min(2, layer.out_features // PROBE_ROWS)
        return [_linear_over(weight[i * PROBE_ROWS : (i + 1) * PROBE_ROWS],
                             None if bias is None else bias[i * PROBE_ROWS : (i + 1) * PROBE_ROWS]) for i in range(count)]
    count = max(1, min(MAX_COPIES, COLD_BYTES // (weight.numel() * weight.element_size())))
    with torch.inference_mode(False):  # (plain tensors, as the layer's own: oneDNN packing reads their versions)
        return [layer] + [_linear_over(weight.clone(), None if bias is None else bias.clone()) for _ in range(count - 1)]


def paired_ratios(layer: nn.Linear, x2d: torch.Tensor, paths: list[str], prior: str, rounds: int) -> dict[str, float]:
    """Each path's median, over `rounds`, of its time over the prior path's in the same round (the two timed next to
    each other, in alternating order; each sample runs the product once on each of `_probes(layer)`, so that its
    weights come from memory as in a forward, and timer noise does not decide)."""
    probes = _probes(layer)
    for path in {prior, *paths}:
        for probe in probes:  # (warm-up: a oneDNN copy is packed once per probe)
            _run(path, probe, x2d)

    def timed(path: str) -> float:
        start = time.perf_counter()
        for probe in probes:
            _run(path, probe, x2d)
        return (time.perf_counter() - start) / len(probes)

    ratios = {path: [] for path in paths if path != prior}
    for round in range(rounds):
        for path in ratios:
            pair = (path, prior) if round % 2 else (prior, path)
            times = {name: timed(name) for name in pair}
            ratios[path].append(times[path] / times[prior])
    return {path: statistics.median(values) for path, values in ratios.items()}


def _choose(layer: nn.Linear, x2d: torch.Tensor) -> str:
    """Time the paths on this layer at this row count against the prior path (`paired_ratios`, over five rounds, three
    for a product of over a millisecond), and keep the fastest when it beats the prior path by at least 10% (a close
    call is not worth a second copy of the weights, and noise should not flip it)."""
    key = _key(layer, x2d)
    choice = CHOICES.get(key)
    if choice is not None:
        return choice
    with _LOCK:  # one thread times at a time (two at once would time each other)
        if key in CHOICES:
            return CHOICES[key]
        probe = _probes(layer)[0]
        paths = []
        # oneDNN packing (float32 here) is tried where it has won (one row, or more than a verification's 8): its
        # trial packs a copy of the weights, which a verification forward's rows never pay back
        onednn = x2d.dtype == torch.float32 and not 2 <= x2d.shape[0] <= 8
        for path in PATHS if onednn else PATHS[:2]:
            try:
                _run(path, probe, x2d)  # (a path this layer cannot take)
            except RuntimeError:
                continue
            paths.append(path)
        prior = prior_path(x2d.shape[0]) if prior_path(x2d.shape[0]) in paths else "linear"
        start = time.perf_counter()
        _run(prior, probe, x2d)
        slow = time.perf_counter() - start > 1e-3
        ratios = paired_ratios(layer, x2d, paths, prior, rounds=3 if slow else 5)
        best = min(ratios, key=ratios.get, default=prior)
        CHOICES[key] = best if ratios.get(best, 1.0) < 0.9 else prior
        STAMPS[key] = {**_stamp(), "ratio_to_prior": round(ratios.get(CHOICES[key], 1.0), 3)}
        _STORE["dirty"] = True
        return CHOICES[key]


def _rechecked(layer: nn.Linear, x2d: torch.Tensor, key: tuple) -> str:
    """A kept choice other than the prior path, used for the first time in this process: timed against the prior path
    once more (three rounds); found slower, it is timed again from scratch."""
    with _LOCK:
        _UNCHECKED.discard(key)
        prior = prior_path(x2d.shape[0])
        if CHOICES.get(key, prior) == prior:
            return CHOICES.get(key, prior)
        ratio = paired_ratios(layer, x2d, [CHOICES[key]], prior, rounds=3)[CHOICES[key]]
        if ratio < 1.0:
            return CHOICES[key]
        del CHOICES[key]
    return _choose(layer, x2d)


def _stamp() -> dict:
    from .machine import stamp

    return stamp()


def _fast_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    # (every product of a routed model passes here: the common case, a choice already made, costs a dict lookup)
    if not _ACTIVE.get() or not x.is_cpu or torch.is_grad_enabled():
        return F.linear(x, self.weight, self.bias)
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    if not 1 <= rows <= MAX_ROWS:
        return F.linear(x, self.weight, self.bias)
    key = (self.out_features, self.in_features, rows, str(x.dtype), torch.get_num_threads())
    path = CHOICES.get(key)
    if path is None:
        path = _choose(self, x.reshape(rows, x.shape[-1]))
    elif key in _UNCHECKED:
        path = _rechecked(self, x.reshape(rows, x.shape[-1]), key)
    if path == "linear":
        return F.linear(x, self.weight, self.bias)
    out = _run(path, self, x.reshape(rows, x.shape[-1]))
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _layers(model) -> list[nn.Linear]:
    return [m for m in model.modules() if type(m) is nn.Linear and m.weight.numel() >= MIN_WEIGHTS]


@contextlib.contextmanager
def routed(model, enabled: bool = True):
    """For the span of a call: `model`'s own `nn.Linear` layers take the fastest measured path inside `verifying()`."""
    if not enabled:
        yield
        return
    with _LOCK:
        _load_choices()
        count = _ROUTED.get(model, 0)
        if count == 0:
            for layer in _layers(model):
                if "forward" not in layer.__dict__:  # (a forward a user or another library set stays theirs)
                    layer.forward = _fast_forward.__get__(layer)
                    _OURS.add(layer)
        _ROUTED[model] = count + 1
    try:
        yield
    finally:
        with _LOCK:
            _ROUTED[model] -= 1
            if _ROUTED[model] == 0:
                onednn = {key[:2] for key, path in CHOICES.items() if path == "onednn"}
                for layer in _layers(model):
                    if layer in _OURS:
                        layer.__dict__.pop("forward", None)
                        _OURS.discard(layer)
                    if (layer.out_features, layer.in_features) not in onednn:
                        _PACKED.pop(layer, None)  # a trial's packed copy, for a shape no row count chose it for
                del _ROUTED[model]
            _save_choices()


@contextlib.contextmanager
def verifying(enabled: bool = True):
    """Inside: the routed layers' products (this thread's) take the fastest path."""
    token = _ACTIVE.set(bool(enabled))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


@contextlib.contextmanager
def fast_linear(model, enabled: bool = True):
    """`routed` and `verifying` at once: every product of `model` inside takes the fastest path (benchmarks)."""
    with routed(model, enabled), verifying(enabled):
        yield


def packed_bytes(model) -> int:
    """Bytes of the oneDNN-packed weight copies kept for `model`'s layers."""
    return sum(_PACKED[layer][1].weight.element_size() * _PACKED[layer][1].weight.nelement()
               for layer in _layers(model) if layer in _PACKED)


def choices_file() -> Path:
    """Where this machine's choices are kept: per CPU model and torch version (each choice names its thread count)."""
    from .machine import cache_dir, cpu_name

    name = f"{cpu_name()}-torch{torch.__version__}"
    return cache_dir() / "cpu_matmul" / (re.sub(r"[^A-Za-z0-9.+-]+", "_", name) + ".json")


def _load_choices() -> None:
    path = choices_file()
    if _STORE["loaded"] == path:
        return
    _STORE["loaded"] = path
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    for entry in saved if isinstance(saved, list) else []:
        # [out, in, rows, dtype, threads, path] and, since stamps, {when, load, ratio}
        if isinstance(entry, list) and len(entry) in (6, 7) and entry[5] in PATHS and tuple(entry[:5]) not in CHOICES:
            key = tuple(entry[:5])
            CHOICES[key] = entry[5]
            STAMPS[key] = entry[6] if len(entry) == 7 and isinstance(entry[6], dict) else {}
            if entry[5] != prior_path(key[2]):
                _UNCHECKED.add(key)


def _save_choices() -> None:
    if not _STORE["dirty"] or _STORE["loaded"] is None:
        return
    _STORE["dirty"] = False
    _write_choices()


def _write_choices() -> None:
    from .machine import write_cache_file

    write_cache_file(_STORE["loaded"], json.dumps([[*key, path_name, STAMPS.get(key, {})]
                                                   for key, path_name in sorted(CHOICES.items())]))


def forget_choices(shapes=None) -> int:
    """Drop this machine's kept choices (for these (out_features, in_features) shapes only, if given), in this
    process and in the file; returns how many were dropped (`hf-specdec calibrate` measures them again)."""
    with _LOCK:
        _load_choices()
        dropped = [key for key in CHOICES if shapes is None or key[:2] in shapes]
        for key in dropped:
            CHOICES.pop(key, None)
            STAMPS.pop(key, None)
            _UNCHECKED.discard(key)
        if dropped:
            _write_choices()
        return len(dropped)


__all__ = ["routed", "verifying", "fast_linear", "packed_bytes", "choices_file", "prior_path", "paired_ratios",
           "forget_choices", "CHOICES", "STAMPS", "PATHS", "MAX_ROWS"]
