"""Drafting with a Gemma 4 assistant through hf_specdec's loop.

A Gemma 4 assistant has no KV cache: its layers attend to the K/V that the target's last non-shared layer of each
attention type stores (keys after their norm and RoPE), as cross-attention, from one constant position, that of the
newest token. Each draft step feeds `[target embedding of the token ; a state]`, where the state is the target's final
(normed) hidden state before the newest token for the first draft, then the assistant's own projected output.

transformers (`SinglePositionMultiTokenCandidateGenerator`) runs it at batch 1, drafts greedily even when sampling,
and after a rejection hands the assistant one stale K/V entry (the rejected token's). Here the K/V are read from the
target's own cache after the step's rejected tokens left it (exactly the verified tokens; a batch's holes masked),
drafts are drawn from the distributions reported as q (so sampling stays exact and the drafts follow the sample), rows
are batched, and the draft is as long as the loop asks.

    target = Gemma4ForCausalLM.from_pretrained("google/gemma-4-e2b-it")
    assistant = Gemma4AssistantForCausalLM.from_pretrained("google/gemma-4-e2b-it-assistant")
    target.generate(**inputs, custom_generate=hf_specdec.speculative_generate, assistant=assistant)
"""

from __future__ import annotations

import torch
from transformers.models.gemma4_assistant import Gemma4AssistantForCausalLM
from transformers.models.gemma4_unified_assistant import Gemma4UnifiedAssistantForCausalLM

from ...cache.hidden import decoder_layers, final_norm
from ...drafters.base import Draft, Drafter, Drafting, check_device, share_of_target
from ...drafters.features import TargetFeatures
from ...errors import InputError

ASSISTANTS = (Gemma4AssistantForCausalLM, Gemma4UnifiedAssistantForCausalLM)


def stored_kv_layers(target) -> dict[str, int]:
    """Per attention type, the target layer whose K/V a Gemma 4 assistant reads (the last non-shared one)."""
    stored = {}
    for index, layer in enumerate(decoder_layers(target)):
        attention = getattr(layer, "self_attn", None)
        if getattr(attention, "store_full_length_kv", False):
            stored[attention.layer_type] = index
    return stored


class Gemma4AssistantDrafter(Drafter):
    """Drafts k tokens with a Gemma 4 assistant reading its Gemma 4 target's stored K/V, for one row or a batch."""

    def __init__(self, model):
        if not isinstance(model, ASSISTANTS):
            raise TypeError(f"Gemma4AssistantDrafter needs a Gemma 4 assistant model, got {type(model).__name__}.")
        self.model = model.eval()
        self.default_num_draft_tokens = model.generation_config.num_assistant_tokens or 4

    def vocab_size(self) -> int:
        return self.model.config.get_text_config().vocab_size

    def draft_cost(self, target_model):
        return share_of_target(target_model, self.model)

    def start(self, target, seqs, settings):
        super().start(target, seqs, settings)
        check_device(self.model, target.model, "Gemma 4 assistant")
        self.stored = stored_kv_layers(target.model)
        if set(self.stored) != {"full_attention", "sliding_attention"}:
            raise InputError(f"A Gemma 4 assistant reads the keys and values its Gemma 4 target's layers store; "
                             f"{type(target.model).__name__} stores none: pass it the Gemma 4 model it was made for.")
        width = target.model.config.get_text_config().hidden_size
        if width != self.model.config.backbone_hidden_size:
            raise InputError(f"This Gemma 4 assistant reads states of width {self.model.config.backbone_hidden_size} "
                             f"but the target's are {width}: it was made for another Gemma 4 model.")
        self.target = target
        self.embedding = target.model.get_input_embeddings()
        self.target_features = TargetFeatures(target, [final_norm(target.model)], seqs.size)

    def accepted(self, seqs, verified):
        self.target_features.extend(verified)

    def select_rows(self, rows):
        self.target_features.select(rows)

    @torch.no_grad()
    def propose(self, seqs, max_tokens):
        if not self.target_features.ready(seqs):
            return Draft.empty(seqs.size, self.model.device)  # the first step: the target has not run yet
        device, dtype = self.model.device, self.model.dtype
        lengths = seqs.lengths()
        state = torch.stack([self.target_features.features[b][n - 2] for b, n in enumerate(lengths)])[:, None]
        token = torch.stack([seqs.ids(b)[-1] for b in range(seqs.size)])
        position = torch.tensor(lengths, device=device)[:, None] - 1  # the newest token's, for every draft step
        cache, target = self.target.cache, self.target
        # the cache holds the verified tokens but the newest, in the target's slots (a batch's holes masked)
        kv = {kind: (cache.layers[i].keys, cache.layers[i].values) for kind, i in self.stored.items()}
        mask = target.slot_mask if target.slot_mask is not None else torch.ones(seqs.size, target.slots, dtype=torch.long, device=device)
        drafting = Drafting(self.settings, seqs, device)
        for _ in range(max_tokens):
            inputs = torch.cat([self.embedding(token[:, None]).to(dtype), state.to(dtype)], dim=-1)
            out = self.model(inputs_embeds=inputs, position_ids=position, attention_mask=mask, shared_kv_states=kv)
            if not drafting.step(out.logits[:, -1].float()):
                break
            token, state = drafting.token, out.last_hidden_state
        return drafting.draft()


__all__ = ["Gemma4AssistantDrafter", "stored_kv_layers"]
