"""Self-speculation: the target drafts for itself with only its first L decoder layers.

The draft model is the target truncated to layers 0..L-1, followed by the target's own final norm and LM head (an
"early exit"). Nothing is copied and no second model is loaded: the drafter runs the target's base model with its
layer list temporarily cut to the first L layers (`EarlyExitModel`), and is otherwise a `DraftModelDrafter`: a KV cache
of its own (L layers deep) rolled back to the accepted prefix after each step, ragged batches included.

Greedy decoding drafts the early-exit argmax (deterministic: q one-hot); sampling draws from the early-exit
distribution after the same logits processors the target uses and reports it as q, so the rejection rule keeps the
output distributed exactly as the target's. With L = all layers the draft IS the target and every draft is accepted.

Supported targets: the decoder-only architectures listed in `SUPPORTED_MODEL_TYPES` (layers in `model.model.layers`
for Llama/Mistral/Qwen2/Qwen3, in `transformer.h` for GPT-2).

KV reuse: the target's verification forward recomputes layers 0..L-1 for the drafted tokens, although the drafter
already computed exactly those keys/values (same weights, same positions, same prefix). Skipping that work needs the
verification forward to start at layer L from the drafter's hidden states, which `decoding.py` does not do yet; see
the project notes (issue 7 report) for the change it needs. Until then the drafter's cache is separate.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn
from transformers import PreTrainedModel

from .draft_model import DraftModelDrafter

# model_type -> (attribute of the base model holding the decoder layers)
SUPPORTED_MODEL_TYPES = {
    "llama": "layers",
    "mistral": "layers",
    "qwen2": "layers",
    "qwen3": "layers",
    "gpt2": "h",
}


def _supported_names() -> str:
    return ", ".join(sorted(SUPPORTED_MODEL_TYPES))


class EarlyExitModel(nn.Module):
    """The target's first `num_layers` decoder layers + its final norm + its LM head, called like a causal LM.

    Holds references to the target's modules (nothing copied); the target is kept outside the module tree so that
    `.eval()`/`.to()` on this wrapper never touch it."""

    def __init__(self, target: PreTrainedModel, base: nn.Module, layers_attr: str, num_layers: int):
        super().__init__()
        self.__dict__["target"] = target  # not a submodule
        self.__dict__["base"] = base
        self.layers_attr = layers_attr
        self.early_layers = list(getattr(base, layers_attr))[:num_layers]
        self.config = target.config

    @property
    def device(self) -> torch.device:
        return self.target.device

    def _supports_logits_to_keep(self) -> bool:
        return True

    def forward(self, input_ids, position_ids=None, cache=None, use_cache=True, attention_mask=None, logits_to_keep=0,
                **kwargs):
        modules = self.base._modules
        all_layers = modules[self.layers_attr]
        modules[self.layers_attr] = nn.ModuleList(self.early_layers)  # the base model now runs the first L layers
        try:
            if attention_mask is None:  # nothing padded (and GPT-2 stays quiet)
                past = cache.get_seq_length() if cache is not None else 0
                attention_mask = torch.ones(input_ids.shape[0], past + input_ids.shape[1], dtype=torch.long,
                                            device=input_ids.device)
            out = self.base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                            use_cache=use_cache)
        finally:
            modules[self.layers_attr] = all_layers
        hidden = out.last_hidden_state[:, -logits_to_keep:] if logits_to_keep else out.last_hidden_state
        return SimpleNamespace(logits=self.target.get_output_embeddings()(hidden))


class SelfSpeculativeDrafter(DraftModelDrafter):
    """Drafts with the target's first `num_layers` decoder layers plus its final norm and LM head.

    Args:
        num_layers: how many of the target's decoder layers the draft runs (1 .. all). More layers: better drafts,
            dearer drafting. None: half of the target's layers.
    """

    default_num_draft_tokens = 4
    supports_batch = True

    def __init__(self, num_layers: int | None = None):
        if num_layers is not None and (not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1):
            raise ValueError(f"num_layers must be None or an integer >= 1, got {num_layers!r}.")
        self.requested_layers = num_layers
        self.num_layers = num_layers
        self.target = None
        self.model = None
        self.kv = None

    def __repr__(self) -> str:
        return f"SelfSpeculativeDrafter(num_layers={self.requested_layers})"

    def vocab_size(self):
        return None  # the target's own head: always the same vocabulary

    def _bind(self, target) -> None:
        if not isinstance(target, PreTrainedModel):
            raise TypeError(f"SelfSpeculativeDrafter needs a transformers PreTrainedModel target, got {type(target).__name__}.")
        model_type = getattr(target.config, "model_type", None)
        layers_attr = SUPPORTED_MODEL_TYPES.get(model_type)
        base = getattr(target, getattr(target, "base_model_prefix", ""), None)
        layers = getattr(base, layers_attr, None) if layers_attr else None
        lm_head = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else None
        if layers_attr is None or not isinstance(layers, nn.ModuleList) or lm_head is None:
            raise ValueError(
                f"SelfSpeculativeDrafter does not support {type(target).__name__} (model_type={model_type!r}); "
                f"supported decoder-only architectures: {_supported_names()} (layers in model.model.layers or "
                "transformer.h, with a final norm and an LM head)."
            )
        total = len(layers)
        num_layers = self.requested_layers if self.requested_layers is not None else max(1, total // 2)
        if num_layers > total:
            raise ValueError(f"num_layers={num_layers} exceeds the target's {total} decoder layers.")
        self.target, self.num_layers, self.total_layers = target, num_layers, total
        self.model = EarlyExitModel(target, base, layers_attr, num_layers)

    def start(self, target, input_ids, generation_config, logits_processor, attention_mask=None):
        self._bind(target)
        super().start(target, input_ids, generation_config, logits_processor, attention_mask=attention_mask)
