"""How many tokens to draft at each step: a constant, or adapted to what the target has been accepting.

`num_draft_tokens` is always the cap. The adaptive policy moves the step's draft length up by one after a step whose
drafts were all accepted and down by one after a rejection, and asks drafters that know their confidence (draft models)
to stop early when their top probability falls below `confidence_threshold`. The stop decision depends only on the
drafter's distribution before a token is drawn, so sampling stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ConstantDraftLength:
    """Always draft up to the cap."""

    confidence_threshold: float | None = None

    def start(self, cap: int) -> None:
        self.cap = cap

    def next_length(self) -> int:
        return self.cap

    def update(self, num_drafted: int, num_accepted: int) -> None:
        pass


@dataclass
class AdaptiveDraftLength:
    """+1 after a fully accepted step, -1 after a rejection, within [min_length, cap]; confidence early stop."""

    confidence_threshold: float | None = 0.3
    min_length: int = 1

    def start(self, cap: int) -> None:
        self.cap = cap
        self.current = cap

    def next_length(self) -> int:
        return self.current

    def update(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted == 0:
            return
        if num_accepted == num_drafted:
            self.current = min(self.cap, self.current + 1)
        else:
            self.current = max(self.min_length, self.current - 1)


def as_draft_length_policy(value):
    if value in (None, "constant"):
        return ConstantDraftLength()
    if value == "adaptive":
        return AdaptiveDraftLength()
    if hasattr(value, "next_length") and hasattr(value, "update") and hasattr(value, "start"):
        return value
    raise ValueError(
        f"draft_length must be 'constant', 'adaptive' or a policy object with start/next_length/update, got {value!r}."
    )
