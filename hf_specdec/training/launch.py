"""`accelerate launch --cpu --num_processes N training/distill.py`: start the N gloo processes asked for."""

from __future__ import annotations

import os
import sys
from pathlib import Path


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
        # sys.argv[0] is training/distill.py's path, whether it was started as a file or with -m
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n), "--master_addr",
                   env["MASTER_ADDR"], "--master_port", env.get("MASTER_PORT", "29500"), sys.argv[0], *sys.argv[1:]]
        print(f"[distill] accelerate started one process for --cpu --num_processes {n}; relaunching {n} gloo processes", flush=True)
        os.execv(sys.executable, command)
