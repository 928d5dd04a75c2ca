"""`hf-specdec bench`: plain decoding vs transformers' built-in equivalent vs hf_specdec, measured in one run.

Methods are interleaved prompt by prompt so that machine noise hits all of them alike. Reported per method: tokens/s,
speed-up vs plain, mean tokens per target forward (counted with a forward hook on the target, the same way for every
method; plain = 1.00), acceptance by draft position (hf_specdec), and whether greedy outputs equal plain's. The costs
behind the speed-up (target forward for 1 and k+1 tokens, drafter time per step) and the break-even figure they imply
are measured in the same process.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import StaticCache

from ..cache.keyword import CACHE, cache_keyword
from ..drafters import DraftModelDrafter, NgramDrafter, PlainDrafter
from ..generation.loop import speculative_generate
from ..generation.stats import SpeculationStats
from ..models.borrowed import BorrowsFromTarget


@dataclass
class MethodResult:
    name: str
    new_tokens: int = 0
    seconds: float = 0.0
    target_forwards: int = 0
    identical: list[bool] = field(default_factory=list)
    first_difference: list[int] = field(default_factory=list)  # new-token position of the first mismatch, per output
    stats: SpeculationStats | None = None
    prompt_seconds: list[float] = field(default_factory=list)  # per prompt (batch), for paired comparisons
    prompt_tokens: list[int] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / max(self.seconds, 1e-9)

    def as_dict(self, plain: "MethodResult", greedy: bool) -> dict:
        plain_tps = plain.tokens_per_second
        ms_per_forward = 1000 * self.seconds / max(self.target_forwards, 1)
        return {
            "name": self.name,
            "tokens_per_second": self.tokens_per_second,
            "speedup": self.tokens_per_second / plain_tps if plain_tps else None,
            # per row and target forward, the bonus token included; plain decoding = 1.00 by definition
            "mean_accepted_tokens": (
                self.stats.mean_accepted_tokens if self.stats else
                1.0 if self.name == "plain" else self.new_tokens / max(self.target_forwards, 1)
            ),
            "acceptance_by_position": self.stats.acceptance_by_position if self.stats else None,
            "identical_to_plain": (all(self.identical) if greedy else None),
            # bf16/fp16 on a GPU: a (k+1)-token and a 1-token forward may round differently (see README, exactness)
            "identical_share": (sum(self.identical) / max(len(self.identical), 1) if greedy else None),
            "first_difference": (min(self.first_difference) if greedy and self.first_difference else None),
            "new_tokens": self.new_tokens,
            "seconds": self.seconds,
            "target_forwards": self.target_forwards,
            "draft_seconds_per_step": (self.stats.draft_seconds / max(self.stats.target_forwards, 1)) if self.stats else None,
            # speed-up = tokens per target forward / this: the share of the speed-up a cheaper (or dearer) step makes
            "ms_per_target_forward": ms_per_forward,
            "step_cost_vs_plain": ms_per_forward / (1000 * plain.seconds / max(plain.target_forwards, 1)),
            "prompt_seconds": self.prompt_seconds,
            "prompt_tokens": self.prompt_tokens,
        }


def builtin_kwargs(drafter, k: int) -> dict | None:
    """transformers' own equivalent of this drafter, if it has one."""
    if type(drafter) is NgramDrafter:
        return {"prompt_lookup_num_tokens": k}
    if type(drafter) is DraftModelDrafter and not isinstance(drafter.model, BorrowsFromTarget):
        model = drafter.model  # a drafter that borrows the target's weights is hf_specdec-only
        model.generation_config.num_assistant_tokens = k
        model.generation_config.num_assistant_tokens_schedule = "constant"
        model.generation_config.assistant_confidence_threshold = 0.0
        return {"assistant_model": model}
    return None


def call(kwargs: dict, *leave_out: str) -> dict:
    """A method's generate() keywords for one call: a fresh cache where it names a `new_cache` factory."""
    out = {k: v for k, v in kwargs.items() if k not in ("new_cache", *leave_out)}
    if "new_cache" in kwargs:
        out[CACHE] = kwargs["new_cache"]()
    return out


