"""The trainer's arguments (one dataclass, parsed by `HfArgumentParser`: --max-steps and --max_steps both work), their
checks, and the rules that keep two runs from mixing in one output folder."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal

from transformers import HfArgumentParser

from hf_specdec.errors import InputError
from hf_specdec.kind_options import range_errors

#: the distillation losses (losses.py)
LOSSES = ("fkl", "rkl", "tvd", "jsd", "lk-alpha", "lk-hybrid", "ce")



@dataclass
class Args:
    # target, as deployed
    target: str = field(default="default", metadata={"help": "'default' (embedded SmolLM2-135M-Instruct), a Hub id or a folder"})
    dtype: Literal["float32", "bfloat16"] = field(default="float32", metadata={"help": "the target's dtype (teacher data, features, eval) and the drafter's compute dtype (accelerate mixed precision; master weights stay float32); bfloat16 is for GPUs"})
    teacher_dtype: Literal["same", "float32", "bfloat16"] = field(default="same", metadata={"help": "the dtype the teacher data is computed in (scored log-probs, self-generated answers, hidden states); 'same': --dtype. bfloat16 scores about twice as fast on CPUs with AVX512-BF16 or AMX; the drafter is still trained and evaluated against the target in --dtype"})
    mixed_precision: Literal["auto", "no", "bf16"] = field(default="auto", metadata={"help": "the drafter's training autocast (master weights stay float32): 'auto' is bf16 with --dtype bfloat16, else what `accelerate launch --mixed_precision` or the accelerate config says; bf16 also runs on CPUs with AVX512-BF16 or AMX while the target stays in --dtype"})
    compile: bool = field(default=False, metadata={"help": "torch.compile the drafter for training (accelerate's dynamo backend, inductor)"})
    tf32: bool = field(default=False, metadata={"help": "allow TF32 matmuls on Ampere+ GPUs (fp32 runs only)"})
    target_quantization: Literal["none", "8bit", "4bit"] = field(default="none", metadata={"help": "bitsandbytes quantization of the target, in training and eval"})
    # drafter
    drafter: str = field(default="new", metadata={"help": "a kind of new drafter: 'new' (token-only) or any registered kind with a training adapter (docs/training.md describes each; an unknown name lists them; `--drafter KIND --help` shows its options), or a folder holding a drafter or causal LM to continue from"})
    draft_vocab_size: int = field(default=8192, metadata={"help": "reduced output vocabulary (most frequent target tokens); 0: full"})
    lora: bool = field(default=False, metadata={"help": "train LoRA adapters on an existing drafter instead of all weights"})
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    # data
    data: str = field(default="sharegpt", metadata={"help": "'sharegpt', a JSONL file (prompt / messages), or a datasets name/folder"})
    data_split: str = "train"
    teacher_data: Literal["generate", "score", "both"] = field(default="both", metadata={"help": "target's own greedy responses, target-scored existing assistant turns, or both"})
    num_generate: int = field(default=512, metadata={"help": "prompts the target answers (greedy self-generation)"})
    num_score: int = field(default=2048, metadata={"help": "existing conversations the target scores (teacher-forced)"})
    heldout_prompts: int = field(default=16, metadata={"help": "held-out training prompts for evaluation (never the dev prompts)"})
    exclude_ids: str = field(default="auto", metadata={"help": "JSONL whose ids/prompts are excluded; 'auto': hf_specdec's dev prompts (hf_specdec/data/dev_prompts.jsonl, every benchmark's set); 'none': nothing"})
    max_prompt_tokens: int = 256
    max_new_tokens: int = 128
    max_seq_len: int = 512
    top_k: int = field(default=32, metadata={"help": "target log-probs stored per token"})
    gen_batch_size: int = 16
    score_batch_size: int = 8
    data_cache_dir: str = field(default="", metadata={"help": "default: <hf_specdec cache>/distill-data"})
    extra_data: str = field(default="", metadata={"help": "comma-separated teacher-data folders prepared earlier (same target and quantization) added to the training set"})
    prepare_part_size: int = field(default=256, metadata={"help": "prompts (or texts) per saved part of the teacher data: a killed preparation continues from its last complete part"})
    max_train_tokens: int = field(default=0, metadata={"help": "train on a seeded subset of the prepared data holding at most this many target tokens (nested: a smaller budget takes part of a larger one's), for a data curve on one prepared set; 0: all"})
    online_features: bool = field(default=False, metadata={"help": "feature kinds (those reading the target's states): compute the target states each training batch reads with a target forward on the device, instead of storing them for the whole set (for GPUs: no states file of several GB, a cheap forward a step; the held-out set's states are still stored)"})
    prepare_only: bool = field(default=False, metadata={"help": "prepare (or find) the teacher data, then exit"})
    # loss and optimisation
    loss: Literal[LOSSES] = field(default="fkl", metadata={"help": "fkl, rkl, tvd, jsd: divergences to the target's top-K distribution; lk-alpha: -log(acceptance); lk-hybrid: KL blended into TV as acceptance grows (the LK losses); ce: cross-entropy on the target's token"})
    on_policy_ratio: float = field(default=0.0, metadata={"help": "share of steps whose continuations the drafter samples and the target scores"})
    on_policy_max_new_tokens: int = 64
    on_policy_temperature: float = 1.0
    max_steps: int = 1000
    time_budget: float = field(default=0.0, metadata={"help": "hours of training after which the run stops cleanly (a checkpoint, then the best drafter published as usual); --resume continues it; 0: no limit"})
    batch_size: int = field(default=16, metadata={"help": "sequences per process per step"})
    learning_rate: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    threads: int = field(default=0, metadata={"help": "torch threads per process; 0: all cores split between processes"})
    # evaluation, checkpoints, output
    eval_every: int = 200
    eval_prompts: int = field(default=0, metadata={"help": "held-out prompts decoded per eval; 0: all"})
    eval_max_new_tokens: int = 64
    num_draft_tokens: int = 5
    log_every: int = 10
    save_every: int = 200
    keep_checkpoints: int = 2
    output_dir: str = "runs/drafter"
    overwrite: bool = field(default=False, metadata={"help": "start a new run in an output folder that holds another run (its checkpoints, log and drafter are replaced)"})
    resume: bool = field(default=False, metadata={"help": "continue from the latest checkpoint in output_dir"})
    push_to_hub: bool = False
    hub_model_id: str = ""
    hub_private: bool = False
    license: str = "apache-2.0"


def autocast_precision(args: Args) -> str | None:
    """The Accelerator's `mixed_precision`: None lets `accelerate launch` or the accelerate config decide."""
    if args.mixed_precision == "auto":
        return "bf16" if args.dtype == "bfloat16" else None
    return args.mixed_precision


