"""The one name that differs between the transformers releases hf_specdec runs on: models take their KV cache as
`cache` from transformers 5.24, as `past_key_values` before."""

from __future__ import annotations

import functools
import inspect


@functools.lru_cache(maxsize=None)
def _declared(function) -> str | None:
    parameters = inspect.signature(function).parameters
    return next((name for name in ("cache", "past_key_values") if name in parameters), None)


def cache_keyword(call) -> str | None:
    """The keyword `call` (a model, a module or a function) takes its KV cache by: `cache` (transformers >= 5.24, and
    hf_specdec's own models), `past_key_values` (earlier releases), or None (it declares neither: it takes no cache,
    or passes `**kwargs` on to a layer that takes `cache`, as some of hf_specdec's drafters do)."""
    call = getattr(call, "_orig_mod", call)  # (torch.compile's wrapper declares only *args, **kwargs)
    function = type(call).forward if hasattr(type(call), "forward") and not inspect.isfunction(call) else call
    return _declared(getattr(function, "__func__", function))


def _transformers_keyword() -> str:
    from transformers.models.llama.modeling_llama import LlamaModel

    return cache_keyword(LlamaModel.forward)


#: the keyword of transformers' own layers, mask functions and outputs in the installed release
CACHE = _transformers_keyword()
