"""Any single-sequence drafter in a batch: one shallow copy per row, each fed its own row without padding.

Drafters that batch natively (draft models, EAGLE-style, n-gram, self-speculation) do not need this; it is how the
rest (a cross-tokenizer drafter, a user's own `Drafter` or `CandidateGenerator`) still work with batch > 1: their
proposals are drafted row by row and verified together in the one batched target forward.
"""

from __future__ import annotations

import copy

import torch

from .base import Draft, Drafter


class PerRowDrafter(Drafter):
    supports_batch = True

    def __init__(self, drafter: Drafter):
        self.inner = drafter
        self.default_num_draft_tokens = drafter.default_num_draft_tokens

    def vocab_size(self):
        return self.inner.vocab_size()

    def start(self, target, input_ids, generation_config, logits_processor, attention_mask=None):
        super().start(target, input_ids, generation_config, logits_processor)
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        self.prompt_len, self.prompt_mask = input_ids.shape[1], mask
        self.rows = []
        for b in range(input_ids.shape[0]):
            row = copy.copy(self.inner)  # shares weights; start() gives each copy its own per-call state
            row.confidence_threshold = self.confidence_threshold
            row.start(target, input_ids[b : b + 1, mask[b]], generation_config, logits_processor)
            self.rows.append(row)

    def _real(self, b: int, input_ids, lengths) -> torch.Tensor:
        row = input_ids[b, : int(lengths[b])]
        return torch.cat([row[: self.prompt_len][self.prompt_mask[b]], row[self.prompt_len :]])[None]

    def select_rows(self, rows):
        self.rows = [self.rows[b] for b in rows.tolist()]
        self.prompt_mask = self.prompt_mask[rows]

    def propose(self, input_ids, max_tokens, lengths=None):
        drafts = [row.propose(self._real(b, input_ids, lengths), max_tokens) for b, row in enumerate(self.rows)]
        counts = [d.num_tokens if d.num_valid is None else int(d.num_valid[0]) for d in drafts]
        width = max(counts, default=0)
        tokens = input_ids.new_zeros(len(drafts), width)
        sampled = any(d.probs is not None for d in drafts)
        probs = None
        for b, (d, n) in enumerate(zip(drafts, counts)):
            tokens[b, :n] = d.tokens[0, :n]
            if sampled and n:
                if d.probs is None:
                    raise ValueError("A batch mixed deterministic and sampled drafts; a drafter must be one or the other.")
                if probs is None:
                    probs = d.probs.new_zeros(len(drafts), width, d.probs.shape[-1])
                probs[b, :n] = d.probs[0, :n]
        if sampled and probs is None and width:
            raise ValueError("A sampled drafter returned no probabilities.")
        num_valid = torch.tensor(counts, device=input_ids.device)
        return Draft(tokens, probs, None if all(n == width for n in counts) else num_valid)

    def accepted(self, input_ids, num_accepted, lengths=None):
        for b, row in enumerate(self.rows):
            row.accepted(self._real(b, input_ids, lengths), num_accepted[b : b + 1])
