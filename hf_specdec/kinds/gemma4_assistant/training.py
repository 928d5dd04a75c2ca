"""Fine-tuning a Gemma 4 assistant on its Gemma 4 target's own answers (`training/distill.py --drafter PATH`), kept in
transformers' layout.

The assistant's first draft at every position of a sequence in one forward: at position j it reads the target's
embedding of token j and the target's final state at j - 1, attends to the K/V the target's store layers hold for the
positions before j (a sliding layer's within its window), and distils the target's distribution of token j + 1. The
K/V and states come from one target forward per step (`return_shared_kv_states=True`). The drafts after the first
(fed the assistant's own state) are not trained here.
"""

from __future__ import annotations

import torch

from ...training.adapters import Adapter
from ...training.losses import distill_loss

from ...errors import InputError


class Gemma4AssistantTraining(Adapter):
    """A Gemma 4 assistant (from its folder): its first draft at every position, against the target's answers."""

    def check(self, args, folder):
        if folder is None:
            raise InputError("The trainer fine-tunes an existing Gemma 4 assistant: pass --drafter with its folder.")

    def build(self, args, target, *rest, **kwargs):
        self.target = target  # the states and K/V the assistant reads come from a target forward each step
        return super().build(args, target, *rest, **kwargs)

    def first_draft_logits(self, model, batch):
        """Logits of the assistant's first draft at every position j >= 1 whose next token has teacher targets, and
        those positions' teacher rows."""
        ids, positions = batch["input_ids"], batch["positions"]
        with torch.no_grad():
            out = self.target(ids, output_hidden_states=True, return_shared_kv_states=True, logits_to_keep=1)
            state = out.hidden_states[-1]  # after the final norm
            embeds = self.target.get_input_embeddings()(ids)
        config = model.config.get_text_config()
        length, device, dtype = ids.shape[1], ids.device, next(model.parameters()).dtype
        inputs = torch.cat([embeds[:, 1:], state[:, :-1]], dim=-1).to(dtype)  # position j: token j, state at j - 1
        query = torch.arange(1, length, device=device)[:, None]
        key = torch.arange(length, device=device)[None]
        masks = {}
        for kind, allowed in (("full_attention", key < query),
                              ("sliding_attention", (key < query) & (key >= query - config.sliding_window))):
            masks[kind] = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(
                ~allowed, torch.finfo(dtype).min)[None, None].expand(len(ids), -1, -1, -1)
        kv = {kind: (k.to(dtype), v.to(dtype)) for kind, (k, v) in out.shared_kv_states.items()}
        hidden = model.model(inputs_embeds=model.pre_projection(inputs), attention_mask=masks, use_cache=False,
                             position_ids=query.T.expand(len(ids), -1), shared_kv_states=kv).last_hidden_state
        keep = positions[:, 1:]
        rank = positions.flatten().cumsum(0).view_as(positions) - 1
        hidden = hidden[keep]
        if config_uses_centroids(model):
            logits = model.masked_embedding(hidden, model.lm_head.weight)
        else:
            logits = model.lm_head(hidden)
        return logits, rank[:, 1:][keep]

    def logits(self, model, batch):
        logits, teacher = self.first_draft_logits(model, batch)
        return logits, batch["tgt_ids"][teacher]

    def loss(self, model, batch, cols, args):
        logits, teacher = self.first_draft_logits(model, batch)
        ids = batch["tgt_ids"][teacher]
        return distill_loss(logits, ids, batch["tgt_lps"][teacher], cols, args.loss), logits, ids


def config_uses_centroids(model) -> bool:
    return bool(getattr(model.config, "use_ordered_embeddings", False))


__all__ = ["Gemma4AssistantTraining"]
