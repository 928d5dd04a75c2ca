"""The options of Medusa heads: how many, how deep, the tree they draft, and how they train."""

from __future__ import annotations

from dataclasses import dataclass

from ...kind_options import TREE_HELP, TreeOptions, check_ranges, option, tree_shape


@dataclass
class MedusaOptions(TreeOptions):
    num_heads: int = option(4, "number of heads (head i predicts the token i + 2 ahead)", config=True, was="medusa_heads")
    num_layers: int = option(1, "residual blocks per head", config=True, was="medusa_layers")
    medusa_decay: float = option(0.8, "loss weight of head i is decay**i")
    medusa_positions: int = option(512, "positions per head per step (each needs full-vocabulary logits)")
    tree: str = option("default", TREE_HELP, argument=True, parse=tree_shape)

    def check(self):
        super().check()
        check_ranges(self, positive=("num_heads", "num_layers", "medusa_positions"))
