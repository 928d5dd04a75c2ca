"""Multi-token-prediction (MTP) heads: the target's own extra layers (DeepSeek-V3, GLM-4-MoE, ...), which transformers
loads as an `MtpModel` from the target's checkpoint (`generate(use_mtp=True)`).

The files of this kind: `drafter.py` (decoding). The model is transformers' own; it has no config of its own, no
training and no export here (a checkpoint that carries MTP layers already serves them in vLLM and SGLang)."""

from .drafter import MtpDrafter, MtpHead

__all__ = ["MtpDrafter", "MtpHead"]
