"""Training the EAGLE-3-style drafter: the token and the states entering three target layers in (fused), one token per
forward, trained with training-time test. The block drafter's training builds on it (`kinds/block/training.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoConfig, DynamicCache

from ...assistants.auto_drafter import AutoDrafter
from ...cache.hidden import entering_layers
from ...errors import InputError
from .model import Eagle3Config

from ...training.adapters import Adapter, unwrap_drafter
from ...training.losses import token_loss
from ...training.target import target_folder


class Eagle3Training(Adapter):
    """EAGLE-3-style: the token and the fused states entering three target layers in; trained with training-time
    test: pass r feeds at each position the drafter's own output of pass r - 1 at the position before, attending to
    the target-fed keys up to r positions back and to its own keys of the passes since, exactly what drafting r tokens
    ahead sees; the passes' losses are weighted decay**r."""

    reads_target_features = reduced_vocabulary = True

    def layer_ids(self, target_config, folder: str | None, target=None) -> list[int] | None:
        """The target layers the drafter reads (None: a folder in another project's layout, which names them, or not,
        in its own way: known once it loads with `target`)."""
        if folder is not None:
            saved = json.loads((Path(folder) / "config.json").read_text())
            if "target_layer_ids" in saved:
                return list(saved["target_layer_ids"])
            return None if target is None else AutoDrafter.from_pretrained(folder, target=target).config.target_layer_ids
        chosen = self.options.value("target_layer_ids")  # None: the target's low, middle and high layers
        return chosen or Eagle3Config.from_target(target_config, draft_vocab_size=1).target_layer_ids

    def check(self, args, folder):
        if folder is not None and self.layer_ids(None, folder) is None:
            return  # (a published layout: its reading refuses another target's layers when it binds)
        try:  # the target's config only (a target that cannot load is refused by its loading, with its own message)
            target_config = AutoConfig.from_pretrained(target_folder(args))
        except (OSError, ValueError):
            return
        ids, count = self.layer_ids(target_config, folder), target_config.get_text_config().num_hidden_layers
        if not all(1 <= i <= count for i in ids):
            raise InputError(f"--target-layer-ids {','.join(map(str, ids))}: an EAGLE-3 drafter reads three target layers, "
                             f"each in 1..{count} (the state entering layer i).")

    def feature_modules(self, target, folder):
        ids = self.layer_ids(target.config, folder, target)
        return entering_layers(target, ids), "layers-" + "-".join(map(str, ids))

    def new(self, args, target, target_name, target_folder, draft_vocab):
        config = Eagle3Config.from_target(
            target.config, draft_vocab_size=draft_vocab, **self.options.config_fields(), target_name_or_path=target_name,
            target_quantization=args.target_quantization, num_draft_tokens_eval=args.num_draft_tokens)
        return self.kind.model_class(config)

    def build(self, args, target, token_counts, eos, *, folder, target_name, target_folder):
        model = super().build(args, target, token_counts, eos, folder=folder, target_name=target_name,
                              target_folder=target_folder)
        if folder is None:  # the LM head starts as the target's rows of the draft vocabulary
            model.set_draft_vocab(model.draft_vocab, target)
        elif model.config.own_embeddings:  # a published layout's copy of the target's embeddings: kept as they are,
            model.embed_tokens.requires_grad_(False)  # as speculators and EAGLE train them (and as ours are borrowed)
        return model

    def logits(self, model, batch):
        return training_time_test_passes(model, batch, steps=1, decay=1.0)[0][0], batch["tgt_ids"]

    def loss(self, model, batch, cols, args):
        passes = 1 if self.step < self.options.ttt_one_pass_steps else self.options.ttt_steps
        all_logits, weights = training_time_test_passes(model, batch, passes, self.options.ttt_decay)
        losses = [w * token_loss(logits, batch, cols, args.loss) for logits, w in zip(all_logits, weights)]
        return sum(losses) / sum(weights), all_logits[0], batch["tgt_ids"]


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
