"""Whether the target gives a token the same logits in a one-token step as in a forward of several tokens (what
greedy token-identity rests on): the default target, per quantization, on one chat prompt and its greedy answer.

    python benchmarks/row_invariance.py --quantizations none 8bit 4bit --tokens 12 --json benchmarks/results/row_invariance.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import DynamicCache

from hf_specdec.cache.keyword import CACHE
from hf_specdec.default_model import load_target

PROMPT = "Write a short poem about the sea and explain it."


@torch.no_grad()
def measure(quantization: str, tokens: int) -> dict:
    model, tokenizer = load_target("default", quantization)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    n = ids.shape[1]
    seq = model.generate(ids, max_new_tokens=tokens + 8, do_sample=False)[0]
    one_by_one, cache = [], DynamicCache()
    model(seq[None, :n], **{CACHE: cache}, use_cache=True)
    for t in range(n, n + tokens):  # what plain greedy decoding computes
        one_by_one.append(model(seq[None, t : t + 1], **{CACHE: cache}, use_cache=True).logits[0, -1])
    cache = DynamicCache()
    model(seq[None, :n], **{CACHE: cache}, use_cache=True)
    at_once = model(seq[None, n : n + tokens], **{CACHE: cache}, use_cache=True).logits[0]  # a verification forward
    one_by_one = torch.stack(one_by_one)
    top2 = one_by_one.topk(2, dim=-1).values
    return {"quantization": quantization, "tokens": tokens, "max_abs_logit_difference": float((one_by_one - at_once).abs().max()),
            "argmax_equal": bool(torch.equal(one_by_one.argmax(-1), at_once.argmax(-1))),
            "smallest_top2_gap": float((top2[:, 0] - top2[:, 1]).min())}


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quantizations", nargs="+", choices=["none", "8bit", "4bit"], default=["none", "8bit", "4bit"])
    p.add_argument("--tokens", type=int, default=12)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    rows = [measure(q, args.tokens) for q in args.quantizations]
    print(f"\n| target | max abs logit difference, {args.tokens} tokens at once vs one at a time | argmax equal | "
          "smallest top-2 gap |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['quantization']} | {r['max_abs_logit_difference']:.2g} | {r['argmax_equal']} | {r['smallest_top2_gap']:.3g} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "command": "python benchmarks/row_invariance.py "
                                               + " ".join(sys.argv[1:] if argv is None else argv)}, indent=2))
    return rows


if __name__ == "__main__":
    main()
