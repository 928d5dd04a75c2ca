"""The options of a token-only drafter (EAGLE-style drafters add theirs: `kinds/eagle/options.py`), and of the draft
models cut from the target itself (self-speculation, `layers:N`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...kind_options import KindOptions, check_ranges, option, or_none


@dataclass
class TokenOptions(KindOptions):
    num_hidden_layers: int = option(2, "decoder layers of a new drafter", config=True, was="drafter_layers")
    intermediate_size: int = option(0, "its MLP width; 0: the target's", config=True, parse=or_none,
                                    was="drafter_intermediate_size")
    init_from_target: bool = option(True, "start from the target's first layers (eagle: its last layers) and final "
                                    "norm")

    def check(self):
        super().check()
        check_ranges(self, positive=("num_hidden_layers",), non_negative=("intermediate_size",))


@dataclass
class SelfOptions(KindOptions):
    num_layers: int | None = option(None, "the target's first N layers draft (default: half of them)", argument=True)


@dataclass
class LayersOptions(KindOptions):
    num_layers: int | None = option(None, "the target's first N layers make the draft model", argument=True,
                                    required=True)
