"""A KV cache whose rows advance at different speeds — how batch > 1 works without re-aligning the cache.

Design note. After a verification forward every row has written the same number of new slots, but row b keeps only
its accepted prefix (or, for a tree, its accepted path). Two ways to continue: (a) re-align, i.e. gather each row's kept
slots so rows are contiguous again (a copy of the whole cache per step, O(context) per layer), or (b) keep the slots
where they are and mark rejected ones as holes in the 2-D attention mask, with per-row position ids. We use (b): it
costs no copy, works for every `Cache` class that can crop, and the trailing slots that every row rejected are cropped
away, so for a chain at batch 1 no hole ever remains. Attention in transformers is causal by slot order, and each
row's real tokens stay in increasing slot order, so causality and positions (RoPE or learned) are exact. The price is
attention over holes, which is small next to the MLPs for the short contexts speculative decoding runs on.
Sliding-window attention counts slots, not positions, so holes would shift its window: such targets decode batch 1
and chains only (the loop refuses the rest before any work).

Bookkeeping is split so that no step reads the device to decide what to do: which slots each row holds is kept on the
host (`cols`), the attention mask that mirrors it on the device (`slot_mask`). Validity masks come in as host tensors,
read with `.numpy()` (which refuses a device tensor, so a sync cannot slip in unnoticed). While every row holds every
slot (always, for a chain at batch 1) there is no mask at all (`slot_mask` is None) and positions are one range: a
drafter's one-token forward is dispatch-bound, and the mask's upkeep was a twentieth of it.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer, LinearAttentionCacheLayerMixin

from ..speed.cpu_matmul import verifying
from ..errors import InputError
from ..tree import Tree
from .keyword import cache_keyword


def has_sliding_window(config) -> bool:
    """Whether any attention layer of this (text) config attends over a sliding window."""
    text = config.get_text_config()
    layer_types = getattr(text, "layer_types", None)
    if layer_types:
        return any(t in ("sliding_attention", "chunked_attention") for t in layer_types)
    return getattr(text, "sliding_window", None) is not None and getattr(text, "use_sliding_window", True)


def can_roll_back(cache) -> bool | None:
    """Whether `crop` can put `cache` back as it was: True, False, or None while its linear-attention layers (which
    know only after their first forward whether they hold a recurrent state, or convolution states alone) are empty."""
    layers = getattr(cache, "layers", None) or []
    if any(isinstance(layer, LinearAttentionCacheLayerMixin) and not any(layer.is_conv_states_initialized.values())
           and not any(layer.is_recurrent_states_initialized.values()) for layer in layers):
        return None if all(layer.is_croppable or isinstance(layer, LinearAttentionCacheLayerMixin) for layer in layers) \
            else False
    return bool(cache.is_croppable)


def mixes_slots(cache) -> bool:
    """Whether some layer reads the cache's last slots whatever the attention mask says (a convolution over recent
    tokens): a hole (a rejected slot of one row) or a tree's sibling would enter it."""
    return any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in getattr(cache, "layers", None) or [])


def takes_4d_masks(model) -> bool:
    """Whether the model's attention takes a 4-D additive mask, as tree verification needs (eager, sdpa and flex do;
    flash attention takes padding masks only)."""
    return "flash" not in (getattr(model.config, "_attn_implementation", None) or "eager")


def check_tree_attention(model, what: str, cache=None, chain: str = "draft a chain") -> None:
    """Refuse, before any work, a tree on a target whose attention cannot take the tree's 4-D mask, whose cache has
    layers that read recent slots whatever the mask (a convolution would mix the tree's siblings), or that attends
    over a sliding window. `chain`: how the drafter drafts a chain instead."""
    if cache is not None and mixes_slots(cache):
        raise InputError(f"{what} verifies a tree of candidates in one forward, but {type(model).__name__} has layers "
                         f"(convolutions over recent tokens) that would read a node's siblings as its past: {chain}.")
    if not takes_4d_masks(model):
        raise InputError(f"{what} verifies a tree of candidates in one forward, which needs a 4-D attention mask; "
                         f"attn_implementation={model.config._attn_implementation!r} takes none. Load the target with "
                         f"attn_implementation='sdpa' (or 'eager'), or {chain}.")
    if has_sliding_window(model.config):
        raise InputError(f"{what} verifies a tree of candidates in one forward, which needs full attention in every "
                         f"layer (its 4-D mask would cross {type(model).__name__}'s sliding window): {chain}.")


