"""Every check a call can fail, done before any forward pass, so that a bad call leaves the model untouched."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from transformers import Cache, DynamicCache

from ..cache.keyword import CACHE, cache_keyword
from ..cache.ragged import can_roll_back, has_sliding_window, mixes_slots
from ..drafters.base import Drafter
from ..errors import InputError
from .verification import AcceptRule, accept_rule

#: generate() inputs the loop handles itself
MODEL_KWARGS_HANDLED = {"attention_mask", "position_ids", "cache", "past_key_values", "use_cache", "logits_to_keep"}


@dataclass
class Request:
    """A validated call: the draft-length cap, the acceptance rule and the target's cache."""

    num_draft_tokens: int
    rule: AcceptRule
    cache: object


def validate(model, input_ids, generation_config, model_kwargs: dict, synced_gpus: bool, options) -> AcceptRule:
    """Every check of the call itself (`options`: its `SpeculationOptions`), before the drafter is built or loaded;
    the call's acceptance rule."""
    assistant, num_draft_tokens = options.assistant, options.num_draft_tokens
    if assistant is None:
        raise InputError("Speculative decoding needs a drafter: pass `assistant=` (a draft model, 'ngram', a Drafter).")
    if model.config.is_encoder_decoder:
        raise InputError("hf_specdec supports decoder-only targets; encoder-decoder models are not supported.")
    check_architecture(model)
    if generation_config.num_beams != 1:
        raise InputError(f"Speculative decoding does not do beam search: set num_beams=1 (got {generation_config.num_beams}).")
    if generation_config.num_return_sequences != 1:
        raise InputError(
            "Speculative decoding returns one sequence per prompt: set num_return_sequences=1 "
            f"(got {generation_config.num_return_sequences}); repeat the prompt in the batch instead."
        )
    if generation_config.output_attentions or generation_config.output_hidden_states:
        raise InputError("output_attentions / output_hidden_states are not supported with speculative decoding.")
    unsupported = sorted(key for key, value in model_kwargs.items() if value is not None and key not in MODEL_KWARGS_HANDLED
                         and not (key == "mm_encoder_outputs" and not value))  # (a text-only prompt: no images)
    if unsupported:
        raise InputError(f"Speculative decoding does not support these generate() inputs: {unsupported}.")
    if synced_gpus:
        raise InputError("synced_gpus is not supported with speculative decoding.")
    if num_draft_tokens is not None and (not isinstance(num_draft_tokens, int) or isinstance(num_draft_tokens, bool)
                                         or num_draft_tokens < 1):
        raise InputError(f"num_draft_tokens must be an integer >= 1, got {num_draft_tokens!r}.")
    if input_ids.shape[0] > 1:
        validate_batch(model, generation_config, model_kwargs.get(CACHE))
    return accept_rule(options.verification, generation_config, options.typical_threshold, options.typical_alpha)


def check_architecture(model) -> None:
    """Refuse, before any forward, a target whose forward cannot be verified several tokens at a time and then rolled
    back to the accepted prefix (transformers' own assisted decoding refuses the same ones)."""
    name = type(model).__name__
    text_config = model.config.get_text_config()
    # transformers < 5.25 marks such models `_is_stateful`; from 5.25 their cache layers are named by `layer_types`
    # ("conv" layers keep only convolution states, which roll back; these keep an SSM / linear-attention state)
    recurrent_layers = set(getattr(text_config, "layer_types", None) or ()) & {"linear_attention", "hybrid", "hybrid_sliding"}
    if getattr(model, "_is_stateful", False) or recurrent_layers:
        raise InputError(f"{name} keeps a recurrent state (Mamba-, RWKV- or linear-attention-style layers), which cannot "
                         "be rolled back to before a rejected draft, as speculative decoding needs: use plain generate().")
    if has_sliding_window(model.config) and CACHE == "past_key_values":
        raise InputError(f"{name} attends over a sliding window, and before transformers 5.24 such cache layers do not "
                         "roll back to before a rejected draft the way speculative decoding needs: upgrade transformers "
                         "(pip install -U 'transformers>=5.24'), or use plain generate().")
    if cache_keyword(model) is None:
        raise InputError(f"{name}'s forward takes no cache, so it cannot verify new tokens after the ones it has read: "
                         "use plain generate().")
    if getattr(text_config, "index_topk", None) is not None:
        raise InputError(f"{name} attends to the top {text_config.index_topk} keys an indexer selects (sparse attention), "
                         "and its selection for a token depends on how many tokens one forward reads, so verifying a "
                         "draft can change the output (transformers' own assisted decoding differs there too): use "
                         "plain generate().")
    declared = _declared_cache_kinds(model)
    if any(kind is dict or getattr(kind, "__origin__", None) is dict for kind in declared):  # XLM's per-layer tensors
        raise InputError(f"{name}'s forward keeps its past in a structure of its own (not a transformers Cache), which "
                         "cannot be rolled back to before a rejected draft: use plain generate().")
    own = [k for k in declared if isinstance(k, type) and "Cache" in k.__name__
           and (not issubclass(k, Cache) or getattr(k, "is_croppable", True) is False)]
    if own:  # a cache class of the model's own: not a transformers Cache (xLSTM's), or one that cannot crop (MiniMax's)
        raise InputError(f"{name} keeps its state in its own {own[0].__name__}, which cannot be rolled back to before "
                         "a rejected draft, as speculative decoding needs: use plain generate().")
    if model.config.model_type in UNVERIFIABLE:
        raise InputError(f"{name} {UNVERIFIABLE[model.config.model_type]}, so it cannot verify a draft: use plain "
                         "generate().")


