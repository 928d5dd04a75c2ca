"""hf_specdec's verification forward against transformers' own forward of the same width: the default target on a
200-token cache, n = 1..9 new tokens per row, batch 1, 2, 4 and 8. The two forwards differ only in the matmul path
(`cpu_matmul.py`: each layer's measured choice; stock `F.linear` in transformers' `generate()`); they run alternately,
`--rounds` times, and the table gives the median ratio (ours over theirs: below 1 is cheaper) with the lowest and
highest round's. A first call measures the CPU paths it has not measured yet (not timed here: one warm-up each).

    python benchmarks/verify_width.py --json benchmarks/results/verify_width.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from hf_specdec import load_default_target
from hf_specdec.cache.keyword import CACHE
from hf_specdec.cli.bench import write_json
from hf_specdec.speed.cpu_matmul import fast_linear


@torch.inference_mode()
def forward_seconds(model, cache, block, fast: bool) -> float:
    with fast_linear(model, fast):
        start = time.perf_counter()
        model(input_ids=block, **{CACHE: cache}, use_cache=True, logits_to_keep=block.shape[1])
        seconds = time.perf_counter() - start
    cache.crop(-block.shape[1])
    return seconds


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, default=9)
    parser.add_argument("--batch-sizes", default="1,2,4,8")
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    model, _ = load_default_target()
    vocab = model.config.vocab_size
    table = {}
    for batch in map(int, args.batch_sizes.split(",")):
        ids = torch.randint(0, vocab, (batch, args.context + args.widths), generator=torch.Generator().manual_seed(0))
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            model(input_ids=ids[:, : args.context], **{CACHE: cache}, use_cache=True, logits_to_keep=1)
        for n in range(1, args.widths + 1):
            block = ids[:, args.context : args.context + n]
            for fast in (True, False):  # warm-up (the first fast forward of a width measures its CPU paths)
                forward_seconds(model, cache, block, fast)
            ours, theirs = [], []
            for r in range(args.rounds):
                for fast in ((True, False) if r % 2 == 0 else (False, True)):
                    (ours if fast else theirs).append(forward_seconds(model, cache, block, fast))
            ratios = sorted(o / t for o, t in zip(ours, theirs))
            table[f"{batch}x{n}"] = {"batch": batch, "width": n, "ours_ms": 1000 * statistics.median(ours),
                                     "transformers_ms": 1000 * statistics.median(theirs),
                                     "ratio": statistics.median(ratios), "ratio_low": ratios[0], "ratio_high": ratios[-1]}
            row = table[f"{batch}x{n}"]
            print(f"batch {batch} width {n}: ours {row['ours_ms']:.1f} ms, transformers {row['transformers_ms']:.1f} ms,"
                  f" ratio {row['ratio']:.2f} ({row['ratio_low']:.2f}-{row['ratio_high']:.2f})", flush=True)
    batches = sorted({r["batch"] for r in table.values()})
    print("\n| width | " + " | ".join(f"batch {b}: ms ours / transformers (ratio)" for b in batches) + " |")
    print("|---|" + "---|" * len(batches))
    for n in range(1, args.widths + 1):
        cells = [table[f"{b}x{n}"] for b in batches]
        print(f"| {n} | " + " | ".join(f"{c['ours_ms']:.1f} / {c['transformers_ms']:.1f} ({c['ratio']:.2f}, "
                                       f"{c['ratio_low']:.2f}-{c['ratio_high']:.2f})" for c in cells) + " |")
    worst = max(table.values(), key=lambda r: r["ratio"])
    print(f"\nhighest ratio: {worst['ratio']:.2f} at batch {worst['batch']}, width {worst['width']}")
    result = {"args": vars(args), "rows": table}
    if args.json:
        write_json(result, args.json)
    return result


if __name__ == "__main__":
    main()
