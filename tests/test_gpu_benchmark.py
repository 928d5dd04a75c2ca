"""benchmarks/gpu/run.py, the benchmark prepared for GPUs, runs end to end here at tiny shapes on the CPU."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "run.py"


def test_gpu_benchmark_runs_at_tiny_shapes(tmp_path, capsys, one_thread):
    spec = importlib.util.spec_from_file_location("gpu_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "gpu.json"
    (row,) = module.main(["--shapes", "tiny", "--device", "cpu", "--dtype", "float32", "--new-tokens", "24",
                          "--repeats", "1", "--json", str(out)])
    assert json.loads(out.read_text())["rows"][0]["shape"] == "tiny"
    assert row["loop"]["hf_specdec_steps"] < 24 and row["loop"]["ratio_per_step"] > 0
    assert set(row["verification"]["ratio"]) == {1, 2, 4, 8, 16, 32, 64} and row["verification"]["ratio"][1] == 1.0
    assert 0 < row["host_syncs_per_step"][1] <= 2 and 0 < row["host_syncs_per_step"][8] <= 2
    self_drafting = row["throughput"]["self_drafting"]
    assert self_drafting["identical_to_plain"] and self_drafting["tokens_per_target_forward"] > 3  # every draft accepted
    ngram = row["throughput"]["ngram_repetitive_prompt"]
    assert ngram["identical_to_plain"] and ngram["tokens_per_target_forward"] > 1.5
    assert "| tiny |" in capsys.readouterr().out
