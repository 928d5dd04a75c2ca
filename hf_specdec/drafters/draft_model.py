"""The classic drafter: a small causal LM with the target's vocabulary and a KV cache of its own."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from ..ragged_cache import RaggedKV
from .base import Draft, Drafter, next_draft_token


class DraftModelDrafter(Drafter):
    """Drafts k tokens autoregressively with a small causal LM, for one row or a batch.

    Greedy decoding drafts the argmax; sampling draws from the drafter's distribution after the same logits processors
    the target uses (so temperature/top-k/top-p shape q like p) and reports that distribution as q. Its KV cache keeps
    the longest prefix each row shares with the accepted sequence, so rejected drafts cost nothing later.
    """

    supports_batch = True

    def __init__(self, model: PreTrainedModel):
        if not isinstance(model, PreTrainedModel) or not hasattr(model, "get_output_embeddings"):
            raise TypeError(f"DraftModelDrafter needs a causal-LM PreTrainedModel, got {type(model).__name__}.")
        self.model = model.eval()
        self.kv = None

    def vocab_size(self) -> int:
        return self.model.config.get_text_config().vocab_size

    def start(self, target, input_ids, generation_config, logits_processor, attention_mask=None):
        Drafter.start(self, target, input_ids, generation_config, logits_processor)
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
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        # Drafts are tiny forwards: the CPU small-M matmul path buys nothing here.
        self.kv = RaggedKV(self.model, DynamicCache(config=self.model.config), mask[:, :0], fast_cpu_verify=False)
        self.prompt_mask = mask.bool()
        self.fed = [row[:0] for row in input_ids]  # per row: the sequence tokens whose KV is in the cache

    def select_rows(self, rows):
        self.kv.select_rows(rows)
        self.fed = [self.fed[b] for b in rows.tolist()]

    def _sync(self, rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Drop cached drafts the target rejected; return the block of tokens each row still has to feed."""
        stale = []
        for b, row in enumerate(rows):
            fed = self.fed[b]
            common = min(len(fed), len(row) - 1)  # always leave at least one token to feed
            mismatch = torch.nonzero(fed[:common] != row[:common]).flatten()
            if mismatch.numel():
                common = int(mismatch[0])
            stale.append(len(fed) - common)
            self.fed[b] = fed[:common]
        self.kv.discard_last(torch.tensor(stale))
        if self.kv.slots == 0:  # first call: the left-padded prompts with their own padding, and what followed them
            self.fed = [row.clone() for row in rows]
            width = max(len(row) for row in rows)
            prompt = self.prompt_mask.shape[1]
            block = torch.stack([torch.nn.functional.pad(row, (0, width - len(row))) for row in rows])
            valid = torch.arange(width, device=block.device)[None] < torch.tensor([len(r) for r in rows], device=block.device)[:, None]
            valid[:, :prompt] &= self.prompt_mask
            return block, valid
        todo = [row[len(fed) :] for row, fed in zip(rows, self.fed)]
        self.fed = [row.clone() for row in rows]
        width = max(len(t) for t in todo)
        block = torch.stack([torch.nn.functional.pad(t, (0, width - len(t))) for t in todo])
        valid = torch.arange(width)[None] < torch.tensor([len(t) for t in todo])[:, None]
        return block, valid.to(block.device)

    @torch.no_grad()
    def propose(self, input_ids, max_tokens, lengths=None):
        rows = [row[: int(n)] for row, n in zip(input_ids, lengths)] if lengths is not None else list(input_ids)
        block, valid = self._sync(rows)
        batch = len(rows)
        last = valid.long().cumsum(dim=1).argmax(dim=1)  # index of each row's last real token in the block
        tokens, probs = [], []
        drafting, stopped_early = torch.ones(batch, dtype=torch.bool, device=block.device), False
        num_valid = torch.zeros(batch, dtype=torch.long, device=block.device)
        for i in range(max_tokens):
            logits = self.kv.forward(block, valid, block.shape[1])
            token, q, drafting = next_draft_token(self, logits[torch.arange(batch), last], rows, tokens, drafting, i == 0)
            if not drafting.any():
                stopped_early = True
                break
            tokens.append(token)
            if q is not None:
                probs.append(q)
            num_valid += drafting.long()
            for b in torch.nonzero(drafting).flatten().tolist():
                self.fed[b] = torch.cat([self.fed[b], token[b : b + 1]])
            if i + 1 < max_tokens:  # the last draft is fed next step, if it is accepted
                block, valid, last = token[:, None], drafting[:, None], torch.zeros_like(last)
            else:
                for b in torch.nonzero(drafting).flatten().tolist():
                    self.fed[b] = self.fed[b][:-1]
        if not tokens:
            return Draft(input_ids[:, :0])
        draft_tokens = torch.stack(tokens, dim=1)
        all_valid = bool((num_valid == draft_tokens.shape[1]).all())
        return Draft(draft_tokens, torch.stack(probs, dim=1) if probs else None, None if all_valid else num_valid,
                     stopped_early=stopped_early)
