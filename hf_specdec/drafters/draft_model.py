"""The classic drafter: a small causal LM with the target's vocabulary and a KV cache of its own."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from .base import Draft, Drafter


class DraftModelDrafter(Drafter):
    """Drafts k tokens autoregressively with a small causal LM.

    Greedy decoding drafts the argmax; sampling draws from the drafter's distribution after the same logits processors
    the target uses (so temperature/top-k/top-p shape q like p) and reports that distribution as q. Its KV cache is
    cropped to the longest prefix it shares with the accepted sequence, so rejected drafts cost nothing later.
    """

    def __init__(self, model: PreTrainedModel):
        if not isinstance(model, PreTrainedModel) or not hasattr(model, "get_output_embeddings"):
            raise TypeError(f"DraftModelDrafter needs a causal-LM PreTrainedModel, got {type(model).__name__}.")
        self.model = model.eval()
        self.cache = None
        self.cached_ids = None

    def vocab_size(self) -> int:
        return self.model.config.get_text_config().vocab_size

    def start(self, target, input_ids, generation_config, logits_processor):
        super().start(target, input_ids, generation_config, logits_processor)
        if self.model.config.is_encoder_decoder:
            raise ValueError("The draft model must be a decoder-only causal LM.")
        if self.model.device != target.device:
            raise ValueError(
                f"The draft model is on {self.model.device} but the target is on {target.device}; "
                f"move it first: `drafter.to({str(target.device)!r})`."
            )
        if hasattr(self.model, "bind_target"):  # drafters that borrow the target's embeddings / LM head
            self.model.bind_target(target)
        self.do_sample = bool(generation_config.do_sample)
        self.cache = DynamicCache(config=self.model.config)
        self.cached_ids = input_ids[:, :0]

    def _forward(self, new_ids: torch.Tensor) -> torch.Tensor:
        start = self.cached_ids.shape[1]
        positions = torch.arange(start, start + new_ids.shape[1], device=new_ids.device)[None]
        out = self.model(input_ids=new_ids, position_ids=positions, cache=self.cache, use_cache=True, logits_to_keep=1)
        self.cached_ids = torch.cat([self.cached_ids, new_ids], dim=1)
        return out.logits[:, -1].float()

    def _roll_back_to(self, input_ids: torch.Tensor) -> None:
        """Keep only the cache entries whose tokens still agree with `input_ids`."""
        cached = self.cached_ids.shape[1]
        common = min(cached, input_ids.shape[1] - 1)  # always leave at least one token to feed
        mismatch = (self.cached_ids[:, :common] != input_ids[:, :common]).any(dim=0).nonzero()
        if mismatch.numel():
            common = int(mismatch[0])
        if common < cached:
            self.cache.crop(common - cached)
            self.cached_ids = self.cached_ids[:, :common]

    @torch.no_grad()
    def propose(self, input_ids, max_tokens):
        self._roll_back_to(input_ids)
        sequence = input_ids
        tokens, probs = [], []
        new_ids = input_ids[:, self.cached_ids.shape[1] :]
        for _ in range(max_tokens):
            scores = self._forward(new_ids)
            if self.logits_processor:
                scores = self.logits_processor(sequence, scores)
            q = scores.softmax(dim=-1) if self.do_sample or self.confidence_threshold is not None else None
            if tokens and self.confidence_threshold is not None and q.max() < self.confidence_threshold:
                break  # not confident: let the target take it from here (decided before drawing, so exact)
            if self.do_sample:
                token = torch.multinomial(q, 1)
                probs.append(q)
            else:
                token = scores.argmax(dim=-1, keepdim=True)
            tokens.append(token)
            sequence = torch.cat([sequence, token], dim=1)
            new_ids = token
        if not tokens:
            return Draft(input_ids[:, :0])
        return Draft(torch.cat(tokens, dim=1), torch.stack(probs, dim=1) if probs else None)