class ArgumentParser(HfArgumentParser):
    """Its errors in the one-line form of every other error: `distill: error: ...`, status 2."""

    def error(self, message):
        self.exit(2, f"distill: error: {message} (see `python training/distill.py --help`)\n")


POSITIVE = ("prepare_part_size", "heldout_prompts", "max_prompt_tokens", "max_new_tokens",
            "max_seq_len", "top_k", "gen_batch_size", "score_batch_size", "on_policy_max_new_tokens", "max_steps",
            "batch_size", "eval_max_new_tokens", "num_draft_tokens", "log_every")


NON_NEGATIVE = ("max_train_tokens", "time_budget", "draft_vocab_size", "num_generate", "num_score",
                "warmup_steps", "threads", "eval_every", "eval_prompts", "save_every", "keep_checkpoints", "lora_r")


#: what a resumed run may change: when it stops, how it reports and saves; anything else changes the result
RESUMABLE_CHANGES = ("tf32", "compile", "time_budget", "max_steps", "eval_every", "eval_prompts", "eval_max_new_tokens",
                     "num_draft_tokens", "log_every", "save_every", "keep_checkpoints", "threads", "gen_batch_size", "score_batch_size", "data_cache_dir",
                     "resume", "overwrite", "prepare_only", "prepare_part_size", "push_to_hub", "hub_model_id", "hub_private", "license")


def parse_args(argv=None) -> tuple[Args, list[str]]:
    """The common arguments, checked, and the strings they leave: the drafter kind's own options (its registered
    options class, parsed once the kind is known) or mistakes, which that parse names."""
    parser = ArgumentParser(Args, epilog=KIND_OPTIONS_HELP)
    args, rest = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    bad = range_errors(args, POSITIVE, NON_NEGATIVE)
    if not 0 <= args.on_policy_ratio <= 1:
        bad.append(f"--on-policy-ratio must lie in [0, 1] (got {args.on_policy_ratio})")
    if args.learning_rate <= 0:
        bad.append(f"--learning-rate must be > 0 (got {args.learning_rate})")
    if args.teacher_data == "generate" and args.num_generate < 1 or args.teacher_data == "score" and args.num_score < 1:
        bad.append(f"--teacher-data {args.teacher_data} with no rows to make: raise --num-generate / --num-score")
    if args.resume and args.overwrite:
        bad.append("--resume continues the run in the output folder and --overwrite replaces it: pass one")
    if bad:
        raise InputError("; ".join(bad) + ".")
    return args, rest


KIND_OPTIONS_HELP = "Each kind of drafter has options of its own: python training/distill.py --drafter KIND --help"


def asks_kind_help(argv: list[str]) -> bool:
    """`--drafter KIND --help`: the help of the common arguments and of that kind's options (known once it loads)."""
    return bool({"-h", "--help"} & set(argv)) and any(a == "--drafter" or a.startswith("--drafter=") for a in argv)


def run_args_path(output_dir: Path) -> Path:
    return output_dir / "run_args.json"


def run_arguments(args: Args, options) -> dict:
    """What run_args.json records: the common arguments and the kind's options, in one flat dict."""
    return json.loads(json.dumps({**asdict(args), **asdict(options)}))


def check_output_dir(args: Args, options) -> None:
    """Refuse, before any work, to mix two runs in one folder: --resume against a run whose result-changing arguments
    differ, or a new run into a folder holding another (unless --overwrite)."""
    out = Path(args.output_dir)
    saved_path = run_args_path(out)
    holds_run = any((out / name).exists() for name in (saved_path.name, "checkpoints", "training_log.jsonl", "config.json"))
    if args.resume:
        if not saved_path.exists():
            return  # nothing to resume: a fresh run (said in the log)
        saved, now = json.loads(saved_path.read_text()), run_arguments(args, options)
        saved.update({name: saved.pop(was) for was, name in options.earlier_names().items() if was in saved})
        # (keys of this run only: a run saved before the kinds' options moved out of the common ones names them all;
        # an argument added since the run was saved counts as its default)
        defaults = {f.name: f.default for f in (*fields(Args), *fields(options))}
        differ = [f"--{k.replace('_', '-')} {saved.get(k, defaults.get(k))!r} -> {now[k]!r}" for k in sorted(now)
                  if k not in RESUMABLE_CHANGES and saved.get(k, defaults.get(k)) != now[k]]
        if differ:
            raise InputError(f"--resume: {out} holds a run with other arguments ({'; '.join(differ)}); resume with the "
                             "run's own arguments, or start a new run in another --output-dir.")
    elif holds_run and not args.overwrite:
        raise InputError(f"--output-dir {out} holds another run or drafter; continue it with --resume, replace it "
                         "with --overwrite, or pick another folder.")
