"""The drafter protocol: every drafting strategy is one class behind this small interface.

The decoding loop calls, per `generate()` call:

    drafter.start(target, input_ids, generation_config, logits_processor)   # reset per-call state, validate
    loop:
        draft = drafter.propose(input_ids, max_tokens)                      # up to max_tokens tokens (+ their q)
        ... the target verifies ...
        drafter.accepted(input_ids, num_accepted)                           # learn what was kept; roll back caches

`Draft.probs` is the distribution each token was drawn from (`[B, k, V]`), or `None` for a deterministic drafter
(greedy draft model, n-gram lookup), whose distribution is one-hot. A drafter may propose fewer than `max_tokens`
tokens, or none: then the target simply decodes one token.

`Drafter` also implements `transformers.generation.CandidateGenerator` (`get_candidates` /
`update_candidate_strategy`), so the same object can be used where transformers expects a candidate generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.generation.candidate_generator import CandidateGenerator


@dataclass
class Draft:
    tokens: torch.Tensor  # [B, k] proposed token ids (k may be 0)
    probs: torch.Tensor | None = None  # [B, k, V] the distribution each token was sampled from; None = one-hot
    num_valid: torch.Tensor | None = None  # [B] rows that proposed fewer than k tokens pad the rest; None = all k
    parents: torch.Tensor | None = None  # [k] a TREE of candidates (Medusa): node i's parent (-1: the last token),
    #   parents first; one shape for every row, `tokens` [B, k] per row. Tree candidates are deterministic (probs None).
    stopped_early: bool = False  # every row stopped below max_tokens on low confidence: to the draft-length policy
    #   the next position counts as tried and missed (else its acceptance would be measured on confident drafts only)

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[1]


def next_draft_token(drafter: "Drafter", scores, rows, tokens, drafting, first: bool):
    """One autoregressive draft step shared by model drafters: the target's logits processors on each row's prefix
    (its sequence plus the drafts so far), an early stop for rows whose top probability is below the drafter's
    confidence threshold (decided from q before drawing, so sampling stays exact), then argmax or a draw from q.
    Returns `(token [B], q [B, V] or None, drafting [B])`; `drafting` all False means stop drafting."""
    if drafter.logits_processor:
        scores = torch.cat([
            drafter.logits_processor(torch.cat([rows[b], *[t[b : b + 1] for t in tokens]])[None], scores[b : b + 1])
            for b in range(len(rows))
        ])
    may_stop = not first and drafter.confidence_threshold is not None  # the first draft is always proposed
    q = scores.softmax(dim=-1) if drafter.do_sample or may_stop else None
    if may_stop:
        drafting = drafting & (q.max(dim=-1).values >= drafter.confidence_threshold)
    token = torch.multinomial(q, 1).squeeze(1) if drafter.do_sample else scores.argmax(dim=-1)
    return token, q if drafter.do_sample else None, drafting


class Drafter(CandidateGenerator):
    """Base class of every drafter. Subclasses implement `propose`; the rest has sensible defaults."""

    #: draft length used when the caller does not pass `num_draft_tokens`
    default_num_draft_tokens: int = 5
    #: set by the loop from the draft-length policy: drafters that know their confidence stop drafting when their top
    #: probability falls below it (None = never stop early). Decide from the distribution only, before drawing.
    confidence_threshold: float | None = None
    #: batch > 1 support. Drafters that set it receive batches: `start(..., attention_mask=prompt_mask)`,
    #: `propose(input_ids, max_tokens, lengths=...)` and `accepted(input_ids, num_accepted, lengths=...)` where
    #: `input_ids` is RIGHT-padded and row b's sequence is `input_ids[b, :lengths[b]]` (its prompt, including the
    #: prompt's own left padding, then its generated tokens), and `select_rows(rows)` when finished rows leave.
    supports_batch: bool = False
    #: feature drafters (EAGLE-style, Medusa) set this: after every verification forward the loop calls
    #: `observe_target(hidden [B, m, H], valid [B, m])` with the target's final hidden state of every token it fed
    #: (the row's uncached tokens, then the drafts), before `accepted(...)` says how many drafts were kept.
    uses_target_hidden: bool = False
    #: drafters that run the TARGET's own layers (self-speculation) may set this in `start`: the loop then calls
    #: `share_target_cache(target_kv)` and runs each verification through `verify(target_kv, new_ids, valid,
    #: num_logits)`, so that the layers the drafter already ran for the drafted tokens are not run again.
    shares_target_cache: bool = False

    def start(self, target, input_ids: torch.Tensor, generation_config, logits_processor) -> None:
        """Called once per `generate()` call, before any target forward. Validate and reset per-call state here."""
        self.generation_config = generation_config
        self.logits_processor = logits_processor

    def propose(self, input_ids: torch.Tensor, max_tokens: int) -> Draft:
        raise NotImplementedError

    def accepted(self, input_ids: torch.Tensor, num_accepted: torch.Tensor, lengths: torch.Tensor | None = None) -> None:
        """`input_ids` now ends with the accepted drafts plus the target's token; `num_accepted` is `[B]`."""

    def observe_target(self, hidden: torch.Tensor, valid: torch.Tensor) -> None:
        """Feature drafters: the target's final hidden states of the tokens just verified (see `uses_target_hidden`)."""

    def select_rows(self, rows: torch.Tensor) -> None:
        """Batch drafters: keep only these rows (finished rows have left the batch)."""

    def vocab_size(self) -> int | None:
        """Size of the token space the drafter proposes in, or None when it proposes the target's own ids."""
        return None

    # --- transformers.generation.CandidateGenerator compatibility ---
    def get_candidates(self, input_ids: torch.LongTensor, **kwargs):
        draft = self.propose(input_ids, self.default_num_draft_tokens)
        logits = None if draft.probs is None else draft.probs.clamp_min(1e-30).log()
        return torch.cat([input_ids, draft.tokens], dim=-1), logits

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, num_matches: int):
        self.accepted(input_ids, torch.tensor([num_matches], device=input_ids.device))


class CandidateGeneratorDrafter(Drafter):
    """Adapter: any `transformers` `CandidateGenerator` used as a drafter.

    Its candidate logits (already processed, as transformers defines them) give q by softmax; without logits, the
    candidates are treated as deterministic proposals.
    """

    def __init__(self, candidate_generator: CandidateGenerator):
        self.candidate_generator = candidate_generator

    def propose(self, input_ids, max_tokens):
        candidate_ids, candidate_logits = self.candidate_generator.get_candidates(input_ids)
        tokens = candidate_ids[:, input_ids.shape[1] :][:, :max_tokens]
        probs = None
        if candidate_logits is not None:
            probs = candidate_logits[:, : tokens.shape[1]].float().softmax(dim=-1)
        return Draft(tokens, probs)

    def accepted(self, input_ids, num_accepted):
        self.candidate_generator.update_candidate_strategy(input_ids, None, int(num_accepted[0]))
