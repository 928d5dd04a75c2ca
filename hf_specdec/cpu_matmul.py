"""A CPU-only speed lever for the target's forwards: each `nn.Linear` product takes the fastest path for its row count,
as measured on the machine it runs on.

On CPU, `F.linear(x, W)` with a handful of rows (M = 2..8, the shape of a verification forward) runs far below the
one-row rate, while `W @ x.T` runs them at about the cost of one; and at one row (a plain step) a weight packed once
for oneDNN (`torch.utils.mkldnn`) reads the weights about twice as fast as `F.linear` (measured on this project's
2-core machine for SmolLM2's 49152x576 LM head: F.linear 10.9 ms at M = 1 and 17-24 ms at M = 2..16; W @ x.T 3.6 ms
at M = 2, 7.9 at 8; oneDNN 5.1 ms at M = 1, 13.4 at 16). Inside `fast_linear()`, the first product of each shape and
row count times the three paths on that layer and caches the winner (`CHOICES`; the prior rule, `W @ x.T` for 2..8
rows, stays unless another path is clearly faster); every later product of that shape and row count takes it. Same math; rounding differs at the 1e-6 level, like any batched forward.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import weakref

import torch
from torch import nn

MAX_ROWS = 32  # above this the ordinary GEMM path is the one to take
PATHS = ("linear", "weight_first", "onednn")

_linear_forward = nn.Linear.forward
#: (out_features, in_features, rows, dtype) -> the fastest path measured on this machine
CHOICES: dict[tuple, str] = {}
_PACKED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # layer -> (its weight's version, packed layer)


def _onednn(layer: nn.Linear):
    entry = _PACKED.get(layer)
    version = (layer.weight.data_ptr(), layer.weight._version)
    if entry is None or entry[0] != version:
        from torch.utils import mkldnn

        entry = _PACKED[layer] = (version, mkldnn.to_mkldnn(_plain_copy(layer)))
    return entry[1]


def _plain_copy(layer: nn.Linear) -> nn.Linear:
    copy = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
    copy.weight, copy.bias = layer.weight, layer.bias
    return copy


def _run(path: str, layer: nn.Linear, x2d: torch.Tensor) -> torch.Tensor:
    if path == "weight_first":
        out = (layer.weight @ x2d.T).T
        return out if layer.bias is None else out + layer.bias
    if path == "onednn":
        return _onednn(layer)(x2d)
    return _linear_forward(layer, x2d)


def prior_path(rows: int) -> str:
    """The path to keep unless a measurement clearly beats it: `W @ x.T` for the 2..8 rows of a verification forward
    (it wins there on every CPU measured so far), `F.linear` otherwise."""
    return "weight_first" if 2 <= rows <= 8 else "linear"


def _choose(layer: nn.Linear, x2d: torch.Tensor) -> str:
    """Time the paths on this layer at this row count, interleaved over five rounds (each sample repeats the product
    for about a millisecond, so timer noise does not decide), and keep the median's fastest when it beats the prior
    path by at least 10% (a close call is not worth a second copy of the weights, and noise should not flip it)."""
    key = (layer.out_features, layer.in_features, x2d.shape[0], x2d.dtype)
    if key not in CHOICES:
        paths = []
        for path in PATHS if x2d.dtype == torch.float32 else PATHS[:2]:  # oneDNN packing: float32 here
            try:
                _run(path, layer, x2d)  # warm-up (and the packing, once)
            except RuntimeError:
                continue
            paths.append(path)
        start = time.perf_counter()
        _run("linear", layer, x2d)
        calls = max(1, min(100, int(1e-3 / max(time.perf_counter() - start, 1e-6))))
        samples = {path: [] for path in paths}
        for _ in range(5):
            for path in paths:
                start = time.perf_counter()
                for _ in range(calls):
                    _run(path, layer, x2d)
                samples[path].append((time.perf_counter() - start) / calls)
        median = {path: statistics.median(times) for path, times in samples.items()}
        prior = prior_path(x2d.shape[0]) if prior_path(x2d.shape[0]) in median else "linear"
        best = min(median, key=median.get)
        CHOICES[key] = best if median[best] < 0.9 * median[prior] else prior
    return CHOICES[key]


def _fast_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    if not (1 <= rows <= MAX_ROWS) or x.device.type != "cpu" or type(self) is not nn.Linear or torch.is_grad_enabled():
        return _linear_forward(self, x)
    x2d = x.reshape(rows, x.shape[-1])
    out = _run(_choose(self, x2d), self, x2d)
    return out.reshape(*x.shape[:-1], out.shape[-1])


@contextlib.contextmanager
def fast_linear(enabled: bool = True):
    """Route `nn.Linear` products of up to MAX_ROWS rows on CPU through the fastest measured path while active."""
    if not enabled or nn.Linear.forward is _fast_forward:
        yield
        return
    nn.Linear.forward = _fast_forward
    try:
        yield
    finally:
        nn.Linear.forward = _linear_forward


__all__ = ["fast_linear", "prior_path", "CHOICES", "PATHS", "MAX_ROWS"]
