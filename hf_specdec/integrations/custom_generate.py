"""The `generate` of a drafter's `custom_generate/` folder: hf_specdec's exact speculative decoding, plain transformers.

    out = target.generate(**inputs, custom_generate="<drafter folder or Hub id>", trust_remote_code=True,
                          max_new_tokens=64)

Every saved `SpecDrafterForCausalLM` folder carries `custom_generate/generate.py`: this module, plus a copy of the
hf_specdec modules it imports, generated at save time by `hf_specdec.hub.write_custom_generate`. transformers loads
it and calls `generate(model=target, **generate_arguments)`; this loads the drafter from the same folder or Hub repo,
binds it to the target and runs `speculative_generate`. hf_specdec itself need not be installed.
"""

from __future__ import annotations

import functools
import inspect

from ..auto_drafter import HUB_KWARGS, AutoDrafter
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
    assistant = _load_drafter(source, tuple(sorted(hub.items())), str(model.device), str(model.dtype))
    bind_if_borrowing(assistant, model)  # drafters that borrow the target's embeddings / LM head
    return model.generate(custom_generate=speculative_generate, assistant=assistant, **kwargs)


@functools.lru_cache(maxsize=4)  # loaded once per process: a Hub id would otherwise be looked up at every call
def _load_drafter(source: str, hub: tuple, device: str, target_dtype: str):
    """The drafter at `source`, on `device`; one per (source, where to read it, device, target dtype)."""
    return AutoDrafter.from_pretrained(source, **dict(hub)).to(device)


def _custom_generate_source(model) -> str:
    """The `custom_generate=` string of the `model.generate()` call running us: the folder / repo of this drafter.

    transformers hands it to `load_custom_generate` but not to `generate`, and runs a COPY of this file from its
    module cache, so `__file__` does not lead back to the drafter: read it from that `generate()` frame.
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
