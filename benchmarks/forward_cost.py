"""What a target forward of n new tokens costs on this machine, T(n) / T(1), for n = 1..16, through three matmul paths:
stock `F.linear` (what plain `generate()` runs), the fixed rule hf_specdec used before (`W @ x.T` for 2..8 rows), and
today's `fast_linear` (each layer's fastest path per row count, measured here and cached). Also prints which path each
row count takes for each distinct layer shape.

    python benchmarks/forward_cost.py --json benchmarks/results/forward_cost.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache

from hf_specdec import load_default_target
from hf_specdec.cache.keyword import CACHE
from hf_specdec.speed.cpu_matmul import CHOICES, fast_linear

_linear = nn.Linear.forward


def _fixed_rule(self, x):  # hf_specdec's earlier rule: W @ x.T for 2..8 rows, F.linear otherwise
    rows = x.numel() // x.shape[-1]
    if not 2 <= rows <= 8:
        return _linear(self, x)
    out = (self.weight @ x.reshape(rows, x.shape[-1]).T).T
    out = out if self.bias is None else out + self.bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


@contextlib.contextmanager
def fixed_rule():
    nn.Linear.forward = _fixed_rule
    try:
        yield
    finally:
        nn.Linear.forward = _linear


def paths(model) -> dict:
    return {"stock F.linear": contextlib.nullcontext, "fixed rule (before)": fixed_rule,
            "fast_linear (now)": lambda: fast_linear(model)}


@torch.no_grad()
def forward_ms(model, n: int, context: int, path, repeats: int) -> float:
    vocab = model.config.vocab_size
    prefix = torch.randint(0, vocab, (1, context))
    times = []
    for _ in range(repeats):
        cache = DynamicCache(config=model.config)
        model(input_ids=prefix, **{CACHE: cache}, use_cache=True, logits_to_keep=1)
        new = torch.randint(0, vocab, (1, n))
        with path():
            start = time.perf_counter()
            model(input_ids=new, **{CACHE: cache}, use_cache=True, logits_to_keep=n)
            times.append(time.perf_counter() - start)
    return 1000 * min(times)  # the least disturbed run: this machine's timings are noisy


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    model, _ = load_default_target()
    PATHS = paths(model)
    sizes = list(range(1, args.max_tokens + 1))
    with fast_linear(model):  # calibrate every shape and row count first, so that the timings below are steady
        for n in sizes:
            forward_ms(model, n, args.context, contextlib.nullcontext, 1)
    table = {name: {} for name in PATHS}
    for n in sizes:  # the paths interleaved, size by size
        for name, path in PATHS.items():
            table[name][n] = forward_ms(model, n, args.context, path, args.repeats)
    base = table["stock F.linear"][1]
    print(f"target forward on a {args.context}-token cache, fastest of {args.repeats} (ms, and / stock T(1))\n")
    print("| new tokens | " + " | ".join(PATHS) + " |")
    print("|---|" + "---|" * len(PATHS))
    for n in sizes:
        print(f"| {n} | " + " | ".join(f"{table[name][n]:.1f} ({table[name][n] / base:.2f})" for name in PATHS) + " |")
    threads = torch.get_num_threads()
    choices = {f"{out}x{inp}": {rows: CHOICES[key] for key in CHOICES if key[:2] == (out, inp) and key[4] == threads
                                for rows in [key[2]]}
               for (out, inp, *_) in sorted(set(CHOICES))}
    print("\npath per layer shape (out x in) and row count:")
    for shape, by_rows in choices.items():
        print(f"  {shape}: " + ", ".join(f"{rows}: {path}" for rows, path in sorted(by_rows.items())))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"settings": vars(args), "ms": table, "paths": choices}, indent=2))


if __name__ == "__main__":
    main()
