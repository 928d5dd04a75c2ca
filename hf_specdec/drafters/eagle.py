"""EAGLE-style drafting: a small drafter that reads the target's own final hidden states.

A token-only drafter must guess what the target "thinks" from text alone. A feature-conditioned drafter
(`SpecDrafterForCausalLM` with `config.target_feature_input`, trained by `training/distill.py --drafter eagle`) gets,
at each position j, the token t_j AND the target's final hidden state f_{j-1} from the previous position, which the
verification forward has already computed (the loop hands it over through `observe_target`; no extra target call).
While drafting ahead it has no target features for its own tokens, so it feeds back its own output hidden state.

Its KV cache only ever holds (token, TARGET feature) pairs: the positions it fed with its own features while drafting
are dropped after each step and re-fed next step with the target's real features, for the drafts that were accepted.
At the very first step there are no target features yet, so it proposes nothing and the target decodes one token.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from ..ragged_cache import RaggedKV, final_norm
from .base import Draft, Drafter, next_draft_token
from .features import TargetFeatures


class EagleDrafter(Drafter):
    """Drafts k tokens with a feature-conditioned `SpecDrafterForCausalLM`, for one row or a batch."""

    supports_batch = True
    uses_target_hidden = True

    def __init__(self, model):
        from ..modeling_drafter import SpecDrafterForCausalLM

        if not isinstance(model, SpecDrafterForCausalLM) or not model.config.target_feature_input:
            raise TypeError("EagleDrafter needs a SpecDrafterForCausalLM with config.target_feature_input=True.")
        self.model = model.eval()
        self.default_num_draft_tokens = model.config.num_draft_tokens_eval or 5

    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    def start(self, target, input_ids, generation_config, logits_processor, attention_mask=None):
        super().start(target, input_ids, generation_config, logits_processor)
        if self.model.device != target.device:
            raise ValueError(
                f"The drafter is on {self.model.device} but the target is on {target.device}; "
                f"move it first: `drafter.to({str(target.device)!r})`."
            )
        final_norm(target)  # raises a clear error for targets whose hidden state cannot be read
        self.model.bind_target(target)
        self.do_sample = bool(generation_config.do_sample)
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        self.kv = RaggedKV(self.model, DynamicCache(config=self.model.config), mask[:, :0], fast_cpu_verify=False)
        self.target_features = TargetFeatures(input_ids, attention_mask, self.model.config.hidden_size)
        self.fed = [0] * len(input_ids)  # per row: real tokens whose (token, target feature) pair is in the cache

    @property
    def features(self) -> list[torch.Tensor]:
        return self.target_features.features

    def observe_target(self, hidden, valid):
        self.target_features.observe(hidden, valid)

    def accepted(self, input_ids, num_accepted, lengths=None):
        self.target_features.accept(input_ids, lengths)

    def select_rows(self, rows):
        self.kv.select_rows(rows)
        self.target_features.select(rows)
        self.fed = [self.fed[b] for b in rows.tolist()]

    @torch.no_grad()
    def propose(self, input_ids, max_tokens, lengths=None):
        n_rows = len(input_ids)
        rows = self.target_features.rows(input_ids, lengths)
        if not self.target_features.ready(rows):
            return Draft(input_ids[:, :0])  # first step: the target has not produced features yet
        # 1. Catch up: feed each row's new tokens with the target's features of the positions before them.
        hidden_size = self.model.config.hidden_size
        todo, feats = [], []
        for b, row in enumerate(rows):
            shifted = torch.cat([self.features[b].new_zeros(1, hidden_size), self.features[b]])  # j -> f_{j-1}
            todo.append(row[self.fed[b] :])
            feats.append(shifted[self.fed[b] : len(row)])
            self.fed[b] = len(row)
        width = max(len(t) for t in todo)
        block = torch.stack([torch.nn.functional.pad(t, (0, width - len(t))) for t in todo])
        feat_block = torch.stack([torch.nn.functional.pad(f, (0, 0, 0, width - len(f))) for f in feats])
        valid = torch.arange(width, device=block.device)[None] < torch.tensor([len(t) for t in todo], device=block.device)[:, None]
        logits = self.kv.forward(block, valid, width, target_features=feat_block)
        hidden = self.kv.last_output.hidden_states[0]
        last = valid.long().cumsum(dim=1).argmax(dim=1)
        index = torch.arange(n_rows, device=block.device)

        # 2. Draft ahead, feeding back the drafter's own hidden state as the feature.
        tokens, probs = [], []
        drafting, stopped_early = torch.ones(n_rows, dtype=torch.bool, device=block.device), False
        num_valid = torch.zeros(n_rows, dtype=torch.long, device=block.device)
        own_slots = torch.zeros(n_rows, dtype=torch.long)
        for i in range(max_tokens):
            token, q, drafting = next_draft_token(self, logits[index, last], rows, tokens, drafting, i == 0)
            if not drafting.any():
                stopped_early = True
                break
            tokens.append(token)
            if q is not None:
                probs.append(q)
            num_valid += drafting.long()
            if i + 1 < max_tokens:
                feature = hidden[index, last][:, None]
                logits = self.kv.forward(token[:, None], drafting[:, None], 1, target_features=feature)
                hidden = self.kv.last_output.hidden_states[0]
                last = torch.zeros_like(last)
                own_slots += drafting.long().cpu()
        # 3. Forget the positions fed with the drafter's own features; accepted ones are re-fed with the target's.
        self.kv.discard_last(own_slots)
        if not tokens:
            return Draft(input_ids[:, :0])
        draft_tokens = torch.stack(tokens, dim=1)
        all_valid = bool((num_valid == draft_tokens.shape[1]).all())
        return Draft(draft_tokens, torch.stack(probs, dim=1) if probs else None, None if all_valid else num_valid,
                     stopped_early=stopped_early)
