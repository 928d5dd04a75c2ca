"""How each drafter kind trains: one adapter per kind, named by the kind's registration in `hf_specdec.kinds`, with
its own options.

`distill.py` never names a kind. It asks `adapter_for(args.drafter, argv)` (a kind's name for a new drafter, or a folder
holding one to continue from), which also parses the kind's own options (its registered `options` class,
`hf_specdec/kind_options.py`: peft's pattern of one config per method), and then uses only this interface:

    adapter.options                    the kind's options (the flags parsed; they also make a new drafter's config)
    adapter.reads_target_features      the batches must carry the target's hidden states (`batch["features"]`)
    adapter.build(args, target, ...)   a new drafter (or the folder's), on the target's device, bound to it
    adapter.logits(model, batch)       teacher-forced drafter logits at the teacher positions, and those positions' teacher ids
    adapter.loss(model, batch, cols, args) -> (loss, logits, teacher ids)
    adapter.measure(model, batch)      extra held-out measurements saved in the best drafter's config
    adapter.step                       the optimisation step about to run (the trainer sets it; schedules read it)

A batch (`data.collate`) holds `input_ids` [B, L] (right-padded), `positions` [B, L] (True where the next token has
teacher targets), `tgt_ids`/`tgt_lps` [N, K] (the target's top-K ids and log-probs at those N positions, row-major),
and for feature kinds `features` [B, L, H] (the modules' outputs `feature_modules` names, at every position).

A new kind registers `training="my_package.train:MyTraining"` (and `options=MyOptions`) and subclasses `Adapter` there.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import asdict, fields
from pathlib import Path

import torch

from hf_specdec.assistants.auto_drafter import AutoDrafter
from hf_specdec.cache.hidden import final_norm
from hf_specdec.errors import InputError
from hf_specdec.registry import DrafterKind, drafter_kinds, kind_of_folder
from hf_specdec.models.borrowed import bind_if_borrowing

from .arguments import ArgumentParser
from .losses import token_loss

ALIASES = {"new": "draft-model"}  # `--drafter new`: a new token-only drafter


def trainable_kinds() -> dict[str, DrafterKind]:
    return {kind.name: kind for kind in drafter_kinds() if kind.training}


def adapter_for(drafter: str, argv: list[str] | None = None) -> tuple["Adapter", str | None]:
    """The adapter for `--drafter` with its options parsed from `argv` (the arguments the common ones left), and the
    folder to continue from (None: a new drafter of that kind)."""
    kinds = trainable_kinds()
    name = ALIASES.get(drafter, drafter)
    new_kinds = [k for k, kind in kinds.items() if kind.config_class is not None]
    if name in new_kinds:
        adapter = load_adapter(kinds[name], argv)
        if isinstance(adapter.options.drafter_keywords().get("tree"), int):  # (TreeOptions: kinds that draft trees)
            raise InputError(f"--tree {adapter.options.tree}: an N-node tree is built from the accuracy a drafter's "
                             "training measured, which a new drafter has only once this run saves it; evaluate with "
                             "--tree chain or --tree tree, and decode the saved drafter as 'FOLDER:N'.")
        return adapter, None
    config_file = Path(drafter) / "config.json"
    if not config_file.is_file():
        raise InputError(f"--drafter {drafter!r} is neither a kind of drafter to train ({', '.join(['new'] + new_kinds)}) "
                         "nor a folder holding a drafter (config.json) to continue from.")
    config = json.loads(config_file.read_text())
    kind = kind_of_folder(drafter, config)  # (a published layout too: the fine-tune keeps it)
    if kind is None or not kind.training:
        raise InputError(f"--drafter {drafter}: its config.json is not a drafter kind the trainer knows "
                         f"({', '.join(kinds)}).")
    adapter = load_adapter(kind, argv)
    passed = {a.split("=")[0].replace("_", "-") for a in argv or [] if a.startswith("--")}  # (--a_b is --a-b)
    changed = [name for name, value in adapter.options.config_fields().items()  # (None: the target's own, which the
               if value is not None and value != config.get(name)  # folder's may well be)
               and passed & {f"--{name.replace('_', '-')}", *kind.options.earlier_flags(name)}]
    if changed:  # a fine-tune keeps the drafter's shape: say so rather than train another shape than asked
        raise InputError(f"--drafter {drafter}: a fine-tune keeps the drafter's shape, so "
                         f"{', '.join('--' + name.replace('_', '-') for name in changed)} cannot change it (its "
                         f"config.json: {', '.join(f'{name}={config.get(name)!r}' for name in changed)}); drop them, or "
                         f"train a new drafter with --drafter {kind.name}.")
    return adapter, drafter


def load_adapter(kind: DrafterKind, argv: list[str] | None = None) -> "Adapter":
    module, _, attribute = kind.training.partition(":")
    adapter_class = getattr(importlib.import_module(module), attribute)
    return adapter_class(kind, parse_options(kind.options, argv or [], kind.name))


def print_kind_help(argv: list[str]) -> dict:
    """`--drafter KIND --help`: the common arguments' help and the kind's options'."""
    from .arguments import KIND_OPTIONS_HELP, Args

    drafter = ArgumentParser(Args).parse_known_args([a for a in argv if a not in ("-h", "--help")])[0].drafter
    adapter, _ = adapter_for(drafter)
    ArgumentParser([Args, adapter.kind.options.flags()], epilog=KIND_OPTIONS_HELP).print_help()
    return {}


