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

Choices. The first product of each shape and row count times the paths on that layer and keeps the winner (the prior
rule, `W @ x.T` for 2..8 rows, stays unless another path is clearly faster). The choices are saved per CPU model,
thread count and torch version under hf_specdec's cache folder, so a later process takes them without timing anything.
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

_linear_forward = nn.Linear.forward
#: (out_features, in_features, rows, dtype name, torch threads) -> the fastest path measured on this machine
CHOICES: dict[tuple, str] = {}
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
        out = (layer.weight @ x2d.T).T.contiguous()  # contiguous: some models view the result as complex numbers
        return out if layer.bias is None else out + layer.bias
    if path == "onednn":
        return _onednn(layer)(x2d)
    return _linear_forward(layer, x2d)


def prior_path(rows: int) -> str:
    """The path to keep unless a measurement clearly beats it: `W @ x.T` for the 2..8 rows of a verification forward
    (it wins there on every CPU measured so far), `F.linear` otherwise."""
    return "weight_first" if 2 <= rows <= 8 else "linear"


def _choose(layer: nn.Linear, x2d: torch.Tensor) -> str:
    """Time the paths on this layer at this row count, interleaved over three rounds (two for a product of over a
    millisecond; each sample repeats the product for about half a millisecond, so timer noise does not decide), and
    keep the median's fastest when it beats the prior path by at least 10% (a close call is not worth a second copy of
    the weights, and noise should not flip it)."""
    key = (layer.out_features, layer.in_features, x2d.shape[0], str(x2d.dtype), torch.get_num_threads())
    choice = CHOICES.get(key)
    if choice is not None:
        return choice
    with _LOCK:  # one thread times at a time (two at once would time each other)
        if key in CHOICES:
            return CHOICES[key]
        if layer.out_features > PROBE_ROWS:
            # a wide layer (an LM head) is timed on a slice of its outputs, at a third of the cost: a slice too large
            # for the caches, since the paths differ in how they stream the weights from memory (a 4096-row slice of
            # SmolLM2's head, cache-resident, ranked them wrongly at 5 rows; 16384 rows ranked them as the whole does)
            layer = _linear_over(layer.weight[:PROBE_ROWS], None if layer.bias is None else layer.bias[:PROBE_ROWS])
        paths = []
        # oneDNN packing (float32 here) is tried where it has won (one row, or more than a verification's 8): its
        # trial packs a copy of the weights, which a verification forward's rows never pay back
        onednn = x2d.dtype == torch.float32 and not 2 <= x2d.shape[0] <= 8
        for path in PATHS if onednn else PATHS[:2]:
            try:
                _run(path, layer, x2d)  # warm-up (and the packing, once)
            except RuntimeError:
                continue
            paths.append(path)
        start = time.perf_counter()
        _run("linear", layer, x2d)
        once = time.perf_counter() - start
        calls = max(1, min(100, int(5e-4 / max(once, 1e-6))))
        samples = {path: [] for path in paths}
        for _ in range(2 if once > 1e-3 else 3):
            for path in paths:
                start = time.perf_counter()
                for _ in range(calls):
                    _run(path, layer, x2d)
                samples[path].append((time.perf_counter() - start) / calls)
        median = {path: statistics.median(times) for path, times in samples.items()}
        prior = prior_path(x2d.shape[0]) if prior_path(x2d.shape[0]) in median else "linear"
        best = min(median, key=median.get)
        CHOICES[key] = best if median[best] < 0.9 * median[prior] else prior
        _STORE["dirty"] = True
        return CHOICES[key]


def _fast_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    # (every product of a routed model passes here: the common case, a choice already made, costs a dict lookup)
    if not _ACTIVE.get() or not x.is_cpu or torch.is_grad_enabled():
        return F.linear(x, self.weight, self.bias)
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    if not 1 <= rows <= MAX_ROWS:
        return F.linear(x, self.weight, self.bias)
    path = CHOICES.get((self.out_features, self.in_features, rows, str(x.dtype), torch.get_num_threads()))
    if path is None:
        path = _choose(self, x.reshape(rows, x.shape[-1]))
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
    from .default_model import cache_dir, cpu_name

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
        if isinstance(entry, list) and len(entry) == 6 and entry[5] in PATHS:
            CHOICES.setdefault(tuple(entry[:5]), entry[5])


def _save_choices() -> None:
    if not _STORE["dirty"] or _STORE["loaded"] is None:
        return
    _STORE["dirty"] = False
    from .default_model import write_cache_file

    write_cache_file(_STORE["loaded"], json.dumps([[*key, path_name] for key, path_name in sorted(CHOICES.items())]))


__all__ = ["routed", "verifying", "fast_linear", "packed_bytes", "choices_file", "prior_path", "CHOICES", "PATHS",
           "MAX_ROWS"]
