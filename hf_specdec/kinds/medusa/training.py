"""Training Medusa heads on the target's final hidden state."""

from __future__ import annotations

import torch

from ...training.adapters import Adapter, unwrap_drafter
from ...training.losses import distill_loss

from .model import MedusaConfig


class MedusaTraining(Adapter):
    """Medusa-1 heads on the target's final hidden state: head i at position j distils the target at j + 1 + i."""

    reads_target_features = reduced_vocabulary = True

    def new(self, args, target, target_name, target_folder, draft_vocab):
        config = MedusaConfig.from_target(target.config, **self.options.config_fields(), target_name_or_path=target_name,
                                          target_quantization=args.target_quantization,
                                          num_draft_tokens_eval=self.options.num_heads, draft_vocab_size=draft_vocab)
        return self.kind.model_class(config)

    def logits(self, model, batch):
        source, teacher = medusa_pairs(batch["positions"], 0)
        return model(batch["features"][source], heads=[0], full_vocab=False)[:, 0], batch["tgt_ids"][teacher]

    def loss(self, model, batch, cols, args):
        generator = torch.Generator().manual_seed(int(batch["input_ids"].sum()))  # the same positions on every process
        losses, weights, head0 = [], [], None
        for i in range(unwrap_drafter(model).config.num_heads):
            source, teacher = medusa_pairs(batch["positions"], i)
            if len(teacher) == 0:
                continue
            keep = torch.randperm(len(teacher), generator=generator)[: self.options.medusa_positions].sort().values
            logits = model(batch["features"][source][keep], heads=[i], full_vocab=False)[:, 0]
            ids, lps = batch["tgt_ids"][teacher][keep], batch["tgt_lps"][teacher][keep]
            losses.append(distill_loss(logits, ids, lps, cols, args.loss) * self.options.medusa_decay**i)
            weights.append(self.options.medusa_decay**i)
            if head0 is None:
                head0 = (logits, ids)
        return sum(losses) / sum(weights), *head0

    @torch.no_grad()
    def measure(self, model, batch, ranks: int = 16) -> dict:
        """head_accuracy[head][rank]: how often head i's r-th likeliest token is the target's top-1 there (held out);
        `MedusaDrafter(heads, tree=N)` builds its N likeliest nodes from it."""
        rows = []
        for i in range(model.config.num_heads):
            source, teacher = medusa_pairs(batch["positions"], i)
            top = model(batch["features"][source].to(model.device), heads=[i])[:, 0].topk(ranks, dim=-1).indices.cpu()
            truth = batch["tgt_ids"][teacher][:, 0]
            rows.append([round(float(x), 5) for x in (top == truth[:, None]).float().mean(0)])
        return {"head_accuracy": rows}


def medusa_pairs(positions: torch.Tensor, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For head i: a [B, L] mask of the source positions j whose hidden state it reads, and the indices (into the
    flattened teacher rows, i.e. True entries of `positions` in row-major order) of the teacher at j + 1 + i."""
    shift = head + 1
    source = torch.zeros_like(positions)
    source[:, :-shift] = positions[:, shift:]
    rank = positions.flatten().cumsum(0).view_as(positions) - 1  # teacher row of each target position
    teacher = rank[:, shift:][positions[:, shift:]]
    return source, teacher
