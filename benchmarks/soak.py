"""A serving process, soaked: threads share one target and one set of drafters for thousands of calls; every output is
checked against plain `generate()`, resident memory is sampled, and calls are interrupted on purpose.

    python benchmarks/soak.py --calls 3000 --threads 8 --json benchmarks/results/soak.json     # BENCHMARKS.md
    python benchmarks/soak.py --calls 200 --threads 4                                         # a quick look

One tiny random Llama target (thousands of calls must fit in minutes on a CPU; the loop's code paths are the same for
any size) and, shared by every thread, the drafters a server would share: names ("ngram", "suffix", "recycle",
"ngram+recycle", "suffix+ngram", "layers:1", "self") resolved once per target, and objects passed by every call (one
`NgramDrafter`, one `SuffixDrafter`, one draft model, one `MedusaDrafter`), both ways in (`enable()` and
`custom_generate=`), batch 1 and left-padded batches of 2-3. Each call is drawn from a pool of `--distinct` calls
(prompts, drafter, way in, draft length, options: max_new_tokens, EOS ids, a repetition penalty) made from a seeded
generator, whose plain `generate()` outputs are computed before the run; its output must equal that. One call in 50 is interrupted: a stopping
criterion or streamer that raises mid-call, or a `KeyboardInterrupt` from a stopping criterion; the exception must
reach the caller, and the thread's next calls must still be identical (every call is checked). A busy refusal, any
other exception, or a different output counts as a failure. Resident memory (RSS) is sampled every 50 calls; growth
after warm-up (the first quarter of the calls) is reported beside the shared suffix indexes' own growth, which is
what they are for (they index every answer, up to their cap: 20,000 tokens here, so that they fill in the warm-up).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NAMES = ("ngram", "suffix", "recycle", "ngram+recycle", "suffix+ngram", "layers:1", "self")
OBJECTS = ("NgramDrafter object", "SuffixDrafter object", "draft model object", "MedusaDrafter object")
VOCAB, PAD = 128, 0


class Interrupted(Exception):
    """Raised on purpose inside a call."""


class RaiseAfter:
    """A stopping criterion (or streamer) that raises `error` at its n-th call, mid-decoding."""

    def __init__(self, n: int, error: BaseException):
        self.n, self.error, self.calls = n, error, 0

    def __call__(self, input_ids, scores, **kwargs):
        self.calls += 1
        if self.calls >= self.n:
            raise self.error
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def put(self, value):  # the streamer protocol
        self(torch.zeros(1, 1, dtype=torch.long), None)

    def end(self):
        pass


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def build_world(seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_specdec import MedusaConfig, MedusaHeads
    from hf_specdec.drafters import MedusaDrafter, NgramDrafter, SuffixDrafter

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, pad_token_id=PAD,
                         bos_token_id=1, eos_token_id=None, initializer_range=0.3, tie_word_embeddings=False)
    target = LlamaForCausalLM(config).eval()
    draft = LlamaForCausalLM(config).eval()
    draft.load_state_dict(target.state_dict())
    with torch.no_grad():  # a draft model that mostly agrees: some drafts rejected
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * 0.05 * p.std().clamp_min(1e-3))
    heads = MedusaHeads(MedusaConfig.from_target(config, num_heads=3, num_layers=1)).bind_target(target)
    # the suffix indexes grow with every answer up to their cap, by design (rebuilds leave the allocator's high-water
    # mark behind them): capped here at 20,000 tokens so that they fill within the warm-up and memory after it is
    # what leaks, if anything
    from hf_specdec.drafters import SuffixIndex
    from hf_specdec.drafters.suffix import index_of

    index_of(target).max_tokens, index_of(target).merge_tokens = 20_000, 4096
    objects = {"NgramDrafter object": NgramDrafter(),
               "SuffixDrafter object": SuffixDrafter(SuffixIndex(max_tokens=20_000, merge_tokens=4096)),
               "draft model object": draft, "MedusaDrafter object": MedusaDrafter(heads, tree="chain")}
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for i in range(24):
        motif = torch.randint(3, VOCAB, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g)
        body = motif.repeat(3) if i % 2 else torch.randint(3, VOCAB, (int(torch.randint(4, 16, (1,), generator=g)),),
                                                           generator=g)
        prompts.append(body[:16])
    return target, objects, prompts


def draw_call(rng: random.Random, prompts) -> dict:
    batch = rng.choice([1, 1, 1, 2, 3])
    rows = rng.sample(range(len(prompts)), batch)
    options = {"max_new_tokens": rng.choice([8, 24, 40]), "do_sample": False, "pad_token_id": PAD}
    if rng.random() < 0.3:
        options["eos_token_id"] = rng.sample(range(3, VOCAB), rng.choice([1, 2]))
    if rng.random() < 0.2:
        options["repetition_penalty"] = 1.3
    return {"rows": tuple(rows), "options": options,
            "assistant": rng.choice(NAMES + OBJECTS), "route": rng.choice(["enable", "custom_generate"]),
            "draft_length": rng.choice([None, "constant", "adaptive"]), "num_draft_tokens": rng.choice([None, 2, 4])}


def inputs(prompts, rows) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(prompts[r]) for r in rows)
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, width - len(prompts[r]):], mask[b, width - len(prompts[r]):] = prompts[r], 1
    return ids, mask


def soak(calls: int, threads: int, seed: int, distinct: int = 150, log=print) -> dict:
    import hf_specdec
    from hf_specdec import SpeculationStats

    target, objects, prompts = build_world(seed)
    hf_specdec.enable(target)
    original = target._hf_specdec_original_generate
    # the calls a server sees, and plain generate()'s output for each, made before the run (memory sampled during
    # the run is then hf_specdec's, not the references')
    rng = random.Random(seed)
    pool = []
    for _ in range(distinct):
        call = draw_call(rng, prompts)
        ids, mask = inputs(prompts, call["rows"])
        pool.append((call, ids, mask, original(ids, attention_mask=mask, **call["options"])))
    counts = {"calls": 0, "identical": 0, "different": 0, "errors": 0, "busy": 0, "interrupted": 0,
              "interrupt_reached_caller": 0, "drafted": 0, "accepted": 0}
    failures: list = []
    rss: list = []
    lock = threading.Lock()
    next_call = iter(range(calls))

    def suffix_bytes() -> int:
        from hf_specdec.drafters import SuffixIndex

        drafters = [objects["SuffixDrafter object"], *target.__dict__.get("_hf_specdec_assistants", {}).values()]
        indexes = {id(part.index): part.index for d in drafters for part in (d, getattr(d, "first", None))
                   if isinstance(getattr(part, "index", None), SuffixIndex)}
        return sum(index.nbytes() for index in indexes.values())

    def worker(t: int):
        rng = random.Random(seed * 7919 + t)
        while True:
            with lock:
                i = next(next_call, None)
            if i is None:
                return
            call, ids, mask, expected = rng.choice(pool)
            options = call["options"]
            assistant = objects.get(call["assistant"], call["assistant"])
            spec = {k: call[k] for k in ("draft_length", "num_draft_tokens")}
            stats = SpeculationStats()
            fault = None
            if rng.random() < 0.02:
                fault = rng.choice(["criterion", "streamer", "KeyboardInterrupt"])
                error = KeyboardInterrupt() if fault == "KeyboardInterrupt" else Interrupted(fault)
                raiser = RaiseAfter(rng.choice([1, 2, 4]), error)
                if fault == "streamer" and call["route"] == "enable" and len(call["rows"]) == 1:
                    spec["streamer"] = raiser
                else:
                    fault = "criterion" if fault == "streamer" else fault
                    spec["stopping_criteria"] = [raiser]
            try:
                if call["route"] == "enable":
                    out = target.generate(ids, attention_mask=mask, assistant=assistant, speculation_stats=stats,
                                          **spec, **options)
                else:
                    out = type(target).generate(target, ids, attention_mask=mask, assistant=assistant,
                                                custom_generate=hf_specdec.speculative_generate,
                                                speculation_stats=stats, **spec, **options)
                outcome = "identical" if torch.equal(out, expected) else "different"
            except (Interrupted, KeyboardInterrupt) as raised:
                outcome = "interrupt_reached_caller" if fault else "errors"
                if not fault:
                    failures.append({**call, "error": repr(raised)})
            except Exception as error:  # noqa: BLE001 (every other exception is a failure)
                busy = "another generate() call" in str(error) or "busy" in str(error)
                outcome = "busy" if busy else "errors"
                failures.append({**{k: v for k, v in call.items()}, "error": f"{type(error).__name__}: {error}"[:400]})
            with lock:
                counts["calls"] += 1
                counts[outcome] += 1
                counts["interrupted"] += fault is not None
                counts["drafted"] += stats.drafted_tokens
                counts["accepted"] += stats.accepted_tokens
                if outcome == "different":
                    failures.append({**call, "error": "different output"})
                if counts["calls"] % 50 == 0:
                    rss.append((counts["calls"], round(rss_mib(), 1), suffix_bytes()))
                    if counts["calls"] % 500 == 0:
                        log(f"{counts['calls']} calls, {counts['different']} different, {counts['errors']} errors, "
                            f"RSS {rss[-1][1]} MiB")

    began = time.time()
    workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.time() - began
    warm = [r for r in rss if r[0] >= calls // 4] or rss
    grown = (warm[-1][1] - warm[0][1]) if warm else 0.0
    index_grown = (warm[-1][2] - warm[0][2]) / 2**20 if warm else 0.0
    # the named drafters kept with the target (one per name, shared by every thread)
    kept = sorted(name for name, *_ in target.__dict__.get("_hf_specdec_assistants", {}))
    return {"calls": calls, "threads": threads, "seconds": round(seconds, 1), "calls_per_second": round(calls / seconds, 1),
            "counts": counts, "rss_mib": rss, "rss_after_warmup_mib": warm[0][1] if warm else None,
            "rss_end_mib": rss[-1][1] if rss else None, "rss_growth_after_warmup_mib": round(grown, 1),
            "suffix_indexes_growth_after_warmup_mib": round(index_grown, 2), "kept_named_drafters": kept,
            "failures": failures[:50], "distinct_calls": distinct}


def table(report: dict) -> str:
    c = report["counts"]
    rows = [("calls (threads)", f"{report['calls']} ({report['threads']})"),
            ("identical to plain", c["identical"]), ("different", c["different"]), ("errors", c["errors"]),
            ("busy refusals", c["busy"]),
            ("interrupted on purpose / reached the caller", f"{c['interrupted']} / {c['interrupt_reached_caller']}"),
            ("drafts accepted / drafted", f"{c['accepted']} / {c['drafted']}"),
            ("RSS after warm-up -> end (MiB)", f"{report['rss_after_warmup_mib']} -> {report['rss_end_mib']}"),
            ("of which the suffix indexes grew (MiB)", report["suffix_indexes_growth_after_warmup_mib"]),
            ("calls per second", report["calls_per_second"])]
    return "\n".join(["| soak | |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--distinct", type=int, default=150, help="distinct calls (prompts and options) drawn from")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    report = soak(args.calls, args.threads, args.seed, args.distinct)
    report["command"] = " ".join(["python benchmarks/soak.py", *(argv if argv is not None else sys.argv[1:])])
    print(table(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    c = report["counts"]
    return 0 if c["different"] == c["errors"] == c["busy"] == 0 and c["interrupted"] == c["interrupt_reached_caller"] else 1


if __name__ == "__main__":
    sys.exit(main())
