"""The target's hidden states per row, as feature drafters (those reading its states) receive them from the loop.

A feature drafter asks, in `start`, for the outputs of some of the target's modules (`request`); every verification
forward then records them, and after each step `Verified.hidden` holds those of the tokens each row committed (its
pending tokens, then its accepted drafts), which `extend` appends. A row's features are aligned with its real tokens:
`features[b][j]` is the target's hidden state at real position j, for every committed token but the newest (the target
has not run on that one yet).
"""

from __future__ import annotations

import torch

from ..cache.hidden import HiddenCapture


class TargetFeatures:
    def __init__(self, target, modules, batch_size: int):
        """`target`: the target's RaggedKV; `modules`: the target modules whose outputs (concatenated) are the
        features."""
        self.columns = request(target, modules)
        columns = self.columns
        width = columns.stop - columns.start if isinstance(columns, slice) else len(columns)
        self.features = [torch.zeros(0, width, device=target.device) for _ in range(batch_size)]
        self.fed = [0] * batch_size  # per row: the positions the drafter has fed into its own cache (it counts them)

    def ready(self, seqs) -> bool:
        """Every row has the features of all its tokens but the newest (False before the first target forward)."""
        return all(len(f) >= n - 1 for f, n in zip(self.features, seqs.lengths()))

    def extend(self, verified) -> None:
        if verified.hidden is None:
            return
        hidden = verified.hidden[..., self.columns].float()
        for b, n in enumerate(verified.num_hidden):
            self.features[b] = torch.cat([self.features[b], hidden[b, :n]])

    def select(self, rows: list[int]) -> None:
        self.features = [self.features[b] for b in rows]
        self.fed = [self.fed[b] for b in rows]


def request(target, modules) -> slice | torch.Tensor:
    """Make the target's verification forwards record these modules' outputs; returns their columns in
    `Verified.hidden`, in the order asked (several drafters may ask: their modules are recorded once each)."""
    hidden_size = target.model.config.get_text_config().hidden_size
    capture = target.capture if target.capture is not None else HiddenCapture([])
    for module in modules:
        if not any(module is m for m in capture.modules):
            capture.modules.append(module)
    target.capture = capture
    index = [next(i for i, m in enumerate(capture.modules) if m is module) for module in modules]
    if index == list(range(index[0], index[0] + len(index))):  # contiguous: a view, no copy
        return slice(index[0] * hidden_size, (index[0] + len(index)) * hidden_size)
    return torch.tensor([i * hidden_size + c for i in index for c in range(hidden_size)], device=target.device)


__all__ = ["TargetFeatures", "request"]
