"""Random combinations of `generate()` options, every drafter kind, several architectures: hf_specdec's greedy output
must be plain `generate()`'s token for token, or the call refused before any forward with a refusal the README lists.

    python benchmarks/fuzz.py --cases 2000 --json benchmarks/results/fuzz.json     # the long run (BENCHMARKS.md)
    python benchmarks/fuzz.py --cases 40 --seed 7                                   # a quick look

A case draws (seeded, so any case can be replayed with `--only N`): an architecture (dense RoPE, learned positions,
sliding windows alone and mixed with full attention, convolution layers), a drafter (every name of the vocabulary that
needs no download, a draft model object, Medusa heads, a transformers `CandidateGenerator`, combinations), a batch of
1-4 left-padded prompts (one repeats itself, so that n-gram lookup drafts), logits processors (repetition and length
penalties, no-repeat n-grams, bad words, suppressed tokens, sequence bias, minimum lengths, a forced EOS, a processor
of the user's own), zero to three EOS ids that the target really produces, `max_new_tokens` or `max_length`,
dict outputs with scores and logits, draft lengths and policies, and the way in (`enable()` or `custom_generate=`).
A case is `identical`, `refused` (an error before the target's first forward, whose message matches a line of
`REFUSALS`, each of which the README states), or a failure: `DIFFERENT`, `CRASH` (an error after forwards ran), or
`UNLISTED` (a refusal the README does not state).
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import re
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.architectures import VOCAB, build, noisy_copy  # noqa: E402

ARCHITECTURES = ("llama", "gpt2", "qwen2", "mistral", "gemma2", "lfm2")
DRAFTERS = ("ngram", "suffix", "recycle", "self", "layers:1", "none", "ngram+recycle", "suffix+ngram", "ngram+self",
            "draft model", "target copy", "medusa:chain", "medusa:tree", "eagle", "eagle3", "block",
            "candidate generator")
#: what the README says is refused (a pattern of the error message, and the README's words for it)
REFUSALS = {
    r"draft a chain": "a sliding-window target with a tree of candidates",
    r"output_scores / output_logits need batch 1": "`output_scores` / `output_logits` at batch > 1",
    r"SelfSpeculativeDrafter does not support": "self-speculation on other architectures",
    r"exposes no final norm": "a feature-conditioned drafter (EAGLE-style, Medusa) on a target without a final norm",
}
PAD = 0


def architecture(name: str):
    model = build(name)
    model.generation_config.pad_token_id = PAD
    return model


def case_options(rng: random.Random, produced: list[int], batch: int) -> dict:
    """One random combination of generate() options (the processors are generate()'s own keywords)."""
    options: dict = {"do_sample": False, "pad_token_id": PAD}
    if rng.random() < 0.3:
        options["repetition_penalty"] = rng.choice([1.1, 1.3, 2.0])
    if rng.random() < 0.2:
        options["no_repeat_ngram_size"] = rng.choice([2, 3])
    if rng.random() < 0.2:
        options["bad_words_ids"] = [[t] for t in rng.sample(produced, min(2, len(produced)))] + [[5, 6]]
    if rng.random() < 0.15:
        options["suppress_tokens"] = rng.sample(range(3, VOCAB), 3)
    if rng.random() < 0.15:
        options["sequence_bias"] = {(rng.randrange(3, VOCAB),): 2.0, (7, 8): -3.0}
    eos = rng.sample(produced, min(rng.choice([0, 1, 1, 2, 3]), len(produced)))
    if eos:
        if rng.random() < 0.15:
            options["exponential_decay_length_penalty"] = (4, 1.5)
        options["eos_token_id"] = eos if len(eos) > 1 or rng.random() < 0.5 else eos[0]
        if rng.random() < 0.3:
            options["min_new_tokens"] = rng.choice([3, 10])
        if rng.random() < 0.1:
            options["forced_eos_token_id"] = eos[0]
    if rng.random() < 0.25:
        options["max_length"] = rng.choice([20, 30, 44])
    else:
        options["max_new_tokens"] = rng.choice([1, 7, 24, 40])
    if rng.random() < 0.3:
        options["return_dict_in_generate"] = True
        scored = batch == 1 or rng.random() < 0.2  # (refused at batch > 1: now and then, to see the refusal)
        options["output_scores"] = scored and rng.random() < 0.5
        options["output_logits"] = scored and rng.random() < 0.5
    if rng.random() < 0.1:
        options["logits_processor"] = [EveryThirdTokenBanned()]
    return options


class EveryThirdTokenBanned:
    """A processor of the user's own that reads input_ids: every third position bans the previous token."""

    def __call__(self, input_ids, scores):
        ban = (input_ids.shape[1] % 3 == 0)
        if ban:
            scores = scores.clone()
            scores[torch.arange(len(scores)), input_ids[:, -1]] = -float("inf")
        return scores


def drafter_for(name: str, target, noisy):
    """The assistant a drafter name of this script stands for (objects built here; hf_specdec names as they are)."""
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    from hf_specdec import MedusaConfig, MedusaHeads
    from hf_specdec.drafters import MedusaDrafter

    if name == "draft model":
        return noisy
    if name == "target copy":
        return copy.deepcopy(target)
    if name.startswith("medusa:"):
        hidden = target.config.get_text_config().hidden_size
        heads = MedusaHeads(MedusaConfig.from_target(target.config, num_heads=3, num_layers=1)).bind_target(target)
        torch.manual_seed(2)
        with torch.no_grad():  # untrained heads propose the target's own argmax: give them some spread
            for p in heads.parameters():
                if p.dim() == 2 and p.shape[0] == hidden:
                    p.normal_(0, 0.02)
        return MedusaDrafter(heads, tree=name.split(":")[1] if name.endswith("chain") else "default")
    if name in ("eagle", "eagle3", "block"):
        from hf_specdec import BlockDrafterConfig, BlockDrafterModel, Eagle3Config, Eagle3DraftModel
        from hf_specdec.kinds.draft_model.model import SpecDrafterForCausalLM, drafter_config_from_target

        torch.manual_seed(3)
        layers = target.config.get_text_config().num_hidden_layers
        if name == "eagle":
            return SpecDrafterForCausalLM(drafter_config_from_target(
                target.config, num_hidden_layers=1, target_feature_input=True)).eval()
        if name == "eagle3":
            return Eagle3DraftModel(Eagle3Config.from_target(target.config, draft_vocab_size=0)).eval().bind_target(target)
        config = BlockDrafterConfig.from_target(target.config, draft_vocab_size=0, target_layer_ids=[1, 1, layers], block_size=3)
        return BlockDrafterModel(config).eval().bind_target(target)
    if name == "candidate generator":
        return PromptLookupCandidateGenerator(num_output_tokens=4, max_matching_ngram_size=2)
    return name


def run_case(index: int, seed: int, targets: dict) -> dict:
    import hf_specdec
    from hf_specdec import SpeculationStats

    rng = random.Random(seed * 1_000_003 + index)
    arch = rng.choice(ARCHITECTURES)
    target, noisy, forwards = targets[arch]
    drafter = rng.choice(DRAFTERS)
    batch = rng.choice([1, 1, 1, 2, 3, 4])
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    motif = torch.randint(3, VOCAB - 8, (6,), generator=g)
    rows = [motif.repeat(3)[: rng.randrange(8, 18)] if b == 0 else torch.randint(3, VOCAB - 8, (rng.randrange(2, 14),),
                                                                                    generator=g) for b in range(batch)]
    width = max(len(r) for r in rows)
    ids = torch.full((batch, width), PAD)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, width - len(r):], mask[b, width - len(r):] = r, 1
    free = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=PAD)
    produced = sorted(set(free[:, width + 2:].flatten().tolist()) - {PAD})
    options = case_options(rng, produced, batch)
    if "logits_processor" in options:
        from transformers import LogitsProcessorList

        options["logits_processor"] = LogitsProcessorList(options["logits_processor"])
    spec = {"num_draft_tokens": rng.choice([None, 1, 2, 4, 8]), "draft_length": rng.choice([None, "constant", "adaptive"])}
    route = rng.choice(["enable", "custom_generate"])
    case = {"case": index, "architecture": arch, "drafter": drafter, "batch": batch, "route": route,
            "options": {k: ("own" if k == "logits_processor" else repr(v) if k == "sequence_bias" else v)
                        for k, v in options.items()},
            **{k: v for k, v in spec.items() if v is not None}}
    try:
        expected = target.generate(ids, attention_mask=mask, **options)
    except Exception as error:  # noqa: BLE001 (options plain generate() refuses too: not a case)
        return {**case, "status": "invalid", "reason": f"plain generate(): {type(error).__name__}: {str(error)[:200]}"}
    try:
        assistant = drafter_for(drafter, target, noisy)
    except Exception as error:  # noqa: BLE001 (a drafter this architecture's config cannot make: not a case)
        return {**case, "status": "invalid", "reason": f"building the drafter: {type(error).__name__}: {str(error)[:200]}"}
    stats = SpeculationStats()
    forwards[0] = 0
    try:
        if route == "enable":
            hf_specdec.enable(target)
            try:
                out = target.generate(ids, attention_mask=mask, assistant=assistant, speculation_stats=stats, **spec,
                                      **options)
            finally:
                hf_specdec.disable(target)
        else:
            out = target.generate(ids, attention_mask=mask, custom_generate=hf_specdec.speculative_generate,
                                  assistant=assistant, speculation_stats=stats, **spec, **options)
    except Exception as error:  # noqa: BLE001 (classified below)
        message = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
        listed = next((why for pattern, why in REFUSALS.items() if re.search(pattern, message)), None)
        if forwards[0]:
            status = "CRASH"
        elif isinstance(error, ValueError) and listed:
            status = "refused"
        else:
            status = "UNLISTED"
        case.update(status=status, reason=f"{type(error).__name__}: {message}")
        if status != "refused":
            case["where"] = traceback.format_exc().strip().splitlines()[-3][:300]
            case["traceback"] = [line for line in traceback.format_exc().splitlines() if "hf_specdec" in line][-12:]
        return case
    case["status"] = compare(out, expected, options)
    case["drafted"], case["accepted"] = stats.drafted_tokens, stats.accepted_tokens
    return case


