"""The table of benchmarks/trainer_vs_field.sh: per budget and trainer, its steps and time per step (from each
trainer's own log), and what the drafter does in hf_specdec's loop (from the one interleaved bench run)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def ours_training(folder: Path) -> dict:
    summary = json.loads((folder / "training_summary.json").read_text())
    logged = [json.loads(line) for line in (folder / "training_log.jsonl").read_text().splitlines()]
    timed = [e for e in logged if "seconds_per_step" in e]
    return {"steps": summary["final_step"], "seconds_per_step": timed[-1]["seconds_per_step"] if timed else None}


def speculators_training(log: Path, run: Path) -> dict:
    step_ms = [float(x) for x in re.findall(r"profile/step_ms=([0-9.e+]+)", log.read_text())]
    timed = step_ms[1:] or step_ms  # (its first logged step includes building the data loader: left out)
    steps = re.search(r"max_steps: (\d+)", (run / "run.yaml").read_text())  # (it runs to --max-steps)
    return {"steps": int(steps.group(1)) if steps else None,
            "seconds_per_step": sum(timed) / len(timed) / 1000 if timed else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True)
    p.add_argument("--budgets", nargs="+", type=int, required=True)
    p.add_argument("--tag", default="")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    work = Path(args.work)
    bench = json.loads((work / f"bench{args.tag}.json").read_text())
    methods = {m["name"]: m for m in bench["methods"]}
    rows = []
    for n in args.budgets:
        split = json.loads((work / f"spec-data-{n}" / "split.json").read_text())
        for trainer, folder, training in [
            ("hf_specdec", work / f"ours-{n}", ours_training(work / f"ours-{n}")),
            ("speculators", work / f"speculators{args.tag}-{n}" / "final",
             speculators_training(work / f"speculators{args.tag}-{n}.log", work / f"speculators{args.tag}-{n}"))]:
            constant, adaptive = methods[f"hf_specdec {folder}"], methods[f"hf_specdec {folder} adaptive"]
            rows.append({"budget_target_tokens": split["train_target_tokens"], "train_tokens": split["train_tokens"],
                         "trainer": trainer, **training, "drafter": str(folder),
                         "tokens_per_forward_k5": constant["mean_accepted_tokens"],
                         "acceptance_by_position_k5": constant["acceptance_by_position"],
                         "speedup_k5": constant["speedup"], "identical_k5": constant["identical_to_plain"],
                         "tokens_per_forward_adaptive": adaptive["mean_accepted_tokens"],
                         "speedup_adaptive": adaptive["speedup"], "identical_adaptive": adaptive["identical_to_plain"]})
    plain = methods["plain"]["tokens_per_second"]
    print(f"\nplain generate(): {plain:.1f} tokens/s; {bench['settings']['num_prompts']} dev prompts, "
          f"{bench['settings']['max_new_tokens']} new tokens, greedy\n")
    print("| answer tokens (all tokens) | trainer | steps | s/step | k = 5: tokens/forward | acceptance by position | "
          "speed-up | adaptive: tokens/forward | speed-up |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['budget_target_tokens']:,} ({r['train_tokens']:,}) | {r['trainer']} | {r['steps']} | "
              f"{r['seconds_per_step']:.2f} | {r['tokens_per_forward_k5']:.3f} | "
              + " ".join(f"{a:.2f}" for a in r["acceptance_by_position_k5"])
              + f" | {r['speedup_k5']:.2f}x | {r['tokens_per_forward_adaptive']:.3f} | {r['speedup_adaptive']:.2f}x |")
    if not all(r["identical_k5"] and r["identical_adaptive"] for r in rows):
        print("\nNOT IDENTICAL to plain greedy in some row: see the bench JSON")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"plain_tokens_per_second": plain, "settings": bench["settings"],
                                               "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
