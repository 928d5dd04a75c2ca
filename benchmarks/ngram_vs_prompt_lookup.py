"""Wall-clock benchmark: our n-gram drafter vs transformers' prompt lookup vs plain greedy generate().

Real SmolLM2-135M-Instruct (fp32, CPU), chat template, greedy, 128 new tokens, on the input-grounded prompts of
examples/input_grounded_prompts.jsonl (summarise / rewrite / fix a text or code given in the prompt). All methods run
in one process, interleaved prompt by prompt (their order rotates from prompt to prompt), after one warm-up run each.

    python benchmarks/ngram_vs_prompt_lookup.py                      # all prompts, default methods
    python benchmarks/ngram_vs_prompt_lookup.py --limit 4 --methods plain,pld3,ngram

Prints a table and writes JSON (per-prompt records included) to --out.
Columns: tokens/s = total new tokens / total seconds; speed-up = plain's total seconds / the method's (the outputs are
the same tokens); per-prompt = geometric mean of per-prompt speed-ups; tok/fwd = new tokens per target forward
(counted with a forward hook on the target, prefill included, so plain = 1.0); identical = prompts whose output equals
plain greedy.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

# name -> NgramDrafter keyword arguments and draft length (num_draft_tokens)
NGRAM_SETTINGS = {
    "ngram": (dict(), None),  # NgramDrafter() with its default draft length (16)
    "ngram_k10": (dict(), 10),
    "ngram_frequent": (dict(strategy="frequent"), None),
    "ngram_0-3-3_k16": (dict(max_tokens_by_match=(0, 3, 3)), 16),
    "ngram_3-3-3_k16": (dict(max_tokens_by_match=(3, 3, 3)), 16),
    "ngram_uncapped_k10": (dict(max_tokens_by_match=()), 10),
}
DEFAULT_METHODS = "plain,pld3,pld10," + ",".join(NGRAM_SETTINGS)


def build_method(name, model):
    import hf_specdec
    from hf_specdec.drafters.ngram import NgramDrafter

    if name == "plain":
        return lambda ids, mask, n: model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n)
    if name.startswith("pld"):
        num = int(name[3:])
        return lambda ids, mask, n: model.generate(
            ids, attention_mask=mask, do_sample=False, max_new_tokens=n, prompt_lookup_num_tokens=num
        )
    if name in NGRAM_SETTINGS:
        kwargs, k = NGRAM_SETTINGS[name]
        return lambda ids, mask, n: model.generate(
            ids, attention_mask=mask, do_sample=False, max_new_tokens=n, custom_generate=hf_specdec.speculative_generate,
            assistant=NgramDrafter(**kwargs), num_draft_tokens=k,
        draft_length="constant")
    raise SystemExit(f"unknown method {name!r}; known: plain, pld<N>, {', '.join(NGRAM_SETTINGS)}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", default=str(ROOT / "examples" / "input_grounded_prompts.jsonl"))
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--methods", default=DEFAULT_METHODS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ngram_vs_prompt_lookup.json"))
    parser.add_argument("--resume", action="store_true", help="keep the per-prompt records of an interrupted run")
    args = parser.parse_args(argv)
    partial = Path(args.out).with_suffix(".partial.jsonl")  # one record per finished prompt, for --resume

    from hf_specdec import load_default_target

    torch.set_num_threads(args.threads)
    model, tokenizer = load_default_target()
    forwards = [0]
    model.register_forward_pre_hook(lambda module, inputs: forwards.__setitem__(0, forwards[0] + 1))
    names = args.methods.split(",")
    methods = {name: build_method(name, model) for name in names}
    rows = [json.loads(line) for line in Path(args.prompts).open()][: args.limit]

    def encode(prompt):
        enc = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        return enc["input_ids"], enc["attention_mask"]

    ids, mask = encode(rows[0]["prompt"])
    for name, run in methods.items():  # warm-up
        run(ids, mask, 16)

    records = []
    if args.resume and partial.exists():
        records = [json.loads(line) for line in partial.open()]
        records = [r for r in records if set(r["methods"]) == set(names)]
    elif partial.exists():
        partial.unlink()
    done = {r["id"] for r in records}
    start_load = os.getloadavg()
    for i, row in enumerate(rows):
        if row["id"] in done:
            continue
        ids, mask = encode(row["prompt"])
        order = names[i % len(names) :] + names[: i % len(names)]
        record = {"id": row["id"], "category": row["category"], "prompt_tokens": ids.shape[1], "methods": {}}
        outputs = {}
        for name in order:
            forwards[0] = 0
            t0 = time.perf_counter()
            seq = methods[name](ids, mask, args.max_new_tokens)
            seconds = time.perf_counter() - t0
            outputs[name] = seq[0, ids.shape[1] :].tolist()
            record["methods"][name] = {"seconds": seconds, "tokens": len(outputs[name]), "forwards": forwards[0]}
        for name in names:
            record["methods"][name]["identical"] = outputs[name] == outputs.get("plain", outputs[name])
        records.append(record)
        partial.parent.mkdir(parents=True, exist_ok=True)
        with partial.open("a") as f:
            f.write(json.dumps(record) + "\n")
        line = "  ".join(
            f"{n}={r['tokens'] / r['seconds']:.1f}t/s,{r['tokens'] / max(r['forwards'], 1):.2f}"
            for n, r in record["methods"].items()
        )
        print(f"[{i + 1}/{len(rows)}] {row['id']} ({ids.shape[1]} prompt tokens): {line}", flush=True)

    order = {row["id"]: i for i, row in enumerate(rows)}
    records.sort(key=lambda r: order[r["id"]])
    summary = {}
    plain_seconds = [r["methods"]["plain"]["seconds"] for r in records] if "plain" in names else None
    for name in names:
        ms = [r["methods"][name] for r in records]
        tokens = sum(m["tokens"] for m in ms)
        seconds = sum(m["seconds"] for m in ms)
        entry = {
            "tokens_per_second": tokens / seconds,
            "tokens_per_forward": tokens / sum(m["forwards"] for m in ms),
            "identical": sum(m["identical"] for m in ms),
            "prompts": len(ms),
            "tokens": tokens,
            "seconds": seconds,
        }
        if plain_seconds:
            entry["speedup"] = sum(plain_seconds) / seconds
            entry["speedup_geomean_per_prompt"] = math.exp(
                sum(math.log(p / m["seconds"]) for p, m in zip(plain_seconds, ms)) / len(ms)
            )
            by_cat = {}
            for r, p in zip(records, plain_seconds):
                c = by_cat.setdefault(r["category"], [0.0, 0.0])
                c[0] += p
                c[1] += r["methods"][name]["seconds"]
            entry["speedup_by_category"] = {c: v[0] / v[1] for c, v in by_cat.items()}
        summary[name] = entry

    header = f"{'method':<16}{'tokens/s':>10}{'speed-up':>10}{'per-prompt':>12}{'tok/fwd':>9}{'identical':>11}"
    print("\n" + header)
    print("-" * len(header))
    for name, e in summary.items():
        print(
            f"{name:<16}{e['tokens_per_second']:>10.2f}{e.get('speedup', float('nan')):>9.2f}x"
            f"{e.get('speedup_geomean_per_prompt', float('nan')):>11.2f}x{e['tokens_per_forward']:>9.2f}"
            f"{e['identical']:>7}/{e['prompts']}"
        )
    if plain_seconds:
        cats = sorted({r["category"] for r in records})
        print("\nspeed-up by category: " + ", ".join(cats))
        for name, e in summary.items():
            print(f"{name:<16}" + "".join(f"{e['speedup_by_category'][c]:>10.2f}x" for c in cats))
    meta = {
        "settings": {n: NGRAM_SETTINGS[n] for n in names if n in NGRAM_SETTINGS},
        "max_new_tokens": args.max_new_tokens,
        "threads": args.threads,
        "torch": torch.__version__,
        "platform": platform.platform(),
        "loadavg_start": start_load,
        "loadavg_end": os.getloadavg(),
    }
    print(f"\nload average at start {start_load}, at end {meta['loadavg_end']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "summary": summary, "records": records}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
