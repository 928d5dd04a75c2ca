"""How many tokens per target forward ANY drafter that copies earlier text could reach on the repeated workloads: an
upper bound for n-gram lookup and suffix decoding alike, from the target's plain greedy outputs.

    python benchmarks/copy_bound.py --workload multiturn --requests 15 --max-new-tokens 96

For each request in order, an oracle that knows the answer drafts, at every step, the longest run of the coming
tokens that occurs anywhere in the earlier requests (prompts and answers) or in the current sequence so far (a run
may overlap the present, as a periodic copy does), at most `--cap` tokens; the step emits those plus the target's
own token. No copying drafter does better: each of its accepted drafts is such a run, and it must also guess which.
Printed beside the measured tokens per forward of n-gram lookup and suffix decoding from `repeated_work.py`'s JSON
(`--measured`), if given: where the bound stays under 1.5x n-gram lookup's figure, no copying drafter reaches it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from repeated_work import add_workload_arguments, requests_in_order


def plain_outputs(workload: str, requests: int, max_new_tokens: int, threads: int) -> list[tuple[list, list]]:
    """(prompt ids, answer ids) of each request, plain greedy, in order (multi-turn replayed with the answers)."""
    import hf_specdec

    torch.set_num_threads(threads)
    target, tokenizer = hf_specdec.load_default_target()
    out = []
    chats = requests_in_order(workload, requests)
    chat = next(chats)
    while chat is not None:
        enc = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        ids = target.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)[0].tolist()
        prompt, answer = ids[: enc["input_ids"].shape[1]], ids[enc["input_ids"].shape[1] :]
        out.append((prompt, answer))
        chat = chats.send(tokenizer.decode(answer, skip_special_tokens=True))
    return out


def as_text(tokens: list[int]) -> str:
    """One character per token (ids shifted past the separator), so that substring search finds runs of tokens."""
    return "".join(chr(t + 2) for t in tokens)


SEPARATOR = chr(1)


def bound_forwards(earlier: str, prompt: list[int], answer: list[int], cap: int) -> int:
    """Target forwards the oracle needs for `answer` (see the module docstring); `earlier`: the earlier requests."""
    sequence, p = as_text(prompt + answer), len(prompt)
    i = forwards = 0
    while i < len(answer):
        length = 0
        while length < cap and i + length < len(answer):
            run = sequence[p + i : p + i + length + 1]
            # in an earlier request, or starting before the present (sequence[:p + i + length] holds every such run)
            if run not in earlier and run not in sequence[: p + i + length]:
                break
            length += 1
        forwards += 1
        i += length + 1
    return forwards


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_arguments(parser, max_new_tokens=96)
    parser.add_argument("--cap", type=int, default=16, help="the most tokens drafted per step (the suffix drafter's)")
    parser.add_argument("--measured", default=None, help="repeated_work.py's JSON of the same workload and requests")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    outputs = plain_outputs(args.workload, args.requests, args.max_new_tokens, args.threads)
    tokens, forwards = {}, {}
    for cap in (args.cap, args.max_new_tokens):
        earlier = ""
        tokens[cap], forwards[cap] = [], []
        for prompt, answer in outputs:
            tokens[cap].append(len(answer))
            forwards[cap].append(bound_forwards(earlier, prompt, answer, cap))
            earlier += SEPARATOR + as_text(prompt + answer)
    n = len(outputs)
    slices = [(a, min(a + max(n // 6, 1), n)) for a in range(0, n, max(n // 6, 1))]
    per = lambda t, f, a, b: sum(t[a:b]) / max(sum(f[a:b]), 1)  # noqa: E731
    rows = {f"copy bound, {cap} tokens a step": {"tokens_per_forward": per(tokens[cap], forwards[cap], 0, n),
                                                 "curve": [per(tokens[cap], forwards[cap], a, b) for a, b in slices]}
            for cap in tokens}
    if args.measured:
        measured = json.loads(Path(args.measured).read_text())["rows"]
        for name in ("ngram", "suffix", "suffix+medusa:chain"):
            if name in measured:
                row = measured[name]
                rows[f"measured: {name}"] = {"tokens_per_forward": row["tokens_per_forward"],
                                             "curve": [c["tokens_per_forward"] for c in row["curve"]]}
    heads = " / ".join(f"after {a}" for a, _ in slices)
    print(f"{args.workload}: {n} requests, {args.max_new_tokens} new tokens at most\n")
    print(f"| drafter | tokens per target forward | by requests seen: {heads} |\n|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['tokens_per_forward']:.2f} | {' / '.join(f'{v:.2f}' for v in row['curve'])} |")
    if "measured: ngram" in rows:
        ngram = rows["measured: ngram"]["tokens_per_forward"]
        print(f"\n1.5x n-gram lookup's tokens per forward: {1.5 * ngram:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