def synchronize(device) -> None:
    """Wait for the device's queued work, so that host clocks time work, not kernel launches (no-op on a CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def measure_target_costs(target, k: int, context: int = 200) -> dict:
    """Median target forward time for 1 and for k+1 new tokens on a `context`-token cache, as the loop runs them."""
    from transformers import DynamicCache

    from ..speed.cpu_matmul import fast_linear

    vocab = target.config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (1, context), device=target.device)
    out = {}
    for n in (1, k + 1):
        def run():
            cache = DynamicCache(config=target.config)
            target(input_ids=ids, **{cache_keyword(target): cache}, use_cache=True, logits_to_keep=1)
            new = torch.randint(0, vocab, (1, n), device=target.device)
            synchronize(target.device)
            t0 = time.perf_counter()
            with fast_linear(target, target.device.type == "cpu"):
                target(input_ids=new, **{cache_keyword(target): cache}, use_cache=True, logits_to_keep=n)
            synchronize(target.device)
            return time.perf_counter() - t0

        out[n] = statistics.median(run() for _ in range(7)) * 1000
    return {"target_forward_ms_1": out[1], f"target_forward_ms_{k + 1}": out[k + 1], "context_tokens": context}


def encode_prompt(tokenizer, prompt: str, device):
    if getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
    else:
        enc = tokenizer(prompt, return_tensors="pt")
    return {key: value.to(device) for key, value in enc.items()}


def encode_batch(tokenizer, prompts: list[str], device, max_prompt_tokens: int = 1024) -> dict:
    """Left-padded batch of (chat-templated) prompts, as batched generate() expects."""
    rows = [encode_prompt(tokenizer, p, device)["input_ids"][0, -max_prompt_tokens:] for p in prompts]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    ids = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, width - len(r) :] = r
        mask[b, width - len(r) :] = 1
    return {"input_ids": ids, "attention_mask": mask}


def count_new_tokens(out: torch.Tensor, prompt_len: int, eos_ids: set[int], pad_id: int | None) -> int:
    """Generated tokens over the batch, up to and including each row's EOS (padding after it does not count)."""
    total = 0
    for row in out[:, prompt_len:].tolist():
        n = len(row)
        for i, t in enumerate(row):
            if t in eos_ids:
                n = i + 1
                break
        total += n
    return total


