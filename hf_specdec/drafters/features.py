"""The target's final hidden states per row, as feature drafters (EAGLE-style, Medusa) receive them from the loop.

After each verification forward the loop calls `observe(hidden, valid)` with the hidden state of every token it fed
(the rows' uncached tokens, then all drafts); `accept(...)` then keeps, per row, those of the tokens now committed. A
row's features are aligned with its real tokens (prompt padding dropped): `features[b][j]` is the target's hidden
state at real position j, for every committed token but the newest (the target has not run on that one yet).
"""

from __future__ import annotations

import torch


class TargetFeatures:
    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, hidden_size: int):
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        self.prompt_mask = mask.bool()
        self.prompt_len = input_ids.shape[1]
        self.features = [torch.zeros(0, hidden_size, device=input_ids.device) for _ in range(len(input_ids))]
        self.pending = None  # the last verification forward's features, until `accept` says which to keep

    def real_tokens(self, b: int, row: torch.Tensor) -> torch.Tensor:
        """Row b (prompt with its left padding, then generated tokens) without the padding."""
        return torch.cat([row[: self.prompt_len][self.prompt_mask[b]], row[self.prompt_len :]])

    def rows(self, input_ids: torch.Tensor, lengths: torch.Tensor | None) -> list[torch.Tensor]:
        return [self.real_tokens(b, input_ids[b, : int(lengths[b])] if lengths is not None else input_ids[b])
                for b in range(len(input_ids))]

    def ready(self, rows: list[torch.Tensor]) -> bool:
        """Every row has the features of all its tokens but the newest (False before the first target forward)."""
        return all(len(f) >= len(r) - 1 for f, r in zip(self.features, rows))

    def observe(self, hidden: torch.Tensor, valid: torch.Tensor) -> None:
        self.pending = [hidden[b][valid[b]].float() for b in range(hidden.shape[0])]

    def accept(self, input_ids: torch.Tensor, lengths: torch.Tensor | None) -> None:
        if self.pending is None:
            return
        for b, row in enumerate(self.rows(input_ids, lengths)):
            need = len(row) - 1 - len(self.features[b])
            self.features[b] = torch.cat([self.features[b], self.pending[b][:need]])
        self.pending = None

    def select(self, rows: torch.Tensor) -> None:
        keep = rows.tolist()
        self.prompt_mask = self.prompt_mask[rows]
        self.features = [self.features[b] for b in keep]
        if self.pending is not None:
            self.pending = [self.pending[b] for b in keep]
