"""The speculative loop's own cost per step, against transformers' assisted loop with the same drafter.

A tiny random Llama target (its forward takes well under a millisecond) drafts with a copy of itself, so every draft
is accepted: what a step costs beyond the forwards both loops make is bookkeeping. Steps are counted as target
forwards (a hook on the target), so each loop is charged for the steps it really takes (transformers' assisted loop
emits fewer tokens per step than k + 1 even when every draft is accepted). At batch 8 transformers' assisted loop does
not run (it is batch 1 only), so the batch-8 row compares with plain batched greedy decoding. Also lists the host
reads (syncs on a GPU) a step makes, by the line that makes them, and the same loop with the drafter's forward
compiled (`compile_drafter=True`).

    python benchmarks/loop_overhead.py --json benchmarks/results/loop_overhead.json
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_specdec import SpeculationStats, speculative_generate
from hf_specdec.speed.diagnostics import count_forwards, count_host_syncs


def tiny_target(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, bos_token_id=1,
                         eos_token_id=None, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def timed(fns: dict, repeats: int) -> dict:
    """Seconds of each function in every round, the functions interleaved call by call (machine noise hits all alike:
    this machine's speed drifts by tens of percent within minutes, so ratios are taken round by round)."""
    for fn in fns.values():
        fn()  # warm-up
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def measure(batch: int, k: int, new_tokens: int, repeats: int, compiled: bool) -> dict:
    target = tiny_target()
    drafter = copy.deepcopy(target)  # agrees with the target on every token
    prompt = torch.randint(2, 256, (batch, 16), generator=torch.Generator().manual_seed(batch))
    common = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    ours = lambda: target.generate(prompt, custom_generate=speculative_generate, assistant=drafter,  # noqa: E731
                                   num_draft_tokens=k, **common, draft_length="constant")
    stats = SpeculationStats()
    target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=k,
                    speculation_stats=stats, **common, draft_length="constant")
    assert stats.accepted_tokens == stats.drafted_tokens, stats.as_dict()
    plain = lambda: target.generate(prompt, **common)  # noqa: E731
    runs = {"ours": ours, "plain": plain}
    if compiled:  # the same loop, the drafter's forward compiled (its first call, the warm-up, compiles)
        runs["compiled"] = lambda: target.generate(prompt, custom_generate=speculative_generate, assistant=drafter,
                                                   num_draft_tokens=k, **common, draft_length="constant",
                                                   compile_drafter=True)
    if batch == 1:  # transformers' assisted decoding is batch 1 only
        drafter.generation_config.num_assistant_tokens = k
        drafter.generation_config.num_assistant_tokens_schedule = "constant"
        drafter.generation_config.assistant_confidence_threshold = 0.0
        runs["theirs"] = lambda: target.generate(prompt, assistant_model=drafter, **common)
    steps = {name: count_forwards(target, fn) for name, fn in runs.items()}
    rounds = timed(runs, repeats)
    seconds = {name: statistics.median(t) for name, t in rounds.items()}
    row = {"batch": batch, "k": k, "new_tokens": new_tokens, "hf_specdec_steps": steps["ours"],
           "hf_specdec_ms_per_step": 1000 * seconds["ours"] / steps["ours"],
           "hf_specdec_ms_per_token": 1000 * seconds["ours"] / new_tokens,
           "plain_ms_per_token_step": 1000 * seconds["plain"] / new_tokens}
    if "theirs" in runs:
        row.update(transformers_steps=steps["theirs"],
                   transformers_assisted_ms_per_step=1000 * seconds["theirs"] / steps["theirs"],
                   transformers_assisted_ms_per_token=1000 * seconds["theirs"] / new_tokens)
        # the median of the rounds' ratios (each round times both loops within a second of each other)
        row["ratio_per_step"] = statistics.median(
            (ours / steps["ours"]) / (theirs / steps["theirs"]) for ours, theirs in zip(rounds["ours"], rounds["theirs"]))
    if compiled:
        row.update(compiled_drafter_steps=steps["compiled"],
                   compiled_drafter_ms_per_step=1000 * seconds["compiled"] / steps["compiled"])
        if "theirs" in runs:
            row["compiled_drafter_ratio_per_step"] = statistics.median(
                (ours / steps["compiled"]) / (theirs / steps["theirs"])
                for ours, theirs in zip(rounds["compiled"], rounds["theirs"]))
    with count_host_syncs(where=True) as syncs:
        ours()
    row["host_reads_per_step"] = syncs.total / steps["ours"]
    row["host_reads_by_line"] = {place: n / steps["ours"] for place, n in syncs.by_place.most_common()}
    return row


