"""Training throughput per drafter kind and setting: seconds per optimisation step and target tokens per second.

Each setting trains a fresh drafter for a few steps on the same prepared teacher data (the on-policy set of
`block_equal_time.sh`, made first if missing) through the real command, `training/distill.py`; a step's time is read
from the run's own log (the span of its steps after the first few: warm-up, compilation). The
settings: each kind in fp32 and under bf16 autocast (`--mixed-precision bf16`: the target stays fp32), the EAGLE-3-style
drafter with one training-time-test pass instead of three, and compiled (`--compile`). On a CPU without AMX, bf16
matrix products are several times slower than fp32 (this machine: 6x forward, 13x for a weight gradient), so the bf16
settings run only when named.

    python benchmarks/trainer_throughput.py --json benchmarks/results/trainer_throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ["--teacher-data", "generate", "--num-generate", "512", "--max-new-tokens", "192", "--gen-batch-size", "32"]
SETTINGS = {  # name: (kind, extra arguments)
    "block, fp32": ("block", []),
    "block, bf16 autocast": ("block", ["--mixed-precision", "bf16"]),
    "block, compiled": ("block", ["--compile"]),
    "EAGLE-3-style, fp32 (3 TTT passes)": ("eagle3", []),
    "EAGLE-3-style, bf16 autocast": ("eagle3", ["--mixed-precision", "bf16"]),
    "EAGLE-3-style, 1 TTT pass": ("eagle3", ["--ttt-steps", "1"]),
    "token-only, fp32": ("new", []),
    "token-only, bf16 autocast": ("new", ["--mixed-precision", "bf16"]),
    "token-only, compiled": ("new", ["--compile"]),
}


def folder(runs: Path, name: str) -> Path:
    return runs / "throughput" / name.replace(",", "").replace(" ", "-").replace("(", "").replace(")", "")


def train(name: str, kind: str, extra: list[str], steps: int, runs: Path) -> str | None:
    """A fresh run of `steps` steps; None, or the last line of the error it ended with."""
    argv = [sys.executable, str(ROOT / "training" / "distill.py"), "--drafter", kind, *DATA, *extra,
            "--max-steps", str(steps), "--log-every", "1", "--eval-every", "0", "--save-every", "0",
            "--eval-prompts", "1", "--eval-max-new-tokens", "4", "--output-dir", str(folder(runs, name)), "--overwrite"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1][:300]


def measured(name: str, kind: str, extra: list[str], skip: int, runs: Path) -> dict:
    """Seconds per step from the run's log: the span from the end of step `skip` + 1 to the last step, per step (the
    log's clock reads tenths of a second, so the span, not single steps)."""
    events = [json.loads(line) for line in (folder(runs, name) / "training_log.jsonl").read_text().splitlines()]
    steps = [e for e in events if e["event"] == "train"]
    start_event = next(e for e in events if e["event"] == "start")
    per_step = (steps[-1]["time"] - steps[skip]["time"]) / (len(steps) - 1 - skip)
    tokens_per_step = steps[-1]["target_tokens_per_second"] * steps[-1]["seconds_per_step"]
    return {"setting": name, "kind": kind, "arguments": extra, "steps": len(steps), "seconds_per_step": per_step,
            "first_step_seconds": steps[0]["seconds_per_step"], "target_tokens_per_second": tokens_per_step / per_step,
            "steps_per_hour": 3600 / per_step, "final_loss": steps[-1]["loss"],
            "drafter_parameters": start_event["drafter_parameters"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default=";".join(n for n in SETTINGS if "bf16" not in n),
                        help="names from the list above, separated by ';' (default: all but bf16 autocast, which on a "
                             "CPU without AMX runs about 20x slower than fp32: 96 s a block step here)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--skip", type=int, default=2, help="first step intervals left out (warm-up, compilation)")
    parser.add_argument("--runs", default=os.environ.get("RUNS", str(Path.home() / ".cache" / "hf_specdec" / "runs")))
    parser.add_argument("--report-only", action="store_true", help="read the runs already in --runs, train nothing")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.settings.split(";") if n.strip()]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        parser.error(f"unknown setting(s) {unknown}; known: {list(SETTINGS)}")
    rows = []
    for name in names:
        error = None if args.report_only else train(name, *SETTINGS[name], args.steps, Path(args.runs))
        rows.append({"setting": name, "error": error} if error else measured(name, *SETTINGS[name], args.skip, Path(args.runs)))
        print(json.dumps(rows[-1]), flush=True)
    print("\n| setting | seconds per step | target tokens per second | steps per hour | first step (s) |")
    print("|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['setting']} | failed: {r['error']} | | | |")
        else:
            print(f"| {r['setting']} | {r['seconds_per_step']:.2f} | {r['target_tokens_per_second']:.0f} | "
                  f"{r['steps_per_hour']:.0f} | {r['first_step_seconds']:.1f} |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
