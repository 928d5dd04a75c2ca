"""Drafters in other projects' layouts: the checkpoints speculators, SafeAILab's EAGLE, SpecForge and FasterDecoding's
Medusa publish, read into hf_specdec's own kinds and written back in the same layout.

A layout is a `PublishedFormat`, kept in the folder of the kind it maps onto (`kinds/<kind>/formats.py`) and
registered with it (`DrafterKind(..., formats=("module:NAME", ...))`). `AutoDrafter` asks `read_published` for any
folder or Hub id whose config is none of hf_specdec's own: the first format that recognises the checkpoint (by its
config, or by its tensor names where the config is a plain Llama's) builds the kind's model from it, and records
where it came from in the model's config (`published`), so that `save_pretrained` (a fine-tune by
`training/distill.py --drafter FOLDER` included) writes the same layout again, which loads where the original did.
A format's `write` is also an export format (`hf-specdec export --format <name>`).

Every flag of a layout is honoured or refused by name before any forward; a checkpoint made for another target is
refused when it binds (hidden size, vocabulary, layer ids); pickled weights load with `weights_only=True`.
"""

from __future__ import annotations

import warnings

import torch

from ..errors import InputError
from ..models.borrowed import bind_if_borrowing
from .checkpoint import Checkpoint


#: speculators' layouts no kind reads, and why
UNREAD = {
    "dflash2": "DFlash plus dynamic convolutions in every layer and a candidate selector, which no kind computes",
    "dspark": "DFlash plus a Markov logit bias and a confidence head, which no kind computes",
    "xpress": "DFlash plus a refiner read by Jacobi passes, which no kind computes",
    "mtp": "a Qwen3-Next / Qwen3.5 multi-token-prediction layer; the mtp kind drafts with the MTP layers transformers "
           "ships, and transformers has none for those models",
}


class PublishedFormat:
    """One project's layout of one kind's drafters (a subclass per layout; one instance each, registered)."""

    name = ""  # what the model's config records, and the export format's name
    kind = ""  # the hf_specdec kind it maps onto
    project = ""  # who writes it, for errors, the README and the warnings

    def recognises(self, checkpoint: Checkpoint) -> bool:
        """Whether the checkpoint is in this layout (default: never; a layout hf_specdec only writes)."""
        return False

    def read(self, checkpoint: Checkpoint, target=None):
        """The kind's model, its weights the checkpoint's (an `InputError` naming what is not supported)."""
        raise NotImplementedError

    def write(self, model, target, out, dtype: torch.dtype) -> None:
        """`model` (read from this layout, or the kind's own) in this layout, into the folder `out`."""
        raise InputError(f"hf_specdec reads {self.project}'s layout but does not write it.")

    # --- helpers the formats share ---
    def built(self, model_class, config, state: dict, checkpoint: Checkpoint, dtype=None):
        """`model_class(config)` holding exactly `state` (every tensor used, none missing), in `dtype` (default: the
        checkpoint's floating dtype), recording this layout and the original config."""
        config.published = {"format": self.name, "config": checkpoint.config}
        model = model_class(config)
        expected = set(model.state_dict())
        missing, unused = sorted(expected - set(state)), sorted(set(state) - expected)
        if missing or unused:
            raise InputError(f"{checkpoint.source}: a {self.project} checkpoint whose tensors do not fit its config "
                             f"(missing {missing[:5]}, not used {unused[:5]}).")
        floating = [t.dtype for t in state.values() if t.is_floating_point()]
        dtype = dtype or (floating[0] if floating else torch.float32)
        model.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()})
        return model.to(dtype).eval()


def read_published(source, config: dict, target=None, dtype=None, **hub):
    """The drafter model at `source` if some registered layout recognises it (with `target`: on its device, bound to
    it), else None."""
    from ..registry import published_formats

    checkpoint = Checkpoint(source, config, **hub)
    found = layout_of(checkpoint)
    if found is None:
        kind = config.get("speculators_model_type")
        if kind is not None:
            readable = sorted({fmt.name.removeprefix("speculators-") for fmt in published_formats()
                               if fmt.name.startswith("speculators-")})
            why = UNREAD.get(kind, "a layout this hf_specdec does not know (a newer speculators release?)")
            raise InputError(f"{source}: a speculators {kind!r} checkpoint; hf_specdec reads speculators' "
                             f"{', '.join(readable)} drafters, not this one: {why}.")
        return None
    model = found.read(checkpoint, target)
    if dtype is not None and dtype != "auto":
        model = model.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
    if target is not None:
        model.to(target.device)
        bind_if_borrowing(model, target)
        check_target_name(model, target)
    return model


def published_format(source, config: dict, **hub) -> PublishedFormat | None:
    """The registered layout that recognises the checkpoint at `source` (reading its config and tensor names only)."""
    return layout_of(Checkpoint(source, config, **hub))


def layout_of(checkpoint: Checkpoint) -> PublishedFormat | None:
    from ..registry import published_formats

    return next((fmt for fmt in published_formats() if fmt.recognises(checkpoint)), None)


def write_published(model, folder) -> None:
    """`model` in the layout it was read from (`config.published`), in that checkpoint's dtype, into `folder`."""
    from ..models.borrowed import bound_target
    from ..registry import published_formats

    name, original = model.config.published["format"], model.config.published.get("config") or {}
    fmt = next((fmt for fmt in published_formats() if fmt.name == name), None)
    if fmt is None:
        raise InputError(f"This drafter was read from the {name!r} layout, which no registered kind writes.")
    dtype = original.get("dtype") or original.get("torch_dtype")
    dtype = getattr(torch, dtype) if isinstance(dtype, str) and hasattr(torch, dtype) else model.dtype
    fmt.write(model, bound_target(model), folder, dtype)


def save_in_layout(model, folder) -> None:
    """`model.save_pretrained(folder)`, in the layout it was read from if another project's (hf_specdec's own drafter
    classes do so themselves; transformers' own, a DFlash drafter read from speculators' layout, do not)."""
    if (getattr(model.config, "published", None) or {}).get("format"):
        write_published(model, folder)
    else:
        model.save_pretrained(folder)


def check_target_name(model, target) -> None:
    """Warn when the target's name differs from the one the checkpoint names (fine-tunes and quantized copies keep
    their own names, so shapes decide; they were checked when the drafter bound)."""
    expected = getattr(model.config, "target_name_or_path", None)
    actual = getattr(target.config, "_name_or_path", None) or getattr(target, "name_or_path", None)
    if expected and actual and expected.rstrip("/").split("/")[-1] != str(actual).rstrip("/").split("/")[-1]:
        warnings.warn(f"This drafter was published for {expected!r}; the target is {actual!r}. Their shapes agree, so it "
                      "drafts for it (the output stays exact either way; acceptance shows whether it suits).",
                      stacklevel=3)


__all__ = ["PublishedFormat", "Checkpoint", "read_published", "published_format", "write_published", "save_in_layout",
           "check_target_name"]
