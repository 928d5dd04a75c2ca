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
from hf_specdec.speed.diagnostics import count_forwards  # noqa: E402
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


def measure(name, target, assistant, theirs_kwargs, length, prompts, new_tokens, repeats) -> dict:
    """One kind's row: per method, tokens per target forward, ms per step and the speed-up against plain greedy."""
    common = dict(max_new_tokens=new_tokens, do_sample=False)
    ours = dict(custom_generate=speculative_generate, assistant=assistant)
    ids, mask = left_pad(prompts)
    batch = dict(attention_mask=mask, pad_token_id=PAD, **common)
    one_by_one = {  # each over every prompt
        "plain": lambda p: target.generate(p, **common),
        "transformers": lambda p: target.generate(p, **common, **theirs_kwargs),
        "same_k": lambda p: target.generate(p, **common, **ours, num_draft_tokens=length, draft_length="constant"),
        "adaptive": lambda p: target.generate(p, **common, **ours),
    }
    runs = {key: (lambda fn=fn: [fn(p) for p in prompts]) for key, fn in one_by_one.items()}
    runs["plain_batch"] = lambda: [target.generate(ids, **batch)]
    runs["batch"] = lambda: [target.generate(ids, **batch, **ours, num_draft_tokens=length, draft_length="constant")]
    outputs = {key: run() for key, run in runs.items()}
    for key, out in outputs.items():  # every method gives plain greedy's tokens
        assert all(torch.equal(a, b) for a, b in zip(out, outputs["plain_batch" if "batch" in key else "plain"])), (name, key)
    forwards = {key: count_forwards(target, run) for key, run in runs.items()}
    stats = SpeculationStats()  # the batch's tokens per forward per row (a sliding-window target decodes row by row)
    target.generate(ids, **batch, **ours, num_draft_tokens=length, draft_length="constant", speculation_stats=stats)
    seconds = {key: [] for key in runs}
    for _ in range(repeats):  # interleaved: each round times every method
        for key, run in runs.items():
            start = time.perf_counter()
            run()
            seconds[key].append(time.perf_counter() - start)
    median = {key: statistics.median(times) for key, times in seconds.items()}
    tokens = new_tokens * len(prompts)
    row = {"kind": name, "k": length, "plain_ms_per_step": 1000 * median["plain"] / forwards["plain"]}
    for key in ("transformers", "same_k", "adaptive"):
        row[key] = {"tokens_per_target_forward": tokens / forwards[key],
                    "ms_per_step": 1000 * median[key] / forwards[key], "speedup_vs_plain": median["plain"] / median[key]}
    row["batch"] = {"rows": len(prompts), "tokens_per_target_forward": stats.emitted_tokens / stats.target_forwards,
                    "speedup_vs_plain_batch": median["plain_batch"] / median["batch"]}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        rows = [measure(name, *spec, args.new_tokens, args.repeats) for name, spec in kinds(folder).items()]
    print("| kind (k = transformers' length) | plain: ms/step | transformers: tokens/forward, ms/step | hf_specdec, "
          "same k | hf_specdec, adaptive: vs plain | hf_specdec, batch of 6: tokens/forward, vs plain |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        theirs, same = r["transformers"], r["same_k"]
        print(f"| {r['kind']} (k = {r['k']}) | {r['plain_ms_per_step']:.2f} | {theirs['tokens_per_target_forward']:.2f}, "
              f"{theirs['ms_per_step']:.2f} | {same['tokens_per_target_forward']:.2f}, {same['ms_per_step']:.2f} | "
              f"{r['adaptive']['speedup_vs_plain']:.2f}x | {r['batch']['tokens_per_target_forward']:.2f}, "
              f"{r['batch']['speedup_vs_plain_batch']:.2f}x |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
