"""The target's own modules, borrowed by drafters at run time (never copied into their state dict, never saved).

`BorrowedEmbedding` stands in for a drafter's input embeddings and `BorrowedLMHead` for its LM head (optionally only the
rows of a reduced draft vocabulary); `bind(model, target)` points them at the target's modules.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel


class TargetNotBoundError(RuntimeError):
    """The drafter was used before `bind_target(target)`: it has no embeddings / LM head of its own."""


NOT_BOUND = (
    "This SpecDrafterForCausalLM has no input embeddings or LM head of its own: it borrows its target's. Call "
    "`drafter.bind_target(target)` first, or pass it as `assistant=` to the target's `generate(..., "
    "custom_generate=hf_specdec.speculative_generate)`, which binds it."
)


class BorrowsFromTarget:
    """A drafter model that borrows modules of its target (embeddings, LM head): `bind_target(target)` before use.
    Loading (`AutoDrafter`), the loop and `custom_generate` bind every such model, asking this class, not its
    attributes."""

    def bind_target(self, target: PreTrainedModel):
        raise NotImplementedError


def bound_target(model) -> PreTrainedModel | None:
    """The target a drafter is bound to (by any of its modules' links), or None."""
    for module in model.modules():
        link = getattr(module, "link", None) or module.__dict__.get("_target")
        if isinstance(link, TargetLink):
            return link.target
    return None


def bind_if_borrowing(model, target: PreTrainedModel):
    """`model`, bound to `target` when it borrows from it."""
    return model.bind_target(target) if isinstance(model, BorrowsFromTarget) else model


class TargetLink:
    """The target's embedding and head modules, held outside the nn.Module tree: not parameters, not in the state
    dict, not moved by `.to()`, not broadcast by DDP, and shared (not duplicated) by `copy.deepcopy`."""

    def __init__(self, target: PreTrainedModel):
        self.target = target
        self.embed = target.get_input_embeddings()
        self.head = target.get_output_embeddings()

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):  # pickling a drafter never pickles its target: it comes back unbound
        return (type(None), ())


class BorrowedEmbedding(nn.Module):
    """Stands in for `embed_tokens`: calls the bound target's own input-embedding module (any scaling included)."""

    def __init__(self):
        super().__init__()
        self.link: TargetLink | None = None

    @property
    def weight(self) -> torch.Tensor:
        if self.link is None:
            raise AttributeError(NOT_BOUND)
        return self.link.embed.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.link is None:
            raise TargetNotBoundError(NOT_BOUND)
        return self.link.embed(input_ids)


class BorrowedLMHead(nn.Module):
    """The target's LM head, restricted to the `draft_vocab` rows when the drafter has a reduced vocabulary.

    The rows are gathered once per binding (a cached, unsaved copy of `draft_vocab_size` rows, 18.9 MB for
    8192 x 576 in fp32) rather than on every call; with the full vocabulary the target's weight is used as is.
    """

    def __init__(self, config):
        super().__init__()
        self.vocab_size = config.vocab_size
        self.link: TargetLink | None = None
        self._rows: tuple | None = None  # (key, weight rows, bias rows)
        if config.draft_vocab_size:
            self.register_buffer("draft_vocab", torch.arange(config.draft_vocab_size, dtype=torch.long))
        else:
            self.draft_vocab = None

    @property
    def weight(self) -> torch.Tensor:
        if self.link is None:
            raise AttributeError(NOT_BOUND)
        return self.link.head.weight

    def _weight_rows(self, dtype: torch.dtype):
        weight, bias = self.link.head.weight, getattr(self.link.head, "bias", None)
        ids = self.draft_vocab
        key = (weight.data_ptr(), weight._version, dtype, None if ids is None else (ids.data_ptr(), ids._version))
        if self._rows is None or self._rows[0] != key:
            with torch.no_grad():
                w = weight.detach() if ids is None else weight.detach().index_select(0, ids.to(weight.device))
                b = None if bias is None else (bias.detach() if ids is None else bias.detach()[ids])
                self._rows = (key, w.to(dtype), None if b is None else b.to(dtype))
        return self._rows[1], self._rows[2]

    def forward(self, hidden: torch.Tensor, full_vocab: bool = True) -> torch.Tensor:
        """Logits `[..., vocab_size]` (-inf outside the draft vocabulary), or `[..., draft_vocab_size]` columns in
        `draft_vocab` order when `full_vocab=False` (what training uses: no 49k-wide tensor)."""
        if self.link is None:
            raise TargetNotBoundError(NOT_BOUND)
        weight, bias = self._weight_rows(hidden.dtype)
        logits = nn.functional.linear(hidden, weight, bias)
        if self.draft_vocab is None or not full_vocab:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.draft_vocab, logits)

    def extra_repr(self) -> str:
        n = "full" if self.draft_vocab is None else len(self.draft_vocab)
        return f"vocab_size={self.vocab_size}, draft_vocab={n}, bound={self.link is not None}"




__all__ = ["TargetNotBoundError", "NOT_BOUND", "TargetLink", "BorrowedEmbedding", "BorrowedLMHead", "bound_target",
           "bind_if_borrowing"]
