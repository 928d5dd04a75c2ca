"""One speculative step for every active row, chains and trees alike (a chain is a tree whose node i has parent i - 1):
draft, verify with ONE target forward, accept a path per row by the call's rule, roll the cache back."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..drafters.base import Draft, Verified
from .processors import process_block
from .verification import verify


@dataclass
class Step:
    """What a step produced, on the host where the loop needs it."""

    tokens: list[list[int]]  # per row: its accepted drafts, then the target's own token
    paths: list[list[int]]  # per row: the accepted nodes
    ids: torch.Tensor  # [B, D + 1] the same tokens on the device (row b's first len(tokens[b]) are real)
    scores: torch.Tensor  # [B, T + 1, V] after the logits processors
    logits: torch.Tensor  # [B, T + 1, V] raw
    draft: Draft
    num_accepted: list[int]
    verified: Verified
    draft_seconds: float
    target_seconds: float


def speculative_step(run) -> Step:
    seqs, target = run.seqs, run.target
    # 1. Draft up to `max_draft` tokens per row (a drafter may propose fewer, or none). A step emits at most
    #    max_draft + 1 tokens, so drafts past max_length could never be emitted.
    start = run.clock.now()
    room = run.max_length - max(seqs.full_length(b) for b in range(seqs.size)) - 1
    draft = propose(run.drafter, seqs, min(run.policy.next_length(), room))
    drafted = run.clock.now()

    # 2. Verify each row's uncached tokens and its draft in ONE target forward, through generate()'s processors.
    logits = run.drafter.own_verification(target, run.pending, run.pending_valid, draft)
    if logits is None:
        logits = verify(target, run.pending, run.pending_valid, draft)
    scores = process_block(run.processors, seqs, draft, logits)

    # 3. Accept a path per row by the call's rule; the token after it always comes from the target.
    accepted = run.rule(draft, scores)
    if draft.num_tokens:
        path_tokens = draft.tokens.gather(1, accepted.path.clamp_min(0))
        ids = torch.cat([path_tokens, accepted.next_token[:, None]], dim=1)
        ids.scatter_(1, accepted.num_accepted[:, None], accepted.next_token[:, None])
    else:
        ids = accepted.next_token[:, None]

    # 4. The step's one transfer to the host; then keep the cache slots of each row's path (the rest become holes
    #    or are cropped) and hand feature drafters the hidden states of what was committed.
    verified_at = run.clock.now()
    host = torch.cat([accepted.num_accepted[:, None], ids, accepted.path], dim=1).tolist()
    host_start = time.perf_counter()
    width = ids.shape[1]
    num_accepted = [row[0] for row in host]
    tokens = [row[1 : 2 + n] for row, n in zip(host, num_accepted)]
    paths = [row[1 + width : 1 + width + n] for row, n in zip(host, num_accepted)]
    pending = [[j for j, real in enumerate(row) if real] for row in run.pending_valid.numpy().tolist()]  # host
    u = len(run.pending_valid[0])
    kept = [p + [u + node for node in path] for p, path in zip(pending, paths)]
    verified = Verified(num_accepted, scores=scores, read_tokens=torch.cat([run.pending[:, -1:], draft.tokens], dim=1))
    if target.last_hidden is not None:
        verified.hidden, verified.num_hidden = committed_hidden(target.last_hidden, kept)
    target.keep(u + draft.num_tokens, kept)
    return Step(tokens, paths, ids, scores, logits, draft, num_accepted, verified, run.clock.seconds(start, drafted),
                run.clock.seconds(drafted, verified_at) + time.perf_counter() - host_start)


def propose(drafter, seqs, max_draft: int) -> Draft:
    """The drafter's proposal of up to `max_draft` tokens per row (none asked for: an empty draft, a plain step)."""
    return drafter.propose(seqs, max_draft) if max_draft > 0 else Draft.empty(seqs.size, seqs.ids(0).device)


def committed_hidden(hidden: torch.Tensor, kept: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
    """Rows `kept[b]` of `hidden[b]` (the fed tokens a row committed), left-aligned and zero-padded."""
    counts = [len(k) for k in kept]
    width = max(counts, default=0)
    index = torch.tensor([k + [0] * (width - len(k)) for k in kept], device=hidden.device)
    return hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1])), counts



class DeviceClock:
    """A step's timestamps on the device's own timeline: CUDA events on a GPU, the host clock elsewhere.

    The events of a step are complete once its one host transfer has returned, so reading them then waits for nothing
    (and `perf_counter` alone would time kernel launches, not work, on a GPU)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1000 if self.cuda else end - start


__all__ = ["speculative_step", "Step", "DeviceClock"]
