"""Two drafters in one: the first one's proposal when it has one, else the second's, row by row.

The natural pair is n-gram lookup first (free, and long and usually right when the text repeats itself) and a model
drafter second (a few ms per token, right some of the time on fresh text): `"ngram+distilled"`, `"ngram+runs/heads:chain"`. Both
keep their own state in step with the sequence (`start`, `accepted`, `select_rows` go to both), so either can take over
at any step; each learns in `accepted` how many of ITS drafts a row kept (none, for rows the other one drafted).
Exactness is untouched: each row's draft comes from one drafter, with that drafter's q.

A first drafter that sizes its own drafts (the suffix drafter: `"suffix+distilled"`) is told, each step, how many
tokens per second the second one has given on the steps it drafted (`rival_rate`, from its accepted tokens, its draft
length and its own drafting time): it drafts only where it expects more, so a weak match leaves the step to the model.
"""

from __future__ import annotations

import dataclasses
import time

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
        self.second_counts: list[int] = []  # per row, how many tokens the second drafter drafted this step
        self.compiles_model = first.compiles_model or second.compiles_model
        self.sizes_own_drafts = first.sizes_own_drafts  # the second drafts where the first declines, at its own length
        self.second_measured = _Measured()  # kept across calls, as the first drafter's own estimates are

    def __repr__(self) -> str:
        return f"FallbackDrafter({self.first!r}, {self.second!r})"

    def vocab_size(self):
        sizes = {self.first.vocab_size(), self.second.vocab_size()} - {None}
        if len(sizes) > 1:
            raise InputError(f"The two drafters propose ids of different vocabularies ({sorted(sizes)}).")
        return sizes.pop() if sizes else None

    def draft_cost(self, target_model):
        return max(self.first.draft_cost(target_model), self.second.draft_cost(target_model))

    def start(self, target, seqs, settings):
        super().start(target, seqs, settings)
        self.first.start(target, seqs, settings)
        self.second.start(target, seqs, settings)
        self.used_first = [True] * seqs.size
        self.second_counts = [0] * seqs.size
        self.verifier: Drafter | None = None  # the part that drafted this step alone (its `own_verification`)

    def accepted(self, seqs, verified):
        ours = verified.mine or [True] * len(self.used_first)  # (inside another fallback: the rows it gave us)
        mine = lambda use: dataclasses.replace(  # noqa: E731
            verified, num_accepted=[a if u == use else 0 for a, u in zip(verified.num_accepted, self.used_first)],
            mine=[u == use and o for u, o in zip(self.used_first, ours)])
        self.first.accepted(seqs, mine(True))
        self.second.accepted(seqs, mine(False))
        for accepted, drafted, first, o in zip(verified.num_accepted, self.second_counts, self.used_first, ours):
            if not first and o and drafted:
                self.second_measured.steps(1 + accepted, drafted)

    def select_rows(self, rows):
        self.first.select_rows(rows)
        self.second.select_rows(rows)
        self.used_first = [self.used_first[b] for b in rows]
        self.second_counts = [self.second_counts[b] for b in rows]

    def end(self):
        self.first.end()
        self.second.end()

    def own_verification(self, target, pending, pending_valid, draft):
        # a drafter that ran part of the target as it drafted (self-speculation in the target's cache) verifies the
        # steps it drafted alone; a plain step (no proposal asked for) and mixed rows take the step's own forward
        verifier, self.verifier = self.verifier, None
        return verifier.own_verification(target, pending, pending_valid, draft) if verifier is not None else None

    def propose(self, seqs, max_tokens):
        if self.sizes_own_drafts:
            self.first.rival_rate = self.second_measured.rate(self.settings.verify_cost)
        first = self.first.propose(seqs, max_tokens)
        counts = _counts(first)
        self.used_first = [n > 0 for n in counts]
        self.second_counts = [0] * seqs.size
        self.verifier = self.first
        if all(self.used_first):
            return first
        # the second drafter at most at its own default length: a model drafter's cost grows with every token
        began = time.perf_counter()
        second = self.second.propose(seqs, min(max_tokens, self.second.default_num_draft_tokens))
        self.second_measured.drafting(time.perf_counter() - began)
        self.second_counts = _counts(second)
        self.verifier = self.second
        if not any(self.used_first):
            return second
        if second.tree is not None or first.tree is not None:
            # a step verifies one shape for every row: a tree and a chain do not mix, so the drafter that serves more
            # rows drafts for all of them this step (the others decode one token)
            use_first = sum(self.used_first) >= sum(n > 0 for n in _counts(second))
            self.used_first = [use_first] * seqs.size
            if use_first:
                self.second_counts = [0] * seqs.size
            self.verifier = self.first if use_first else self.second
            return first if use_first else second
        # row by row: the first drafter's tokens where it proposed some, else the second's
        self.verifier = None
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


class _Measured:
    """What a drafter's steps gave: tokens per step (1 + accepted), tokens drafted and seconds spent drafting (decayed
    means), and so its expected tokens per second given what a forward verifying n drafts costs."""

    def __init__(self, decay: float = 0.9):
        self.decay, self.gain, self.length, self.seconds = decay, None, None, None

    def _mean(self, old, new):
        return new if old is None else self.decay * old + (1 - self.decay) * new

    def steps(self, tokens: int, drafted: int) -> None:
        self.gain, self.length = self._mean(self.gain, tokens), self._mean(self.length, drafted)

    def drafting(self, seconds: float) -> None:
        self.seconds = self._mean(self.seconds, seconds)

    def rate(self, verify_cost) -> float | None:
        if self.gain is None or self.seconds is None or verify_cost is None:
            return None
        cost = verify_cost(round(self.length))
        return None if cost is None else self.gain / (cost + self.seconds)


def _counts(draft: Draft) -> list[int]:
    return list(draft.num_valid) if draft.num_valid is not None else [draft.num_tokens] * draft.tokens.shape[0]
