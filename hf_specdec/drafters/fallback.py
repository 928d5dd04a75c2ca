"""Two drafters in one: the first one's proposal when it has one, else the second's, row by row.

The natural pair is n-gram lookup first (free, and long and usually right when the text repeats itself) and a model
drafter second (a few ms per token, right some of the time on fresh text): `"ngram+distilled"`, `"ngram+medusa"`. Both
keep their own state in step with the sequence (`start`, `accepted`, `select_rows` go to both), so either can take over
at any step; each learns in `accepted` how many of ITS drafts a row kept (none, for rows the other one drafted).
Exactness is untouched: each row's draft comes from one drafter, with that drafter's q.
"""

from __future__ import annotations

import dataclasses

import torch

from .base import Draft, Drafter
from ..errors import InputError


class FallbackDrafter(Drafter):
    def __init__(self, first: Drafter, second: Drafter):
        if not (isinstance(first, Drafter) and isinstance(second, Drafter)):
            raise TypeError("FallbackDrafter combines two Drafters; wrap models first: `hf_specdec.as_drafter(model)`.")
        self.first, self.second = first, second
        self.default_num_draft_tokens = max(first.default_num_draft_tokens, second.default_num_draft_tokens)
        self.used_first: list[bool] = []
        self.compiles_model = first.compiles_model or second.compiles_model

    def __repr__(self) -> str:
        return f"FallbackDrafter({self.first!r}, {self.second!r})"

    def vocab_size(self):
        sizes = {self.first.vocab_size(), self.second.vocab_size()} - {None}
        if len(sizes) > 1:
            raise InputError(f"The two drafters propose ids of different vocabularies ({sorted(sizes)}).")
        return sizes.pop() if sizes else None

    def start(self, target, seqs, settings):
        super().start(target, seqs, settings)
        self.first.start(target, seqs, settings)
        self.second.start(target, seqs, settings)
        self.used_first = [True] * seqs.size

    def accepted(self, seqs, verified):
        ours = verified.mine or [True] * len(self.used_first)  # (inside another fallback: the rows it gave us)
        mine = lambda use: dataclasses.replace(  # noqa: E731
            verified, num_accepted=[a if u == use else 0 for a, u in zip(verified.num_accepted, self.used_first)],
            mine=[u == use and o for u, o in zip(self.used_first, ours)])
        self.first.accepted(seqs, mine(True))
        self.second.accepted(seqs, mine(False))

    def select_rows(self, rows):
        self.first.select_rows(rows)
        self.second.select_rows(rows)
        self.used_first = [self.used_first[b] for b in rows]

    def end(self):
        self.first.end()
        self.second.end()

    def propose(self, seqs, max_tokens):
        first = self.first.propose(seqs, max_tokens)
        counts = _counts(first)
        self.used_first = [n > 0 for n in counts]
        if all(self.used_first):
            return first
        # the second drafter at most at its own default length: a model drafter's cost grows with every token
        second = self.second.propose(seqs, min(max_tokens, self.second.default_num_draft_tokens))
        if not any(self.used_first):
            return second
        if second.tree is not None or first.tree is not None:
            # a step verifies one shape for every row: a tree and a chain do not mix, so the drafter that serves more
            # rows drafts for all of them this step (the others decode one token)
            use_first = sum(self.used_first) >= sum(n > 0 for n in _counts(second))
            self.used_first = [use_first] * seqs.size
            return first if use_first else second
        # row by row: the first drafter's tokens where it proposed some, else the second's
        width = max(first.num_tokens, second.num_tokens)
        pad = lambda t: torch.nn.functional.pad(t, (0, width - t.shape[1]))  # noqa: E731
        use = torch.tensor(self.used_first, device=first.tokens.device)
        tokens = torch.where(use[:, None], pad(first.tokens), pad(second.tokens))
        num_valid = [a if u else b for a, b, u in zip(counts, _counts(second), self.used_first)]
        probs = None
        if first.probs is not None or second.probs is not None:
            vocab = (first.probs if first.probs is not None else second.probs).shape[-1]
            as_probs = lambda d: d.probs if d.probs is not None else torch.nn.functional.one_hot(d.tokens, vocab).float()  # noqa: E731
            pad_probs = lambda p: torch.nn.functional.pad(p, (0, 0, 0, width - p.shape[1]))  # noqa: E731
            probs = torch.where(use[:, None, None], pad_probs(as_probs(first)), pad_probs(as_probs(second)))
        return Draft(tokens, probs, num_valid, stopped_early=first.stopped_early and second.stopped_early)


def _counts(draft: Draft) -> list[int]:
    return list(draft.num_valid) if draft.num_valid is not None else [draft.num_tokens] * draft.tokens.shape[0]
