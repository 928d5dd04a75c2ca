"""N-gram lookup: draft what followed an earlier occurrence of the sequence's own suffix.

Unlike transformers' prompt lookup (which rescans the prompt on every step and copies the OLDEST match of at most a
2-gram), this drafter:

- indexes the prompt AND the text generated so far, incrementally: appending a token records, for each n in
  [min_n, max_n], what followed the n-gram that ended just before it (O(max_n - min_n + 1) dict updates per token, no
  rescan per step);
- matches the LONGEST suffix (n from max_n down to min_n) that occurred before;
- proposes the continuation of the most RECENT occurrence (default), or, with `strategy="frequent"`, the token that
  most often followed it (ties: the most recent), one token at a time, looking the extended suffix up again;
- copies continuations that run into the present as a periodic extension (after "a b a b", matching "a b" at the
  start proposes "a b a b ..."), so repeated lines and runs draft their full length;
- drafts fewer tokens after short matches (`max_tokens_by_match`): a 1-gram match is a weak guess (on the project's
  input-grounded prompts its first token is right ~20% of the time, an 8-gram's ~94%), and every extra verified token
  costs target compute;
- proposes nothing when no suffix of length >= min_n occurred before.

The drafter is deterministic (its q is one-hot), so sampled decoding stays exact through the usual rejection rule.
"""

from __future__ import annotations

import torch

from .base import Draft, Drafter
from ..errors import InputError

STRATEGIES = ("recent", "frequent")


class NgramIndex:
    """Continuations of every n-gram (min_n <= n <= max_n) of a growing token list.

    `latest[g]` is the end (exclusive) of the most recent occurrence of n-gram `g` that has a continuation, i.e. that
    ends before the last token; `tokens[latest[g]]` is what followed it. With `count=True`, `follow[g][t]` is
    `[times t followed g, end of the latest such occurrence]`.
    """

    def __init__(self, min_n: int = 1, max_n: int = 4, count: bool = False):
        if not (isinstance(min_n, int) and isinstance(max_n, int) and 1 <= min_n <= max_n):
            raise InputError(f"Need integers 1 <= min_n <= max_n, got min_n={min_n!r}, max_n={max_n!r}.")
        self.min_n, self.max_n, self.count = min_n, max_n, count
        self.tokens: list[int] = []
        self.latest: dict[tuple[int, ...], int] = {}
        self.follow: dict[tuple[int, ...], dict[int, list[int]]] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, new_tokens) -> None:
        tokens, latest, follow = self.tokens, self.latest, self.follow
        min_n, max_n, count = self.min_n, self.max_n, self.count
        for token in new_tokens:
            end = len(tokens)  # the n-grams ending here now have a continuation: `token`
            for n in range(min_n, min(max_n, end) + 1):
                key = tuple(tokens[end - n : end])
                latest[key] = end
                if count:
                    entry = follow.setdefault(key, {}).get(token)
                    if entry is None:
                        follow[key][token] = [1, end]
                    else:
                        entry[0] += 1
                        entry[1] = end
            tokens.append(token)

    def _longest_match(self, seq: list[int]) -> tuple[int, tuple[int, ...] | None]:
        """(n, n-gram) for the longest suffix of `seq` with a recorded continuation, or (0, None)."""
        latest, length = self.latest, len(seq)
        for n in range(min(self.max_n, length), self.min_n - 1, -1):
            key = tuple(seq[length - n :])
            if key in latest:
                return n, key
        return 0, None

    def propose(self, max_tokens: int, strategy: str = "recent") -> tuple[list[int], int]:
        """Up to `max_tokens` drafted tokens, and the length of the suffix match they came from (0: no match)."""
        if max_tokens <= 0:
            return [], 0
        tokens = self.tokens
        n, key = self._longest_match(tokens)
        if key is None:
            return [], 0
        if strategy == "recent":
            start = self.latest[key]
            available = len(tokens) - start
            if available >= max_tokens:
                return tokens[start : start + max_tokens], n
            # The continuation runs into the present: extend it periodically (its period is len(tokens) - start).
            out = tokens[start:]
            while len(out) < max_tokens:
                out.append(out[len(out) - available])
            return out, n
        if strategy != "frequent":
            raise InputError(f"Unknown n-gram strategy {strategy!r}; choose one of {STRATEGIES}.")
        if not self.count:
            raise InputError("strategy='frequent' needs an index built with count=True.")
        seq = tokens[-self.max_n :]  # a window long enough for every lookup
        out: list[int] = []
        first_n = n
        while True:
            followers = self.follow[key]
            best = max(followers.items(), key=lambda item: (item[1][0], item[1][1]))[0]
            out.append(best)
            if len(out) >= max_tokens:
                break
            seq.append(best)
            n, key = self._longest_match(seq[-self.max_n :])
            if key is None:
                break
        return out, first_n


