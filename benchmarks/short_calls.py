"""Short calls through `enable()`, as extraction and tool-call users make them: what the first call of a process costs,
and what each of 20 calls costs, speculative against plain, interleaved.

    python benchmarks/short_calls.py --json benchmarks/results/short_calls.json

Part 1 starts a fresh process per method (`--first-call-rounds` of each, in turn): load SmolLM2, then time its first
`generate()` call (plain, or `assistant=NAME`), so that one-time costs (loading a drafter, the CPU matmul path timing
its products, the allocator) land where a user meets them. `--cold` removes the CPU matmul path's saved choices before
every speculative process (a machine that has never run hf_specdec); otherwise they are kept (every later process).
Part 2, in one process: 20 short prompts (24-64 new tokens each), each decoded plainly and with each assistant, the
order turning every prompt; time per call, tokens per target forward from the second call on, identical outputs.
Public API only, so that the same script measures an older checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPTS = [  # (prompt, new tokens): extraction, classification and tool-call shaped requests
    ("Extract the city from: 'Our office moved to Lyon last spring.' Answer with the city only.", 24),
    ("Is this review positive or negative? 'The battery died after two days.' One word.", 24),
    ('Return JSON {"name": str, "age": int} for: Maria is 34 years old.', 32),
    ("List the three primary colours, comma separated.", 24),
    ("Translate to French: 'Where is the train station?'", 32),
    ('Call the weather tool: output {"tool": "weather", "city": ...} for Paris.', 32),
    ("Extract all numbers from: 'We shipped 12 boxes, 7 crates and 300 letters.'", 32),
    ("Give the capital of Japan in one word.", 24),
    ('Return JSON {"title": str, "year": int} for: Inception came out in 2010.', 40),
    ("Summarise in one sentence: The meeting was moved from Monday to Wednesday because the room was booked.", 48),
    ("Write a Python one-liner that sums a list called xs.", 48),
    ("Classify the topic (sport, politics, science): 'The striker scored twice in the final.'", 24),
    ("Extract the email address from: 'Contact jane.doe@example.com for details.'", 32),
    ('Return JSON {"product": str, "price": float} for: The lamp costs 19.99 euros.', 40),
    ("Name two planets larger than Earth.", 32),
    ("Write a SQL query selecting all rows of the table users where age > 30.", 48),
    ("What is 17 times 3? Answer with the number only.", 24),
    ("Extract the date from: 'The invoice was issued on 3 March 2024.'", 32),
    ("Rewrite in the passive voice: 'The cat chased the mouse.'", 32),
    ("Give a regular expression that matches a five-digit ZIP code.", 64),
]


def encode(tokenizer, prompt):
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)


def first_call(method: str, threads: int) -> dict:
    """In this (fresh) process: load the target, then time its first call."""
    import torch

    import hf_specdec

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model, tokenizer = hf_specdec.load_default_target()
    loaded = time.perf_counter() - t0
    hf_specdec.enable(model)
    prompt, new = PROMPTS[0]
    inputs = encode(tokenizer, prompt)
    kwargs = {} if method == "plain" else {"assistant": method}
    t0 = time.perf_counter()
    model.generate(**inputs, max_new_tokens=new, do_sample=False, **kwargs)
    return {"method": method, "load_seconds": loaded, "first_call_seconds": time.perf_counter() - t0}


def first_calls(methods: list[str], rounds: int, threads: int, cold: bool) -> dict:
    import hf_specdec.speed.cpu_matmul as cpu_matmul

    times = {m: [] for m in methods}
    for r in range(rounds):
        for method in methods[r % len(methods):] + methods[: r % len(methods)]:
            if cold and method != "plain":
                try:
                    cpu_matmul.choices_file().unlink(missing_ok=True)
                except AttributeError:  # an older checkout kept nothing
                    pass
            out = subprocess.run([sys.executable, __file__, "--first-call", method, "--threads", str(threads)],
                                 capture_output=True, text=True, check=True)
            times[method].append(json.loads(out.stdout.strip().splitlines()[-1])["first_call_seconds"])
    return {m: {"median_seconds": statistics.median(t), "seconds": t} for m, t in times.items()}


def many_calls(methods: list[str], threads: int) -> dict:
    import torch

    import hf_specdec

    torch.set_num_threads(threads)
    model, tokenizer = hf_specdec.load_default_target()
    hf_specdec.enable(model)
    forwards = [0]
    model.register_forward_pre_hook(lambda *a: forwards.__setitem__(0, forwards[0] + 1))
    runs = [("plain", {})] + [(m, {"assistant": m}) for m in methods]
    warm = encode(tokenizer, "Hello")  # the first call of each method is part 1's business
    for _, kwargs in runs:
        model.generate(**warm, max_new_tokens=4, do_sample=False, **kwargs)
    rows = {name: {"seconds": [], "tokens": [], "forwards": [], "identical": []} for name, _ in runs}
    for i, (prompt, new) in enumerate(PROMPTS):
        inputs = encode(tokenizer, prompt)
        outputs = {}
        for name, kwargs in runs[i % len(runs):] + runs[: i % len(runs)]:
            forwards[0] = 0
            t0 = time.perf_counter()
            out = model.generate(**inputs, max_new_tokens=new, do_sample=False, **kwargs)
            rows[name]["seconds"].append(time.perf_counter() - t0)
            rows[name]["tokens"].append(out.shape[1] - inputs["input_ids"].shape[1])
            rows[name]["forwards"].append(forwards[0])
            outputs[name] = out
        for name in outputs:
            rows[name]["identical"].append(bool(torch.equal(outputs[name], outputs["plain"])))
    plain = rows["plain"]
    for name, row in rows.items():
        later = slice(1, None)  # from the second call on
        row["tokens_per_forward_from_call_2"] = sum(row["tokens"][later]) / max(sum(row["forwards"][later]), 1)
        row["total_seconds"] = sum(row["seconds"])
        row["speed_up"] = sum(plain["seconds"]) / row["total_seconds"]
        row["calls_slower_than_plain"] = sum(s > p for s, p in zip(row["seconds"], plain["seconds"]))
        row["worst_call_ratio"] = max(s / p for s, p in zip(row["seconds"], plain["seconds"]))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assistants", default="default,ngram,recycle", help="comma list of assistant names")
    parser.add_argument("--first-call-rounds", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="remove the CPU matmul path's saved choices each time")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parts", default="first,calls", help="first (the first call of a process), calls (20 calls)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--first-call", default=None, help=argparse.SUPPRESS)  # (the child process of part 1)
    args = parser.parse_args(argv)
    if args.first_call:
        print(json.dumps(first_call(args.first_call, args.threads)))
        return
    methods = args.assistants.split(",")
    report = {"settings": {**vars(args), "checkout": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}}
    parts = args.parts.split(",")
    report["first_call"] = first_calls(["plain", methods[0]], args.first_call_rounds, args.threads, args.cold) \
        if "first" in parts else {}
    report["calls"] = many_calls(methods, args.threads) if "calls" in parts else {}
    print(f"first call after loading (median of {args.first_call_rounds} fresh processes each, "
          f"{'no saved CPU matmul choices' if args.cold else 'choices saved by an earlier process'}):")
    for name, row in report["first_call"].items():
        print(f"  {name}: {row['median_seconds']:.2f} s  ({', '.join(f'{s:.2f}' for s in row['seconds'])})")
    print(f"\n{len(PROMPTS)} short calls (24-64 new tokens), methods interleaved:\n")
    print("| method | total s | speed-up | calls slower than plain | worst call vs plain | tokens per forward "
          "(calls 2..) | identical |")
    print("|---|---|---|---|---|---|---|")
    for name, row in report["calls"].items():
        print(f"| {name} | {row['total_seconds']:.2f} | {row['speed_up']:.2f}x | {row['calls_slower_than_plain']} | "
              f"{row['worst_call_ratio']:.2f}x | {row['tokens_per_forward_from_call_2']:.2f} | "
              f"{'yes' if all(row['identical']) else 'NO'} |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
