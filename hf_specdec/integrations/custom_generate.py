"""The `generate` of a drafter's `custom_generate/` folder: hf_specdec's exact speculative decoding, plain transformers.

    out = target.generate(**inputs, custom_generate="<drafter folder or Hub id>", trust_remote_code=True,
                          max_new_tokens=64)

Every saved `SpecDrafterForCausalLM` folder carries `custom_generate/generate.py`: this module, plus a copy of the
hf_specdec modules it imports, generated at save time by `hf_specdec.hub.write_custom_generate`. transformers loads
it and calls `generate(model=target, **generate_arguments)`; this loads the drafter from the same folder or Hub repo,
binds it to the target and runs `speculative_generate`. hf_specdec itself need not be installed.
"""

from __future__ import annotations

import inspect
import threading

from ..assistants.auto_drafter import HUB_KWARGS, AutoDrafter
from ..kinds import __name__ as _built_in_kinds  # noqa: F401 (its registry lines: the bundle carries the kinds)
from ..generation.loop import speculative_generate
from ..models.borrowed import bind_if_borrowing


def generate(model, drafter: str | None = None, **kwargs):
    """Speculative decoding of `model` (the target) with the drafter stored next to this file.

    `drafter`: the drafter folder / Hub id (default: the one `custom_generate=` named). Everything else is what
    `generate()` takes, plus `speculative_generate`'s options (`num_draft_tokens`, `draft_length`, ...).
    """
    if kwargs.get("assistant") is not None:
        raise ValueError("custom_generate=<drafter folder or repo> brings its own drafter: drop `assistant=`.")
    hub = {k: kwargs.pop(k) for k in HUB_KWARGS if k in kwargs}  # where to read the drafter, not generation options
    source = drafter or _custom_generate_source(model)
    assistant = _drafter_for(model, source, tuple(sorted(hub.items())))
    return model.generate(custom_generate=speculative_generate, assistant=assistant, **kwargs)


_KEPT = "_hf_specdec_folder_drafters"  # the target's attribute holding the drafters its calls loaded
_LOCK = threading.Lock()


def _drafter_for(model, source: str, hub: tuple):
    """The drafter at `source`, loaded at this target's first call and kept with it (per where it was read, device and
    dtype; released with the target), bound to it: a Hub id is looked up once, and two targets never share (or rebind)
    one drafter. Concurrent calls may pass the same drafter: each decodes with its own per-call state."""
    key = (source, hub, str(model.device), str(model.dtype))
    with _LOCK:
        kept = model.__dict__.setdefault(_KEPT, {})
        drafter = kept.get(key)
    if drafter is None:
        drafter = bind_if_borrowing(AutoDrafter.from_pretrained(source, **dict(hub)).to(model.device), model)
        with _LOCK:
            drafter = kept.setdefault(key, drafter)  # two threads may have loaded one: both use the first
    return drafter


def _custom_generate_source(model) -> str:
    """The `custom_generate=` string of the `model.generate()` call running us: the folder / repo of this drafter.

    transformers hands it to `load_custom_generate` but not to `generate`, and runs a COPY of this file from its
    module cache, so `__file__` does not lead back to the drafter: read it from that `generate()` frame (this thread's
    own stack: concurrent calls each find their own).
    """
    frame = inspect.currentframe()
    while frame is not None:
        source = frame.f_locals.get("custom_generate")
        if frame.f_code.co_name == "generate" and frame.f_locals.get("self") is model and isinstance(source, str):
            return source
        frame = frame.f_back
    raise ValueError(
        "Could not tell which drafter to load: pass `drafter='<drafter folder or Hub id>'` to `generate()`, or call "
        "`model.generate(..., custom_generate='<drafter folder or Hub id>', trust_remote_code=True)`."
    )