class RaggedKV:
    """A model plus its cache, fed per-row token blocks with validity masks; rejected slots become holes."""

    def __init__(self, model, cache, batch_size: int, fast_cpu_verify: bool = False, forward=None):
        """`forward`: what to call in the model's place (its compiled forward); None: the model."""
        cache.activate_past_recording()  # so that sliding-window layers can be rolled back past their window
        self.model, self.cache = model, cache
        self.call = model if forward is None else forward
        self.device = model.device
        self.cols: list[list[int]] = [[] for _ in range(batch_size)]  # each row's real slots, in order (host)
        self.num_slots = 0
        self.slot_mask: torch.Tensor | None = None  # [B, slots] on the device, 1 = real; None while there are no holes
        self.fast = fast_cpu_verify and self.device.type == "cpu"
        # (a base model, DFlash's, has no logits to keep)
        self.keep_logits = hasattr(model, "_supports_logits_to_keep") and model._supports_logits_to_keep()
        self.capture = None  # a HiddenCapture a feature drafter asked for (see `cache/hidden.py`)
        self.shares_kv = bool(getattr(model.config.get_text_config(), "num_kv_shared_layers", 0))
        self.last_output = None
        self.check_roll_back = can_roll_back(cache) is None  # known after the first forward (see `can_roll_back`)

    @property
    def slots(self) -> int:
        return self.num_slots

    @property
    def has_holes(self) -> bool:
        return self.slot_mask is not None

    @property
    def last_hidden(self) -> torch.Tensor | None:
        """The captured hidden states of every token the last forward fed, [B, m, H]."""
        return None if self.capture is None else self.capture.hidden

    def _positions(self, valid: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        """Per-row positions of a new block (`valid` [B, m] on the host); padding slots get position 1."""
        base = torch.tensor([len(c) for c in self.cols])[:, None]
        positions = (base + valid.long().cumsum(dim=1) - 1).masked_fill(~valid, 1)
        return positions if extra is None else torch.cat([positions, extra], dim=1)

    def append_slots(self, valid: torch.Tensor) -> None:
        """Record new slots that something else wrote into the cache (a drafter running the target's own layers);
        `valid`: host bools [B, m]."""
        self._append(valid.shape[1], valid)

    def _append(self, width: int, valid: torch.Tensor | None) -> None:
        """Record `width` new slots; `valid`: host bools [B, width] of the real ones (None: every one)."""
        start = self.num_slots
        self.num_slots += width
        real = None if valid is None else valid.numpy()  # a host tensor: .numpy() reads it without a sync
        if real is None or real.all():
            for cols in self.cols:
                cols.extend(range(start, self.num_slots))
            if self.slot_mask is not None:
                ones = torch.ones(len(self.cols), width, dtype=torch.long, device=self.device)
                self.slot_mask = torch.cat([self.slot_mask, ones], dim=1)
            return
        for cols, row in zip(self.cols, real.tolist()):
            cols.extend(start + j for j, kept in enumerate(row) if kept)
        if self.slot_mask is None:
            self.slot_mask = torch.ones(len(self.cols), start, dtype=torch.long, device=self.device)
        self.slot_mask = torch.cat([self.slot_mask, valid.to(self.device, torch.long)], dim=1)

    def forward(self, ids: torch.Tensor, num_logits: int, valid: torch.Tensor | None = None, **extra) -> torch.Tensor:
        """Feed `ids` [B, m] (`valid`: a host bool [B, m] of the real tokens, None = all); return the last
        `num_logits` logits in float32."""
        if valid is not None and valid.numpy().all():
            valid = None
        if valid is None and self.slot_mask is None:  # every row holds every slot: positions are one range
            positions = torch.arange(self.num_slots, self.num_slots + ids.shape[1], device=self.device)[None]
            positions = positions if ids.shape[0] == 1 else positions.expand(ids.shape)
        else:
            positions = self._positions(torch.ones(ids.shape, dtype=torch.bool) if valid is None else valid)
            positions = positions.to(self.device)
        # an empty cache is filled by the model itself: a compiled forward would compile once more for that one call
        call = self.call if self.num_slots else self.model
        self._append(ids.shape[1], valid)
        return self._run(ids, positions, num_logits, self.slot_mask, extra, call)

    def forward_tree(self, pending: torch.Tensor, pending_valid: torch.Tensor, tokens: torch.Tensor, tree: Tree,
                     valid: torch.Tensor | None = None) -> torch.Tensor:
        """Feed each row's uncached tokens `pending` [B, u] and its candidate tree `tokens` [B, T] in ONE forward: node i
        sits at the position after its depth and attends to the row's real past, its pending tokens and its own
        ancestors only (a 4-D additive mask through the model's normal forward). Host bool masks: `pending_valid`
        [B, u], `valid` [B, T] (None = every node). Returns float32 logits [B, T + 1, V]: row 0 after the last pending
        token, row i + 1 after node i."""
        batch, u = pending.shape
        size, device = tree.size, self.device
        valid = torch.ones(batch, size, dtype=torch.bool) if valid is None else valid
        root = torch.tensor([len(c) for c in self.cols])[:, None] + pending_valid.long().sum(dim=1, keepdim=True) - 1
        positions = self._positions(pending_valid, root + torch.tensor(tree.depth)[None]).to(device)
        past = (torch.ones(batch, self.num_slots, dtype=torch.bool, device=device) if self.slot_mask is None
                else self.slot_mask.bool())
        self._append(u + size, torch.cat([pending_valid, valid], dim=1))
        pend, nodes = pending_valid.to(device), valid.to(device)
        # allowed[b, query, key]: real old slots; pending tokens causally; nodes see all pending and their ancestors
        allowed = torch.zeros(batch, u + size, self.slots, dtype=torch.bool, device=device)
        allowed[:, :, : past.shape[1]] = past[:, None, :]
        allowed[:, :u, past.shape[1] : past.shape[1] + u] = torch.ones(u, u, dtype=torch.bool, device=device).tril() & pend[:, None, :]
        allowed[:, u:, past.shape[1] : past.shape[1] + u] = pend[:, None, :]
        allowed[:, u:, past.shape[1] + u :] = tree.tensors(device)["ancestors"][None] & nodes[:, None, :]
        # a padded slot sees itself, so that no attention row is empty (its output is never used)
        diagonal = torch.eye(u + size, dtype=torch.bool, device=device)[None] & ~torch.cat([pend, nodes], dim=1)[:, :, None]
        allowed[:, :, past.shape[1] :] |= diagonal
        dtype = self.model.dtype if self.model.dtype.is_floating_point else torch.float32
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
        return self._run(torch.cat([pending, tokens], dim=1), positions, size + 1, mask[:, None], {})

    def _run(self, ids, positions, num_logits: int, mask, kwargs: dict, call=None) -> torch.Tensor:
        """The model's forward (or `call`) on the cache (keeping `last_output`, and the captured hidden states)."""
        call = self.model if call is None else call
        # (a model whose KV-shared layers run on the kept positions only, Gemma 4's, would then give a feature drafter
        # the states of those positions alone: while it records states, it computes logits for every position)
        if self.keep_logits and not (self.capture is not None and self.shares_kv):
            kwargs["logits_to_keep"] = num_logits
        if mask is not None:
            kwargs["attention_mask"] = mask
        kwargs[cache_keyword(call) or "cache"] = self.cache
        with verifying(self.fast):  # (the loop routes the target's layers for the call: cpu_matmul.routed)
            if self.capture is None:
                out = call(input_ids=ids, position_ids=positions, use_cache=True, **kwargs)
            else:
                with self.capture.recording():
                    out = call(input_ids=ids, position_ids=positions, use_cache=True, **kwargs)
        self.last_output = out
        if self.check_roll_back:
            self.check_roll_back = False
            if not self.cache.is_croppable:  # (nothing was rolled back yet: the caller's model is as it was)
                raise InputError(f"{type(self.model).__name__}'s cache holds a recurrent state after its first forward, "
                                 "which cannot be rolled back to before a rejected draft: use plain generate().")
        return out.logits[:, -num_logits:].float()

    def keep(self, num_new: int, kept: list[list[int]]) -> None:
        """Of the last `num_new` slots, row b keeps the offsets `kept[b]` (its accepted path); the rest become holes
        and the trailing slots no row keeps are cropped. Kept slots that are not already the block's first ones (a
        tree's path) are first moved to the front of the block, where the cache allows it, so that no hole stays."""
        if any(offsets != list(range(len(offsets))) for offsets in kept) and self._compact(num_new, kept):
            kept = [list(range(len(offsets))) for offsets in kept]
        start = self.slots - num_new
        mask = torch.zeros(len(self.cols), num_new, dtype=torch.long)
        for b, offsets in enumerate(kept):
            cols = self.cols[b]
            while cols and cols[-1] >= start:
                cols.pop()
            cols.extend(start + j for j in offsets)
            mask[b, offsets] = 1
        if num_new and self.slot_mask is not None:
            self.slot_mask = torch.cat([self.slot_mask[:, :start], mask.to(self.device)], dim=1)
        self._crop_trailing()

    def _compact(self, num_new: int, kept: list[list[int]]) -> bool:
        """Move each row's kept slots of the last `num_new` to the front of that block, in every layer of a dynamic
        cache (keys already carry their positions, so slot order is all attention needs). False: not possible here."""
        layers = getattr(self.cache, "layers", [])
        if not layers or any(type(layer) is not DynamicLayer or layer.keys is None for layer in layers):
            return False
        order = torch.tensor([offsets + [j for j in range(num_new) if j not in offsets] for offsets in kept],
                             device=self.device)
        for layer in layers:
            for name in ("keys", "values"):
                states = getattr(layer, name)
                block = states[:, :, -num_new:]
                index = order[:, None, :, None].expand(-1, block.shape[1], -1, block.shape[3])
                states[:, :, -num_new:] = block.gather(2, index)
        return True

    def discard_last(self, counts: list[int]) -> None:
        """Turn each row's last `counts[b]` real slots into holes (rejected drafts), then crop trailing holes."""
        dropped = []
        for b, n in enumerate(counts):
            if n:
                dropped += [(b, col) for col in self.cols[b][-n:]]
                del self.cols[b][-n:]
        if dropped and self.slot_mask is not None:
            rows, cols = torch.tensor(dropped).T.to(self.device)
            self.slot_mask = self.slot_mask.index_put((rows, cols), torch.zeros((), dtype=torch.long, device=self.device))
        self._crop_trailing()

    def _crop_trailing(self) -> None:
        """Crop the trailing slots no row holds, then bring the mask in line with `cols`: none while no row has a
        hole, built from `cols` (one transfer) when the first hole appears."""
        used = max((c[-1] + 1 for c in self.cols if c), default=0)
        if self.num_slots:  # (a cache nothing was fed into yet has nothing to crop)
            # crop(0) too: it trims sliding-window layers back to their window once the step is settled
            self.cache.crop(used - self.num_slots)
        self.num_slots = used
        if all(len(c) == used for c in self.cols):
            self.slot_mask = None
        elif self.slot_mask is not None:
            self.slot_mask = self.slot_mask[:, :used]
        else:
            mask = torch.zeros(len(self.cols), used, dtype=torch.long)
            for b, cols in enumerate(self.cols):
                mask[b, cols] = 1
            self.slot_mask = mask.to(self.device)

    def select_rows(self, rows: list[int]) -> None:
        """Keep only these rows (finished rows leave the batch and stop costing work)."""
        index = torch.tensor(rows, device=self.device)
        self.cache.batch_select_indices(index)
        if self.slot_mask is not None:
            self.slot_mask = self.slot_mask[index]
        self.cols = [self.cols[b] for b in rows]
        self._crop_trailing()
