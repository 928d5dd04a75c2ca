"""Where decoding waits on the device: a counter of host syncs, usable on any device (on a CPU nothing waits, but the
same calls are the ones that stall a GPU's queue, so they can be counted anywhere).

    with count_host_syncs() as syncs:
        model.generate(...)
    print(syncs.total, syncs.by_kind)

Counted: the Tensor methods that read values back to the host (`item`, `tolist`, `__bool__`, `__int__`, `__float__`,
`__index__`, `nonzero`) and copies to the CPU (`cpu`). On a CPU-only run every tensor counts as if it lived on a device
(`cpu_counts`), except those read with `.numpy()`: hf_specdec reads its host-side bookkeeping tensors that way (which
refuses a device tensor), so what is counted is what would wait on a GPU.
"""

from __future__ import annotations

import collections
import contextlib
import traceback

import torch

_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero")
_COPIES = ("cpu",)


class SyncCounter:
    def __init__(self, cpu_counts: bool = True, where: bool = False):
        self.by_kind: collections.Counter = collections.Counter()
        self.by_place: collections.Counter = collections.Counter()
        self.cpu_counts = cpu_counts  # on a CPU run, count reads as if the tensors were on a device
        self.where = where

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    def record(self, kind: str) -> None:
        self.by_kind[kind] += 1
        if self.where:  # the first frame inside hf_specdec that asked
            for frame in reversed(traceback.extract_stack()[:-2]):
                if "hf_specdec" in frame.filename and "diagnostics" not in frame.filename:
                    self.by_place[f"{frame.filename.split('hf_specdec/')[-1]}:{frame.lineno} {kind}"] += 1
                    break


@contextlib.contextmanager
def count_host_syncs(cpu_counts: bool = True, where: bool = False):
    """Count the host syncs made inside the block (see the module docstring). `where=True` also records the line of
    hf_specdec that asked for each one (slow)."""
    counter = SyncCounter(cpu_counts, where)
    originals = {name: getattr(torch.Tensor, name) for name in (*_READS, *_COPIES)}
    depth = [0]  # a counted call that calls another counted method is one sync

    def wrap(name, original):
        def counted(self, *args, **kwargs):
            if depth[0] == 0 and (counter.cpu_counts or self.device.type != "cpu"):
                counter.record(name)
            depth[0] += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                depth[0] -= 1
        return counted

    for name, original in originals.items():
        setattr(torch.Tensor, name, wrap(name, original))
    try:
        yield counter
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def count_forwards(model, fn) -> int:
    """How many forwards of `model` (its top-level module) one call of `fn` makes."""
    count = [0]
    hook = model.register_forward_pre_hook(lambda *args: count.__setitem__(0, count[0] + 1))
    try:
        fn()
    finally:
        hook.remove()
    return count[0]


__all__ = ["count_host_syncs", "count_forwards", "SyncCounter"]
