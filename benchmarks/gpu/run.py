"""The GPU benchmark: random-weight Llamas of real shapes, built from configs (nothing downloaded), in bf16.

For each shape (`1b`: Llama-3.2-1B's, `8b`: Llama-3.1-8B's; `tiny` for a CPU check of the script itself):
  1. the loop's own cost per step against transformers' assisted loop, the target drafting for itself (every draft
     accepted), at batch 1 (and hf_specdec alone at batch 8);
  2. the verification cost T(n) / T(1) of a target forward of n = 1..64 new tokens on a 512-token cache;
  3. host syncs per step (the counter of hf_specdec.speed.diagnostics), batch 1 and 8;
  4. tokens/s of plain greedy, of the target drafting for itself (acceptance 100%) and of n-gram lookup on a
     repetitive prompt, with tokens per target forward and whether the output equals plain greedy's (in bf16 a
     (k+1)-token and a 1-token forward may round differently, so "identical" is reported, not required).

Random weights make random text; the figures are about cost, not acceptance on real text. Timing waits for the
device (torch.cuda.synchronize) around every measured call.

    python benchmarks/gpu/run.py --shapes 1b,8b --json benchmarks/results/gpu.json     # on a GPU, a few minutes
    python benchmarks/gpu/run.py --shapes tiny --device cpu --dtype float32             # what CI runs
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import statistics
import time

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from hf_specdec import SpeculationStats, speculative_generate
from hf_specdec.cache.keyword import CACHE
from hf_specdec.cli.bench import synchronize
from hf_specdec.speed.diagnostics import count_forwards, count_host_syncs
from hf_specdec.drafters import DraftModelDrafter, NgramDrafter

SHAPES = {  # (hidden, intermediate, layers, heads, kv heads, vocab): the published configs' shapes
    "tiny": (64, 128, 2, 4, 2, 512),
    "1b": (2048, 8192, 16, 32, 8, 128256),
    "8b": (4096, 14336, 32, 32, 8, 128256),
}


def build(shape: str, device, dtype) -> LlamaForCausalLM:
    hidden, intermediate, layers, heads, kv, vocab = SHAPES[shape]
    config = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                         max_position_embeddings=8192, rope_theta=500000.0, bos_token_id=1, eos_token_id=None,
                         pad_token_id=0, tie_word_embeddings=shape == "1b", attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    return model.eval()


def twin(target):
    """The target as its own drafter: the same weights and modules, but hooks and a generation config of its own (so
    that counting the target's forwards does not count the drafter's)."""
    drafter = copy.copy(target)
    drafter._forward_pre_hooks, drafter._forward_hooks = collections.OrderedDict(), collections.OrderedDict()
    drafter.generation_config = copy.deepcopy(target.generation_config)
    return drafter


def timed(fn, device, repeats: int) -> float:
    """Median seconds of `fn` (after one warm-up), waiting for the device around each call."""
    fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def verification_costs(target, device, sizes, context: int, repeats: int) -> dict:
    vocab = target.config.vocab_size
    prefix = torch.randint(2, vocab, (1, context), device=device)
    cache = DynamicCache(config=target.config)
    target(input_ids=prefix, **{CACHE: cache}, use_cache=True, logits_to_keep=1)
    ms = {}
    for n in sizes:
        new = torch.randint(2, vocab, (1, n), device=device)

        def forward():
            target(input_ids=new, **{CACHE: cache}, use_cache=True, logits_to_keep=n)
            cache.crop(-n)

        ms[n] = 1000 * timed(forward, device, repeats)
    return {"context_tokens": context, "ms": ms, "ratio": {n: ms[n] / ms[1] for n in sizes}}


def decode(target, prompt, drafter, k: int, new_tokens: int) -> tuple[torch.Tensor, SpeculationStats]:
    stats = SpeculationStats()
    out = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens, do_sample=False,
                          pad_token_id=0, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=k,
                          speculation_stats=stats, draft_length="constant")
    return out, stats


def measure_shape(shape: str, device, dtype, k: int, new_tokens: int, repeats: int) -> dict:
    target = build(shape, device, dtype)
    vocab = target.config.vocab_size
    row = {"shape": shape, "parameters": sum(p.numel() for p in target.parameters()), "dtype": str(dtype), "k": k,
           "new_tokens": new_tokens}
    prompt = torch.randint(2, vocab, (1, 64), device=device)
    common = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)

    # 1. the loop's cost per step, the target drafting for itself (so every draft is accepted)
    assistant = twin(target)
    self_drafter = DraftModelDrafter(assistant)
    ours = lambda: decode(target, prompt, self_drafter, k, new_tokens)  # noqa: E731
    assistant.generation_config.num_assistant_tokens = k
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0
    theirs = lambda: target.generate(prompt, assistant_model=assistant, **common)  # noqa: E731
    plain = lambda: target.generate(prompt, **common)  # noqa: E731
    steps = {name: count_forwards(target, fn) for name, fn in (("ours", ours), ("theirs", theirs))}
    seconds = {name: timed(fn, device, repeats) for name, fn in (("ours", ours), ("theirs", theirs), ("plain", plain))}
    # a step of each loop is one target forward plus one drafter pass of k+1 forwards of the same model; per step
    row["loop"] = {"hf_specdec_steps": steps["ours"], "transformers_steps": steps["theirs"],
                   "hf_specdec_ms_per_step": 1000 * seconds["ours"] / steps["ours"],
                   "transformers_assisted_ms_per_step": 1000 * seconds["theirs"] / steps["theirs"],
                   "plain_ms_per_token": 1000 * seconds["plain"] / new_tokens}
    row["loop"]["ratio_per_step"] = row["loop"]["hf_specdec_ms_per_step"] / row["loop"]["transformers_assisted_ms_per_step"]

    # 2. verification cost
    row["verification"] = verification_costs(target, device, [1, 2, 4, 8, 16, 32, 64], 512, repeats)

    # 3. host syncs per step, batch 1 and 8 (the slope between a short and a long run leaves setup out)
    row["host_syncs_per_step"] = {}
    for batch in (1, 8):
        ids = torch.randint(2, vocab, (batch, 32), device=device)
        counts = []
        for n in (8, 40):
            stats = SpeculationStats()
            with count_host_syncs() as syncs:
                target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                pad_token_id=0, custom_generate=speculative_generate, assistant=NgramDrafter(),
                                num_draft_tokens=k, speculation_stats=stats, draft_length="constant")
            counts.append((syncs.total, stats.target_forwards))
        row["host_syncs_per_step"][batch] = (counts[1][0] - counts[0][0]) / max(counts[1][1] - counts[0][1], 1)

    # 4. tokens/s: plain, self-drafting (acceptance 100%), n-gram lookup on a repetitive prompt
    reference = plain_out = target.generate(prompt, **common)
    plain_tps = new_tokens / seconds["plain"]
    row["throughput"] = {"plain_tokens_per_second": plain_tps}
    out, stats = ours()
    row["throughput"]["self_drafting"] = {"tokens_per_second": new_tokens / seconds["ours"],
                                          "speedup": seconds["plain"] / seconds["ours"],
                                          "tokens_per_target_forward": stats.mean_accepted_tokens,
                                          "identical_to_plain": bool(torch.equal(out, reference))}
    motif = torch.randint(2, vocab, (1, 16), generator=torch.Generator().manual_seed(0)).to(device)
    repetitive = motif.repeat(1, 8)
    rep_common = dict(common, attention_mask=torch.ones_like(repetitive))
    plain_rep = lambda: target.generate(repetitive, **rep_common)  # noqa: E731
    ngram = lambda: target.generate(repetitive, custom_generate=speculative_generate, assistant=NgramDrafter(),  # noqa: E731
                                    num_draft_tokens=k, **rep_common, draft_length="constant")
    rep_plain_s, rep_ngram_s = timed(plain_rep, device, repeats), timed(ngram, device, repeats)
    stats = SpeculationStats()
    out = target.generate(repetitive, custom_generate=speculative_generate, assistant=NgramDrafter(),
                          num_draft_tokens=k, speculation_stats=stats, **rep_common, draft_length="constant")
    row["throughput"]["ngram_repetitive_prompt"] = {
        "plain_tokens_per_second": new_tokens / rep_plain_s, "tokens_per_second": new_tokens / rep_ngram_s,
        "speedup": rep_plain_s / rep_ngram_s, "tokens_per_target_forward": stats.mean_accepted_tokens,
        "identical_to_plain": bool(torch.equal(out, plain_rep()))}
    del plain_out
    return row


def format_rows(rows: list[dict]) -> str:
    lines = ["| shape | hf_specdec ms/step | transformers assisted ms/step | ratio | T(n)/T(1) n=2,4,8,16,32,64 | "
             "host syncs/step b1, b8 | plain tok/s | self-drafting tok/s (t/f) | n-gram repetitive tok/s (speed-up) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        loop, ratio = r["loop"], r["verification"]["ratio"]
        t = r["throughput"]
        lines.append(
            f"| {r['shape']} | {loop['hf_specdec_ms_per_step']:.2f} | {loop['transformers_assisted_ms_per_step']:.2f} | "
            f"{loop['ratio_per_step']:.2f} | {' '.join(f'{ratio[n]:.2f}' for n in (2, 4, 8, 16, 32, 64))} | "
            f"{r['host_syncs_per_step'][1]:.2f}, {r['host_syncs_per_step'][8]:.2f} | {t['plain_tokens_per_second']:.1f} | "
            f"{t['self_drafting']['tokens_per_second']:.1f} ({t['self_drafting']['tokens_per_target_forward']:.2f}) | "
            f"{t['ngram_repetitive_prompt']['tokens_per_second']:.1f} ({t['ngram_repetitive_prompt']['speedup']:.2f}x) |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="1b,8b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    rows = []
    for shape in args.shapes.split(","):
        rows.append(measure_shape(shape, device, dtype, args.k, args.new_tokens, args.repeats))
        print(json.dumps(rows[-1]), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(format_rows(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                       "torch": torch.__version__, "rows": rows}, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
