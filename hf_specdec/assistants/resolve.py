"""`assistant=`, resolved once per call into an `Assistant`: the batched `Drafter` the loop decodes with.

Names (the vocabulary is `grammar.py`) are parsed once and their drafters kept with the target (per device and dtype;
released with it) and reused by later calls, so that loaded weights, token recycling's table, a suffix index and what
`draft_length="adaptive"` learned carry over from call to call, as they do for a drafter object. State that belongs to
one call (caches, rows) is reset by every drafter's `start`. Calls on several threads may share one drafter, by name or
by object: a call that finds it busy decodes with a fork of it (`Assistant.claimed`).

Objects work too: a `Drafter` (batched), a `SequenceDrafter` (wrapped to draft row by row), a drafter model of any
registered kind (`registry.py`), a causal-LM `PreTrainedModel`, or a transformers `CandidateGenerator`.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

from transformers import PreTrainedModel
from transformers.generation.candidate_generator import CandidateGenerator

from .auto_drafter import AutoDrafter
from ..errors import InputError
from ..drafters.base import CandidateGeneratorDrafter, Drafter, SequenceDrafter
from ..drafters.fallback import FallbackDrafter
from ..drafters.per_row import PerRowDrafter
from .grammar import Name, Part, UnknownDrafterError, known_names, parse
from ..registry import drafter_kinds, kind_of_model


def accepted_assistants() -> str:
    """What `assistant=` takes, for errors (the names as registered now: kinds registered from outside included)."""
    return (f"a name ({known_names()}), an `hf_specdec.Drafter` or `SequenceDrafter`, a drafter model hf_specdec made, "
            "a causal-LM `PreTrainedModel` sharing the target's vocabulary, or a "
            "`transformers.generation.CandidateGenerator`")


_KEPT = "_hf_specdec_assistants"  # the target's attribute holding the drafters built from names
_LOCK = threading.Lock()
_BUSY: set[int] = set()  # ids of the drafters decoding a call right now


@dataclass(frozen=True)
class Assistant:
    """What one call's `assistant=` stands for: the drafter, and what `draft_length="adaptive"` keeps what it learns
    under (`learner`: a name's kept drafter, or the object the caller passed, since a model is wrapped afresh)."""

    drafter: Drafter
    learner: object

    @contextlib.contextmanager
    def claimed(self):
        """The drafter this call decodes with: the first call to take it decodes with it; a concurrent call (another
        thread) with a fork of it, which shares what it knows and has per-call state of its own (`Drafter.fork`)."""
        with _LOCK:
            busy = id(self.drafter) in _BUSY
            if not busy:
                _BUSY.add(id(self.drafter))
        try:
            yield self.drafter.fork() if busy else self.drafter
        finally:
            if not busy:
                with _LOCK:
                    _BUSY.discard(id(self.drafter))


def resolve(assistant, target=None, sampling: bool = False) -> Assistant:
    """`assistant=` as this call's `Assistant`, or a clear error listing what is accepted. A name is parsed here,
    once ("default" standing for the drafter measured fastest for this target, greedy or `sampling`), and built at its
    first use on `target`, then kept with it."""
    # (each family goes down once: names to grammar.py, models to the registry, objects to their batched form)
    if isinstance(assistant, str):
        drafter = _kept(target, parse(assistant, target, sampling))
        return Assistant(drafter, drafter)
    if isinstance(assistant, (Drafter, SequenceDrafter, CandidateGenerator)):
        return Assistant(_adapted(assistant), assistant)
    kind = kind_of_model(assistant) if isinstance(assistant, PreTrainedModel) else None
    if kind is None:
        raise TypeError(f"Unsupported assistant of type {type(assistant).__name__} (a model needs an LM head to draft "
                        f"with); expected {accepted_assistants()}.")
    return Assistant(kind.drafter_for(assistant), assistant)


def as_drafter(assistant, target=None) -> Drafter:
    """Whatever can be passed as `assistant=`, as a batched Drafter (names need the `target` for some kinds, and are
    kept with it)."""
    return resolve(assistant, target).drafter


def get_assistant(target, name: str) -> Drafter:
    """The drafter `name` stands for on this target: built at the first call, then the same object, kept with the
    target (per device and dtype). Use it to look inside (`get_assistant(model, "suffix").index.save(path)`)."""
    return resolve(name, target).drafter


def build(name: str, target=None) -> Drafter:
    """A new drafter for an assistant name (not kept)."""
    return _built(parse(name, target), target)


def _kept(target, name: Name) -> Drafter:
    if target is None:
        return _built(name, None)
    key = (name.text, str(target.device), str(target.dtype))
    with _LOCK:
        kept = target.__dict__.setdefault(_KEPT, {})
        drafter = kept.get(key)
    if drafter is None:
        drafter = _built(name, target)
        with _LOCK:
            drafter = kept.setdefault(key, drafter)  # two threads may have built one: both keep the first
    return drafter


def _built(name: Name, target) -> Drafter:
    drafters = [_built_part(part, target) for part in name.parts]
    drafter = drafters[-1]
    for first in reversed(drafters[:-1]):
        drafter = FallbackDrafter(first, drafter)
    return drafter


def _built_part(part: Part, target) -> Drafter:
    if part.kind is not None:
        return part.kind.builder()(target, part.options)
    model = AutoDrafter.from_pretrained(part.source, target=target)
    kind = kind_of_model(model)
    try:  # what follows ':' is its kind's to read (`kind_options.py`)
        options = kind.options.from_argument(part.argument)
    except InputError as error:
        takers = [k.name for k in drafter_kinds() if k.model_class is not None and k.options.argument() is not None]
        raise UnknownDrafterError(f"{part.source}:{part.argument}: a {kind.name} drafter {error} (the drafters that "
                                  f"take ':chain', ':tree' or ':N' draft trees: {', '.join(takers)}). Known names: "
                                  f"{known_names()}.") from None
    return kind.drafter_for(model, options)


def _adapted(assistant) -> Drafter:
    """A drafter object as a batched Drafter: one copy per row of a sequence drafter (the loop sees one signature)."""
    if isinstance(assistant, SequenceDrafter):
        return PerRowDrafter(assistant)
    if isinstance(assistant, CandidateGenerator):
        return PerRowDrafter(CandidateGeneratorDrafter(assistant))
    return assistant


__all__ = ["Assistant", "resolve", "as_drafter", "get_assistant", "build", "accepted_assistants"]
