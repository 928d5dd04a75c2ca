"""Self-speculation: the target drafts for itself with only its first L decoder layers.

The draft model is the target truncated to layers 0..L-1, followed by the target's own final norm and LM head (an
"early exit"). Nothing is copied and no second model is loaded: the drafter runs the target's base model with its
layer list temporarily cut to the first L layers, on a KV cache of its own (L layers deep), which is rolled back to the
accepted prefix after each step, as `DraftModelDrafter` does for a separate draft model.

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

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from .base import Draft, Drafter

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


class SelfSpeculativeDrafter(Drafter):
    """Drafts with the target's first `num_layers` decoder layers plus its final norm and LM head.

    Args:
        num_layers: how many of the target's decoder layers the draft runs (1 .. all). More layers: better drafts,
            dearer drafting. None: half of the target's layers.
    """

    default_num_draft_tokens = 4

    def __init__(self, num_layers: int | None = None):
        if num_layers is not None and (not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1):
            raise ValueError(f"num_layers must be None or an integer >= 1, got {num_layers!r}.")
        self.requested_layers = num_layers
        self.num_layers = num_layers
        self.target = None
        self.cache = None
        self.cached_ids = None

    def __repr__(self) -> str:
        return f"SelfSpeculativeDrafter(num_layers={self.requested_layers})"

    # --- binding to the target ---
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
        self.target, self.base, self.layers_attr, self.lm_head = target, base, layers_attr, lm_head
        self.num_layers, self.total_layers = num_layers, total
        self.early_layers = nn.ModuleList(list(layers)[:num_layers])  # the same modules, not copies

    def start(self, target, input_ids, generation_config, logits_processor):
        super().start(target, input_ids, generation_config, logits_processor)
        if input_ids.shape[0] != 1:
            raise ValueError("SelfSpeculativeDrafter drafts for one sequence at a time.")
        self._bind(target)
        self.do_sample = bool(generation_config.do_sample)
        self._reset(input_ids)

    def _reset(self, input_ids) -> None:
        self.cache = DynamicCache(config=self.target.config)  # only the first num_layers layers ever get filled
        if hasattr(self.cache, "activate_past_recording"):
            self.cache.activate_past_recording()  # sliding-window layers must stay croppable
        self.cached_ids = input_ids[:, :0]

    # --- the early-exit forward ---
    def _forward(self, new_ids: torch.Tensor) -> torch.Tensor:
        """Feed `new_ids` through layers 0..L-1, the final norm and the LM head; logits of the last position."""
        start = self.cached_ids.shape[1]
        end = start + new_ids.shape[1]
        positions = torch.arange(start, end, device=new_ids.device)[None]
        mask = torch.ones(1, end, dtype=torch.long, device=new_ids.device)  # nothing padded (and GPT-2 stays quiet)
        modules = self.base._modules
        all_layers = modules[self.layers_attr]
        modules[self.layers_attr] = self.early_layers  # the base model's forward now runs the first L layers only
        try:
            out = self.base(
                input_ids=new_ids, attention_mask=mask, position_ids=positions, cache=self.cache, use_cache=True
            )
        finally:
            modules[self.layers_attr] = all_layers
        self.cached_ids = torch.cat([self.cached_ids, new_ids], dim=1)
        return self.lm_head(out.last_hidden_state[:, -1]).float()

    def _roll_back_to(self, input_ids: torch.Tensor) -> None:
        """Keep only the cache entries whose tokens still agree with `input_ids` (leaving at least one to feed)."""
        cached = self.cached_ids.shape[1]
        common = min(cached, input_ids.shape[1] - 1)
        mismatch = (self.cached_ids[:, :common] != input_ids[:, :common]).any(dim=0).nonzero()
        if mismatch.numel():
            common = int(mismatch[0])
        if common < cached:
            self.cache.crop(common - cached)
            self.cached_ids = self.cached_ids[:, :common]

    @torch.no_grad()
    def propose(self, input_ids, max_tokens):
        if self.target is None:
            raise RuntimeError("SelfSpeculativeDrafter.start(target, ...) must run first (generate() does it).")
        if max_tokens <= 0:
            return Draft(input_ids[:, :0])
        self._roll_back_to(input_ids)
        sequence = input_ids
        new_ids = input_ids[:, self.cached_ids.shape[1] :]
        tokens, probs = [], []
        for _ in range(max_tokens):
            scores = self._forward(new_ids)
            if self.logits_processor:
                scores = self.logits_processor(sequence, scores)
            if self.do_sample:
                q = scores.softmax(dim=-1)
                token = torch.multinomial(q, 1)
                probs.append(q)
            else:
                token = scores.argmax(dim=-1, keepdim=True)
            tokens.append(token)
            sequence = torch.cat([sequence, token], dim=1)
            new_ids = token
        return Draft(torch.cat(tokens, dim=1), torch.stack(probs, dim=1) if probs else None)
