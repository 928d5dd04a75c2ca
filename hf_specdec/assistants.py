"""The one vocabulary of assistants, shared by `generate(assistant=...)`, `AutoDrafter` and the `hf-specdec` command.

    "ngram"                   n-gram lookup over the prompt and the output so far (no model)
    "recycle"                 token recycling: a tree from the target's own recent top-k successors (no model)
    "none"                    no drafts: plain steps through hf_specdec's own loop (a baseline for measurements)
    "self", "self:L"          self-speculation: the target's first half (or first L) of its layers
    "layers:N"                an untrained draft model cut from the target's first N layers (a baseline)
    "distilled", "medusa"     a drafter shipped for the default target (hf_specdec/shipped_drafters/)
    "medusa:chain", "medusa:N"  Medusa heads drafting their top-1 chain, or an N-node tree
    "a+b"                     a's draft when it has one, else b's (e.g. "ngram+medusa")
    "default"                 the fastest drafter measured for this target (BENCHMARKS.md)
    a folder or "owner/name"  any drafter hf_specdec saved (`AutoDrafter`), or a causal LM with the target's vocabulary

Objects work too: a `Drafter` (batched), a `SequenceDrafter` (wrapped to draft row by row), a drafter model of any
registered kind (`kinds.py`), a causal-LM `PreTrainedModel`, or a transformers `CandidateGenerator`.
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedModel
from transformers.generation.candidate_generator import CandidateGenerator

from .auto_drafter import AutoDrafter, UnknownDrafterError, known_names
from .drafters.base import CandidateGeneratorDrafter, Drafter, SequenceDrafter
from .drafters.draft_model import DraftModelDrafter
from .drafters.fallback import FallbackDrafter
from .drafters.medusa import MedusaDrafter
from .drafters.ngram import NgramDrafter
from .drafters.per_row import PerRowDrafter
from .drafters.plain import PlainDrafter
from .drafters.recycle import RecycleDrafter
from .drafters.self_speculative import SelfSpeculativeDrafter
from .kinds import kind_of
from .models.medusa import MedusaHeads
from .errors import InputError

ACCEPTED_ASSISTANTS = (
    f"a name ({known_names()}), an `hf_specdec.Drafter` or `SequenceDrafter`, a drafter model hf_specdec made, a "
    "causal-LM `PreTrainedModel` sharing the target's vocabulary, or a `transformers.generation.CandidateGenerator`"
)


def as_drafter(assistant, target=None) -> Drafter:
    """Whatever was passed as `assistant=` as a batched Drafter (names need the `target` for some kinds), or a clear
    error that lists what is accepted."""
    if isinstance(assistant, Drafter):
        return assistant
    if isinstance(assistant, SequenceDrafter):
        return PerRowDrafter(assistant)  # one copy per row; the loop sees one batched signature
    if isinstance(assistant, str):
        return resolve(assistant, target)
    if isinstance(assistant, PreTrainedModel):
        kind = kind_of(assistant.config)
        if kind is None or assistant.config.is_encoder_decoder:
            raise TypeError(f"assistant={type(assistant).__name__} is not a drafter or a causal LM; expected "
                            f"{ACCEPTED_ASSISTANTS}.")
        if kind.config_class is None and assistant.get_output_embeddings() is None:
            raise TypeError(f"assistant={type(assistant).__name__} has no LM head; expected {ACCEPTED_ASSISTANTS}.")
        return kind.drafter_class(assistant)
    if isinstance(assistant, CandidateGenerator):
        return PerRowDrafter(CandidateGeneratorDrafter(assistant))
    raise TypeError(f"Unsupported assistant of type {type(assistant).__name__}; expected {ACCEPTED_ASSISTANTS}.")


def resolve(spec: str, target=None) -> Drafter:
    """A drafter for an assistant name (see the module docstring)."""
    if spec == "default":
        spec = default_assistant_name(target)
    if "+" in spec:
        first, second = spec.split("+", 1)
        return FallbackDrafter(resolve(first, target), resolve(second, target))
    if spec == "ngram":
        return NgramDrafter()
    if spec == "recycle":
        return RecycleDrafter()
    if spec == "none":
        return PlainDrafter()
    name, _, variant = spec.partition(":")
    if name == "self" and (not variant or variant.isdigit()):
        return SelfSpeculativeDrafter(int(variant) if variant else None)
    if name == "layers" and variant.isdigit():
        if target is None:
            raise InputError(f"assistant={spec!r} cuts a draft model from the target: pass the target too.")
        return DraftModelDrafter(early_layers_draft_model(target, int(variant)))
    if Path(spec).exists() or not variant:
        return as_drafter(AutoDrafter.from_pretrained(spec, target=target))
    model = AutoDrafter.from_pretrained(name, target=target)
    if not isinstance(model, MedusaHeads) or not (variant in ("chain", "tree") or variant.isdigit()):
        raise UnknownDrafterError(f"{spec!r}: only Medusa heads take a suffix (':chain', ':tree' or ':N', an N-node "
                                  f"tree). Known names: {known_names()}.")
    return MedusaDrafter(model, tree=int(variant) if variant.isdigit() else "chain" if variant == "chain" else "default")


def check_name(spec: str) -> None:
    """Raise `UnknownDrafterError` now, before any model loads, for a name `resolve` could never resolve."""
    from .shipped import shipped_drafter_names

    for part in spec.split("+"):
        name, _, variant = part.partition(":")
        if part in ("default", "ngram", "recycle", "none") or Path(part).exists():
            continue
        if (name == "self" and (not variant or variant.isdigit())) or (name == "layers" and variant.isdigit()):
            continue
        readable = name in shipped_drafter_names() or name.count("/") == 1 or Path(name).exists()  # a saved run too
        if readable and (not variant or variant in ("chain", "tree") or variant.isdigit()):
            continue
        raise UnknownDrafterError(f"Unknown drafter {part!r}. Known: {known_names()}.")


def default_assistant_name(target=None) -> str:
    """The fastest drafter the project has measured for this target (BENCHMARKS.md).

    For the embedded SmolLM2: n-gram lookup backed by the shipped Medusa heads' chain; for any other target, n-gram
    lookup.
    """
    from .default_model import is_default_target
    from .shipped import shipped_drafter_names

    if (target is None or is_default_target(target)) and "medusa" in shipped_drafter_names():
        return "ngram+medusa:chain"
    return "ngram"


def early_layers_draft_model(target, num_layers: int):
    """An (untrained) draft model cut from the target: its first `num_layers` layers, final norm and LM head, on the
    target's device and in its dtype."""
    config = target.config.__class__.from_dict(target.config.to_dict())
    total = config.num_hidden_layers
    if not 1 <= num_layers <= total:
        raise InputError(f"layers:{num_layers} needs 1 <= N <= the target's {total} layers.")
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:num_layers]
    drafter = target.__class__(config).to(device=target.device, dtype=target.dtype)
    drafter.load_state_dict(target.state_dict(), strict=False)
    return drafter.eval()


__all__ = ["as_drafter", "resolve", "check_name", "default_assistant_name", "early_layers_draft_model", "ACCEPTED_ASSISTANTS"]
