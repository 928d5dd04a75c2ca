"""Whatever was passed as `assistant=`, as a batched `Drafter`; the drafters built from names, kept with their target.

Names (the vocabulary is `names.py`) are resolved once per target: the drafter built for a name is kept with the
target (per device and dtype; released with it) and reused by later calls, so that loaded weights, token recycling's
table, a suffix index and what `draft_length="adaptive"` learned carry over from call to call, as they do for a
drafter object. State that belongs to one call (caches, rows) is reset by every drafter's `start`. Calls on several
threads may share one drafter, by name or by object: a call that finds it busy decodes with a fork of it (`claim`).

Objects work too: a `Drafter` (batched), a `SequenceDrafter` (wrapped to draft row by row), a drafter model of any
registered kind (`kinds.py`), a causal-LM `PreTrainedModel`, or a transformers `CandidateGenerator`.
"""

from __future__ import annotations

import contextlib
import importlib
import threading

from transformers import PreTrainedModel
from transformers.generation.candidate_generator import CandidateGenerator

from .auto_drafter import AutoDrafter
from .drafters.base import CandidateGeneratorDrafter, Drafter, SequenceDrafter
from .drafters.draft_model import DraftModelDrafter
from .drafters.fallback import FallbackDrafter
from .drafters.medusa import MedusaDrafter
from .drafters.per_row import PerRowDrafter
from .errors import InputError
from .kinds import kind_of
from .models.medusa import MedusaHeads
from .names import Part, UnknownDrafterError, default_name, known_names, parse

ACCEPTED_ASSISTANTS = (
    f"a name ({known_names()}), an `hf_specdec.Drafter` or `SequenceDrafter`, a drafter model hf_specdec made, a "
    "causal-LM `PreTrainedModel` sharing the target's vocabulary, or a `transformers.generation.CandidateGenerator`"
)

_KEPT = "_hf_specdec_assistants"  # the target's attribute holding the drafters built from names
_LOCK = threading.Lock()
_BUSY: set[int] = set()  # ids of the drafters decoding a call right now


def as_drafter(assistant, target=None) -> Drafter:
    """Whatever was passed as `assistant=` as a batched Drafter (names need the `target` for some kinds, and are kept
    with it), or a clear error that lists what is accepted."""
    if isinstance(assistant, Drafter):
        return assistant
    if isinstance(assistant, SequenceDrafter):
        return PerRowDrafter(assistant)  # one copy per row; the loop sees one batched signature
    if isinstance(assistant, str):
        return get_assistant(target, assistant) if target is not None else build(assistant)
    if isinstance(assistant, PreTrainedModel):
        kind = kind_of(assistant.config)
        if kind is None and _is_causal_lm(assistant):
            return DraftModelDrafter(assistant)  # a causal LM whose config type no mapping names (a multimodal text model)
        if kind is None or assistant.config.is_encoder_decoder:
            raise TypeError(f"assistant={type(assistant).__name__} is not a drafter or a causal LM; expected "
                            f"{ACCEPTED_ASSISTANTS}.")
        if kind.config_class is None and assistant.get_output_embeddings() is None:
            raise TypeError(f"assistant={type(assistant).__name__} has no LM head; expected {ACCEPTED_ASSISTANTS}.")
        return kind.drafter_class(assistant)
    if isinstance(assistant, CandidateGenerator):
        return PerRowDrafter(CandidateGeneratorDrafter(assistant))
    raise TypeError(f"Unsupported assistant of type {type(assistant).__name__}; expected {ACCEPTED_ASSISTANTS}.")


def _is_causal_lm(model) -> bool:
    """What a causal LM is, whatever its config type: a decoder that generates, with an LM head."""
    from transformers import GenerationMixin

    return (isinstance(model, GenerationMixin) and not model.config.is_encoder_decoder
            and model.get_output_embeddings() is not None)


def get_assistant(target, name: str) -> Drafter:
    """The drafter `name` stands for on this target: built at the first call, then the same object, kept with the
    target (per device and dtype). Use it to look inside (`get_assistant(model, "suffix").index.save(path)`)."""
    key = (name, str(target.device), str(target.dtype))
    with _LOCK:
        kept = target.__dict__.setdefault(_KEPT, {})
        drafter = kept.get(key)
    if drafter is None:
        drafter = build(name, target)
        with _LOCK:
            drafter = kept.setdefault(key, drafter)  # two threads may have built one: both keep the first
    return drafter


def forget_assistants(target) -> None:
    """Drop the drafters kept for this target's names (the next call builds them again)."""
    with _LOCK:
        target.__dict__.pop(_KEPT, None)


def build(name: str, target=None) -> Drafter:
    """A new drafter for an assistant name (see `names.py`)."""
    parts = [_build_part(part, target) for part in parse(name, target)]
    drafter = parts[-1]
    for first in reversed(parts[:-1]):
        drafter = FallbackDrafter(first, drafter)
    return drafter


def _build_part(part: Part, target) -> Drafter:
    if part.word is not None:
        module, _, attribute = part.word.build.partition(":")
        builder = importlib.import_module(f".{module}", __package__)
        for name in attribute.split("."):
            builder = getattr(builder, name)
        return builder(target, part.number)
    model = AutoDrafter.from_pretrained(part.source, target=target)
    if not part.variant:
        return as_drafter(model)
    if not isinstance(model, MedusaHeads):
        raise UnknownDrafterError(f"{part.source}:{part.variant}: only Medusa heads take a suffix (':chain', ':tree' or "
                                  f"':N', an N-node tree). Known names: {known_names()}.")
    variant = part.variant
    return MedusaDrafter(model, tree=int(variant) if variant.isdigit() else "chain" if variant == "chain" else "default")


@contextlib.contextmanager
def claim(assistant, target):
    """The drafter one `generate()` call decodes with, and the drafter what it learns is kept under (`learner`). The
    first call to take a drafter decodes with it; a concurrent call (another thread) decodes with a fork of it, which
    shares what it knows and has per-call state of its own (`Drafter.fork`): one drafter serves any number of calls."""
    drafter = as_drafter(assistant, target)
    # what "adaptive" learns is kept per drafter: a name's (kept with the target), or the object the caller passed
    # (a model is wrapped afresh for each call)
    learner = drafter if isinstance(assistant, str) else assistant
    with _LOCK:
        busy = id(drafter) in _BUSY
        if not busy:
            _BUSY.add(id(drafter))
    try:
        yield (drafter.fork() if busy else drafter), learner
    finally:
        if not busy:
            with _LOCK:
                _BUSY.discard(id(drafter))


def default_assistant_name(target=None) -> str:
    return default_name(target)


def early_layers_drafter(target, num_layers: int) -> Drafter:
    """`layers:N`: an untrained draft model cut from the target's first N layers."""
    if target is None:
        raise InputError(f"assistant='layers:{num_layers}' cuts a draft model from the target: pass the target too.")
    return DraftModelDrafter(early_layers_draft_model(target, num_layers))


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


__all__ = ["as_drafter", "get_assistant", "forget_assistants", "build", "claim", "default_assistant_name",
           "early_layers_draft_model", "ACCEPTED_ASSISTANTS"]
