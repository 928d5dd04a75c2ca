"""Training a DFlash block drafter (transformers' `MuseGlimmerAssistantModel`) on the target's own answers, new or
fine-tuning one from a folder or the Hub; saved in transformers' own layout, so that plain transformers decodes with
it (`generate(assistant_model=..., speculation_type="dflash")`) as hf_specdec does.

One forward trains many blocks, as DFlash is trained: every position of the sequence is context (the target's states
at `target_layer_ids`, projected once), and after each of `--block-anchors` sampled anchor positions j a block
`[t_j, MASK x (block_size - 1)]` at positions j..j + block_size - 1 attends to the context before j and to its own
block; block slot i distils the target's distribution of token j + i, weighted decay**(i - 1).
"""

from __future__ import annotations

import torch
from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantConfig

from ...training.adapters import Adapter, unwrap_drafter
from ...training.target import target_folder
from ...training.losses import distill_loss

from ...errors import InputError
from .drafter import context_modules, embedded
from .options import DFlashOptions


def new_config(target_config, options: DFlashOptions, **fields) -> MuseGlimmerAssistantConfig:
    """A DFlash drafter for this target: its width, heads and RoPE (the drafter attends over the target's positions)."""
    text = target_config.get_text_config()
    count = text.num_hidden_layers
    chosen = options.config_fields()  # the drafter's depth, block, context layers and mask token; the rest the target's
    ids = chosen.pop("target_layer_ids") or sorted({1, count // 2, max(count - 2, 0)})
    if any(not 0 <= i < count for i in ids):
        raise InputError(f"--target-layer-ids {ids}: the target has layers 0..{count - 1}.")
    if chosen["mask_token_id"] is None:
        chosen["mask_token_id"] = text.pad_token_id if text.pad_token_id is not None else text.vocab_size - 1
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    rope = getattr(text, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
    return MuseGlimmerAssistantConfig(
        hidden_size=text.hidden_size, intermediate_size=text.intermediate_size,
        num_attention_heads=text.num_attention_heads, num_key_value_heads=text.num_key_value_heads, head_dim=head_dim,
        rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6), rope_parameters=dict(rope),
        max_position_embeddings=text.max_position_embeddings, target_layer_ids=ids, bos_token_id=text.bos_token_id,
        eos_token_id=text.eos_token_id, pad_token_id=text.pad_token_id, **chosen, **fields)


def block_hidden(model, features, input_ids, anchors, embedding):
    """The drafter's outputs at every block slot: [B, A, block_size, H], for blocks after `anchors` [B, A] (positions
    >= 1 of `input_ids` [B, L]), each reading the context `features` [B, L, H * n] before its anchor, in one forward."""
    config = unwrap_drafter(model).config
    size, (batch, length), count = config.block_size, input_ids.shape, anchors.shape[1]
    device = input_ids.device
    slots = torch.arange(size, device=device)
    block = torch.full((batch, count, size), config.mask_token_id, device=device)
    block[:, :, 0] = input_ids.gather(1, anchors)
    positions = torch.cat([torch.arange(length, device=device).expand(batch, -1),
                           (anchors[:, :, None] + slots).flatten(1)], dim=1)
    # a block sees the context before its anchor, and its own slots (both ways)
    sees_context = torch.arange(length, device=device)[None, None] < anchors.repeat_interleave(size, dim=1)[:, :, None]
    owner = torch.arange(count, device=device).repeat_interleave(size)
    allowed = torch.cat([sees_context, (owner[:, None] == owner[None, :]).expand(batch, -1, -1)], dim=2)
    dtype = next(model.parameters()).dtype
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)[:, None]
    out = model(noise_embeds=embedded(embedding, block.flatten(1)).to(dtype), context_hidden_states=features.to(dtype),
                position_ids=positions, attention_mask={"full_attention": mask, "sliding_attention": mask}, use_cache=False)
    return out.last_hidden_state.view(batch, count, size, -1)


class DFlashTraining(Adapter):
    """A DFlash block drafter (transformers' layout): block slot i after anchor j distils the target at token j + i."""

    reads_target_features = True

    def new(self, args, target, target_name, target_folder, draft_vocab):
        config = new_config(target.config, self.options, target_name_or_path=target_name,
                            target_quantization=args.target_quantization)
        return self.kind.model_class(config)

    def check(self, args, folder):
        if folder is None:
            from transformers import AutoConfig

            try:  # the target's config only (a target that cannot load is refused by its loading, with its own message)
                target_config = AutoConfig.from_pretrained(target_folder(args))
            except (OSError, ValueError):
                return
            new_config(target_config, self.options)  # its layers exist

    def build(self, args, target, *rest, **kwargs):
        self.embedding, self.head = target.get_input_embeddings(), target.get_output_embeddings()  # the drafter's own
        return super().build(args, target, *rest, **kwargs)

    def feature_modules(self, target, folder):
        if folder is not None:
            from transformers import AutoConfig

            ids = AutoConfig.from_pretrained(folder).target_layer_ids
        else:
            ids = new_config(target.config, self.options).target_layer_ids
        return context_modules(target, ids), "dflash-" + "-".join(map(str, ids))

    def block_logits(self, model, batch, anchors):
        """Logits of every block slot 1.. whose token has teacher targets, the slots' numbers, and their teacher rows."""
        positions = batch["positions"]
        hidden = block_hidden(model, batch["features"], batch["input_ids"], anchors, self.embedding)
        size, length = hidden.shape[2], positions.shape[1]
        slot = torch.arange(1, size, device=anchors.device)
        reads = anchors[:, :, None] + slot - 1  # slot i predicts token j + i: the teacher row of position j + i - 1
        keep = (reads < length) & positions.gather(1, reads.clamp_max(length - 1).flatten(1)).view_as(reads)
        rank = positions.flatten().cumsum(0).view_as(positions) - 1
        teacher = rank.gather(1, reads.clamp_max(length - 1).flatten(1)).view_as(reads)[keep]
        logits = self.head(hidden[:, :, 1:][keep])
        return logits, slot.expand_as(keep)[keep], teacher

    def anchors(self, batch, count: int, generator=None):
        """Anchor positions j >= 1 whose next token has teacher targets, `count` per sequence."""
        weights = batch["positions"].float().cpu()
        weights[:, 0] = 0
        weights[weights.sum(1) == 0, 1] = 1  # (a sequence too short to anchor anything: a block nothing is read from)
        return torch.multinomial(weights, count, replacement=True, generator=generator).to(batch["input_ids"].device)

    def logits(self, model, batch):
        logits, slot, teacher = self.block_logits(model, batch, self.anchors(batch, 1, torch.Generator().manual_seed(0)))
        return logits[slot == 1], batch["tgt_ids"][teacher[slot == 1]]

    def loss(self, model, batch, cols, args):
        generator = torch.Generator().manual_seed(int(batch["input_ids"].sum()))  # the same anchors on every process
        logits, slot, teacher = self.block_logits(model, batch, self.anchors(batch, self.options.block_anchors, generator))
        losses, weights = [], []
        for i in slot.unique().tolist():
            chosen, weight = slot == i, self.options.position_decay ** (i - 1)
            rows = teacher[chosen]
            losses.append(weight * distill_loss(logits[chosen], batch["tgt_ids"][rows], batch["tgt_lps"][rows], cols, args.loss))
            weights.append(weight)
        first = slot == 1
        return sum(losses) / sum(weights), logits[first], batch["tgt_ids"][teacher[first]]


__all__ = ["DFlashTraining", "new_config", "block_hidden"]
