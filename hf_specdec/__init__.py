"""hf_specdec: exact speculative decoding for Hugging Face transformers' `model.generate()`."""

__version__ = "0.1.0"

from .assistants import as_drafter
from .auto_drafter import AutoDrafter
from .default_model import load_default_target
from .drafters import Draft, Drafter, DraftModelDrafter, NgramDrafter, SequenceDrafter
from .generation.loop import speculative_generate
from .generation.stats import SpeculationStats, SpeculativeDecoderOnlyOutput
from .integrations.enable import disable, enable
from .kinds import DrafterKind, register_drafter_kind
from .models.eagle3 import Eagle3Config, Eagle3DraftModel
from .models.medusa import MedusaConfig, MedusaHeads
from .models.spec_drafter import SpecDrafterConfig, SpecDrafterForCausalLM
from . import hub  # noqa: F401  (its save hook writes custom_generate/ into every saved drafter)

__all__ = [
    "speculative_generate",
    "enable",
    "disable",
    "SpeculationStats",
    "SpeculativeDecoderOnlyOutput",
    "Drafter",
    "SequenceDrafter",
    "Draft",
    "DraftModelDrafter",
    "NgramDrafter",
    "as_drafter",
    "load_default_target",
    "SpecDrafterConfig",
    "SpecDrafterForCausalLM",
    "Eagle3Config",
    "Eagle3DraftModel",
    "MedusaConfig",
    "MedusaHeads",
    "AutoDrafter",
    "DrafterKind",
    "register_drafter_kind",
]
