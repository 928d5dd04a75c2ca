"""Medusa heads: K small heads on the target's final hidden state; head i predicts the token i + 2 positions ahead.

Each head is its own stack of residual SiLU blocks (`x + SiLU(W x + b)`, W and b zero-initialised, so a new head
starts as the identity and predicts what the target's LM head predicts) followed by an LM head: by default the
TARGET's own, borrowed at run time with `bind_target(target)` and never saved (as `SpecDrafterForCausalLM` does), so
four heads for SmolLM2-135M are a few MB. Unlike the reference implementation, no block is shared between layers or
heads (`[ResBlock] * n` repeats one module).

    heads = MedusaHeads(MedusaConfig.from_target(target.config, num_heads=4))
    target.generate(**inputs, custom_generate=hf_specdec.speculative_generate, assistant=heads)

The decoding loop hands the heads the hidden state its verification forward already computed (no extra target call);
see `drafter.py` beside this file.
"""

from __future__ import annotations


import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import PreTrainedModel

from ...models.borrowed import NOT_BOUND, BorrowedLMHead, BorrowsFromTarget, TargetLink, TargetNotBoundError
from ...models.config import DrafterConfig
from ...models.saving import DrafterSaving

MEDUSA_MODEL_TYPE = "hf_specdec_medusa"


@strict
class MedusaConfig(DrafterConfig):
    r"""num_heads: K (head i predicts the token i + 2 ahead). num_layers: residual blocks per head. share_lm_head: heads
    end in the target's LM head (True) or in their own (False); the target, training and measurements as every drafter
    records them (`DrafterConfig`). head_accuracy[i][r]: how often
    head i's r-th most likely token was the target's, on held-out data (what `MedusaDrafter(heads, tree=N)` builds its
    N-node tree from)."""

    model_type = MEDUSA_MODEL_TYPE

    num_heads: int = 4
    num_layers: int = 1
    hidden_size: int = 576
    vocab_size: int = 49152
    share_lm_head: bool = True
    draft_vocab_size: int | None = 0  # shared head: propose only these many target tokens (FR-Spec; 0 = all)
    num_draft_tokens_eval: int = 4
    head_accuracy: list | None = None

    def __post_init__(self, **kwargs):
        if self.num_heads < 1 or self.num_layers < 0:
            raise ValueError(f"MedusaConfig needs num_heads >= 1 and num_layers >= 0 (got {self.num_heads}, {self.num_layers}).")
        super().__post_init__(**kwargs)

    @classmethod
    def from_target(cls, target_config, **kwargs) -> "MedusaConfig":
        text = target_config.get_text_config()
        return cls(hidden_size=text.hidden_size, vocab_size=text.vocab_size, **kwargs)


class ResBlock(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(DrafterSaving, BorrowsFromTarget, PreTrainedModel):
    config: MedusaConfig
    config_class = MedusaConfig
    base_model_prefix = "medusa"

    def __init__(self, config: MedusaConfig):
        super().__init__(config)
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(config.hidden_size) for _ in range(config.num_layers)]) for _ in range(config.num_heads)
        )
        if config.share_lm_head:
            self.lm_head = BorrowedLMHead(config)
        else:
            self.lm_heads = nn.ModuleList(nn.Linear(config.hidden_size, config.vocab_size, bias=False) for _ in range(config.num_heads))
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module):
        # (transformers visits leaf modules, so the blocks' linears are recognised as the ones with a bias)
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.weight.zero_()  # residual blocks start as the identity: the head predicts what the LM head does
            module.bias.zero_()
        elif isinstance(module, nn.Linear):
            module.weight.normal_(0, 0.02)

    def bind_target(self, target) -> "MedusaHeads":
        """Borrow `target`'s LM head (shared heads) and check the shapes. Idempotent; returns self."""
        text = target.config.get_text_config()
        if text.vocab_size != self.config.vocab_size or text.hidden_size != self.config.hidden_size:
            raise ValueError(
                f"These Medusa heads were trained for a target with hidden size {self.config.hidden_size} and "
                f"{self.config.vocab_size} tokens ({self.config.target_name_or_path!r}), not {text.hidden_size} / "
                f"{text.vocab_size}."
            )
        if self.config.share_lm_head and (self.lm_head.link is None or self.lm_head.link.target is not target):
            if not target.get_output_embeddings().weight.is_floating_point():
                raise ValueError("The target's LM head is quantized; keep it in floating point (bitsandbytes skips it by default).")
            self.lm_head.link = TargetLink(target)
            self.lm_head._rows = None
        return self

    @property
    def draft_vocab(self) -> torch.Tensor | None:
        """Ids of the target tokens the heads may propose (None: all of them)."""
        return self.lm_head.draft_vocab if self.config.share_lm_head else None

    def set_draft_vocab(self, token_ids) -> None:
        ids = torch.as_tensor(token_ids, dtype=torch.long).unique()
        if self.draft_vocab is None or ids.numel() != self.config.draft_vocab_size:
            raise ValueError(f"Expected {self.config.draft_vocab_size} distinct ids, got {ids.numel()}.")
        self.lm_head.draft_vocab.copy_(ids.to(self.lm_head.draft_vocab.device))
        self.lm_head._rows = None

    def forward(self, hidden: torch.Tensor, heads: list[int] | None = None, full_vocab: bool = True) -> torch.Tensor:
        """`hidden` [..., H] (the target's final hidden state) -> logits [..., num_heads, V] (only `heads`, if given;
        with a draft vocabulary and `full_vocab=False`, only its columns, as training uses them)."""
        if self.config.share_lm_head and self.lm_head.link is None:
            raise TargetNotBoundError(NOT_BOUND.replace("SpecDrafterForCausalLM", "MedusaHeads"))
        hidden = hidden.to(self.dtype)
        chosen = range(self.config.num_heads) if heads is None else heads
        if self.config.share_lm_head:
            return torch.stack([self.lm_head(self.heads[i](hidden), full_vocab=full_vocab) for i in chosen], dim=-2)
        return torch.stack([self.lm_heads[i](self.heads[i](hidden)) for i in chosen], dim=-2)


__all__ = ["MedusaConfig", "MedusaHeads", "MEDUSA_MODEL_TYPE"]