def run_bench(
    target,
    tokenizer,
    drafters: list[tuple[str, object]],
    prompts: list[str],
    max_new_tokens: int = 128,
    num_draft_tokens: int | list[int] = 5,
    do_sample: bool = False,
    temperature: float = 1.0,
    seed: int = 0,
    target_name: str = "",
    max_prompt_tokens: int = 1024,
    batch_size: int = 1,
    adaptive: bool = False,
    policies: tuple[str, ...] = (),
    compile_drafter: bool = False,
    static_plain: bool = False,
    policies_only: bool = False,
) -> dict:
    """`drafters`: (name, Drafter) pairs compared in the same interleaved run, one row each (see `as_drafter`);
    `adaptive` / `policies`: also a row per drafter for each of these draft-length policies ("adaptive", "calibrated",
    "default": what a call gets without `draft_length`), capped at the largest length;
    `compile_drafter`: each row of a drafter with a draft model gets a twin with its forward compiled; `static_plain`:
    a row of plain decoding in a static cache of one size for every prompt (transformers compiles its decoding step
    once, on a GPU); `policies_only`: no constant-length rows, the policies' alone (what calls get)."""
    # A list of draft lengths is a sweep: one hf_specdec method per constant length, and adaptive capped at the largest.
    lengths = [num_draft_tokens] if isinstance(num_draft_tokens, int) else list(num_draft_tokens)
    cap = max(lengths)
    # transformers' own equivalents, one of each kind (prompt lookup, an assistant model; batch size 1 only)
    equivalents = [builtin_kwargs(d, cap) for _, d in drafters] if batch_size == 1 and len(lengths) == 1 else []
    builtins = list({next(iter(kwargs)): kwargs for kwargs in equivalents if kwargs is not None}.values())
    forwards = [0]
    hook = target.register_forward_pre_hook(lambda *args: forwards.__setitem__(0, forwards[0] + 1))
    sampling = dict(do_sample=do_sample, **({"temperature": temperature} if do_sample else {}))

    def method_runs():
        runs = [("plain", {})]
        if static_plain:
            size = max_prompt_tokens + max_new_tokens  # (one size: one compiled decoding step)
            fresh = lambda: StaticCache(config=target.config, max_cache_len=size)  # noqa: E731
            runs.append(("plain, static cache", {"new_cache": fresh}))
        runs += [("transformers " + next(iter(builtin)), builtin) for builtin in builtins]
        stats = {}
        # plain steps through hf_specdec's own loop and forward path: what the loop costs or saves apart from drafting
        for drafter_name, drafter in [("none", PlainDrafter()), *drafters]:
            prefix = "hf_specdec" if len(drafters) == 1 else f"hf_specdec {drafter_name}"
            methods = [] if policies_only and (adaptive or policies) else [
                (prefix if len(lengths) == 1 else f"{prefix} k={k}", "constant", k) for k in lengths]
            for policy in dict.fromkeys((["adaptive"] if adaptive else []) + list(policies)):  # (once each, in order)
                methods.append((f"{prefix} {policy}" if len(lengths) == 1 else f"{prefix} {policy} k<={cap}",
                                None if policy == "default" else policy, cap))
            if drafter_name == "none":
                methods = [("hf_specdec, no drafts", "constant", 1)]
            twins = [False, True] if compile_drafter and drafter.compiles_model else [False]
            for (name, policy, k), compiled in itertools.product(methods, twins):
                name = f"{name}, compiled" if compiled else name
                stats[name] = SpeculationStats()
                # each row drafts with its own copy, so that what a drafter learns (a table, a policy) stays its own
                runs.append((name, dict(custom_generate=speculative_generate, assistant=copy.deepcopy(drafter),
                                        draft_length=policy, num_draft_tokens=k, speculation_stats=stats[name],
                                        **({"compile_drafter": True} if compiled else {}))))
        return runs, stats

    runs, all_stats = method_runs()
    spec_stats = list(all_stats.values())[1]  # the first drafter's (the first row is the no-drafts baseline)
    results = {name: MethodResult(name) for name, _ in runs}
    for name, st in all_stats.items():
        results[name].stats = st
    eos = target.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    try:
        # Warm-up so that the first measured prompt pays no one-time costs: a batch as wide as the run's, so that what
        # is measured once per batch size (the calibrated policy's verification costs, CPU paths for its row counts)
        # is measured here
        warm = encode_batch(tokenizer, ["Hello!"] * batch_size, target.device, max_prompt_tokens)
        if batch_size == 1:
            warm.pop("attention_mask")
        for _, kwargs in runs:
            target.generate(**warm, max_new_tokens=8, pad_token_id=pad_id, **sampling, **call(kwargs, "speculation_stats"))
        groups = [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]
        for i, group in enumerate(tqdm(groups, desc=f"bench (batches of {batch_size})")):
            enc = encode_batch(tokenizer, group, target.device, max_prompt_tokens)
            if batch_size == 1:
                enc.pop("attention_mask")
            outputs = {}
            # Each prompt starts at a different method, so that no method always runs first or right after another.
            for name, kwargs in runs[i % len(runs) :] + runs[: i % len(runs)]:
                torch.manual_seed(seed + i)
                forwards[0] = 0
                synchronize(target.device)
                t0 = time.perf_counter()
                out = target.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=pad_id, **sampling,
                                      **call(kwargs))
                synchronize(target.device)
                elapsed = time.perf_counter() - t0
                result = results[name]
                result.seconds += elapsed
                result.prompt_seconds.append(elapsed)
                result.prompt_tokens.append(count_new_tokens(out, enc["input_ids"].shape[1], eos_ids, pad_id))
                result.new_tokens += result.prompt_tokens[-1]
                result.target_forwards += forwards[0]
                outputs[name] = out
            for name in outputs:
                same, first = compare_outputs(outputs[name], outputs["plain"], enc["input_ids"].shape[1])
                results[name].identical.append(same)
                if first is not None:
                    results[name].first_difference.append(first)
    finally:
        hook.remove()

    costs = measure_target_costs(target, cap)
    draft_ms = 1000 * spec_stats.draft_seconds / max(spec_stats.target_forwards, 1)
    verify_ms = costs[f"target_forward_ms_{cap + 1}"]
    costs["drafter_ms_per_step"] = draft_ms
    costs["break_even_mean_accepted_tokens"] = (draft_ms + verify_ms) / costs["target_forward_ms_1"]
    return {
        "settings": {
            "target": target_name,
            "assistant": ",".join(name for name, _ in drafters),
            "num_prompts": len(prompts),
            "max_new_tokens": max_new_tokens,
            "num_draft_tokens": cap,
            "draft_lengths": lengths,
            "do_sample": do_sample,
            "temperature": temperature if do_sample else None,
            "seed": seed,
            "batch_size": batch_size,
            "torch_threads": torch.get_num_threads(),
            "device": str(target.device),
            "dtype": str(target.dtype),
        },
        "methods": [r.as_dict(results["plain"], greedy=not do_sample) for r in results.values()],
        "costs": costs,
    }