#: types measured (benchmarks/architectures.py) to give other tokens, or to fail, when one forward reads several new
#: tokens after its cache; transformers' own assisted decoding differs or fails there too
UNVERIFIABLE = {
    "moshi": "gives other tokens when it reads several new tokens in one forward than one at a time",
    "hrm_text": "reasons in cycles over the tokens one forward reads, so several new tokens give other outputs",
    "cpmant": "builds its position bias for the new tokens alone (several new tokens after a cache fail)",
    "prophetnet": "reads one new token per forward once it has a cache",
}


def _declared_cache_kinds(model) -> list:
    """The types the forward of the model (and of its inner model) declares for `cache` (legacy tuple annotations of
    models that take a Cache all the same are harmless here: only dicts and uncroppable classes are refused)."""
    kinds = []
    for module in (model, getattr(model, "model", None)):
        keyword = cache_keyword(module) if module is not None else None
        parameter = inspect.signature(module.forward).parameters.get(keyword) if keyword is not None else None
        annotation = getattr(parameter, "annotation", None)
        kinds += getattr(annotation, "__args__", (annotation,))
    return kinds


def request_for(model, model_kwargs: dict, drafter: Drafter, num_draft_tokens, rule: AcceptRule) -> Request:
    """The checks that need the drafter; then the call's draft-length cap, acceptance rule and cache."""
    k = drafter.default_num_draft_tokens if num_draft_tokens is None else num_draft_tokens
    target_vocab = model.config.get_text_config().vocab_size
    drafter_vocab = drafter.vocab_size()
    if drafter_vocab is not None and drafter_vocab != target_vocab:
        raise InputError(
            f"The drafter's vocabulary ({drafter_vocab} tokens) differs from the target's ({target_vocab}): a drafter "
            "must share the target's tokenizer. Use a drafter trained for this target (see training/distill.py), or "
            "assistant='ngram'."
        )
    cache = model_kwargs.get(CACHE)
    if cache is None:
        cache = DynamicCache(config=model.config)
    if cache.get_seq_length() != 0:
        raise InputError("Speculative decoding starts from an empty cache; pass a fresh cache (or none).")
    if can_roll_back(cache) is False:
        upgrade = " (a static cache rolls back from transformers 5.24)" if CACHE == "past_key_values" else ""
        raise InputError(f"This target's cache cannot be rolled back (crop), which speculative decoding needs{upgrade}: "
                         "use a dynamic cache, or plain generate().")
    return Request(k, rule, cache)


def decodes_rows_alone(model) -> bool:
    """Whether a batch of this target decodes one row at a time: its cache cannot hold rows that advance unevenly (see
    the design note in cache/ragged.py), since the holes a row's rejected drafts leave would shift a sliding window,
    or stay among the most recent slots that convolution layers read."""
    return has_sliding_window(model.config) or mixes_slots(DynamicCache(config=model.config))


def validate_batch(model, generation_config, cache) -> None:
    """What batch > 1 needs beyond batch 1."""
    if cache is not None and type(cache) is not DynamicCache:
        raise InputError("Batched speculative decoding needs a DynamicCache; drop cache_implementation for batch > 1.")
    if generation_config.return_dict_in_generate and (generation_config.output_scores or generation_config.output_logits):
        raise InputError("output_scores / output_logits need batch 1 with speculative decoding: at batch > 1 plain "
                         "generate() also scores finished rows on padding tokens, forwards speculation never runs; "
                         "pass one prompt per call, or use plain generate().")
    if generation_config._pad_token_tensor is None:
        raise InputError("Batched generation needs a pad token: set pad_token_id.")


__all__ = ["validate", "decodes_rows_alone", "request_for", "Request", "MODEL_KWARGS_HANDLED"]