def compare(out, expected, options) -> str:
    if not options.get("return_dict_in_generate"):
        return "identical" if torch.equal(out, expected) else "DIFFERENT"
    if not torch.equal(out.sequences, expected.sequences):
        return "DIFFERENT"
    for name in ("scores", "logits"):
        ours, theirs = getattr(out, name), getattr(expected, name)
        if (ours is None) != (theirs is None):
            return f"DIFFERENT ({name} missing)"
        if ours is not None and (len(ours) != len(theirs) or not all(  # (-inf where a processor bans: equal as ever)
                torch.allclose(a, b, atol=1e-4, rtol=1e-4) for a, b in zip(ours, theirs))):
            return f"DIFFERENT ({name})"
    return "identical"


def load_targets() -> dict:
    targets = {}
    for arch in ARCHITECTURES:
        target = architecture(arch)
        forwards = [0]
        target.register_forward_pre_hook(lambda *a, forwards=forwards: forwards.__setitem__(0, forwards[0] + 1))
        targets[arch] = (target, noisy_copy(target), forwards)
    return targets


def fuzz(cases: int, seed: int, only: list[int] | None = None, log=print) -> list[dict]:
    targets, results = load_targets(), []
    for index in (only if only is not None else range(cases)):
        result = run_case(index, seed, targets)
        results.append(result)
        if result["status"] not in ("identical", "refused", "invalid"):
            log(json.dumps(result))
    return results


