"""Two drafters in one: the first one's proposal when it has one, else the second's, row by row.

The natural pair is n-gram lookup first (free, and long and usually right when the text repeats itself) and a
distilled draft model second (a few ms per token, right about a third of the time on fresh text): `"ngram+distilled"`.
Both keep their own state in step with the sequence (`start`, `accepted`, `select_rows` go to both), so either can take
over at any step. Exactness is untouched: each row's draft comes from one drafter, with that drafter's q.
"""

from __future__ import annotations

import torch

from .base import Draft, Drafter


class FallbackDrafter(Drafter):
    def __init__(self, first: Drafter, second: Drafter):
        if not (isinstance(first, Drafter) and isinstance(second, Drafter)):
            raise TypeError("FallbackDrafter combines two Drafters; wrap models first: `hf_specdec.as_drafter(model)`.")
        self.first, self.second = first, second
        self.supports_batch = first.supports_batch and second.supports_batch
        self.uses_target_hidden = first.uses_target_hidden or second.uses_target_hidden
        self.default_num_draft_tokens = max(first.default_num_draft_tokens, second.default_num_draft_tokens)

    def __repr__(self) -> str:
        return f"FallbackDrafter({self.first!r}, {self.second!r})"

    def vocab_size(self):
        sizes = {self.first.vocab_size(), self.second.vocab_size()} - {None}
        if len(sizes) > 1:
            raise ValueError(f"The two drafters propose ids of different vocabularies ({sorted(sizes)}).")
        return sizes.pop() if sizes else None

    def _both(self, method: str, *args, **kwargs) -> None:
        for drafter in (self.first, self.second):
            getattr(drafter, method)(*args, **kwargs)

    def start(self, target, input_ids, generation_config, logits_processor, **kwargs):
        super().start(target, input_ids, generation_config, logits_processor)
        for drafter in (self.first, self.second):
            drafter.confidence_threshold = self.confidence_threshold
        self._both("start", target, input_ids, generation_config, logits_processor, **kwargs)

    def accepted(self, input_ids, num_accepted, **kwargs):
        self._both("accepted", input_ids, num_accepted, **kwargs)

    def select_rows(self, rows):
        self._both("select_rows", rows)

    def observe_target(self, hidden, valid):
        self._both("observe_target", hidden, valid)

    def propose(self, input_ids, max_tokens, **kwargs):
        first = self.first.propose(input_ids, max_tokens, **kwargs)
        counts = _counts(first)
        if bool((counts > 0).all()):
            return first
        # the second drafter at most at its own default length: a model drafter's cost grows with every token
        second = self.second.propose(input_ids, min(max_tokens, self.second.default_num_draft_tokens), **kwargs)
        use_first = counts > 0
        if not use_first.any():
            return second
        # row by row: the first drafter's tokens where it proposed some, else the second's
        width = max(first.num_tokens, second.num_tokens)
        pad = lambda t: torch.nn.functional.pad(t, (0, width - t.shape[1]))  # noqa: E731
        tokens = torch.where(use_first[:, None], pad(first.tokens), pad(second.tokens))
        num_valid = torch.where(use_first, counts, _counts(second))
        probs = None
        if first.probs is not None or second.probs is not None:
            vocab = (first.probs if first.probs is not None else second.probs).shape[-1]
            as_probs = lambda d: d.probs if d.probs is not None else torch.nn.functional.one_hot(d.tokens, vocab).float()  # noqa: E731
            pad_probs = lambda p: torch.nn.functional.pad(p, (0, 0, 0, width - p.shape[1]))  # noqa: E731
            probs = torch.where(use_first[:, None, None], pad_probs(as_probs(first)), pad_probs(as_probs(second)))
        return Draft(tokens, probs, None if bool((num_valid == width).all()) else num_valid,
                     stopped_early=first.stopped_early and second.stopped_early)


def _counts(draft: Draft) -> torch.Tensor:
    if draft.num_valid is not None:
        return draft.num_valid
    return torch.full((draft.tokens.shape[0],), draft.num_tokens, dtype=torch.long, device=draft.tokens.device)
