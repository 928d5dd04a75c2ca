"""A drafter that proposes nothing: every step is a plain one-token step through hf_specdec's own loop and forward
path (`assistant="none"`). A baseline: against stock `generate()` it shows what the loop itself costs or saves, apart
from speculation."""

from __future__ import annotations

from .base import Draft, Drafter


class PlainDrafter(Drafter):
    default_num_draft_tokens = 1

    def __repr__(self) -> str:
        return "PlainDrafter()"

    def propose(self, seqs, max_tokens):
        return Draft.empty(seqs.size, seqs.ids(0).device)
