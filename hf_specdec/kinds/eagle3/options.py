"""The options of an EAGLE-3-style drafter (block drafters share its layer options: `kinds/block/options.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import InputError
from ...kind_options import KindOptions, check_ranges, option, or_none


def three_layers(text: str) -> list[int] | None:
    """'2,15,27' -> [2, 15, 27]; '': None (the target's low, middle and high layers)."""
    layers = text.split(",") if text else []
    if layers and (len(layers) != 3 or not all(x.strip().isdigit() and int(x) >= 1 for x in layers)):
        raise InputError(f"must be three target layers, e.g. 2,15,27 (got {text!r})")
    return [int(x) for x in layers] or None


@dataclass
class LayerOptions(KindOptions):
    target_layer_ids: str = option("", "the three target layers whose entering hidden states it fuses, e.g. "
                                   "'2,15,27'; default: 2, N/2, N-3", config=True, parse=three_layers, was="target_layers")
    intermediate_size: int = option(0, "its MLP width; 0: the target's", config=True, parse=or_none,
                                    was="drafter_intermediate_size")

    def check(self):
        super().check()
        check_ranges(self, non_negative=("intermediate_size",))


@dataclass
class Eagle3Options(LayerOptions):
    ttt_steps: int = option(3, "training-time-test passes (pass r trains the r-th token drafted ahead, on its own "
                            "states)")
    ttt_decay: float = option(0.8, "loss weight of pass r is decay**r")
    ttt_one_pass_steps: int = option(0, "the first N steps train one pass only (about 3.6x cheaper a step on a CPU, and "
                                     "at equal time the first draft learns faster), then all --ttt-steps")

    def check(self):
        super().check()
        check_ranges(self, positive=("ttt_steps",), non_negative=("ttt_one_pass_steps",))
