"""Emitting a step's tokens: each row appends its accepted block up to exactly where plain decoding would have stopped,
the streamer and the per-token scores follow, and finished rows leave the batch."""

from __future__ import annotations

import time

import torch
from transformers import StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria

from .draft_length import StepOutcome


class Stopper:
    """The call's stopping criteria, checked token by token where plain decoding checks them (after each token, with
    that token's scores). The ones transformers defines by length, EOS and time are read on the host from the tokens
    the step already brought back; any other (stop strings, your own) runs on the row's prefix on the device."""

    def __init__(self, criteria, max_length: int):
        criteria = list(criteria or [])
        self.max_length = min([c.max_length for c in criteria if type(c) is MaxLengthCriteria] + [max_length])
        self.eos = {int(t) for c in criteria if type(c) is EosTokenCriteria for t in c.eos_token_id.flatten().tolist()}
        self.timers = [c for c in criteria if type(c) is MaxTimeCriteria]
        self.others = StoppingCriteriaList(c for c in criteria
                                           if type(c) not in (MaxLengthCriteria, EosTokenCriteria, MaxTimeCriteria))

    def first_stop(self, full: torch.Tensor, ids: torch.Tensor, tokens: list[int], scores) -> int | None:
        """The index in `tokens` (a row's block, appended after its `full` sequence) where generation stops, or None."""
        now = time.time()
        for j, token in enumerate(tokens):
            if full.shape[0] + j + 1 >= self.max_length:
                return j
            if token in self.eos or any(now - c.initial_timestamp > c.max_time for c in self.timers):
                return j
            if self.others and bool(self.others(torch.cat([full, ids[: j + 1]])[None], scores(j)).any()):
                return j
        return None


def emit(run, step) -> None:
    """A step's tokens out: each row's block (cut at its stop) appended, the step recorded, finished rows dropped."""
    num_emitted, finished = append_blocks(run, step)
    record(run, step, num_emitted, finished)
    run.drafter.accepted(run.seqs, step.verified)  # every row, finished ones too: what the target said still informs
    drop_finished(run, finished)


def append_blocks(run, step) -> tuple[list[int], list[int]]:
    """Append each row's block up to its stop, feeding the streamer and the score outputs; returns the tokens each
    row kept and the rows that stopped."""
    seqs, finished, num_emitted = run.seqs, [], []
    for b, tokens in enumerate(step.tokens):
        ids = step.ids[b, : len(tokens)]
        rows = [0] + [node + 1 for node in step.paths[b]]  # the score row each token was chosen from
        stop = run.stopper.first_stop(seqs.full(b), ids, tokens, lambda j: step.scores[b : b + 1, rows[j]])
        n = len(tokens) if stop is None else stop + 1
        seqs.append(b, ids[:n], tokens[:n])
        num_emitted.append(n)
        if run.want_scores or run.want_logits:  # batch 1 only (validated): one entry per emitted token
            run.scores_out += [step.scores[b : b + 1, r] for r in rows[:n]] if run.want_scores else []
            run.logits_out += [step.logits[b : b + 1, r] for r in rows[:n]] if run.want_logits else []
        if run.streamer is not None:
            run.streamer.put(ids[:n][None].cpu())
        if stop is not None:
            finished.append(b)
    return num_emitted, finished


def record(run, step, num_emitted: list[int], finished: list[int]) -> None:
    """The step into the call's statistics and into the draft-length policy."""
    run.stats.record_step(step.draft.depth_by_row(), step.num_accepted, num_emitted, run.seqs.index,
                          step.draft_seconds, step.target_seconds)
    shape = step.draft.shape
    # a confidence stop is a miss at the next position: choosing a longer length bought nothing there
    stopped = int(step.draft.stopped_early)
    tried = [d + stopped if d else 0 for d in step.draft.depth_by_row()]
    if shape.size and len(tried) > 1:  # a row the drafter had nothing for paid the batch's width all the same: a miss
        tried = [t or 1 for t in tried]
    run.policy.update(StepOutcome(shape.size, tried, step.num_accepted,
                                  step.draft_seconds, step.draft_seconds + step.target_seconds,
                                  None if shape.is_chain else step.paths, rows=list(run.seqs.index),
                                  next_rows=[row for b, row in enumerate(run.seqs.index) if b not in finished]))


def drop_finished(run, finished: list[int]) -> None:
    """Finished rows leave the batch (and stop costing work); the rest get their next uncached token."""
    seqs = run.seqs
    keep = [b for b in range(seqs.size) if b not in finished]
    for b in finished:
        run.finished[seqs.index[b]] = seqs.full(b)
    if finished and keep:
        run.target.select_rows(keep)
        run.drafter.select_rows(keep)
    seqs.select(keep)
    # the next step's uncached tokens: each row's newest token, the target's own pick
    run.pending = torch.stack([seqs.ids(b)[-1:] for b in range(seqs.size)]) if keep else None
    run.pending_valid = torch.ones(len(keep), 1, dtype=torch.bool)