def parse_options(options_class, argv: list[str], kind: str):
    """The kind's options from `argv`; an argument neither common nor the kind's is an error naming both."""
    parser = ArgumentParser(options_class.flags())
    flags, unknown = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if unknown:
        names = ", ".join(f"--{f.name.replace('_', '-')}" for f in fields(options_class)) or "none"
        raise InputError(f"unrecognized arguments: {' '.join(unknown)} (the options of a {kind} drafter: {names}; see "
                         f"`python training/distill.py --drafter {kind} --help`)")
    return options_class(**asdict(flags))


def unwrap_drafter(model):
    """The drafter module speculative decoding can use (LoRA layers active), from torch.compile / DDP / peft wrappers."""
    model = getattr(model, "_orig_mod", model)  # torch.compile (--compile wraps the DDP wrapper, if any)
    model = getattr(model, "module", model)  # DDP
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def choose_draft_vocab(counts: torch.Tensor, size: int, always: list[int]) -> torch.Tensor:
    """FR-Spec: the `size` target tokens the teacher predicts most often (EOS always included; ties by id)."""
    counts = counts.clone().double()
    counts[torch.tensor(always, dtype=torch.long)] = float("inf")
    order = torch.sort(-counts, stable=True).indices  # most frequent first, ties by id
    return order[:size].sort().values


class Adapter:
    reads_target_features = False
    #: whether the kind's new models draft over a reduced vocabulary (`set_draft_vocab`)
    reduced_vocabulary = False
    step = 0

    def __init__(self, kind: DrafterKind, options=None):
        self.kind = kind
        self.options = kind.options() if options is None else options

    def build(self, args, target, token_counts: torch.Tensor | None, eos: list[int], *, folder: str | None,
              target_name: str, target_folder: str):
        """The drafter to train: `folder`'s (re-bound to this target), or a new one. On the target's device."""
        if folder is not None:  # (hf_specdec's layout, or another project's: AutoDrafter reads both)
            model = AutoDrafter.from_pretrained(folder, target=target, dtype=torch.float32)
            if "target_name_or_path" in model.config.to_dict():
                model.config.target_name_or_path = target_name
                model.config.target_quantization = args.target_quantization
        else:
            vocab = target.config.get_text_config().vocab_size
            size = args.draft_vocab_size if args.draft_vocab_size < vocab else 0
            model = self.new(args, target, target_name, target_folder, size)
            if size and self.reduced_vocabulary:  # FR-Spec: the kind drafts over a reduced vocabulary
                model.set_draft_vocab(choose_draft_vocab(token_counts, size, eos))
        model.to(target.device)
        return bind_if_borrowing(model, target)

    def new(self, args, target, target_name: str, target_folder: str, draft_vocab: int):
        """A new drafter of this kind (`draft_vocab`: the reduced vocabulary's size, 0 for the full one)."""
        raise NotImplementedError(f"the trainer cannot make a new {self.kind.name} drafter; pass a folder holding one")

    def logits(self, model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def loss(self, model, batch: dict, cols, args) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits, teacher = self.logits(model, batch)
        return token_loss(logits, batch, cols, args.loss), logits, teacher

    def measure(self, model, batch: dict) -> dict:
        return {}

    def check(self, args, folder: str | None) -> None:
        """Refuse (an `InputError`) arguments this kind cannot use with the target, before any model loads."""

    def feature_modules(self, target, folder: str | None) -> tuple[list, str]:
        """The target modules whose outputs the batches carry as `features` (feature kinds), and a name for them:
        the final norm's output (the LM head's input)."""
        return [final_norm(target)], "final"
