"""The options of a DFlash drafter (transformers' `MuseGlimmerAssistantConfig` holds the config fields)."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import InputError
from ...kind_options import TreeOptions, check_ranges, option


def layer_list(text: str) -> list[int] | None:
    """'1,13,25' -> [1, 13, 25]; '': None (the target's layers 1, N/2 and N-2)."""
    layers = text.split(",") if text else []
    if not all(x.strip().isdigit() for x in layers):
        raise InputError(f"must be target layer numbers, e.g. 1,13,25 (got {text!r})")
    return [int(x) for x in layers] or None


@dataclass
class DFlashOptions(TreeOptions):
    block_size: int = option(8, "block positions per drafter forward (the newest token, then block_size - 1 masks: the "
                             "longest draft)", config=True)
    num_hidden_layers: int = option(1, "decoder layers of a new drafter", config=True, was="dflash_layers")
    target_layer_ids: str = option("", "the target layers whose outputs are its context, e.g. '1,13,25'; default: 1, "
                                   "N/2, N-2", config=True, parse=layer_list, was="target_layers")
    mask_token_id: int = option(-1, "the token id of the mask positions; -1: the target's pad token (else its last id)",
                                config=True, parse=lambda value: value if value >= 0 else None)
    block_anchors: int = option(16, "blocks trained per sequence per step")
    position_decay: float = option(0.8, "loss weight of block slot i is decay**(i - 1)")

    def check(self):
        super().check()
        check_ranges(self, positive=("num_hidden_layers", "block_anchors"))
        if self.block_size < 2:
            raise InputError(f"--block-size must be >= 2 (got {self.block_size}): block_size - 1 tokens are drafted.")
