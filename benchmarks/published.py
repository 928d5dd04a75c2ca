"""Drafters read from other projects' layouts cost what the same kind's own drafters cost: the same weights, written
in each layout hf_specdec reads and read back, decode the same prompts with the same tokens per target forward at
the same time per step.

On the default target (SmolLM2-135M, fp32, this CPU), greedy, a constant draft length:
- EAGLE-3: a drafter for the target (one layer, a draft vocabulary of 8192, its LM head fitted by least squares to
  the target's answers to other dev prompts, as the tests fit theirs), as hf_specdec saves it, and read back from
  speculators' layout and from the SafeAILab / SpecForge / vLLM Llama layout;
- Medusa: the shipped heads as hf_specdec ships them (they borrow the target's LM head, over a reduced draft
  vocabulary), read back from FasterDecoding's Medusa-1 layout (each head carries its own copy of the whole LM head,
  as that layout does), and those own-head heads saved in hf_specdec's layout (the same shape natively).
Methods are interleaved prompt by prompt; ms per step is the call's time over its target forwards.

    python benchmarks/published.py --json benchmarks/results/published.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hf_specdec  # noqa: E402
from hf_specdec import AutoDrafter, Eagle3Config, Eagle3DraftModel, SpeculationStats, speculative_generate  # noqa: E402
from hf_specdec.kinds.eagle3.formats import LLAMA, SPECULATORS  # noqa: E402
from hf_specdec.kinds.medusa.formats import MEDUSA  # noqa: E402
from hf_specdec.cli.bench import write_json  # noqa: E402
from hf_specdec.data import read_prompts  # noqa: E402
from tests.speculation import fit_lm_head  # noqa: E402


def fitted_eagle3(target, tokenizer, prompts) -> Eagle3DraftModel:
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)["input_ids"] for p in prompts]
    with torch.no_grad():
        answers = [target.generate(c, max_new_tokens=64, do_sample=False) for c in chats]
    counts = torch.bincount(torch.cat([a[0] for a in answers]), minlength=target.config.vocab_size)
    vocab = torch.sort(-counts.double(), stable=True).indices[:8192].sort().values
    torch.manual_seed(0)
    drafter = Eagle3DraftModel(Eagle3Config.from_target(target.config, draft_vocab_size=8192)).eval()

    def readings(seq, shifted):
        out = drafter(input_ids=seq, target_features=shifted, use_cache=False).hidden_states[0]
        return drafter.norm(out[0, :-1]), seq[0, 1:]

    with torch.no_grad():
        return fit_lm_head(drafter, target, chats, readings, vocab, 0.05, 1.0, 1.0, {"max_new_tokens": 64})


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--num-draft-tokens", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    target, tokenizer = hf_specdec.load_default_target()
    prompts = read_prompts("dev")
    folder = Path(tempfile.mkdtemp())
    eagle3 = fitted_eagle3(target, tokenizer, prompts[-24:])  # (fitted on prompts it is not measured on)
    eagle3.save_pretrained(folder / "eagle3")
    SPECULATORS.write(eagle3, target, folder / "eagle3-speculators", torch.float32)
    LLAMA.write(eagle3, target, folder / "eagle3-llama", torch.float32)
    medusa = AutoDrafter.from_pretrained("medusa", target=target)
    MEDUSA.write(medusa, target, folder / "medusa-1", torch.float32)
    own = AutoDrafter.from_pretrained(folder / "medusa-1", target=target)
    own.config.published = None  # (the same heads, in hf_specdec's own layout)
    own.config.save_dtype = "float32"
    own.save_pretrained(folder / "medusa-own")
    methods = {
        "eagle3, hf_specdec's layout": AutoDrafter.from_pretrained(folder / "eagle3", target=target, dtype=torch.float32),
        "eagle3, from speculators' layout": AutoDrafter.from_pretrained(folder / "eagle3-speculators", target=target),
        "eagle3, from the Llama EAGLE-3 layout": AutoDrafter.from_pretrained(folder / "eagle3-llama", target=target),
        "medusa chain, as shipped": medusa,
        "medusa chain, from Medusa-1's layout": AutoDrafter.from_pretrained(folder / "medusa-1", target=target),
        "medusa chain, own heads, hf_specdec's layout": AutoDrafter.from_pretrained(folder / "medusa-own", target=target),
    }
    for name, drafter in methods.items():
        if "medusa" in name:
            methods[name] = hf_specdec.drafters.MedusaDrafter(drafter, tree="chain")
    rows = {name: {"seconds": [], "forwards": 0, "tokens": 0, "draft_seconds": 0.0, "outputs": []} for name in methods}
    names = list(methods)
    for i, prompt in enumerate(prompts[: args.num_prompts]):
        chat = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             return_tensors="pt", return_dict=True)
        for name in names[i % len(names):] + names[: i % len(names)]:  # each prompt starts at another method
            stats = SpeculationStats()
            start = time.perf_counter()
            out = target.generate(**chat, custom_generate=speculative_generate, assistant=methods[name], do_sample=False,
                                  max_new_tokens=args.max_new_tokens, num_draft_tokens=args.num_draft_tokens,
                                  draft_length="constant", speculation_stats=stats)
            row = rows[name]
            row["seconds"].append((time.perf_counter() - start) / stats.target_forwards)
            row["forwards"] += stats.target_forwards
            row["tokens"] += stats.emitted_tokens
            row["draft_seconds"] += stats.draft_seconds
            row["outputs"].append(out[0].tolist())
    table = {}
    for name, row in rows.items():
        table[name] = {"ms_per_step": 1000 * statistics.median(row["seconds"]),
                       "draft_ms_per_step": 1000 * row["draft_seconds"] / row["forwards"],
                       "tokens_per_forward": row["tokens"] / row["forwards"]}
    reference = {"eagle3": rows[names[0]]["outputs"], "medusa": rows[names[3]]["outputs"]}
    print(f"{'drafter':40} {'ms/step':>8} {'draft ms':>9} {'tokens/forward':>15}  same tokens as its kind's own")
    for name, figures in table.items():
        same = rows[name]["outputs"] == reference["medusa" if "medusa" in name else "eagle3"]
        figures["same_output"] = same
        print(f"{name:40} {figures['ms_per_step']:8.2f} {figures['draft_ms_per_step']:9.2f} "
              f"{figures['tokens_per_forward']:15.3f}  {same}")
    result = {"command": "python benchmarks/published.py " + " ".join(argv or sys.argv[1:]), "args": vars(args),
              "target": "SmolLM2-135M-Instruct fp32, CPU", "rows": table}
    if args.json:
        write_json(result, args.json)
    return result


if __name__ == "__main__":
    main()
