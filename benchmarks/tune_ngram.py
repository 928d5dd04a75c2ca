"""Tune the n-gram drafter offline: replay greedy decoding from the target's plain greedy outputs.

Greedy speculative decoding emits exactly the plain greedy tokens, so for a deterministic drafter the whole run is
determined by those tokens: at each step the drafter proposes from the current prefix, the accepted count is the
longest prefix of the proposal that agrees with the plain output, and one more token comes from the target. This
script replays that for many drafter settings in seconds, and prices each verification forward with a cost table
measured on the real target (seconds per forward as a function of the number of tokens fed), to pick settings for the
wall-clock benchmark (benchmarks/ngram_vs_prompt_lookup.py), which then measures them for real.

    python benchmarks/tune_ngram.py --plain-json benchmarks/results/plain_outputs.json   # makes it if missing
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch

from hf_specdec.cache.keyword import CACHE

ROOT = Path(__file__).resolve().parent.parent


def chat_ids(tokenizer, prompt):
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]


def plain_outputs(path: Path, max_new_tokens: int):
    if path.exists():
        return json.loads(path.read_text())
    from hf_specdec import load_default_target

    model, tokenizer = load_default_target()
    rows = [json.loads(line) for line in (ROOT / "examples" / "input_grounded_prompts.jsonl").open()]
    out = []
    for row in rows:
        ids = chat_ids(tokenizer, row["prompt"])
        seq = model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens)
        out.append({"id": row["id"], "prompt_ids": ids[0].tolist(), "output_ids": seq[0, ids.shape[1] :].tolist()})
        print(row["id"], len(out[-1]["output_ids"]), flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    return out


@torch.no_grad()
def cost_table(max_tokens: int = 17, context: int = 350, repeats: int = 7) -> dict[int, float]:
    """Median seconds of one target forward feeding m tokens after `context` cached ones, as decoding.py runs it."""
    from transformers import DynamicCache

    from hf_specdec import load_default_target
    from hf_specdec.speed.cpu_matmul import fast_linear

    model, _ = load_default_target()
    ids = torch.randint(100, 40000, (1, context + max_tokens))
    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :context], **{CACHE: cache}, use_cache=True)
    table = {}
    for m in range(1, max_tokens + 1):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            with fast_linear(model):
                model(
                    input_ids=ids[:, context : context + m], **{CACHE: cache}, use_cache=True, logits_to_keep=m,
                    position_ids=torch.arange(context, context + m)[None],
                )
            times.append(time.perf_counter() - t0)
            cache.crop(-m)
        table[m] = sorted(times)[len(times) // 2]
    return table


def replay(record, make_drafter, k: int):
    """(target forwards, emitted tokens, list of tokens fed per forward) of a greedy speculative run."""
    prompt, output = record["prompt_ids"], record["output_ids"]
    drafter = make_drafter()
    sequence = list(prompt)
    done, forwards, fed = 0, 0, []
    while done < len(output):
        max_draft = min(k, len(output) - done - 1)  # as decoding.py: never draft past the end
        draft = drafter.propose(torch.tensor([sequence]), max_draft).tokens[0].tolist() if max_draft > 0 else []
        n = 0
        while n < len(draft) and draft[n] == output[done + n]:
            n += 1
        fed.append(len(draft) + 1)
        forwards += 1
        sequence += output[done : done + n + 1]
        done += n + 1
    return forwards, len(output), fed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--plain-json", default=str(ROOT / "benchmarks" / "results" / "plain_outputs.json"))
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--costs", default=None, help="JSON cost table to reuse (else measured)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from hf_specdec.drafters.ngram import NgramDrafter

    records = plain_outputs(Path(args.plain_json), args.max_new_tokens)
    if args.costs and Path(args.costs).exists():
        costs = {int(m): s for m, s in json.loads(Path(args.costs).read_text()).items()}
    else:
        costs = cost_table()
        if args.costs:
            Path(args.costs).write_text(json.dumps(costs))
    print("cost per forward (ms) by tokens fed:", {m: round(s * 1e3, 1) for m, s in costs.items()})

    def price(fed):
        return sum(costs[min(m, max(costs))] for m in fed)

    plain_time = sum(price([1] * len(r["output_ids"])) for r in records)

    def evaluate(make_drafter, k):
        forwards = tokens = 0
        cost = 0.0
        for record in records:
            f, t, fed = replay(record, make_drafter, k)
            forwards += f
            tokens += t
            cost += price(fed)
        return plain_time / cost, tokens / forwards

    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    from hf_specdec.drafters.base import CandidateGeneratorDrafter

    for num in (3, 10):  # transformers' prompt lookup, priced with OUR verification costs (it has slower ones)
        speedup, mat = evaluate(
            lambda: CandidateGeneratorDrafter(PromptLookupCandidateGenerator(num_output_tokens=num, max_length=10**6)), num
        )
        print(f"prompt_lookup_num_tokens={num}: est. speed-up {speedup:.3f}  tokens/forward {mat:.3f}")

    results = []
    caps_grid = [()] + [
        c for c in itertools.product([0, 1, 3], [1, 3, 8], [3, 16]) if c[0] <= c[1] <= c[2]
    ]
    for strategy, max_n, k, caps in itertools.product(["recent", "frequent"], [4, 8], [8, 10, 16], caps_grid):
        kwargs = dict(min_ngram=1, max_ngram=max_n, strategy=strategy, max_tokens_by_match=caps)
        speedup, mat = evaluate(lambda: NgramDrafter(**kwargs), k)
        results.append((speedup, mat, k, kwargs))
    results.sort(key=lambda r: -r[0])
    print("best estimated speed-up:")
    for speedup, mat, k, kwargs in results[:15]:
        print(f"est. speed-up {speedup:.3f}  tokens/forward {mat:.3f}  k={k}  {kwargs}")
    print("best tokens/forward:")
    for speedup, mat, k, kwargs in sorted(results, key=lambda r: -r[1])[:8]:
        print(f"est. speed-up {speedup:.3f}  tokens/forward {mat:.3f}  k={k}  {kwargs}")


if __name__ == "__main__":
    main()
