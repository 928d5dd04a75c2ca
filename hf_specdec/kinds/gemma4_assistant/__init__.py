"""Gemma 4 assistants: transformers' `gemma4_assistant` / `gemma4_unified_assistant` models (`generate(
assistant_model=...)` with a Gemma 4 target), which draft from the target's final state and read the K/V its layers
store instead of keeping a cache of their own.

The files of this kind: `drafter.py` (decoding). The models and configs are transformers' own."""

from .drafter import Gemma4AssistantDrafter

__all__ = ["Gemma4AssistantDrafter"]
