"""The options of an EAGLE-style drafter: a token-only drafter's, and how its training feeds it its own states."""

from __future__ import annotations

from dataclasses import dataclass

from ...kind_options import check_ranges, option
from ..draft_model.options import TokenOptions


@dataclass
class EagleOptions(TokenOptions):
    feature_loss_weight: float = option(1.0, "weight of the smooth-L1 loss between the drafter's and the target's "
                                        "hidden states")
    unroll_steps: int = option(1, "extra training passes that feed the drafter its own hidden states, as drafting "
                               "ahead does")

    def check(self):
        super().check()
        check_ranges(self, non_negative=("unroll_steps",))
