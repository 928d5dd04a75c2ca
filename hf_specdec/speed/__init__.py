"""What makes a step fast on this machine, measured here and kept in the cache folder (`machine.py`: where, under which
CPU name, measured when): the CPU path of each of a verification's matmuls (`cpu_matmul.py`), and counters of host
syncs and forwards for tests and benchmarks (`diagnostics.py`). The cost of a target forward at each width, which
the draft-length policy reads, is `generation/step_costs.py`."""
