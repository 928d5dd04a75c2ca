"""The drafters transformers itself ships, through transformers' own path and through hf_specdec's loop, side by side.

For each kind, one tiny random instance (built as tests/transformers_drafters.py builds them: an MTP layer in a
2-layer DeepSeek-V3's checkpoint, a Gemma 4 assistant of a 2-layer Gemma 4, a DFlash drafter trained for 150 steps on
a tiny Llama's greedy continuations of the prompts below), decoding the same prompts greedily:

- plain greedy `generate()`;
- transformers' path: `use_mtp=True`, `assistant_model=` (Gemma 4), `assistant_model=..., speculation_type="dflash"`,
  each at its fixed draft length (1, the assistant's `num_assistant_tokens`, block_size - 1);
- hf_specdec at that same constant length, and at its default (`draft_length="adaptive"`), batch 1;
- hf_specdec with the prompts as one left-padded batch (transformers' paths are batch 1 only).

Tokens per target forward come from a hook counting the target's forwards (per row in the batch, from
`speculation_stats`); ms per step is the call's time over the target's forwards; times are medians of rounds that interleave
the methods call by call. The targets are tiny (a forward costs well under a millisecond on this CPU), so time per
step is mostly each loop's own bookkeeping: the speed-ups say nothing of a real model, where the target's forward
dominates; the tokens per forward and the time per step do carry over.

    python benchmarks/transformers_drafters.py --json benchmarks/results/transformers_drafters.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tiny builders the tests use

from hf_specdec import SpeculationStats, speculative_generate  # noqa: E402
from hf_specdec.diagnostics import count_forwards  # noqa: E402
from tests.conftest import random_prompts, tiny_llama  # noqa: E402
from tests.speculation import PAD, left_pad, quiet_last_layer  # noqa: E402
from tests.transformers_drafters import tiny_deepseek_with_mtp, tiny_gemma4_with_assistant, trained_dflash  # noqa: E402


def kinds(folder: str) -> dict:
    """name -> (target, hf_specdec's assistant, transformers' keywords, the fixed length transformers drafts, prompts)."""
    from transformers.modeling_layers import MtpModel

    deepseek = tiny_deepseek_with_mtp(folder)
    mtp_prompts = random_prompts(6, vocab=32, seed=5)
    gemma4, assistant = tiny_gemma4_with_assistant()
    prompts = random_prompts(6, vocab=16, seed=5)
    llama = quiet_last_layer(tiny_llama(vocab=16, seed=0))
    dflash = trained_dflash(llama, prompts)
    return {
        "mtp (DeepSeek-V3)": (deepseek, MtpModel.from_pretrained(deepseek).eval(), {"use_mtp": True}, 1, mtp_prompts),
        "gemma4 assistant": (gemma4, assistant, {"assistant_model": assistant},
                             assistant.generation_config.num_assistant_tokens, prompts),
        "dflash": (llama, dflash, {"assistant_model": dflash, "speculation_type": "dflash"},
                   dflash.config.block_size - 1, prompts),
    }


def measure(name, target, assistant, theirs_kwargs, length, prompts, new_tokens, repeats) -> list[dict]:
    common = dict(max_new_tokens=new_tokens, do_sample=False)
    ours = dict(custom_generate=speculative_generate, assistant=assistant)
    methods = {
        "plain greedy": lambda p: target.generate(p, **common),
        "transformers' path": lambda p: target.generate(p, **common, **theirs_kwargs),
        f"hf_specdec, k = {length}": lambda p: target.generate(p, **common, **ours, num_draft_tokens=length,
                                                              draft_length="constant"),
        "hf_specdec, adaptive": lambda p: target.generate(p, **common, **ours),
    }
    rows = []
    expected = [methods["plain greedy"](p) for p in prompts]
    for method, fn in methods.items():
        assert all(torch.equal(fn(p), e) for p, e in zip(prompts, expected)), f"{name}: {method} changed the output"
    forwards = {m: sum(count_forwards(target, lambda p=p, fn=fn: fn(p)) for p in prompts) for m, fn in methods.items()}
    rounds = {m: [] for m in methods}
    for _ in range(repeats):  # interleaved: each round times every method on every prompt
        for m, fn in methods.items():
            start = time.perf_counter()
            for p in prompts:
                fn(p)
            rounds[m].append(time.perf_counter() - start)
    tokens = new_tokens * len(prompts)
    plain = statistics.median(rounds["plain greedy"])
    for m in methods:
        seconds = statistics.median(rounds[m])
        rows.append({"kind": name, "method": m, "batch": 1, "tokens_per_target_forward": tokens / forwards[m],
                     "ms_per_step": 1000 * seconds / forwards[m], "tokens_per_second": tokens / seconds,
                     "speedup_vs_plain": plain / seconds, "identical": True})
    ids, mask = left_pad(prompts)
    batch = dict(attention_mask=mask, pad_token_id=PAD, **common)
    expected = target.generate(ids, **batch)
    out = target.generate(ids, **batch, **ours, num_draft_tokens=length, draft_length="constant")
    assert torch.equal(out, expected), f"{name}: the batch changed the output"
    stats = SpeculationStats()  # per row: a sliding-window target's batch decodes row by row
    steps = count_forwards(target, lambda: target.generate(ids, **batch, **ours, num_draft_tokens=length,
                                                           draft_length="constant", speculation_stats=stats))
    times = {"plain": [], "ours": []}
    for _ in range(repeats):
        for key, fn in (("plain", lambda: target.generate(ids, **batch)),
                        ("ours", lambda: target.generate(ids, **batch, **ours, num_draft_tokens=length,
                                                         draft_length="constant"))):
            start = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - start)
    seconds = statistics.median(times["ours"])
    rows.append({"kind": name, "method": f"hf_specdec, k = {length}, one batch", "batch": len(prompts),
                 "tokens_per_target_forward": stats.emitted_tokens / stats.target_forwards, "ms_per_step": 1000 * seconds / steps,
                 "tokens_per_second": tokens / seconds, "speedup_vs_plain": statistics.median(times["plain"]) / seconds,
                 "identical": True})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, spec in kinds(folder).items():
            rows += measure(name, *spec, args.new_tokens, args.repeats)
    print("| kind | method | batch | tokens / target forward | ms / step | tokens/s | vs plain |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kind']} | {r['method']} | {r['batch']} | {r['tokens_per_target_forward']:.2f} | "
              f"{r['ms_per_step']:.2f} | {r['tokens_per_second']:.0f} | {r['speedup_vs_plain']:.2f}x |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