def paired_speed_ratio(a: dict, b: dict, resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Tokens/s of method `a` over method `b` in the same run, with a 95% bootstrap interval over prompts (both ran
    every prompt back to back, so resampling prompts keeps each prompt's pair together)."""
    def ratio(idx):
        ta, tb = sum(a["prompt_seconds"][i] for i in idx), sum(b["prompt_seconds"][i] for i in idx)
        na, nb = sum(a["prompt_tokens"][i] for i in idx), sum(b["prompt_tokens"][i] for i in idx)
        return (na / ta) / (nb / tb)

    n, rng = len(a["prompt_seconds"]), random.Random(seed)
    draws = sorted(ratio([rng.randrange(n) for _ in range(n)]) for _ in range(resamples))
    return ratio(range(n)), draws[int(0.025 * resamples)], draws[int(0.975 * resamples) - 1]


def adaptive_vs_best_constant(report: dict) -> list[str]:
    """For a sweep with --adaptive: each adaptive row against the fastest constant length of the same drafter."""
    lines, methods = [], report["methods"]
    for m in methods:
        if " adaptive" not in m["name"] or not m.get("prompt_seconds"):
            continue
        prefix = m["name"].split(" adaptive")[0]
        constants = [c for c in methods if c["name"].startswith(prefix + " k=")]
        if len(constants) < 2:
            continue
        best = max(constants, key=lambda c: c["tokens_per_second"])
        r, lo, hi = paired_speed_ratio(m, best)
        lines.append(f"{m['name']} vs the fastest constant ({best['name']}): {r:.3f}x tokens/s "
                     f"(95% interval over prompts {lo:.3f} to {hi:.3f})")
    return lines


def compare_outputs(out: torch.Tensor, plain: torch.Tensor, prompt_length: int) -> tuple[bool, int | None]:
    """(identical, the first new-token position where they differ, or None)."""
    if out.shape == plain.shape and torch.equal(out, plain):
        return True, None
    width = min(out.shape[1], plain.shape[1])
    differs = (out[:, :width] != plain[:, :width]).any(dim=0).nonzero()
    return False, (int(differs[0]) if len(differs) else width) - prompt_length


def format_table(report: dict) -> str:
    rows = [
        f"batch size {report['settings'].get('batch_size', 1)}; tokens/s = generated tokens over the batch per second",
        "",
        "| method | tokens/s | speed-up | tokens per target forward | step cost vs a plain step | acceptance by position "
        "| identical to plain |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in report["methods"]:
        acc = "n/a" if m["acceptance_by_position"] is None else " ".join(f"{a:.2f}" for a in m["acceptance_by_position"])
        ident = "n/a (sampling)" if m["identical_to_plain"] is None else ("yes" if m["identical_to_plain"] else
                                                                          f"NO: {m['identical_share']:.0%} identical, "
                                                                          f"first difference at new token {m['first_difference']}")
        rows.append(
            f"| {m['name']} | {m['tokens_per_second']:.1f} | {m['speedup']:.2f}x | {m['mean_accepted_tokens']:.2f} "
            f"| {m['step_cost_vs_plain']:.2f}x | {acc} | {ident} |"
        )
    c = report["costs"]
    k = report["settings"]["num_draft_tokens"]
    rows.append("")
    rows.append(
        f"Costs: target forward 1 token {c['target_forward_ms_1']:.1f} ms, {k + 1} tokens "
        f"{c[f'target_forward_ms_{k + 1}']:.1f} ms (on a {c['context_tokens']}-token cache); drafter "
        f"{c['drafter_ms_per_step']:.1f} ms per step (first hf_specdec row); break-even at {c['break_even_mean_accepted_tokens']:.2f} "
        "tokens per target forward."
    )
    rows.append("Speed-up = tokens per target forward / step cost vs a plain step (time per target forward over stock "
                "generate()'s time per token): the first is speculation's share, the second what the step itself costs.")
    paired = adaptive_vs_best_constant(report)
    if paired:
        rows += ["", *paired]
    floor = floor_ratios(report)
    if floor:
        rows += ["", "Tokens/s ratios, with 95% intervals over prompts (groups of a batch):", *floor]
    return "\n".join(rows)


def floor_ratios(report: dict) -> list[str]:
    """hf_specdec's no-drafts path against plain decoding, and every hf_specdec row against that path: what the
    loop costs or saves apart from drafting, and what drafting adds to it."""
    methods = {m["name"]: m for m in report["methods"] if m.get("prompt_seconds")}
    plain, none = methods.get("plain"), methods.get("hf_specdec, no drafts")
    if plain is None or none is None:
        return []
    lines = []
    for name, m, base, against in [("hf_specdec, no drafts", none, plain, "plain"),
                                   *[(n, m, none, "no drafts") for n, m in methods.items()
                                     if n.startswith("hf_specdec") and m is not none]]:
        r, lo, hi = paired_speed_ratio(m, base)
        lines.append(f"- {name} / {against}: {r:.3f}x ({lo:.3f} to {hi:.3f})")
    return lines


def plot_report(report: dict, path: str) -> None:
    """Acceptance by draft position and speed-up per method, titled with the drafter and the settings."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    methods, settings = report["methods"], report["settings"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [1, 1.3]})
    for m in methods:
        if m["acceptance_by_position"]:
            positions = range(1, len(m["acceptance_by_position"]) + 1)
            ax1.plot(positions, m["acceptance_by_position"], marker="o", label=m["name"])
    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.set_xlabel("draft position")
    ax1.set_ylabel("P(accepted | proposed)")
    ax1.set_ylim(0, 1)
    ax1.set_title("Acceptance by draft position")
    if ax1.lines:
        ax1.legend(fontsize="small")
    names = [m["name"] for m in methods]
    bars = ax2.barh(range(len(names)), [m["speedup"] for m in methods], color="tab:blue")
    ax2.bar_label(bars, labels=[f"{m['speedup']:.2f}x, {m['mean_accepted_tokens']:.2f} tok/fwd" for m in methods],
                  padding=3, fontsize="small")
    ax2.set_yticks(range(len(names)), names, fontsize="small")
    ax2.invert_yaxis()  # the table's order, top to bottom
    ax2.axvline(1.0, color="gray", linestyle="--")
    ax2.set_xlim(0, max(m["speedup"] for m in methods) * 1.35)
    ax2.set_xlabel("speed-up vs plain decoding (same run)")
    ax2.set_title("Wall-clock speed-up")
    mode = f"sampling, T={settings['temperature']}" if settings["do_sample"] else "greedy"
    fig.suptitle(f"{settings['target']}, assistant {settings['assistant']}: {settings['num_prompts']} prompts, "
                 f"{settings['max_new_tokens']} new tokens, k <= {settings['num_draft_tokens']}, {mode}, batch "
                 f"{settings['batch_size']}, {settings['device']} {settings['dtype'].replace('torch.', '')}", fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_json(report: dict, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=2))
