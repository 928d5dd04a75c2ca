"""Drafting with the target's own multi-token-prediction layer, as hf_specdec drafts with an EAGLE-style drafter.

An MTP layer is an EAGLE-1 drafter trained with the target: at position j it reads the token t_j and the target's
final hidden state (after its final norm) at j - 1, and predicts t_{j+1}. transformers' `use_mtp=True` drafts one
token per MTP layer (one, for DeepSeek-V3 and GLM-4-MoE) at batch 1. Here the first layer is chained as vLLM does: its
own output state stands in for the target's while drafting ahead, so the draft is as long as the loop asks (the
adaptive length decides whether the second token pays), in batches, sampled exactly; and the layer's cache only ever
holds (token, target state) pairs, as in `EagleDrafter`, whose drafting this reuses. Layers after the first, where a
checkpoint has them, are not used.

    hf_specdec.enable(model)                       # a DeepSeek-V3 / GLM-4-MoE checkpoint with its MTP weights
    model.generate(**inputs, assistant="mtp")      # or assistant=MtpModel.from_pretrained(model)
"""

from __future__ import annotations

from torch import nn
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.modeling_layers import MtpModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from ...drafters.base import share_of_target
from ...errors import InputError
from ..eagle.drafter import EagleDrafter

_MASKS = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}


class MtpHead(nn.Module):
    """An `MtpModel`'s first layer with the forward hf_specdec's ragged cache drives (ids, positions, a padding mask
    over the cache's slots, the target's states as `target_features`), returning logits and its output state."""

    def __init__(self, mtp: MtpModel):
        super().__init__()
        layer_types = getattr(mtp.config, "layer_types", None)
        self.layer_type = layer_types[0] if layer_types else "full_attention"
        if self.layer_type not in _MASKS:
            raise InputError(f"This checkpoint's MTP layer uses {self.layer_type!r} attention, which hf_specdec's MTP "
                             "drafter does not run; use generate(use_mtp=True) without hf_specdec.")
        self.mtp, self.config = mtp, mtp.config

    @property
    def device(self):
        return self.mtp.device

    @property
    def dtype(self):
        return self.mtp.dtype

    def bind_target(self, target) -> None:
        """Share the target's embeddings and LM head (an MtpModel is built tied to one target object)."""
        self.mtp.tie_with_main_model(target)

    def forward(self, input_ids, position_ids, target_features, attention_mask=None, cache=None, use_cache=True,
                **kwargs):
        embeds = self.mtp.embed_tokens(input_ids)
        mask = _MASKS[self.layer_type](config=self.config, inputs_embeds=embeds, attention_mask=attention_mask,
                                       cache=cache, position_ids=position_ids)
        rotary = self.mtp.rotary_emb
        position_embeddings = None if rotary is None else rotary(embeds, position_ids=position_ids)
        hidden = self.mtp.layers[0](embeds, target_features.to(embeds.dtype), position_embeddings=position_embeddings,
                                    attention_mask=mask, position_ids=position_ids, cache=cache)
        if self.mtp.use_shared_post_norm:
            hidden = self.mtp.shared_post_norm(hidden)
        return CausalLMOutputWithPast(logits=self.mtp._project_to_logits(hidden), hidden_states=(hidden,))


class MtpDrafter(EagleDrafter):
    """Drafts k tokens with the target's first MTP layer (an `MtpModel`), for one row or a batch."""

    #: one layer predicts one token ahead; chained drafts beyond it are guesses the adaptive length weighs
    default_num_draft_tokens = 2

    def __init__(self, model):
        if isinstance(model, MtpHead):
            model = model.mtp
        if not isinstance(model, MtpModel):
            raise TypeError("MtpDrafter needs transformers' MtpModel (MtpModel.from_pretrained(target)).")
        self.model = MtpHead(model).eval()

    @classmethod
    def for_target(cls, target, options=None) -> "MtpDrafter":
        """`assistant="mtp"`: the MTP layers saved in the target's own checkpoint."""
        if target is None:
            raise InputError("assistant='mtp' drafts with the target's own MTP layers: pass it with a target model.")
        if not getattr(target.config.get_text_config(), "num_mtp_layers", None):
            raise InputError(f"assistant='mtp': {type(target).__name__}'s config has no num_mtp_layers, so its "
                             "checkpoint carries no multi-token-prediction layers (DeepSeek-V3, GLM-4-MoE and other "
                             "families do); pick another assistant (hf-specdec bench --assistant ...).")
        device = next(target.get_decoder().layers[-1].parameters()).device
        return cls(MtpModel.from_pretrained(target, device_map={"": device}).eval())

    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    def draft_cost(self, target_model):
        return share_of_target(target_model, self.model.mtp.layers[0], target_model.get_output_embeddings())

    def start(self, target, seqs, settings):
        super().start(target, seqs, settings)
        # position 0 has no state before it: the layer's first pair is (t_1, h_0), as transformers feeds it
        self.target_features.fed = [1] * seqs.size
