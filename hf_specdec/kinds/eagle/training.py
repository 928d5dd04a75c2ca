"""Training EAGLE-style drafters: a `SpecDrafterForCausalLM` whose input at each position is the token and the target's
final hidden state before it, trained to predict the next token and the target's next state."""

from __future__ import annotations

import torch

from ...training.losses import token_loss

from ..draft_model.training import TokenTraining


class EagleTraining(TokenTraining):
    """EAGLE-style: the token and the target's hidden state before it in; trained to predict the next token and the
    target's next hidden state, also from its own states fed back (`--unroll-steps`), as drafting ahead does."""

    reads_target_features = True

    def logits(self, model, batch):
        return eagle_passes(model, batch, unroll_steps=0)[0][0], batch["tgt_ids"]

    def loss(self, model, batch, cols, args):
        all_logits, feature_loss = eagle_passes(model, batch, self.options.unroll_steps)
        tokens = sum(token_loss(logits, batch, cols, args.loss) for logits in all_logits) / len(all_logits)
        return tokens + self.options.feature_loss_weight * feature_loss, all_logits[0], batch["tgt_ids"]


def eagle_passes(model, batch: dict, unroll_steps: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """An eagle drafter's logits at the target positions for 1 + unroll_steps passes, and its feature loss.

    Pass 0 feeds at position j the token t_j and the TARGET's hidden state f_{j-1} (what the drafter gets for tokens
    the target has verified); pass r feeds the drafter's own output of pass r-1 instead (what it gets for the r-th token
    it drafts ahead). Every pass regresses its output hidden state on f_j (smooth L1)."""
    feats, positions = batch["features"], batch["positions"]
    shift = lambda h: torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)  # noqa: E731
    inputs, all_logits, feature_loss = shift(feats), [], 0.0
    for _ in range(1 + unroll_steps):
        out = model(input_ids=batch["input_ids"], target_features=inputs, logits_to_keep=positions, use_cache=False,
                    full_vocab_logits=False)
        hidden = out.hidden_states[0]
        all_logits.append(out.logits)
        feature_loss = feature_loss + torch.nn.functional.smooth_l1_loss(hidden[positions], feats[positions])
        inputs = shift(hidden)
    return all_logits, feature_loss / (1 + unroll_steps)
