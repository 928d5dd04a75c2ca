"""Replay the target's plain greedy outputs of a repeated workload through the suffix drafter, with no model: tokens per
target forward with wider trees and flat verification costs (as on a GPU), beside this CPU's costs and n-gram lookup.

    python benchmarks/suffix_replay.py --workload humaneval --requests 60 --seen 24
    python benchmarks/suffix_replay.py --workload multiturn --requests 36 --seen 24

Requests go in order, the index starting empty. At each step the drafter grows its tree from the index and the
sequence so far (`SuffixDrafter.grow`) and sizes it against a verification cost (`--cpu-cost`: this CPU's, a one-token
forward plus a cost per drafted node, from `forward_cost.py` and the loop; "flat": no cut). Greedy verification accepts
the longest path of the tree that the coming tokens follow, plus the target's own token, as a real run does; the
drafter learns from it, and each finished request joins the index. A real run's figures differ only where its
measured costs differ from the model here. The plain outputs are generated once and cached (`--outputs`).
"""

from __future__ import annotations

import argparse
import json
import types
from pathlib import Path

from copy_bound import plain_outputs
from repeated_work import add_workload_arguments

from hf_specdec.drafters.ngram import NgramDrafter, NgramIndex
from hf_specdec.drafters.suffix import SuffixDrafter


def replay_suffix(outputs, budget: int, min_probability: float, cost) -> list[int]:
    """Target forwards per request."""
    drafter = SuffixDrafter(min_probability=min_probability, max_depth=budget)
    drafter.settings = types.SimpleNamespace(verify_cost=cost)
    forwards = []
    for prompt, answer in outputs:
        sequence, context, i, steps = NgramIndex(1, drafter.max_ngram, count=True), list(prompt), 0, 0
        while i < len(answer):
            sequence.extend(context[len(sequence) :])
            nodes = drafter._sized(drafter.grow(context, sequence, drafter.index.arrays, budget))
            path, node = set(), -1
            for token in answer[i:]:  # the accepted path: the coming tokens followed down the tree
                node = next((k for k, n in enumerate(nodes) if n.parent == node and n.token == token), None)
                if node is None:
                    break
                path.add(node)
            if nodes:
                drafter.acceptance.record(nodes, path)
            emitted = min(len(path) + 1, len(answer) - i)
            context += answer[i : i + emitted]
            i, steps = i + emitted, steps + 1
        drafter.index.add(context)
        forwards.append(steps)
    return forwards


def replay_ngram(outputs, k: int = 16) -> list[int]:
    """N-gram lookup at a constant cap of k, with its own settings and caps after short matches (no step-cost
    sizing)."""
    ngram = NgramDrafter()
    caps = ngram.max_tokens_by_match
    forwards = []
    for prompt, answer in outputs:
        index, context, i, steps = ngram._new_index(), list(prompt), 0, 0
        while i < len(answer):
            index.extend(context[len(index) :])
            proposal, matched = index.propose(k, ngram.strategy)
            proposal = proposal[: caps[matched - 1]] if 0 < matched <= len(caps) else proposal
            accepted = 0
            while accepted < len(proposal) and i + accepted < len(answer) and proposal[accepted] == answer[i + accepted]:
                accepted += 1
            emitted = min(accepted + 1, len(answer) - i)
            context += answer[i : i + emitted]
            i, steps = i + emitted, steps + 1
        forwards.append(steps)
    return forwards


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_arguments(parser, max_new_tokens=96)
    parser.add_argument("--budgets", default="16,32,64,128", help="tree sizes replayed with flat costs")
    parser.add_argument("--cpu-cost", default="0.058,0.0033",
                        help="seconds of a one-token verification, and per drafted node, on this CPU")
    parser.add_argument("--seen", type=int, default=24, help="also over the requests after the first SEEN")
    parser.add_argument("--outputs", default=None, help="where the plain outputs are cached (JSON)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    cache = Path(args.outputs or Path.home() / ".cache" / "hf_specdec" / "replay" /
                 f"{args.workload}-{args.requests}-{args.max_new_tokens}.json")
    if cache.exists():
        outputs = json.loads(cache.read_text())
    else:
        outputs = plain_outputs(args.workload, args.requests, args.max_new_tokens, args.threads)
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(outputs))
    one, per_node = map(float, args.cpu_cost.split(","))
    rows = {"ngram, k <= 16 (constant)": replay_ngram(outputs),
            "suffix as shipped, this CPU's costs": replay_suffix(outputs, 16, 0.1, lambda n: one + per_node * n)}
    for budget in map(int, args.budgets.split(",")):
        rows[f"suffix, {budget} nodes, flat costs"] = replay_suffix(outputs, budget, min(0.1, 1 / budget), None)
    tokens = [len(answer) for _, answer in outputs]
    seen = min(args.seen, len(outputs) - 1)
    ngram = "ngram, k <= 16 (constant)"
    per = lambda forwards, a=0: sum(tokens[a:]) / sum(forwards[a:])  # noqa: E731
    print(f"{args.workload}: {len(outputs)} requests replayed, {args.max_new_tokens} new tokens at most\n")
    print(f"| drafter | tokens per target forward | after {seen} requests | against n-gram's, after {seen} |")
    print("|---|---|---|---|")
    report = {}
    for name, forwards in rows.items():
        report[name] = {"tokens_per_forward": per(forwards), "after_seen": per(forwards, seen),
                        "vs_ngram_after_seen": per(forwards, seen) / per(rows[ngram], seen), "forwards": forwards}
        r = report[name]
        print(f"| {name} | {r['tokens_per_forward']:.2f} | {r['after_seen']:.2f} | {r['vs_ngram_after_seen']:.2f}x |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"settings": vars(args), "tokens": tokens, "rows": report}, indent=1))


if __name__ == "__main__":
    main()
