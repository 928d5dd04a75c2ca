"""Training drafters that read the states entering three target layers (EAGLE-3's fused features): the EAGLE-3-style
drafter (one token per forward, training-time test) and the block drafter (a block of tokens per forward)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig, DynamicCache

from hf_specdec.cache.hidden import entering_layers
from hf_specdec.errors import InputError
from hf_specdec.models.block import BlockDrafterConfig
from hf_specdec.models.eagle3 import Eagle3Config

from .adapters import Adapter, check_ranges, unwrap_drafter
from .losses import distill_loss, token_loss
from .target import target_folder


@dataclass
class LayerOptions:
    target_layers: str = field(default="", metadata={"help": "the three target layers whose entering hidden states it fuses, e.g. '2,15,27'; default: 2, N/2, N-3"})
    drafter_intermediate_size: int = field(default=0, metadata={"help": "its MLP width; 0: the target's"})

    def __post_init__(self):
        layers = self.target_layers.split(",") if self.target_layers else []
        if layers and (len(layers) != 3 or not all(x.strip().isdigit() and int(x) >= 1 for x in layers)):
            raise InputError(f"--target-layers must be three target layers, e.g. 2,15,27 (got {self.target_layers!r}).")
        check_ranges(self, non_negative=("drafter_intermediate_size",))


@dataclass
class Eagle3Options(LayerOptions):
    ttt_steps: int = field(default=3, metadata={"help": "training-time-test passes (pass r trains the r-th token drafted ahead, on its own states)"})
    ttt_decay: float = field(default=0.8, metadata={"help": "loss weight of pass r is decay**r"})
    ttt_one_pass_steps: int = field(default=0, metadata={"help": "the first N steps train one pass only (about 3.6x cheaper a step on a CPU, and at equal time the first draft learns faster), then all --ttt-steps"})

    def __post_init__(self):
        super().__post_init__()
        check_ranges(self, positive=("ttt_steps",), non_negative=("ttt_one_pass_steps",))


@dataclass
class BlockOptions(LayerOptions):
    block_size: int = field(default=5, metadata={"help": "tokens one drafter forward proposes (the newest token's position, then block_size - 1 mask positions)"})
    block_anchors: int = field(default=32, metadata={"help": "positions per sequence per step after which a block of mask positions is trained"})
    position_decay: float = field(default=0.8, metadata={"help": "loss weight of block position r is decay**r"})

    def __post_init__(self):
        super().__post_init__()
        check_ranges(self, positive=("block_size", "block_anchors"))


class Eagle3Training(Adapter):
    """EAGLE-3-style: the token and the fused states entering three target layers in; trained with training-time
    test: pass r feeds at each position the drafter's own output of pass r - 1 at the position before, attending to
    the target-fed keys up to r positions back and to its own keys of the passes since, exactly what drafting r tokens
    ahead sees; the passes' losses are weighted decay**r."""

    Options = Eagle3Options
    reads_target_features = reduced_vocabulary = True

    def layer_ids(self, target_config, folder: str | None) -> list[int]:
        if folder is not None:
            return list(json.loads((Path(folder) / "config.json").read_text())["target_layer_ids"])
        if self.options.target_layers:
            return [int(i) for i in self.options.target_layers.split(",")]
        return Eagle3Config.from_target(target_config, draft_vocab_size=1).target_layer_ids

    def check(self, args, folder):
        try:  # the target's config only (a target that cannot load is refused by its loading, with its own message)
            target_config = AutoConfig.from_pretrained(target_folder(args))
        except (OSError, ValueError):
            return
        ids, count = self.layer_ids(target_config, folder), target_config.get_text_config().num_hidden_layers
        if not all(1 <= i <= count for i in ids):
            raise InputError(f"--target-layers {','.join(map(str, ids))}: an EAGLE-3 drafter reads three target layers, "
                             f"each in 1..{count} (the state entering layer i).")

    def feature_modules(self, target, folder):
        ids = self.layer_ids(target.config, folder)
        return entering_layers(target, ids), "layers-" + "-".join(map(str, ids))

    def new(self, args, target, target_name, target_folder, draft_vocab):
        config = Eagle3Config.from_target(
            target.config, draft_vocab_size=draft_vocab, layer_ids=self.layer_ids(target.config, None),
            intermediate_size=self.options.drafter_intermediate_size or None, target_name_or_path=target_name,
            target_quantization=args.target_quantization, num_draft_tokens_eval=args.num_draft_tokens)
        return self.kind.model_class(config)

    def build(self, args, target, token_counts, eos, *, folder, target_name, target_folder):
        model = super().build(args, target, token_counts, eos, folder=folder, target_name=target_name,
                              target_folder=target_folder)
        if folder is None:  # the LM head starts as the target's rows of the draft vocabulary
            model.set_draft_vocab(model.draft_vocab, target)
        return model

    def logits(self, model, batch):
        return training_time_test_passes(model, batch, steps=1, decay=1.0)[0][0], batch["tgt_ids"]

    def loss(self, model, batch, cols, args):
        passes = 1 if self.step < self.options.ttt_one_pass_steps else self.options.ttt_steps
        all_logits, weights = training_time_test_passes(model, batch, passes, self.options.ttt_decay)
        losses = [w * token_loss(logits, batch, cols, args.loss) for logits, w in zip(all_logits, weights)]
        return sum(losses) / sum(weights), all_logits[0], batch["tgt_ids"]