def summary(results: list[dict]) -> dict:
    counts: dict = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    refusals: dict = {}
    for r in results:
        if r["status"] == "refused":
            refusals[r["reason"][:120]] = refusals.get(r["reason"][:120], 0) + 1
    invalid: dict = {}
    for r in results:
        if r["status"] == "invalid":
            invalid[r["reason"][:100]] = invalid.get(r["reason"][:100], 0) + 1
    spec = [r for r in results if r["status"] == "identical"]
    return {"cases": len(results), "counts": counts, "refusals": refusals, "invalid": invalid,
            "valid_cases": len(results) - counts.get("invalid", 0),
            "identical_with_drafts_accepted": sum(1 for r in spec if r.get("accepted")),
            "by_architecture": {a: sum(1 for r in results if r["architecture"] == a) for a in ARCHITECTURES},
            "by_drafter": {d: sum(1 for r in results if r["drafter"] == d) for d in DRAFTERS}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", type=str, default=None, help="comma-separated case numbers to replay")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")  # (plain generate()'s notes on unfeasible lengths, drawn on purpose)
    began = time.time()
    only = [int(x) for x in args.only.split(",")] if args.only else None
    results = fuzz(args.cases, args.seed, only)
    report = {"command": " ".join(["python benchmarks/fuzz.py", *(argv if argv is not None else sys.argv[1:])]),
              "seconds": round(time.time() - began, 1), "summary": summary(results),
              "failures": [r for r in results if r["status"] not in ("identical", "refused", "invalid")]}
    print(json.dumps(report["summary"], indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if not report["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
