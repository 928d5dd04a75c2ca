"""Drafters: one file per drafting strategy, all behind the protocol in `base.py`."""

from transformers import PreTrainedModel
from transformers.generation.candidate_generator import CandidateGenerator

from .base import CandidateGeneratorDrafter, Draft, Drafter
from .draft_model import DraftModelDrafter
from .cross_tokenizer import CrossTokenizerDrafter
from .eagle import EagleDrafter
from .medusa import MedusaDrafter
from .fallback import FallbackDrafter
from .ngram import NgramDrafter
from .self_speculative import SelfSpeculativeDrafter

__all__ = [
    "Draft",
    "Drafter",
    "DraftModelDrafter",
    "NgramDrafter",
    "SelfSpeculativeDrafter",
    "EagleDrafter",
    "MedusaDrafter",
    "FallbackDrafter",
    "CrossTokenizerDrafter",
    "CandidateGeneratorDrafter",
    "as_drafter",
]

#: `assistant="<name>"` -> a drafter built with its defaults
NAMED_DRAFTERS = {"ngram": NgramDrafter, "self": SelfSpeculativeDrafter}

ACCEPTED_ASSISTANTS = (
    "a causal-LM `PreTrainedModel` sharing the target's vocabulary, an `hf_specdec` drafter "
    "(`hf_specdec.Drafter` subclass such as `NgramDrafter()`), one of the strings 'ngram' or 'self', "
    "or a `transformers.generation.CandidateGenerator`"
)


def as_drafter(assistant) -> Drafter:
    """Turn whatever was passed as `assistant=` into a Drafter, or raise a TypeError that lists what is accepted."""
    if isinstance(assistant, Drafter):
        return assistant
    if isinstance(assistant, str) and assistant in NAMED_DRAFTERS:
        return NAMED_DRAFTERS[assistant]()
    if isinstance(assistant, PreTrainedModel) and getattr(assistant.config, "model_type", None) == "hf_specdec_medusa":
        return MedusaDrafter(assistant)  # heads on the target's hidden state
    if isinstance(assistant, PreTrainedModel):
        if assistant.config.is_encoder_decoder or not hasattr(assistant, "get_output_embeddings"):
            raise TypeError(f"assistant={type(assistant).__name__} is not a causal LM; expected {ACCEPTED_ASSISTANTS}.")
        if assistant.get_output_embeddings() is None:
            raise TypeError(f"assistant={type(assistant).__name__} has no LM head; expected {ACCEPTED_ASSISTANTS}.")
        if getattr(assistant.config, "target_feature_input", False):
            return EagleDrafter(assistant)  # reads the target's hidden states (EAGLE-style)
        return DraftModelDrafter(assistant)
    if isinstance(assistant, CandidateGenerator):
        return CandidateGeneratorDrafter(assistant)
    raise TypeError(f"Unsupported assistant of type {type(assistant).__name__}; expected {ACCEPTED_ASSISTANTS}.")
