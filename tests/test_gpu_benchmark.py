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


def test_the_gpu_figures_script_runs_at_tiny_sizes(tmp_path):
    """benchmarks/gpu/figures.sh's second command (the dev prompts against plain, a static cache and transformers' own
    methods; the trainer checkpointed and resumed) at tiny sizes on the CPU."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "PYTHON": sys.executable,
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run(["bash", "benchmarks/gpu/figures.sh", "tiny"], cwd=SCRIPT.parents[2], env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "text-float32.json").read_text())
    rows = {m["name"]: m for m in report["methods"]}
    assert {"plain, static cache", "transformers prompt_lookup_num_tokens", "transformers assistant_model"} <= set(rows)
    assert all(row["identical_to_plain"] for row in rows.values()), rows
    log = [json.loads(line) for line in (tmp_path / "out" / "trainer_log.jsonl").read_text().splitlines()]
    resumed = [e for e in log if e["event"] == "resume" and "checkpoint" in e]
    assert resumed and resumed[0]["step"] == 4 and [e for e in log if e["event"] == "done"][-1]["final_step"] == 6
