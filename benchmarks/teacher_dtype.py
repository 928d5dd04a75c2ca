"""What a bf16 teacher costs and what it changes, for the default fp32 target: the teacher-forced forward's tokens/s
in fp32 and in a bf16 copy (interleaved rounds), and how far the bf16 copy's next-token distributions are from the
fp32 target's on ShareGPT text (top-1 agreement, KL, total variation, top-32 overlap), the data `--teacher-dtype
bfloat16` makes.

    python -m benchmarks.teacher_dtype --texts 16 --length 256 --rounds 3 --threads 2 --json benchmarks/results/teacher_dtype.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch

from hf_specdec.default_model import load_target
from hf_specdec.training.sources import as_example, iter_json_list, render, sharegpt_path


def texts(tokenizer, count: int, length: int) -> torch.Tensor:
    """The first `count` ShareGPT prompt + answer pairs, rendered as the trainer scores them, at least `length` tokens
    long, cut to `length`."""
    rows = []
    for index, record in enumerate(iter_json_list(sharegpt_path())):
        example, _ = as_example(record, index)
        if example is None or example["response"] is None:
            continue
        _, ids = render(tokenizer, example["messages"], example["response"])
        if len(ids) >= length:
            rows.append(ids[:length])
        if len(rows) == count:
            return torch.tensor(rows)
    raise SystemExit(f"only {len(rows)} conversations of {length}+ tokens")


@torch.no_grad()
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    fp32, tokenizer = load_target("default")
    bf16, _ = load_target("default", dtype=torch.bfloat16)  # loaded from the files, as the trainer's teacher is
    ids = texts(tokenizer, args.texts, args.length)
    batches = ids.split(args.batch_size)
    seconds = {"float32": 0.0, "bfloat16": 0.0}
    logprobs = {}
    for _, (name, model) in itertools.product(range(args.rounds), [("float32", fp32), ("bfloat16", bf16)]):
        start, out = time.perf_counter(), []
        for batch in batches:
            out.append(model(batch).logits.float().log_softmax(-1))
        seconds[name] += time.perf_counter() - start
        logprobs[name] = torch.cat(out)
    p, q = logprobs["float32"], logprobs["bfloat16"]
    overlap = (p.topk(32, -1).indices[..., :, None] == q.topk(32, -1).indices[..., None, :]).any(-1).float().mean()
    tokens = ids.numel() * args.rounds
    result = {
        "texts": args.texts, "length": args.length, "batch_size": args.batch_size, "rounds": args.rounds,
        "threads": args.threads,
        "tokens_per_second": {name: tokens / s for name, s in seconds.items()},
        "top1_agreement": float((p.argmax(-1) == q.argmax(-1)).float().mean()),
        "mean_kl_fp32_to_bf16": float((p.exp() * (p - q)).sum(-1).mean()),
        "mean_total_variation": float(0.5 * (p.exp() - q.exp()).abs().sum(-1).mean()),
        "top32_overlap": float(overlap),
    }
    speed = result["tokens_per_second"]
    print("| teacher | forward tokens/s | top-1 agreement with fp32 | mean KL(fp32 || it) | mean TV | top-32 overlap |")
    print("|---|---|---|---|---|---|")
    print(f"| float32 (the target) | {speed['float32']:.0f} | 1 | 0 | 0 | 1 |")
    print(f"| bfloat16 copy | {speed['bfloat16']:.0f} | {result['top1_agreement']:.4f} | {result['mean_kl_fp32_to_bf16']:.2e} "
          f"| {result['mean_total_variation']:.4f} | {result['top32_overlap']:.4f} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
