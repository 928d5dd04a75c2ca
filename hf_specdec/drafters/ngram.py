"""N-gram lookup: draft the continuation of the latest earlier occurrence of the sequence's own suffix.

Unlike transformers' prompt lookup, the index covers the prompt AND the text generated so far, is updated
incrementally (each new token adds the n-grams ending at it; no rescan per step), and the drafter proposes nothing
when no suffix matches, so no verification work is wasted on guesses.
"""

from __future__ import annotations

import torch

from .base import Draft, Drafter


class NgramIndex:
    """For each n-gram length in [min_n, max_n]: n-gram -> end positions (exclusive) where it occurred, in order."""

    def __init__(self, min_n: int = 1, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"Need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}.")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self.table: dict[tuple[int, ...], list[int]] = {}

    def extend(self, new_tokens: list[int]) -> None:
        for token in new_tokens:
            self.tokens.append(token)
            end = len(self.tokens)
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self.table.setdefault(tuple(self.tokens[end - n : end]), []).append(end)

    def lookup(self, max_tokens: int) -> list[int]:
        """Continuation (up to max_tokens) after the latest earlier occurrence of the longest matching suffix."""
        end = len(self.tokens)
        for n in range(min(self.max_n, end), self.min_n - 1, -1):
            ends = self.table.get(tuple(self.tokens[end - n :]))
            if ends and len(ends) > 1:  # the last entry is the suffix itself
                start = ends[-2]
                return self.tokens[start : start + max_tokens]
        return []


class NgramDrafter(Drafter):
    """Prompt-and-output n-gram lookup drafter (deterministic: q is one-hot)."""

    default_num_draft_tokens = 8

    def __init__(self, min_ngram: int = 1, max_ngram: int = 4):
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        NgramIndex(min_ngram, max_ngram)  # validate now, not at the first generate() call
        self.index = None

    def start(self, target, input_ids, generation_config, logits_processor):
        super().start(target, input_ids, generation_config, logits_processor)
        if input_ids.shape[0] != 1:
            raise ValueError("NgramDrafter drafts for one sequence at a time.")
        self.index = NgramIndex(self.min_ngram, self.max_ngram)

    def propose(self, input_ids, max_tokens):
        new = input_ids[0, len(self.index.tokens) :].tolist()
        self.index.extend(new)
        proposal = self.index.lookup(max_tokens) if max_tokens > 0 else []
        return Draft(torch.tensor([proposal], dtype=torch.long, device=input_ids.device).view(1, -1))
