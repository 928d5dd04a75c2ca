"""The grammar of assistant names: parsed once per call by the resolver (`resolve.py`), by the command line's check
of a name before anything loads (`check`), and listed by the errors (`known_names`). The words are the registry's
kinds built from a name (`registry.py`), a kind registered from outside included.

    "ngram"                   n-gram lookup over the prompt and the output so far (no model)
    "suffix"                  suffix decoding: earlier calls' prompts and outputs (kept with the target) and this call's
    "recycle"                 token recycling: a tree from the target's own recent top-k successors (no model)
    "none"                    no drafts: plain steps through hf_specdec's own loop (a baseline for measurements)
    "self", "self:L"          self-speculation: the target's first half (or first L) of its layers
    "layers:N"                an untrained draft model cut from the target's first N layers (a baseline)
    "distilled", ...          a drafter shipped for the default target (hf_specdec/shipped_drafters/)
    "NAME:chain", "NAME:N"    a loaded drafter that drafts trees, drafting its top-1 chain or an N-node tree (what
                              follows ':' is its kind's options' to read: `kind_options.py`)
    "a+b"                     a's draft when it has one, else b's (e.g. "ngram+distilled")
    "default"                 the fastest drafter measured for this target (BENCHMARKS.md)
    a folder or "owner/name"  any drafter hf_specdec saved (`AutoDrafter`), or a causal LM with the target's vocabulary
                              (a built-in name wins over a folder of that name: "./ngram" names the folder)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..default_model import is_default_target, is_hub_id
from ..errors import InputError
from ..kind_options import KindOptions
from ..registry import DrafterKind, drafter_kinds, named_kinds
from .shipped import shipped_default, shipped_drafter_names


class UnknownDrafterError(InputError):
    """A drafter name that is none of the known ones, no folder, and no Hub repo that could be read."""


@dataclass(frozen=True)
class Part:
    """One drafter of a name ("a+b" has two): a kind built from its name, or a drafter to load (shipped, folder or Hub
    id)."""

    kind: DrafterKind | None = None
    options: KindOptions | None = None  # a kind's options, as its ':arg' set them
    source: str | None = None  # a shipped drafter's name, a folder or a Hub id
    argument: str = ""  # a loaded drafter's ':arg', which its kind's options read once it is loaded ('chain', 'N')


def known_names() -> str:
    shipped = ", ".join(shipped_drafter_names()) or "none"
    words = ", ".join(kind.usage for kind in named_kinds().values())
    return (f"{words}, 'default', a shipped drafter ({shipped}; one that drafts trees also as 'NAME:chain' or "
            "'NAME:N'), "
            "'a+b' (a's draft, else b's), a drafter folder, or a Hub id 'owner/name'")


def default_name(target=None, sampling: bool = False) -> str:
    """The fastest drafter the project has measured for this target among those that keep nothing across calls
    (BENCHMARKS.md): for the embedded SmolLM2, the name its shipped drafters' `default.json` gives, greedy or sampled
    (n-gram lookup backed by the shipped heads' chain; sampled, n-gram lookup alone); for any other target, n-gram
    lookup. Suffix decoding measures faster on repeated work, but a seeded sample would then depend on earlier calls,
    and one caller's text would shape how fast another's requests run, so it stays opt-in ("suffix")."""
    if target is None or is_default_target(target):
        return shipped_default(sampling) or "ngram"
    return "ngram"


@dataclass(frozen=True)
class Name:
    """A parsed assistant name: its parts, and the name they spell with each "default" replaced by the drafter it
    stands for in this call (the key a name's drafter is kept under)."""

    text: str
    parts: tuple[Part, ...]


def parse(spec: str, target=None, sampling: bool = False) -> Name:
    """An assistant name parsed, or `UnknownDrafterError` listing the known names. Nothing is loaded."""
    if not isinstance(spec, str) or not spec:
        raise UnknownDrafterError(f"Unknown drafter {spec!r}. Known: {known_names()}.")
    pieces = []
    for piece in spec.split("+"):
        pieces += default_name(target, sampling).split("+") if piece == "default" else [piece]
    return Name("+".join(pieces), tuple(_parse_one(piece) for piece in pieces))


def _parse_one(piece: str) -> Part:
    name, colon, argument = piece.partition(":")
    kind = named_kinds().get(name)
    # registered names win: a folder called "ngram" in the working directory is named by a path ("./ngram")
    if kind is None and name not in shipped_drafter_names() and Path(piece).exists():
        return Part(source=piece)
    if colon and not argument:
        raise UnknownDrafterError(f"Unknown drafter {piece!r}: nothing follows ':'. Known: {known_names()}.")
    if kind is not None:
        try:
            return Part(kind, kind.options.from_argument(argument if colon else ""))
        except InputError:
            raise UnknownDrafterError(f"Unknown drafter {piece!r}: {kind.usage} is {kind.description}. "
                                      f"Known: {known_names()}.") from None
    loadable = name in shipped_drafter_names() or Path(name).exists() or is_hub_id(name)
    # (which kind a loaded drafter is shows once it loads: here, an argument no kind's options take is refused)
    if loadable and (not colon or any(_takes(kind.options, argument) for kind in drafter_kinds() if kind.model_class)):
        return Part(source=name, argument=argument)
    raise UnknownDrafterError(f"Unknown drafter {piece!r}. Known: {known_names()}.")


def _takes(options_class, argument: str) -> bool:
    try:
        options_class.from_argument(argument)
        return True
    except InputError:
        return False


def check(spec: str) -> None:
    """Raise `UnknownDrafterError` now, before any model loads, for a name that could never resolve."""
    parse(spec)


__all__ = ["Part", "Name", "parse", "check", "known_names", "default_name",
           "UnknownDrafterError"]
