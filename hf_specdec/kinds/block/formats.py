"""P-EAGLE drafters (speculators' `peagle`: RedHatAI's `*-speculator.peagle` repos) read as block drafters.

P-EAGLE is an EAGLE-3 layer run once over a block: the newest token with the target's fused states, then K - 1 mask
positions whose token is `mask_token_id` (a row of the drafter's own embeddings) and whose state is a learned
target-state vector (`mask_hidden`, normed and fused by `fc` as real states are), each attending causally to the
context and the masks before it; position d proposes the (d + 1)-th token. That is hf_specdec's block drafter with
the mask's embedding taken from the token and its state fused (`BlockDrafterConfig.mask_token_id`,
`mask_state_before_fc`); K is the checkpoint's `speculative_tokens`. Everything else is read as speculators' EAGLE-3
(`kinds/eagle3/formats.py`).
"""

from __future__ import annotations

from ...errors import InputError
from ...formats import speculators
from ..eagle3.formats import SpeculatorsEagle3
from .model import BlockDrafterConfig, BlockDrafterModel


class SpeculatorsPEagle(SpeculatorsEagle3):
    name, kind, algorithm = "speculators-peagle", "block", "peagle"
    extra_flags = {"mask_token_id"}
    model_class = BlockDrafterModel
    architecture = "PEagleDraftModel"

    def extra_config(self, config: dict, state: dict) -> dict:
        if config.get("mask_token_id") is None or "mask_hidden" not in state:
            raise InputError("a P-EAGLE checkpoint without its mask_token_id or mask_hidden: speculators would draft "
                             "from random ones.")
        state["mask_state"] = state.pop("mask_hidden").reshape(-1)
        return {"config_class": BlockDrafterConfig, "block_size": speculators.speculative_tokens(config, 8),
                "mask_token_id": int(config["mask_token_id"]), "mask_state_before_fc": True}

    def extra_written(self, model, tensors: dict) -> dict:
        c = model.config
        if c.mask_token_id is None or not c.mask_state_before_fc or "embed_tokens.weight" not in tensors:
            raise InputError("P-EAGLE's layout embeds its mask positions as a token and fuses their state: this block "
                             "drafter has vectors of its own; it has no speculators layout.")
        tensors["mask_hidden"] = tensors.pop("mask_state").reshape(1, 1, -1)
        return {"mask_token_id": c.mask_token_id}


SPECULATORS = SpeculatorsPEagle()

__all__ = ["SPECULATORS", "SpeculatorsPEagle"]
