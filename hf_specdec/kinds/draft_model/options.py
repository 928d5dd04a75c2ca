"""The options of a token-only drafter (EAGLE-style drafters add theirs: `kinds/eagle/options.py`), and of the draft
models cut from the target itself (self-speculation, `layers:N`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...kind_options import KindOptions, check_ranges, option, or_none


@dataclass
class TokenOptions(KindOptions):
    drafter_layers: int = option(2, "decoder layers of a new drafter", config="num_hidden_layers")
    drafter_intermediate_size: int = option(0, "its MLP width; 0: the target's", config="intermediate_size",
                                            parse=or_none)
    init_from_target: bool = option(True, "start from the target's first layers (eagle: its last layers) and final "
                                    "norm")

    def check(self):
        super().check()
        check_ranges(self, positive=("drafter_layers",), non_negative=("drafter_intermediate_size",))


@dataclass
class SelfOptions(KindOptions):
    num_layers: int | None = option(None, "the target's first N layers draft (default: half of them)", argument=True)


@dataclass
class LayersOptions(KindOptions):
    num_layers: int | None = option(None, "the target's first N layers make the draft model", argument=True,
                                    required=True)
