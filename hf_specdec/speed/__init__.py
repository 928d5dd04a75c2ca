"""What makes a step fast on this machine, measured here and kept in the cache folder (`machine.py`): the CPU paths of
a verification's matmuls (`cpu_matmul.py`), the time of a target forward at each width (`step_costs.py`, which the
draft-length policy reads), and counters of host syncs and forwards for tests and benchmarks (`diagnostics.py`)."""
