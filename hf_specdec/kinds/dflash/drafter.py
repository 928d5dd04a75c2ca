"""Drafting with a DFlash block drafter (transformers' `MuseGlimmerAssistantModel`) through hf_specdec's loop.

Each step the drafter's cache takes, as context, the target's states (the outputs of its layers
`config.target_layer_ids`, as the verification forward recorded them) of the tokens verified since the last step; in
the same forward the block `[newest token, MASK x (block_size - 1)]` attends to that context and to itself, and the
target's LM head reads the masks' outputs: block_size - 1 positions scored at once. The block leaves the cache right
after, so the cache only ever holds verified context (nothing to roll back). transformers runs this at batch 1 with a
fixed length; here rows are batched (each row's context is as long as what it verified: shorter rows leave holes in
the cache, masked), the draft is as long as the loop asks up to block_size - 1, and it can be a tree of the
positions' top tokens (`:tree`), sampled exactly like any chain.

    drafter = MuseGlimmerAssistantModel.from_pretrained("path/or/hub-id")     # or assistant="path/or/hub-id"
    target.generate(**inputs, custom_generate=hf_specdec.speculative_generate, assistant=drafter)
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import DFlashCache
from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantModel

from ...cache.hidden import decoder_layers, final_norm
from ...cache.ragged import RaggedKV
from ...drafters.base import check_device, share_of_target
from ...drafters.features import TargetFeatures
from ...drafters.positionwise import PositionwiseDrafter
from ...errors import InputError


def context_modules(target, layer_ids) -> list[nn.Module]:
    """The modules whose outputs are transformers' `hidden_states[i + 1]` for each of DFlash's `target_layer_ids`:
    layer i's output (the residual stream), the final norm's for the last layer (transformers puts the normed state
    there)."""
    layers = decoder_layers(target)
    if any(not 0 <= i < len(layers) for i in layer_ids):
        raise InputError(f"This DFlash drafter reads the target's layers {list(layer_ids)}, but the target has "
                         f"{len(layers)} layers: it was trained for another target.")
    return [final_norm(target) if i == len(layers) - 1 else layers[i] for i in layer_ids]


def embedded(embedding: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The target's token embeddings without the norm some embeddings apply after the lookup (DFlash is trained on the
    embeddings before it, as transformers feeds them). Those embeddings are an `nn.Embedding` whose forward norms its
    lookup: the lookup alone is `nn.Embedding.forward` (the module is not touched: calls on other threads share it)."""
    if getattr(embedding, "embed_norm", None) is None:
        return embedding(ids)
    return nn.Embedding.forward(embedding, ids)


class DFlashDrafter(PositionwiseDrafter):
    """Drafts a chain (default) or a tree of a DFlash drafter's block positions, for one row or a batch."""

    what = "A DFlash drafter"

    def __init__(self, model, tree="chain"):
        if not isinstance(model, MuseGlimmerAssistantModel):
            raise TypeError(f"DFlashDrafter needs a MuseGlimmerAssistantModel, got {type(model).__name__}.")
        if model.config.block_size < 2:
            raise InputError(f"A DFlash drafter with block_size={model.config.block_size} drafts nothing; its "
                             "block_size must be at least 2.")
        self.model = model.eval()
        self.block_size = model.config.block_size
        super().__init__(self.block_size - 1, None, tree)

    def vocab_size(self) -> None:
        return None  # the target's own LM head scores the drafts

    def draft_cost(self, target_model):
        return share_of_target(target_model, self.model, target_model.get_output_embeddings()) / (self.block_size - 1)

    def start(self, target, seqs, settings):
        super().start(target, seqs, settings)
        check_device(self.model, target.model, "DFlash drafter")
        hidden = target.model.config.get_text_config().hidden_size
        if hidden != self.model.config.hidden_size:
            raise InputError(f"This DFlash drafter has hidden size {self.model.config.hidden_size} but the target "
                             f"{hidden}: it was trained for another target.")
        self.embedding = target.model.get_input_embeddings()
        self.head = target.model.get_output_embeddings()
        self.target_features = TargetFeatures(target, context_modules(target.model, self.model.config.target_layer_ids),
                                              seqs.size)
        # full-length layers, sliding-window ones too (the window is in their masks): a row's holes are then the same
        # slots in every layer (the target's cache holds as much)
        self.kv = RaggedKV(self.model, DFlashCache(), seqs.size)
        self.masks = torch.full((1, self.block_size - 1), self.model.config.mask_token_id, device=target.device)

    def accepted(self, seqs, verified):
        self.target_features.extend(verified)

    def select_rows(self, rows):
        self.kv.select_rows(rows)
        self.target_features.select(rows)

    def position_logits(self, seqs, k):
        if not self.target_features.ready(seqs):
            return None  # the first step: the target has not run yet
        batch, kv, device = seqs.size, self.kv, self.kv.device
        context, newest, fed = [], [], self.target_features.fed  # fed: verified tokens whose states are cached
        for b in range(batch):
            row = seqs.ids(b)
            context.append(self.target_features.features[b][fed[b] : len(row) - 1])
            newest.append(row[-1])
            fed[b] = len(row) - 1
        counts = [len(c) for c in context]
        width = max(counts)
        if kv.slot_mask is None and min(counts) == width:  # no holes, none made: the positions are one range
            positions = torch.arange(kv.slots, kv.slots + width + self.block_size, device=device)[None].expand(batch, -1)
            kv.append_slots(torch.ones(batch, width, dtype=torch.bool))
        else:
            valid = torch.arange(width)[None] < torch.tensor(counts)[:, None]
            context_positions = kv._positions(valid)
            kv.append_slots(valid)  # the context's slots, holes where a row verified fewer tokens
            block_positions = torch.tensor([len(c) for c in kv.cols])[:, None] + torch.arange(self.block_size)[None]
            positions = torch.cat([context_positions, block_positions], dim=1).to(device)
        mask = None
        if kv.slot_mask is not None:
            mask = torch.cat([kv.slot_mask, kv.slot_mask.new_ones(batch, self.block_size)], dim=1)
        block = torch.cat([torch.stack(newest)[:, None].to(device), self.masks.expand(batch, -1)], dim=1)
        kv.cache.set_previous_accepted_tokens(width)
        out = self.model(noise_embeds=embedded(self.embedding, block).to(self.model.dtype),
                         context_hidden_states=torch.nn.utils.rnn.pad_sequence(context, batch_first=True).to(self.model.dtype),
                         position_ids=positions,
                         attention_mask=mask, cache=kv.cache)
        kv.cache.crop(-self.block_size)  # the block leaves the cache: it keeps verified context only
        return self.head(out.last_hidden_state[:, 1 : 1 + k].to(self.head.weight.dtype))


__all__ = ["DFlashDrafter", "context_modules", "embedded"]
