"""A drafter kind's options: one dataclass per kind (as peft keeps one config per method), read wherever the kind is
configured, each option under one name.

    @dataclass
    class HeadsOptions(KindOptions):
        num_heads: int = option(4, "number of heads", config=True, was="medusa_heads")  # saved in a new drafter's config
        tree: str = option("chain", "...", argument=True, parse=tree_shape)              # the drafter's keyword; "heads:12"
        head_decay: float = option(0.8, "loss weight of head i is decay**i")             # how it trains

- every field is a flag of the trainer under its own name (`--num-heads`: `HfArgumentParser` reads `flags()`);
- `config=True` fields are a new drafter's config fields, under the same names (`config_fields()`); a fine-tune keeps
  its folder's, so the trainer refuses them with `--drafter DIR`;
- the one `argument=True` field is the drafter's keyword and what follows ':' in an assistant name (`from_argument`):
  `"heads:chain"`, `"self:12"`;
- `parse` turns a field's text (a flag, a name's ':arg') into what the config or the drafter takes, once, when the
  options are made (`value()` reads it); `was` is the option's earlier name: its flag still works, and a run saved
  under it still resumes.

The kind registers its class (`DrafterKind(..., options=HeadsOptions)`). Light: no torch, no transformers.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Callable

from .errors import InputError


def option(default, help: str, *, config: bool = False, argument: bool = False,
           parse: Callable[[str], object] | None = None, required: bool = False, was: str | None = None):
    """A field of a kind's options (the module's docstring says what each role does); `required`: a name must carry
    the argument (`"layers:N"`)."""
    role = {"config": config, "argument": argument, "parse": parse, "required": required, "was": was}
    return field(default=default, metadata={"help": help, ROLE: role})


ROLE = "hf_specdec"  # the metadata key of what a field serves (`help` is argparse's)


def _role(f) -> dict:
    return f.metadata.get(ROLE, {})


def positive_int(text) -> int:
    if isinstance(text, int) and not isinstance(text, bool) and text >= 1:
        return text
    if isinstance(text, str) and text.isdigit() and int(text) >= 1:
        return int(text)
    raise InputError(f"must be a whole number >= 1 (got {text!r})")


def or_none(value):
    """0 or '': the target's own (None)."""
    return value or None


def tree_shape(text):
    """A drafter that scores several positions at once drafts its top-1 chain ('chain'), its default tree ('tree' or
    'default') or the N nodes likeliest to be accepted ('N')."""
    if text in ("chain", "default"):
        return text
    if text == "tree":
        return "default"
    try:
        return positive_int(text)
    except InputError:
        raise InputError(f"must be 'chain', 'tree' or a node count N >= 1 (got {text!r})") from None


@dataclass
class KindOptions:
    """A kind with no options of its own (the base of every kind's options)."""

    def __post_init__(self):
        self._parsed = {}  # the values of the fields that have a `parse`, parsed once here
        for f in fields(self):
            parse = _role(f).get("parse")
            if parse is not None and getattr(self, f.name) is not None:
                try:
                    self._parsed[f.name] = parse(getattr(self, f.name))
                except InputError as error:
                    raise InputError(f"--{f.name.replace('_', '-')} {error}.") from error
        self.check()

    def check(self) -> None:
        """Raise an `InputError` naming every option out of its range (`check_ranges`), before any work."""

    @classmethod
    def argument(cls):
        """The field a name's ':arg' sets, or None (the kind's names take none)."""
        return next((f for f in fields(cls) if _role(f).get("argument")), None)

    @classmethod
    def usage(cls, name: str) -> str:
        """How the kind's name is written: 'self' (or 'self:N'), 'layers:N', 'ngram'."""
        arg = cls.argument()
        if arg is None:
            return f"'{name}'"
        return f"'{name}:N'" if _role(arg)["required"] else f"'{name}' (or '{name}:N')"

    @classmethod
    def from_argument(cls, text: str = "") -> "KindOptions":
        """The options a name's ':arg' (`text`; "" when it has none) stands for, or an `InputError` saying what the
        kind takes ("takes nothing after ':'")."""
        arg = cls.argument()
        if not text:
            if arg is not None and _role(arg)["required"]:
                raise InputError("needs ':N'")
            return cls()
        if arg is None:
            raise InputError("takes nothing after ':'")
        try:
            return cls(**{arg.name: text if _role(arg)["parse"] else positive_int(text)})
        except InputError as error:  # (its parse's own words, not the flag's)
            raise InputError(f"cannot take ':{text}': what follows ':' {error.__cause__ or error}") from None

    def value(self, name: str):
        """An option's value as the config or the drafter takes it (its text parsed: '2,15,27' -> [2, 15, 27])."""
        return self._parsed.get(name, getattr(self, name))

    @classmethod
    def flags(cls) -> type:
        """The dataclass `HfArgumentParser` reads for the trainer's flags: these fields with their help and their
        earlier spellings (`aliases`), and no other metadata, since argparse takes every metadata key as a keyword;
        `cls(**asdict(parsed))` is the options."""
        hints = typing.get_type_hints(cls)
        return make_dataclass(f"{cls.__name__}Flags", [
            (f.name, hints[f.name], field(default=f.default, metadata={"help": f.metadata.get("help", ""),
                                                                        "aliases": cls.earlier_flags(f.name)}))
            for f in fields(cls)])

    @classmethod
    def earlier_flags(cls, name: str) -> list[str]:
        """The flags an option was spelled as before it took its config's name ('--medusa-heads', '--medusa_heads')."""
        was = _role(cls.__dataclass_fields__[name]).get("was")
        return [f"--{was.replace('_', '-')}", f"--{was}"] if was else []

    @classmethod
    def earlier_names(cls) -> dict[str, str]:
        """{earlier name: name} (a saved run's arguments may use the earlier)."""
        return {_role(f)["was"]: f.name for f in fields(cls) if _role(f).get("was")}

    def config_fields(self) -> dict:
        """A new drafter's config fields (its `config=True` fields, parsed), under their names."""
        return {f.name: self.value(f.name) for f in fields(self) if _role(f).get("config")}

    def drafter_keywords(self) -> dict:
        """The kind's drafter's keywords: its argument's field, parsed (none for a kind whose names take none)."""
        arg = self.argument()
        return {} if arg is None else {arg.name: self.value(arg.name)}


def range_errors(options, positive=(), non_negative=()) -> list[str]:
    """What is out of its range among these fields of `options` (a dataclass of flags), one phrase each."""
    flag = lambda name: "--" + name.replace("_", "-")  # noqa: E731
    bad = [f"{flag(n)} must be >= 1 (got {getattr(options, n)})" for n in positive if getattr(options, n) < 1]
    return bad + [f"{flag(n)} must be >= 0 (got {getattr(options, n)})" for n in non_negative if getattr(options, n) < 0]


def check_ranges(options, positive=(), non_negative=()) -> None:
    """An `InputError` naming every option out of its range (a kind's `check`)."""
    bad = range_errors(options, positive, non_negative)
    if bad:
        raise InputError("; ".join(bad) + ".")


TREE_HELP = ("what it drafts (and the trainer evaluates): 'chain' (each position's top token), 'tree' (the default "
             "tree) or N (the N nodes likeliest to be accepted, from the accuracy training measured)")


@dataclass
class TreeOptions(KindOptions):
    """The options of a kind whose drafter scores several positions at once: the shape it drafts."""

    tree: str = option("chain", TREE_HELP, argument=True, parse=tree_shape)


__all__ = ["KindOptions", "TreeOptions", "TREE_HELP", "option", "check_ranges", "range_errors", "positive_int", "or_none", "tree_shape"]
