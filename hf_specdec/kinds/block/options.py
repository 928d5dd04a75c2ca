"""The options of a block drafter: EAGLE-3's layers, its block, the shape it drafts, and how its blocks train."""

from __future__ import annotations

from dataclasses import dataclass

from ...kind_options import TreeOptions, check_ranges, option
from ..eagle3.options import LayerOptions


@dataclass
class BlockOptions(LayerOptions, TreeOptions):
    block_size: int = option(5, "tokens one drafter forward proposes (the newest token's position, then block_size - 1 "
                             "mask positions)", config=True)
    block_anchors: int = option(32, "positions per sequence per step after which a block of mask positions is trained")
    position_decay: float = option(0.8, "loss weight of block position r is decay**r")

    def check(self):
        super().check()
        check_ranges(self, positive=("block_size", "block_anchors"))
