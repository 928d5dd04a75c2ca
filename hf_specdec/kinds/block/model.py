"""A block drafter: one forward proposes `block_size` tokens, reading the target's fused states as EAGLE-3 does.

An EAGLE-3 drafter pays one drafter forward per draft token; on a CPU (and at batch 1 on a GPU) a small forward costs
about the same for one position as for five, so this drafter proposes the whole block at once, as PARD and DFlash
do. Its layer is the EAGLE-3 layer (`Eagle3DraftModel`: the token and the fused target state before it); after the
newest token it appends `block_size - 1` MASK positions, whose token embedding and state are two learned vectors.
Mask position i (at real position n + i) attends to the verified context and to the masks before it, and predicts
the token i + 1 after the newest one; the newest token's own position predicts the first. Nothing is fed back, so
the block's positions do not see each other's tokens (as heads on the target's state do not), but unlike such heads
they see the newest token and the whole context through attention.

Per position the drafter gives a full distribution: the decoding loop drafts a chain (each position's top token, or
a draw) or a static tree of each position's top candidates, built from the accuracy training measured per position
and rank (`config.position_accuracy`), as every positionwise drafter's trees are (`drafters/positionwise.py`).

    drafter = AutoDrafter.from_pretrained("runs/block", target=target)
    target.generate(**inputs, custom_generate=hf_specdec.speculative_generate, assistant=drafter)
"""

from __future__ import annotations

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..eagle3.model import Eagle3Config, Eagle3DraftModel

MODEL_TYPE = "hf_specdec_block"


@strict
class BlockDrafterConfig(Eagle3Config):
    r"""An `Eagle3Config` plus block_size: the tokens one forward proposes (the newest token's position, then
    block_size - 1 mask positions); position_accuracy[i][r]: how often position i's r-th likeliest token was the
    target's on held-out data (written by training; what `BlockDrafter(model, tree=N)` builds its tree from).
    P-EAGLE's layout (speculators' `peagle`, `formats.py` beside this file): mask_token_id: the mask positions embed
    this token (its row of the drafter's own embeddings) instead of a vector of their own; mask_state_before_fc: their
    state is a target-state vector (n x target hidden), fused by `fc` as real states are."""

    model_type = MODEL_TYPE

    block_size: int = 5
    position_accuracy: list | None = None
    mask_token_id: int | None = None
    mask_state_before_fc: bool = False

    def __post_init__(self, **kwargs):
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1 (got {self.block_size}).")
        super().__post_init__(**kwargs)


class BlockDrafterModel(Eagle3DraftModel):
    """`forward(input_ids, target_features, is_mask=...)`: an EAGLE-3 drafter's forward where `is_mask` [B, L] marks
    the mask positions (their ids and features are ignored)."""

    config: BlockDrafterConfig
    config_class = BlockDrafterConfig
    base_model_prefix = "block"

    def __init__(self, config: BlockDrafterConfig):
        super().__init__(config)
        scale = config.initializer_range
        if config.mask_token_id is None:
            self.mask_embedding = nn.Parameter(torch.randn(config.hidden_size) * scale)
        width = len(config.target_layer_ids) * config.target_hidden_size if config.mask_state_before_fc else config.hidden_size
        self.mask_state = nn.Parameter(torch.randn(width) * scale)

    def mask_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The mask positions' token embedding and (fused) state."""
        if self.config.mask_token_id is None:
            embedding = self.mask_embedding
        else:
            embedding = self.get_input_embeddings()(torch.tensor([self.config.mask_token_id], device=self.fc.weight.device))[0]
        state = self.fuse(self.mask_state) if self.config.mask_state_before_fc else self.mask_state
        return embedding, state

    def forward(self, input_ids, target_features, is_mask: torch.Tensor | None = None, **kwargs) -> CausalLMOutputWithPast:
        if is_mask is None:
            return super().forward(input_ids, target_features, **kwargs)
        embeds = self.get_input_embeddings()(input_ids.masked_fill(is_mask, 0)).to(self.fc.weight.dtype)
        where = is_mask[..., None]
        mask_embedding, mask_state = self.mask_inputs()
        embeds = torch.where(where, mask_embedding.to(embeds.dtype), embeds)
        states = torch.where(where, mask_state.to(embeds.dtype), target_features.to(embeds.dtype))
        return super().forward(input_ids, states, inputs_embeds=embeds, **kwargs)

    def block_inputs(self, input_ids, target_features, anchors: torch.Tensor) -> tuple[dict, torch.Tensor, torch.Tensor]:
        """Training's layout: every position of `input_ids` [B, L] as verified context (`target_features`: the fused
        target state before each), and after each anchor a in `anchors` [B, M] its block's mask positions, each
        seeing exactly what it sees in decoding when a is the newest token (the context up to a, the masks before it).
        Returns the forward's keyword arguments for the L + M (block_size - 1) slots, per slot the position whose
        next token it predicts [B, W] (a real position j: j; mask i of anchor a: a + i), and per slot its offset in
        the block [W] (0 for the real positions, i for mask i)."""
        batch, length = input_ids.shape
        masks = self.config.block_size - 1
        device = input_ids.device
        offsets = torch.arange(1, masks + 1, device=device)
        mask_positions = (anchors[:, :, None] + offsets).flatten(1)  # [B, M * masks]
        position_ids = torch.cat([torch.arange(length, device=device).expand(batch, -1), mask_positions], dim=1)
        real = torch.arange(length, device=device)
        group = torch.arange(anchors.shape[1], device=device).repeat_interleave(masks)
        offset = torch.cat([torch.zeros(length, dtype=torch.long, device=device), offsets.repeat(anchors.shape[1])])
        width = length + len(group)
        allowed = torch.zeros(batch, width, width, dtype=torch.bool, device=device)
        allowed[:, :length, :length] = real[None, :] <= real[:, None]  # the context, causally
        allowed[:, length:, :length] = real[None, None, :] <= anchors.repeat_interleave(masks, dim=1)[:, :, None]
        allowed[:, length:, length:] = (group[None, :] == group[:, None]) & (offset[length:][None, :] <= offset[length:][:, None])
        dtype = self.fc.weight.dtype
        attention = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
        ids = torch.cat([input_ids, input_ids.new_zeros(batch, len(group))], dim=1)
        features = torch.cat([target_features, target_features.new_zeros(batch, len(group), target_features.shape[-1])], dim=1)
        is_mask = (offset > 0)[None].expand(batch, -1)
        kwargs = dict(input_ids=ids, target_features=features, is_mask=is_mask, attention_mask=attention[:, None],
                      position_ids=position_ids, use_cache=False)
        return kwargs, position_ids - is_mask.long(), offset

    def forward_blocks(self, input_ids, target_features, anchors: torch.Tensor, **kwargs) -> tuple[CausalLMOutputWithPast, torch.Tensor]:
        """`block_inputs`' layout through the forward: the output and, per slot, the position it predicts after."""
        inputs, predicts, _ = self.block_inputs(input_ids, target_features, anchors)
        return self(**inputs, **kwargs), predicts

__all__ = ["BlockDrafterConfig", "BlockDrafterModel"]
