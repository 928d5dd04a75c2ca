"""The rows a `generate()` call decodes, growing independently, in the two views the loop and the drafters need.

- `full(b)`: the row as plain `generate()` sees it (its prompt with its left padding, then the tokens generated so
  far): what logits processors, stopping criteria and the returned sequences use.
- `ids(b)` (device) and `tokens(b)` (host): its real tokens (the prompt without padding, then the generated tokens):
  what drafters read. The host copy comes with the one transfer a step makes anyway, so lookups need no sync.
"""

from __future__ import annotations

import torch


class Sequences:
    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        mask = attention_mask.bool()
        self.prompt_len = input_ids.shape[1]
        self.prompt_mask = mask.cpu()  # host copy: which prompt slots are real
        self._full = list(input_ids)
        self._ids = [row[m] for row, m in zip(input_ids, mask)]
        self._tokens = [[t for t, real in zip(row, m) if real]
                        for row, m in zip(input_ids.tolist(), self.prompt_mask.tolist())]
        self.index = list(range(input_ids.shape[0]))  # each row's position in the caller's batch

    @property
    def size(self) -> int:
        return len(self._full)

    def full(self, b: int) -> torch.Tensor:
        return self._full[b]

    def ids(self, b: int) -> torch.Tensor:
        return self._ids[b]

    def tokens(self, b: int) -> list[int]:
        return self._tokens[b]

    def full_length(self, b: int) -> int:
        return self._full[b].shape[0]

    def lengths(self) -> list[int]:
        """Real tokens per row."""
        return [len(t) for t in self._tokens]

    def padded(self, pad: int = 0) -> torch.Tensor:
        """The rows' real tokens, right-padded: [B, max length]."""
        return torch.nn.utils.rnn.pad_sequence(self._ids, batch_first=True, padding_value=pad)

    def append(self, b: int, ids: torch.Tensor, tokens: list[int]) -> None:
        self._full[b] = torch.cat([self._full[b], ids])
        self._ids[b] = torch.cat([self._ids[b], ids])
        self._tokens[b].extend(tokens)

    def select(self, keep: list[int]) -> None:
        self._full = [self._full[b] for b in keep]
        self._ids = [self._ids[b] for b in keep]
        self._tokens = [self._tokens[b] for b in keep]
        self.index = [self.index[b] for b in keep]
        self.prompt_mask = self.prompt_mask[keep]


__all__ = ["Sequences"]
