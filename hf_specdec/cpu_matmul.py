"""A CPU-only speed lever for verification forwards.

On CPU, `F.linear(x, W)` with a handful of rows (M = 2..8, the shape of a verification forward) runs far below the
one-row rate: measured on this project's 2-core machine, the 49152x576 LM head takes ~15 ms at M=2 through `F.linear`
but ~2.5 ms as `W @ x.T`, and a whole SmolLM2-135M forward of 3 tokens drops from ~64 ms to ~35 ms (one token: ~41 ms).
Inside this context, `nn.Linear` computes small-M products in that layout. Same math, rounding at the 1e-6 level.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

MAX_ROWS = 8  # above this the ordinary GEMM path is as fast or faster

_linear_forward = nn.Linear.forward


def _small_m_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    if not (2 <= rows <= MAX_ROWS) or x.device.type != "cpu" or type(self) is not nn.Linear:
        return _linear_forward(self, x)
    out = (self.weight @ x.reshape(rows, x.shape[-1]).T).T
    if self.bias is not None:
        out = out + self.bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


@contextlib.contextmanager
def small_m_linear(enabled: bool = True):
    """Route small-M `nn.Linear` products through `W @ x.T` on CPU while the context is active."""
    if not enabled or nn.Linear.forward is _small_m_forward:
        yield
        return
    nn.Linear.forward = _small_m_forward
    try:
        yield
    finally:
        nn.Linear.forward = _linear_forward
