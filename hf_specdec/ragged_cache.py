"""A KV cache whose rows advance at different speeds — how batch > 1 works without re-aligning the cache.

Design note. After a verification forward every row has written the same number of new slots, but row b keeps only
its accepted prefix. Two ways to continue: (a) re-align, i.e. gather each row's kept slots so rows are contiguous again
(a copy of the whole cache per step, O(context) per layer), or (b) keep the slots where they are and mark rejected ones
as holes in the 2-D attention mask, with per-row position ids computed from that mask. We use (b): it costs no copy,
works for every `Cache` class that can crop, and the trailing slots that every row rejected are cropped away, so for
batch 1 no hole ever remains. Attention in transformers is causal by slot order, and each row's real tokens stay in
increasing slot order, so causality and positions (RoPE or learned) are exact. The price is attention over holes, which
is small next to the MLPs for the short contexts speculative decoding runs on. Sliding-window attention counts slots,
not positions, so holes would shift its window: such targets are refused for batch > 1.
"""

from __future__ import annotations

import torch
from torch import nn

from .cpu_matmul import small_m_linear


def final_norm(model) -> nn.Module:
    """The module whose output is the target's final hidden state (the LM head's input), for feature drafters."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    for name in ("norm", "ln_f", "final_layernorm", "final_layer_norm"):
        module = getattr(decoder, name, None)
        if isinstance(module, nn.Module):
            return module
    raise ValueError(
        f"{type(model).__name__} exposes no final norm (decoder.norm / ln_f) whose output a feature-conditioned "
        "drafter (EAGLE-style, Medusa) could read; use a token-only drafter with this target."
    )


class RaggedKV:
    """A model plus its cache, fed per-row token blocks with validity masks; rejected slots become holes."""

    def __init__(self, model, cache, slot_mask: torch.Tensor, fast_cpu_verify: bool = True, capture_hidden: bool = False):
        self.model = model
        # feature drafters read the final hidden state of every fed token: a hook on the final norm (no extra compute)
        self.hidden_source = final_norm(model) if capture_hidden else None
        self.last_hidden = None
        self.cache = cache
        self.slot_mask = slot_mask.long()  # [B, S]: 1 = a real token's slot, 0 = left padding or a hole
        self.fast = fast_cpu_verify and model.device.type == "cpu"
        self.keep_logits = model._supports_logits_to_keep()
        self.has_holes = not bool(self.slot_mask.all())

    @property
    def slots(self) -> int:
        return self.slot_mask.shape[1]

    def append_slots(self, valid: torch.Tensor) -> None:
        """Record new slots that something else wrote into the cache (a drafter running the target's layers)."""
        self.slot_mask = torch.cat([self.slot_mask, valid.long()], dim=1)
        self.has_holes = self.has_holes or not bool(valid.all())

    def forward(self, new_ids: torch.Tensor, valid: torch.Tensor, num_logits: int, **extra) -> torch.Tensor:
        """Feed `new_ids` [B, m] (`valid` [B, m] marks real tokens); return the last `num_logits` logits in float32."""
        real_before = self.slot_mask.sum(dim=1, keepdim=True)
        positions = real_before + valid.long().cumsum(dim=1) - 1
        positions = positions.masked_fill(~valid, 1)
        self.slot_mask = torch.cat([self.slot_mask, valid.long()], dim=1)
        self.has_holes = self.has_holes or not bool(valid.all())
        kwargs = dict(extra)
        if self.has_holes:
            kwargs["attention_mask"] = self.slot_mask
        return self._run(new_ids, positions, num_logits, kwargs)

    def _run(self, ids, positions, num_logits: int, kwargs: dict) -> torch.Tensor:
        """The model's forward on the cache (keeping `last_output`, and `last_hidden` [B, m, H] when captured)."""
        if self.keep_logits:
            kwargs["logits_to_keep"] = num_logits
        captured, hook = [], None
        if self.hidden_source is not None:
            hook = self.hidden_source.register_forward_hook(lambda module, args, output: captured.append(output))
        try:
            with small_m_linear(self.fast):
                out = self.model(input_ids=ids, position_ids=positions, cache=self.cache, use_cache=True, **kwargs)
        finally:
            if hook is not None:
                hook.remove()
        self.last_output = out
        self.last_hidden = captured[-1] if captured else None
        return out.logits[:, -num_logits:].float()

    def forward_tree(self, pending: torch.Tensor, pending_valid: torch.Tensor, tree_tokens: torch.Tensor,
                     parents: torch.Tensor) -> torch.Tensor:
        """Feed each row's uncached tokens `pending` [B, u] and a candidate tree (`tree_tokens` [B, T], one shared
        shape `parents` [T]) in ONE forward: node i sits at the position after its depth and attends to the prefix and
        its own ancestors only (a 4-D additive mask through the model's normal forward). Returns float32 logits
        [B, T + 1, V]: row 0 after the last pending token, row i + 1 after node i."""
        from .verification import tree_ancestor_mask, tree_depths

        batch, u = pending.shape
        size = parents.shape[0]
        device = pending.device
        real_before = self.slot_mask.sum(dim=1, keepdim=True)
        pending_pos = (real_before + pending_valid.long().cumsum(dim=1) - 1).masked_fill(~pending_valid, 1)
        last = real_before + pending_valid.long().sum(dim=1, keepdim=True) - 1  # the root: the last pending token
        node_pos = last + tree_depths(parents).to(device)[None]
        past = self.slot_mask.bool()
        self.slot_mask = torch.cat([self.slot_mask, pending_valid.long(), torch.ones(batch, size, dtype=torch.long, device=device)], dim=1)
        self.has_holes = True
        # allowed[b, query, key]: old slots if real; pending causally; nodes see all pending and their ancestors
        causal = torch.ones(u, u, dtype=torch.bool, device=device).tril()
        allowed = torch.zeros(batch, u + size, self.slots, dtype=torch.bool, device=device)
        allowed[:, :, : past.shape[1]] = past[:, None, :]
        allowed[:, :u, past.shape[1] : past.shape[1] + u] = causal[None] & pending_valid[:, None, :]
        allowed[:, u:, past.shape[1] : past.shape[1] + u] = pending_valid[:, None, :]
        allowed[:, u:, past.shape[1] + u :] = tree_ancestor_mask(parents).to(device)[None]
        # a padded pending slot sees itself, so no attention row is empty (no host sync: one masked diagonal)
        allowed[:, :u, past.shape[1] : past.shape[1] + u] |= torch.eye(u, dtype=torch.bool, device=device)[None] & ~pending_valid[:, None, :]
        dtype = self.model.dtype if self.model.dtype.is_floating_point else torch.float32
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
        ids = torch.cat([pending, tree_tokens], dim=1)
        positions = torch.cat([pending_pos, node_pos], dim=1)
        return self._run(ids, positions, size + 1, {"attention_mask": mask[:, None]})

    def keep_tree(self, size: int, keep: torch.Tensor) -> None:
        """Of the last `size` slots (a tree's nodes), row b keeps those with `keep[b]` (its accepted path)."""
        self.slot_mask[:, -size:] *= keep.long()
        used = torch.nonzero(self.slot_mask[:, -size:].any(dim=0)).flatten()
        droppable = size - (int(used[-1]) + 1 if used.numel() else 0)  # trailing node slots no row keeps
        if droppable:
            self.cache.crop(-droppable)
            self.slot_mask = self.slot_mask[:, :-droppable]
        self.has_holes = not bool(self.slot_mask.all())

    def keep(self, num_new: int, num_kept: torch.Tensor) -> None:
        """Of the last `num_new` slots, row b keeps its first `num_kept[b]`; the rest become holes (or are cropped)."""
        if num_new == 0:
            return
        index = torch.arange(num_new, device=num_kept.device)
        kept = (index[None] < num_kept[:, None]).long()
        self.slot_mask[:, -num_new:] *= kept
        droppable = int((num_new - num_kept).min())  # trailing slots no row keeps
        if droppable:
            self.cache.crop(-droppable)
            self.slot_mask = self.slot_mask[:, :-droppable]
        self.has_holes = not bool(self.slot_mask.all())

    def select_rows(self, rows: torch.Tensor) -> None:
        """Drop finished rows so they stop costing work."""
        self.cache.batch_select_indices(rows)
        self.slot_mask = self.slot_mask[rows]
        self.has_holes = not bool(self.slot_mask.all())

    def discard_last(self, counts: torch.Tensor) -> None:
        """Turn each row's last `counts[b]` real slots into holes (rejected drafts), then crop trailing holes."""
        for b in torch.nonzero(counts).flatten().tolist():
            real = torch.nonzero(self.slot_mask[b]).flatten()
            self.slot_mask[b, real[-int(counts[b]) :]] = 0
        real_columns = torch.nonzero(self.slot_mask.any(dim=0)).flatten()
        trailing = self.slots - (int(real_columns[-1]) + 1 if real_columns.numel() else 0)
        if trailing:
            self.cache.crop(-trailing)
            self.slot_mask = self.slot_mask[:, : self.slots - trailing]
        self.has_holes = not bool(self.slot_mask.all())