class BlockTraining(Eagle3Training):
    """A block drafter: at every position the token and the fused target state before it, as EAGLE-3 reads them,
    trained to predict the next token there; and after `--block-anchors` sampled positions per sequence, the block's
    mask positions, each trained on the token it proposes in decoding (`BlockDrafterModel.block_inputs`: one forward,
    a 4-D mask). Position r of the block weighs decay**r (`--position-decay`)."""

    Options = BlockOptions

    def new(self, args, target, target_name, target_folder, draft_vocab):
        config = BlockDrafterConfig.from_target(
            target.config, draft_vocab_size=draft_vocab, layer_ids=self.layer_ids(target.config, None),
            intermediate_size=self.options.drafter_intermediate_size or None, block_size=self.options.block_size,
            target_name_or_path=target_name, target_quantization=args.target_quantization,
            num_draft_tokens_eval=args.num_draft_tokens)
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


def shifted_fused(model, batch: dict) -> torch.Tensor:
    """The fused target states, shifted so that position j reads the state at j - 1 (what verified tokens get)."""
    fused = unwrap_drafter(model).fuse(batch["features"])
    return torch.cat([torch.zeros_like(fused[:, :1]), fused[:, :-1]], dim=1)


def training_time_test_passes(model, batch: dict, steps: int, decay: float) -> tuple[list[torch.Tensor], list[float]]:
    """An EAGLE-3 drafter's draft-vocabulary logits at the teacher positions for `steps` training-time-test passes,
    and each pass's loss weight (decay**r).

    Pass 0 feeds at position j the token t_j and the fused target states at j - 1 (what verified tokens get). Pass r
    feeds t_j and the drafter's own pass r - 1 output at j - 1, and position j attends to pass 0's keys at positions
    <= j - r and to pass s's key at position j - r + s (s = 1..r): the context of a token drafted r steps ahead of the
    last verified one. One drafter cache holds every pass's keys; a 4-D mask says which each query sees."""
    inner = unwrap_drafter(model)
    ids, positions = batch["input_ids"], batch["positions"]
    length = ids.shape[1]
    shift = lambda h: torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)  # noqa: E731
    hidden = shift(inner.fuse(batch["features"]))
    cache = DynamicCache(config=inner.config)
    place = torch.arange(length, device=ids.device)[None].expand(ids.shape[0], -1)
    query, key = torch.arange(length, device=ids.device)[:, None], torch.arange(length, device=ids.device)[None]
    all_logits, weights = [], []
    for r in range(steps):
        blocks = [key <= query - r] + [key == query - r + s for s in range(1, r + 1)]  # pass 0's keys, then pass s's
        allowed = torch.cat(blocks, dim=1)
        dtype = inner.fc.weight.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=ids.device).masked_fill(~allowed, torch.finfo(dtype).min)
        out = model(input_ids=ids, target_features=hidden, attention_mask=mask[None, None].expand(ids.shape[0], 1, -1, -1),
                    position_ids=place, cache=cache, use_cache=True, logits_to_keep=positions, full_vocab_logits=False)
        all_logits.append(out.logits)
        weights.append(decay**r)
        hidden = shift(out.hidden_states[0])
    return all_logits, weights
