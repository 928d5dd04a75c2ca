"""`enable(model)`: make plain `model.generate(**inputs, assistant=drafter, ...)` speculative, `streamer=` included.

`generate(custom_generate=callable)` drops `streamer` before calling the callable, so the wrapper hands the streamer
over under its own name. Without `assistant=`, the enabled model's `generate` is the original, untouched.
"""

from __future__ import annotations

import functools

from transformers import StoppingCriteriaList, StopStringCriteria

from ..generation.loop import speculative_generate


def enable(model):
    """Let `model.generate()` take `assistant=`. Returns the model. Idempotent; undo with `disable(model)`."""
    if getattr(model, "_hf_specdec_original_generate", None) is not None:
        return model
    original = model.generate

    @functools.wraps(original)
    def generate(*args, assistant=None, **kwargs):
        if assistant is None:
            return original(*args, **kwargs)
        custom = kwargs.pop("custom_generate", None)
        if custom is not None and custom is not speculative_generate:  # hf_specdec's own loop: either route is fine
            raise ValueError(f"`assistant=` runs hf_specdec's loop, so it cannot go with custom_generate={custom!r}: "
                             "drop one of them (or pass custom_generate=hf_specdec.speculative_generate).")
        if kwargs.get("assistant_model") is not None:
            raise ValueError("Pass either `assistant=` (hf_specdec) or `assistant_model=` (transformers), not both.")
        if model.config.is_encoder_decoder:
            raise ValueError("hf_specdec supports decoder-only targets; encoder-decoder models are not supported.")
        streamer = kwargs.pop("streamer", None)
        # generate() drops `tokenizer` for custom_generate callables, so build the stop-string criterion here.
        stop_strings = kwargs.pop("stop_strings", None)
        tokenizer = kwargs.pop("tokenizer", None)
        if stop_strings:
            if tokenizer is None:
                raise ValueError("stop_strings needs the tokenizer: pass `tokenizer=` to generate().")
            criteria = StoppingCriteriaList(kwargs.pop("stopping_criteria", None) or [])
            criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings))
            kwargs["stopping_criteria"] = criteria
        return original(
            *args, custom_generate=speculative_generate, assistant=assistant, hf_specdec_streamer=streamer, **kwargs
        )

    model._hf_specdec_original_generate = original
    model.generate = generate
    return model


def disable(model):
    """Restore the model's own `generate`. Returns the model."""
    if getattr(model, "_hf_specdec_original_generate", None) is not None:
        del model.generate  # the instance attribute; the class method shows through again
        model._hf_specdec_original_generate = None
    return model
