"""Mean accepted tokens per target forward of one or more drafters, against the target as deployed (fp32 / 8-bit /
4-bit), through the real decoding loop. Acceptance does not depend on timing, so this may run beside other work;
wall-clock speed-ups come from `hf-specdec bench` on a quiet machine.

    python benchmarks/acceptance.py --target-quantization 4bit --drafters runs/eagle-4bit-fkl runs/eagle-4bit-ce \
        --prompts dev --num-draft-tokens 5 --json benchmarks/results/acceptance.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm

import hf_specdec
from hf_specdec.cli.bench import encode_prompt
from hf_specdec.data import read_prompts
from hf_specdec.default_model import load_target  # the same deployed target as training and its evaluation


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target-quantization", choices=["none", "8bit", "4bit"], default="none")
    p.add_argument("--drafters", nargs="+", required=True, help="folders, shipped names, ngram, self, layers:N")
    p.add_argument("--prompts", default="dev", help="a JSON-lines file, or dev (hf_specdec's dev prompts)")
    p.add_argument("--num-prompts", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--num-draft-tokens", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target, tokenizer = load_target("default", args.target_quantization)
    prompts = read_prompts(args.prompts, args.num_prompts)
    rows = []
    for spec in args.drafters:
        assistant = hf_specdec.as_drafter(spec, target=target)  # any assistant name, folder or Hub id
        stats = hf_specdec.SpeculationStats()
        for prompt in tqdm(prompts, desc=spec, unit="prompt"):
            enc = encode_prompt(tokenizer, prompt, target.device)
            target.generate(**enc, max_new_tokens=args.max_new_tokens, do_sample=False, custom_generate=hf_specdec.speculative_generate,
                            assistant=assistant, num_draft_tokens=args.num_draft_tokens, speculation_stats=stats, draft_length="constant")
        rows.append({"drafter": spec, **stats.as_dict()})
        print(f"{spec}: {stats.mean_accepted_tokens:.3f} tokens per target forward; by position "
              + " ".join(f"{a:.2f}" for a in stats.acceptance_by_position), flush=True)
    report = {"target_quantization": args.target_quantization, "prompts": args.prompts, "num_prompts": len(prompts),
              "max_new_tokens": args.max_new_tokens, "num_draft_tokens": args.num_draft_tokens, "results": rows,
              "command": "python benchmarks/acceptance.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    print("\n| drafter | target | mean accepted tokens / forward | acceptance by position |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['drafter']} | {args.target_quantization} | {r['mean_accepted_tokens']:.3f} | "
              + " ".join(f"{a:.2f}" for a in r["acceptance_by_position"]) + " |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
