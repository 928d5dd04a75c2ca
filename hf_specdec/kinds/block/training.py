"""Training the block drafter: EAGLE-3's inputs at every position, and after sampled anchors a block of mask
positions trained on the tokens they propose in decoding (one forward, a 4-D mask)."""

from __future__ import annotations

import torch

from ...training.adapters import unwrap_drafter
from ...training.losses import distill_loss

from ..eagle3.training import Eagle3Training, shifted_fused
from .model import BlockDrafterConfig


class BlockTraining(Eagle3Training):
    """A block drafter: at every position the token and the fused target state before it, as EAGLE-3 reads them,
    trained to predict the next token there; and after `--block-anchors` sampled positions per sequence, the block's
    mask positions, each trained on the token it proposes in decoding (`BlockDrafterModel.block_inputs`: one forward,
    a 4-D mask). Position r of the block weighs decay**r (`--position-decay`)."""

    def new(self, args, target, target_name, target_folder, draft_vocab):
        config = BlockDrafterConfig.from_target(
            target.config, draft_vocab_size=draft_vocab, **self.options.config_fields(), target_name_or_path=target_name,
            target_quantization=args.target_quantization, num_draft_tokens_eval=args.num_draft_tokens)
        return self.kind.model_class(config)

    def logits(self, model, batch):
        out = model(input_ids=batch["input_ids"], target_features=shifted_fused(model, batch), use_cache=False,
                    logits_to_keep=batch["positions"], full_vocab_logits=False)
        return out.logits, batch["tgt_ids"]

    def block_logits(self, model, batch: dict, anchors: torch.Tensor):
        """Draft-vocabulary logits of every slot whose predicted token has teacher targets, the slots' block
        offsets, and their teacher rows."""
        positions = batch["positions"]
        inputs, predicts, offset = unwrap_drafter(model).block_inputs(batch["input_ids"], shifted_fused(model, batch), anchors)
        length = positions.shape[1]
        inside = predicts < length
        keep = inside & positions.gather(1, predicts.clamp_max(length - 1))
        rank = positions.flatten().cumsum(0).view_as(positions) - 1  # teacher row of each position
        teacher = rank.gather(1, predicts.clamp_max(length - 1))[keep]
        logits = model(**inputs, logits_to_keep=keep, full_vocab_logits=False).logits
        return logits, offset.expand_as(keep)[keep], teacher

    def loss(self, model, batch, cols, args):
        generator = torch.Generator().manual_seed(int(batch["input_ids"].sum()))  # the same anchors on every process
        anchors = torch.multinomial(batch["positions"].float().cpu(), self.options.block_anchors, replacement=True,
                                    generator=generator).to(batch["input_ids"].device)
        logits, offset, teacher = self.block_logits(model, batch, anchors)
        losses, weights = [], []
        for r in range(unwrap_drafter(model).config.block_size):
            chosen = offset == r
            if chosen.any():
                rows = teacher[chosen]
                losses.append(self.options.position_decay**r * distill_loss(logits[chosen], batch["tgt_ids"][rows], batch["tgt_lps"][rows],
                                                               cols, args.loss))
                weights.append(self.options.position_decay**r)
        first = offset == 0
        return sum(losses) / sum(weights), logits[first], batch["tgt_ids"][teacher[first]]

    @torch.no_grad()
    def measure(self, model, batch, ranks: int = 16, anchors_per_pass: int = 64) -> dict:
        """position_accuracy[i][r]: how often block position i's r-th likeliest token is the target's top-1 there
        (held out, every position an anchor); `BlockDrafter(model, tree=N)` builds its N likeliest nodes from it."""
        batch = {k: v.to(model.device) for k, v in batch.items()}
        size = model.config.block_size
        hits, counts = torch.zeros(size, ranks), torch.zeros(size)
        for b in range(len(batch["input_ids"])):
            row = {k: v[b : b + 1] for k, v in batch.items() if k not in ("tgt_ids", "tgt_lps")}
            before = int(batch["positions"][:b].sum())
            row["tgt_ids"] = batch["tgt_ids"][before : before + int(row["positions"].sum())]
            where = row["positions"][0].nonzero()[:, 0]
            for chunk in where.split(anchors_per_pass):
                logits, offset, teacher = self.block_logits(model, row, chunk[None])
                top = model.draft_vocab[logits.topk(ranks, dim=-1).indices]
                right = (top == row["tgt_ids"][teacher, :1]).float()
                for r in range(size):
                    chosen = offset == r
                    hits[r] += right[chosen].sum(0).cpu()
                    counts[r] += int(chosen.sum())
        return {"position_accuracy": [[round(float(x), 5) for x in hits[r] / max(counts[r], 1)] for r in range(size)]}
