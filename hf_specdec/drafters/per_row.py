"""Any single-sequence drafter in a batch: one shallow copy per row, each fed its own row's real tokens.

Batched drafters (every kind the registry knows, n-gram lookup, self-speculation) do not need this; it is how a
`SequenceDrafter` (a cross-tokenizer drafter, your own drafter, a transformers `CandidateGenerator`) works at any batch
size: its proposals are drafted row by row and verified together in the one batched target forward. The loop wraps
such drafters once, at the boundary (`hf_specdec.assistants.resolve.as_drafter`).
"""

from __future__ import annotations

import copy

import torch

from .base import Draft, Drafter, SequenceDrafter


class PerRowDrafter(Drafter):
    def __init__(self, drafter: SequenceDrafter):
        self.inner = drafter
        self.default_num_draft_tokens = drafter.default_num_draft_tokens

    def __repr__(self) -> str:
        return repr(self.inner)

    def vocab_size(self):
        return self.inner.vocab_size()

    def draft_cost(self, target_model):
        return self.inner.draft_cost(target_model) if hasattr(self.inner, "draft_cost") else 0.0

    def start(self, target, seqs, settings):
        super().start(target, seqs, settings)
        self.rows = []
        for b in range(seqs.size):
            row = copy.copy(self.inner)  # shares weights; start() gives each copy its own per-call state
            row.start(target.model, seqs.ids(b)[None], settings)
            self.rows.append(row)

    def select_rows(self, rows):
        self.rows = [self.rows[b] for b in rows]

    def propose(self, seqs, max_tokens):
        drafts = [row.propose(seqs.ids(b)[None], max_tokens) for b, row in enumerate(self.rows)]
        counts = [d.num_tokens if d.num_valid is None else d.num_valid[0] for d in drafts]
        width = max(counts, default=0)
        device = seqs.ids(0).device
        tokens = torch.zeros(len(drafts), width, dtype=torch.long, device=device)
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
        return Draft(tokens, probs, counts)

    def accepted(self, seqs, verified):
        for b, row in enumerate(self.rows):
            row.accepted(seqs.ids(b)[None], verified.num_accepted[b])
