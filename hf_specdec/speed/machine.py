"""Where this machine's measurements are kept: the cache folder (also the default target's converted copy), the CPU
model they are kept under, and what each was measured under."""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path


def cache_dir() -> Path:
    """`$HF_SPECDEC_CACHE`, else `$HF_HOME/hf_specdec`, else `$XDG_CACHE_HOME/hf_specdec`, else `~/.cache/hf_specdec`."""
    if os.environ.get("HF_SPECDEC_CACHE"):
        return Path(os.environ["HF_SPECDEC_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hf_specdec"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hf_specdec"


@functools.lru_cache(maxsize=None)
def cpu_name() -> str:
    """This machine's CPU model: what measured choices and costs are kept under in the cache folder."""
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def write_cache_file(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (a reader sees the old file or the new one); a read-only cache folder is
    skipped (the next process measures again)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        pass


def stamp() -> dict:
    """What a calibration kept in the cache folder was measured under: when, the machine's load average, its CPUs and
    torch threads."""
    import time

    import torch

    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_average": load, "cpus": os.cpu_count(),
            "threads": torch.get_num_threads()}
