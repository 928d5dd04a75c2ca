"""hf_specdec: exact speculative decoding for Hugging Face transformers' `model.generate()`."""

from .decoding import SpeculationStats, SpeculativeDecoderOnlyOutput, speculative_generate
from .default_model import load_default_target
from .drafters import CandidateGeneratorDrafter, Draft, Drafter, DraftModelDrafter, NgramDrafter, as_drafter
from .enable import disable, enable
from .modeling_drafter import SpecDrafterConfig, SpecDrafterForCausalLM  # registers the drafter with the Auto classes
from .modeling_medusa import MedusaConfig, MedusaHeads
from .auto_drafter import AutoDrafter

__version__ = "0.1.0"

__all__ = [
    "speculative_generate",
    "enable",
    "disable",
    "SpeculationStats",
    "SpeculativeDecoderOnlyOutput",
    "Drafter",
    "Draft",
    "DraftModelDrafter",
    "NgramDrafter",
    "CandidateGeneratorDrafter",
    "as_drafter",
    "load_default_target",
    "SpecDrafterConfig",
    "SpecDrafterForCausalLM",
    "AutoDrafter",
]
