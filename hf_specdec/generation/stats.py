"""What speculation did: `SpeculationStats` (filled by the loop, accumulating over calls) and the output class."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers.generation.utils import GenerateDecoderOnlyOutput


@dataclass
class SpeculationStats:
    """What speculation did during one or more `generate()` calls (accumulates when passed to several).

    Counted per row: a batched target forward counts once for each row it verified, so `mean_accepted_tokens` is the
    tokens a row gains per target forward whatever the batch size.
    """

    target_forwards: int = 0
    emitted_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    #: per row of the input batch (row b of every call): drafts proposed and accepted
    drafted_by_row: list[int] = field(default_factory=list)
    accepted_by_row: list[int] = field(default_factory=list)
    #: batched steps in which the rows accepted different numbers of drafts (each row then keeps its own prefix)
    uneven_steps: int = 0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        """Tokens emitted per target forward, the bonus token included (plain decoding = 1.0)."""
        return self.emitted_tokens / max(self.target_forwards, 1)

    @property
    def acceptance_by_position(self) -> list[float]:
        """P(draft i accepted | draft i was proposed), for i = 0..k-1."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_position, self.drafted_by_position)]

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / max(self.drafted_tokens, 1)

    def record_step(self, num_drafted: list[int], num_accepted: list[int], num_emitted: list[int], rows: list[int],
                    draft_seconds: float, target_seconds: float) -> None:
        """One verification step: row `rows[i]` of the input batch proposed `num_drafted[i]` drafts (a tree: its depth),
        the target accepted `num_accepted[i]` of them, and the row kept `num_emitted[i]` tokens (accepted drafts and
        the target's own token, cut where a stopping criterion fired)."""
        width = max(num_drafted, default=0)
        self.drafted_by_position += [0] * (width - len(self.drafted_by_position))
        self.accepted_by_position += [0] * (width - len(self.accepted_by_position))
        height = max(rows, default=-1) + 1
        self.drafted_by_row += [0] * (height - len(self.drafted_by_row))
        self.accepted_by_row += [0] * (height - len(self.accepted_by_row))
        for drafted, accepted, emitted, row in zip(num_drafted, num_accepted, num_emitted, rows):
            self.target_forwards += 1
            self.emitted_tokens += emitted
            self.drafted_tokens += drafted
            self.accepted_tokens += accepted
            self.drafted_by_row[row] += drafted
            self.accepted_by_row[row] += accepted
            for i in range(drafted):
                self.drafted_by_position[i] += 1
                self.accepted_by_position[i] += int(i < accepted)
        self.uneven_steps += len(set(num_accepted)) > 1
        self.draft_seconds += draft_seconds
        self.target_seconds += target_seconds

    def merge(self, other: "SpeculationStats", first_row: int = 0) -> "SpeculationStats":
        """Add `other`'s counts to these (e.g. the statistics of several processes; `other`'s row i counts as row
        `first_row + i`: a batch decoded row by row); returns self."""
        for name in ("target_forwards", "emitted_tokens", "drafted_tokens", "accepted_tokens", "uneven_steps",
                     "draft_seconds", "target_seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("drafted_by_position", "accepted_by_position", "drafted_by_row", "accepted_by_row"):
            mine, theirs = getattr(self, name), getattr(other, name)
            offset = first_row if name.endswith("_row") else 0
            mine += [0] * (offset + len(theirs) - len(mine))
            for i, value in enumerate(theirs):
                mine[offset + i] += value
        return self

    def as_dict(self) -> dict:
        return {
            "target_forwards": self.target_forwards,
            "emitted_tokens": self.emitted_tokens,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "mean_accepted_tokens": self.mean_accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_by_position": self.acceptance_by_position,
            "drafted_by_row": self.drafted_by_row,
            "accepted_by_row": self.accepted_by_row,
            "uneven_steps": self.uneven_steps,
            "draft_seconds": self.draft_seconds,
            "target_seconds": self.target_seconds,
        }


@dataclass
class SpeculativeDecoderOnlyOutput(GenerateDecoderOnlyOutput):
    """`GenerateDecoderOnlyOutput` plus what speculation did."""

    speculation_stats: SpeculationStats | None = None


__all__ = ["SpeculationStats", "SpeculativeDecoderOnlyOutput"]
