"""EAGLE-style drafting: a small drafter that reads the target's own final hidden states.

A token-only drafter must guess what the target "thinks" from text alone. A feature-conditioned drafter
(`SpecDrafterForCausalLM` with `config.target_feature_input`, trained by `training/distill.py --drafter eagle`) gets,
at each position j, the token t_j AND the target's final hidden state f_{j-1} from the previous position, which the
verification forward has already computed (the loop hands it over in `accepted`; no extra target call). While drafting
ahead it has no target features for its own tokens, so it feeds back its own output hidden state.

Its KV cache only ever holds (token, TARGET feature) pairs: the positions it fed with its own features while drafting
are dropped after each step and re-fed next step with the target's real features, for the drafts that were accepted.
At the very first step there are no target features yet, so it proposes nothing and the target decodes one token.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from ...cache.hidden import final_norm
from ...cache.ragged import RaggedKV
from ..draft_model.model import SpecDrafterForCausalLM
from ...drafters.base import Draft, Drafter, Drafting, borrowed_head, check_device, share_of_target
from ...drafters.features import TargetFeatures


class EagleDrafter(Drafter):
    """Drafts k tokens with a feature-conditioned `SpecDrafterForCausalLM`, for one row or a batch."""

    def __init__(self, model):
        if not isinstance(model, SpecDrafterForCausalLM) or not model.config.target_feature_input:
            raise TypeError("EagleDrafter needs a SpecDrafterForCausalLM with config.target_feature_input=True.")
        self.model = model.eval()
        self.default_num_draft_tokens = model.config.num_draft_tokens_eval or 5

    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    def draft_cost(self, target_model):
        return share_of_target(target_model, self.model, *borrowed_head(self.model, target_model))

    def start(self, target, seqs, settings):
        super().start(target, seqs, settings)
        check_device(self.model, target.model, "drafter")
        self.model.bind_target(target.model)
        self.target_features = TargetFeatures(target, self.feature_modules(target.model), seqs.size)
        self.kv = RaggedKV(self.model, DynamicCache(config=self.model.config), seqs.size)

    def feature_modules(self, target) -> list:
        """The target modules whose outputs the drafter reads: the final norm's (the LM head's input)."""
        return [final_norm(target)]

    def input_features(self, features: torch.Tensor) -> torch.Tensor:
        """What the drafter is fed for the target's recorded features (a subclass may fuse several layers' states)."""
        return features

    @property
    def features(self) -> list[torch.Tensor]:
        return self.target_features.features

    def accepted(self, seqs, verified):
        self.target_features.extend(verified)

    def select_rows(self, rows):
        self.kv.select_rows(rows)
        self.target_features.select(rows)

    def catch_up(self, seqs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
        """Each row's tokens not yet in the drafter's cache, right-padded [B, m], with the drafter's input features for
        them (position j reads the target's f_{j-1}), their host validity mask and counts; marks them fed."""
        todo, feats, fed = [], [], self.target_features.fed  # fed: real tokens whose (token, feature) pair is cached
        for b in range(seqs.size):
            row, features = seqs.ids(b), self.features[b]
            shifted = torch.cat([features.new_zeros(1, features.shape[-1]), features])  # position j reads f_{j-1}
            todo.append(row[fed[b] :])
            feats.append(shifted[fed[b] : len(row)])
            fed[b] = len(row)
        counts = [len(t) for t in todo]
        block = torch.nn.utils.rnn.pad_sequence(todo, batch_first=True)
        feat_block = self.input_features(torch.nn.utils.rnn.pad_sequence(feats, batch_first=True))
        valid = torch.arange(block.shape[1])[None] < torch.tensor(counts)[:, None]
        return block, feat_block, valid, counts

    @torch.no_grad()
    def propose(self, seqs, max_tokens):
        batch = seqs.size
        if not self.target_features.ready(seqs):
            return Draft.empty(batch, self.model.device)  # first step: the target has not produced features yet
        # 1. Catch up: feed each row's new tokens with the target's features of the positions before them.
        block, feat_block, valid, counts = self.catch_up(seqs)
        logits = self.kv.forward(block, block.shape[1], valid=valid, target_features=feat_block)
        hidden = self.kv.last_output.hidden_states[0]
        last = torch.tensor([n - 1 for n in counts], device=block.device)
        everyone = torch.arange(batch, device=block.device)

        # 2. Draft ahead, feeding back the drafter's own hidden state as the feature.
        drafting = Drafting(self.settings, seqs, block.device)
        own_slots = [0] * batch
        for i in range(max_tokens):
            if not drafting.step(logits[everyone, last]):
                break
            if i + 1 < max_tokens:
                feature = hidden[everyone, last][:, None]
                logits = self.kv.forward(drafting.token[:, None], 1, valid=drafting.still[:, None],
                                         target_features=feature)
                hidden = self.kv.last_output.hidden_states[0]
                last = last * 0
                own_slots = [n + int(s) for n, s in zip(own_slots, drafting.still.numpy().tolist())]
        # 3. Forget the positions fed with the drafter's own features; accepted ones are re-fed with the target's.
        self.kv.discard_last(own_slots)
        return drafting.draft()