class PhaseTimer:
    """Host seconds spent inside wrapped functions, by phase (a wrapper costs about a microsecond per call)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def wrap(self, owner, name: str, phase: str):
        original = getattr(owner, name)

        @functools.wraps(original)  # (generate() reads a custom_generate callable's signature)
        def timed_call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed_call)
        return original


def phases(batch: int, k: int, new_tokens: int, repeats: int) -> dict:
    """Where an hf_specdec step's time goes: ms per step in the drafter's forwards, the rest of drafting, the target's
    verification forward, the rest of verifying (processors, the rule, the cache's roll-back), and the loop's own
    bookkeeping (everything else: the step's host transfer, emitting, statistics, the policy)."""
    import hf_specdec.generation.loop as loop_module
    import hf_specdec.generation.step as step_module
    from hf_specdec.cache.ragged import RaggedKV
    from hf_specdec.kinds.draft_model.drafter import DraftModelDrafter
    from hf_specdec.generation.verification import AcceptRule

    target = tiny_target()
    drafter = copy.deepcopy(target)
    prompt = torch.randint(2, 256, (batch, 16), generator=torch.Generator().manual_seed(batch))
    common = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    timer, hooks, forward_start = PhaseTimer(), [], {}

    def before(module, args, kwargs):
        forward_start[id(module)] = time.perf_counter()

    def after(module, args, kwargs, output):
        phase = "target forward" if module is target else "drafter forwards"
        timer.seconds[phase] = timer.seconds.get(phase, 0.0) + time.perf_counter() - forward_start[id(module)]

    for model in (target, drafter):
        hooks += [model.register_forward_pre_hook(before, with_kwargs=True),
                  model.register_forward_hook(after, with_kwargs=True)]
    originals = [(DraftModelDrafter, "propose", timer.wrap(DraftModelDrafter, "propose", "draft")),
                 (step_module, "process_block", timer.wrap(step_module, "process_block", "accept")),
                 (RaggedKV, "keep", timer.wrap(RaggedKV, "keep", "accept")),
                 (AcceptRule, "__call__", timer.wrap(AcceptRule, "__call__", "accept")),
                 (loop_module, "speculative_step", timer.wrap(loop_module, "speculative_step", "step")),
                 (loop_module, "emit", timer.wrap(loop_module, "emit", "emit")),
                 (loop_module, "speculative_generate", timer.wrap(loop_module, "speculative_generate", "call"))]
    try:
        run = lambda: target.generate(prompt, custom_generate=loop_module.speculative_generate, assistant=drafter,  # noqa: E731
                                      num_draft_tokens=k, **common, draft_length="constant")
        run()  # warm-up
        timer.seconds.clear()
        steps = 0
        for _ in range(repeats):
            steps += count_forwards(target, run)
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
        for hook in hooks:
            hook.remove()
    t = {name: 1000 * value / steps for name, value in timer.seconds.items()}
    draft_other = t.get("draft", 0) - t.get("drafter forwards", 0)
    verify_other = t["step"] - t.get("draft", 0) - t.get("target forward", 0) - t.get("accept", 0)
    return {"batch": batch, "the whole step (timers on)": t["call"], "drafter forwards": t.get("drafter forwards", 0),
            "drafting, the rest": draft_other, "target forward": t.get("target forward", 0),
            "accept (processors, rule, cache roll-back)": t.get("accept", 0),
            "step bookkeeping (verify call, host transfer)": verify_other, "emit (append, stats, policy, drop rows)": t["emit"],
            "call set-up and finish": t["call"] - t["step"] - t["emit"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=250)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    parser.add_argument("--no-compiled", action="store_true",
                        help="skip the run with compile_drafter=True (its warm-up compiles: about a minute)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [measure(int(b), args.k, args.new_tokens, args.repeats, not args.no_compiled)
            for b in args.batch_sizes.split(",")]
    print("| batch | hf_specdec: steps, ms per step, ms per token | transformers assisted: steps, ms per step, "
          "ms per token | per-step ratio | plain ms per token step | host reads per step |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ours = f"{r['hf_specdec_steps']}, {r['hf_specdec_ms_per_step']:.2f}, {r['hf_specdec_ms_per_token']:.2f}"
        theirs = ("n/a (batch 1 only)" if "transformers_steps" not in r else
                  f"{r['transformers_steps']}, {r['transformers_assisted_ms_per_step']:.2f}, "
                  f"{r['transformers_assisted_ms_per_token']:.2f}")
        ratio = f"{r['ratio_per_step']:.2f}" if "ratio_per_step" in r else "n/a"
        print(f"| {r['batch']} | {ours} | {theirs} | {ratio} | {r['plain_ms_per_token_step']:.2f} "
              f"| {r['host_reads_per_step']:.1f} |")
    if not args.no_compiled:
        print("\nThe same loop with compile_drafter=True (the drafter's forward compiled; transformers' loop as above):")
        print("| batch | hf_specdec, compiled drafter: steps, ms per step | per-step ratio |")
        print("|---|---|---|")
        for r in rows:
            ratio = f"{r['compiled_drafter_ratio_per_step']:.2f}" if "compiled_drafter_ratio_per_step" in r else "n/a"
            print(f"| {r['batch']} | {r['compiled_drafter_steps']}, {r['compiled_drafter_ms_per_step']:.2f} | {ratio} |")
    for r in rows:
        print(f"\nhost reads per step at batch {r['batch']}:")
        for place, n in r["host_reads_by_line"].items():
            print(f"  {n:5.2f}  {place}")
    breakdown = [phases(int(b), args.k, args.new_tokens, max(3, args.repeats // 3)) for b in args.batch_sizes.split(",")]
    names = [n for n in breakdown[0] if n not in ("batch",)]
    print("\nhf_specdec's step by phase, ms per step (timers around each phase; the drafter is a copy of the target):")
    print("| phase | " + " | ".join(f"batch {r['batch']}" for r in breakdown) + " |")
    print("|---|" + "---|" * len(breakdown))
    for name in names:
        print(f"| {name} | " + " | ".join(f"{r[name]:.2f}" for r in breakdown) + " |")
    if args.json:
        from pathlib import Path

        rows = [{**r, "phases": b} for r, b in zip(rows, breakdown)]

        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"settings": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