class NgramDrafter(Drafter):
    """Prompt-and-output n-gram lookup drafter (deterministic: q is one-hot).

    Args:
        min_ngram / max_ngram: suffix lengths tried, longest first (a match shorter than `min_ngram` drafts nothing).
        strategy: "recent" (copy what followed the latest occurrence) or "frequent" (the most frequent follower).
        max_tokens_by_match: caps on the draft length by match length: entry i applies to a match of i + 1 tokens
            (0 drafts nothing); longer matches draft up to the step's maximum (`num_draft_tokens`). `()`: no caps.

    The defaults were tuned on examples/input_grounded_prompts.jsonl with SmolLM2-135M on CPU (see
    benchmarks/ngram_vs_prompt_lookup.py): short drafts after 1-gram matches, long ones after long matches.
    """

    default_num_draft_tokens = 16

    def __init__(
        self,
        min_ngram: int = 1,
        max_ngram: int = 8,
        strategy: str = "recent",
        max_tokens_by_match: tuple[int, ...] | list[int] = (3, 8),
    ):
        if strategy not in STRATEGIES:
            raise InputError(f"Unknown n-gram strategy {strategy!r}; choose one of {STRATEGIES}.")
        caps = tuple(max_tokens_by_match)
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in caps):
            raise InputError(f"max_tokens_by_match must hold integers >= 0, got {max_tokens_by_match!r}.")
        NgramIndex(min_ngram, max_ngram)  # validate now, not at the first generate() call
        self.min_ngram, self.max_ngram, self.strategy = min_ngram, max_ngram, strategy
        self.max_tokens_by_match = caps
        self.indexes: list[NgramIndex] = []

    def __repr__(self) -> str:
        return (
            f"NgramDrafter(min_ngram={self.min_ngram}, max_ngram={self.max_ngram}, strategy={self.strategy!r}, "
            f"max_tokens_by_match={self.max_tokens_by_match})"
        )

    def _new_index(self) -> NgramIndex:
        return NgramIndex(self.min_ngram, self.max_ngram, count=self.strategy == "frequent")

    def start(self, target, seqs, settings):
        super().start(target, seqs, settings)
        self.indexes = [self._new_index() for _ in range(seqs.size)]  # one per row; prompt padding is never indexed

    def select_rows(self, rows):
        self.indexes = [self.indexes[b] for b in rows]

    @property
    def index(self) -> NgramIndex | None:  # the single-sequence view
        return self.indexes[0] if self.indexes else None

    def propose(self, seqs, max_tokens):
        caps = self.max_tokens_by_match
        proposals = []
        for b, index in enumerate(self.indexes):
            tokens = seqs.tokens(b)  # on the host: lookups need no device sync
            index.extend(tokens[len(index) :])
            proposal, matched = index.propose(max_tokens, self.strategy)
            if 0 < matched <= len(caps):
                proposal = proposal[: caps[matched - 1]]
            proposals.append(proposal)
        width = max(len(p) for p in proposals)
        tokens = torch.tensor([p + [0] * (width - len(p)) for p in proposals], dtype=torch.long)
        return Draft(tokens.to(seqs.ids(0).device), None, [len(p) for p in proposals])
