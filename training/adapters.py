"""How each drafter kind trains: one adapter per kind, named by the kind's registration in `hf_specdec.kinds`.

`distill.py` never names a kind. It asks `adapter_for(args.drafter)` (a kind's name for a new drafter, or a folder
holding one to continue from) and then uses only this interface:

    adapter.reads_target_features      the batches must carry the target's hidden states (`batch["features"]`)
    adapter.build(args, target, ...)   a new drafter (or the folder's), on the target's device, bound to it
    adapter.logits(model, batch)       teacher-forced drafter logits at the teacher positions, and those positions' teacher ids
    adapter.loss(model, batch, cols, args) -> (loss, logits, teacher ids)
    adapter.measure(model, batch)      extra held-out measurements saved in the best drafter's config

A batch (`distill.collate`) holds `input_ids` [B, L] (right-padded), `positions` [B, L] (True where the next token has
teacher targets), `tgt_ids`/`tgt_lps` [N, K] (the target's top-K ids and log-probs at those N positions, row-major),
and for feature kinds `features` [B, L, H] (the target's final hidden state at every position).

A new kind registers `training="my_package.train:MyAdapter"` and subclasses `Adapter` there.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from hf_specdec.cache.hidden import entering_layers, final_norm
from hf_specdec.errors import InputError
from hf_specdec.kinds import DrafterKind, drafter_kinds, kind_of
from hf_specdec.models.block import BlockDrafterConfig
from hf_specdec.models.eagle3 import Eagle3Config
from hf_specdec.models.medusa import MedusaConfig
from hf_specdec.models.spec_drafter import SpecDrafterForCausalLM, drafter_config_from_target

from .losses import distill_loss, token_loss
from .target import target_folder

ALIASES = {"new": "draft-model"}  # the trainer's historical name for a new token-only drafter


def trainable_kinds() -> dict[str, DrafterKind]:
    return {kind.name: kind for kind in drafter_kinds() if kind.training}


def adapter_for(drafter: str) -> tuple["Adapter", str | None]:
    """The adapter for `--drafter`, and the folder to continue from (None: a new drafter of that kind)."""
    kinds = trainable_kinds()
    name = ALIASES.get(drafter, drafter)
    new_kinds = [k for k, kind in kinds.items() if kind.config_class is not None]
    if name in new_kinds:
        return load_adapter(kinds[name]), None
    config_file = Path(drafter) / "config.json"
    if not config_file.is_file():
        raise InputError(f"--drafter {drafter!r} is neither a kind of drafter to train ({', '.join(['new'] + new_kinds)}) "
                         "nor a folder holding a drafter (config.json) to continue from.")
    kind = kind_of(json.loads(config_file.read_text()))
    if kind is None or not kind.training:
        raise InputError(f"--drafter {drafter}: its config.json is not a drafter kind the trainer knows "
                         f"({', '.join(kinds)}).")
    return load_adapter(kind), drafter


def load_adapter(kind: DrafterKind) -> "Adapter":
    module, _, attribute = kind.training.partition(":")
    return getattr(importlib.import_module(module), attribute)(kind)


def unwrap_drafter(model):
    """The drafter module speculative decoding can use (LoRA layers active), from DDP / peft wrappers."""
    model = getattr(model, "module", model)  # DDP
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def choose_draft_vocab(counts: torch.Tensor, size: int, always: list[int]) -> torch.Tensor:
    """FR-Spec: the `size` target tokens the teacher predicts most often (EOS always included; ties by id)."""
    counts = counts.clone().double()
    counts[torch.tensor(always, dtype=torch.long)] = float("inf")
    order = torch.sort(-counts, stable=True).indices  # most frequent first, ties by id
    return order[:size].sort().values


class Adapter:
    reads_target_features = False

    def __init__(self, kind: DrafterKind):
        self.kind = kind

    def build(self, args, target, token_counts: torch.Tensor | None, eos: list[int], *, folder: str | None,
              target_name: str, target_folder: str):
        """The drafter to train: `folder`'s (re-bound to this target), or a new one. On the target's device."""
        if folder is not None:
            model = self.kind.model_class.from_pretrained(folder, dtype=torch.float32)
            if hasattr(model.config, "target_name_or_path"):
                model.config.target_name_or_path = target_name
                model.config.target_quantization = args.target_quantization
        else:
            vocab = target.config.get_text_config().vocab_size
            size = args.draft_vocab_size if args.draft_vocab_size < vocab else 0
            model = self.new(args, target, target_name, target_folder, size)
            if size and hasattr(model, "set_draft_vocab"):  # FR-Spec: the kind drafts over a reduced vocabulary
                model.set_draft_vocab(choose_draft_vocab(token_counts, size, eos))
        model.to(target.device)
        return model.bind_target(target) if hasattr(model, "bind_target") else model

    def new(self, args, target, target_name: str, target_folder: str, draft_vocab: int):
        """A new drafter of this kind (`draft_vocab`: the reduced vocabulary's size, 0 for the full one)."""
        raise NotImplementedError(f"the trainer cannot make a new {self.kind.name} drafter; pass a folder holding one")

    def logits(self, model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def loss(self, model, batch: dict, cols, args) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits, teacher = self.logits(model, batch)
        return token_loss(logits, batch, cols, args.loss), logits, teacher

    def measure(self, model, batch: dict) -> dict:
        return {}

    def check(self, args, folder: str | None) -> None:
        """Refuse (an `InputError`) arguments this kind cannot use with the target, before any model loads."""

    def feature_modules(self, target, args, folder: str | None) -> tuple[list, str]:
        """The target modules whose outputs the batches carry as `features` (feature kinds), and a name for them:
        the final norm's output (the LM head's input)."""
        return [final_norm(target)], "final"


class TokenDrafter(Adapter):
    """A drafter that reads tokens only: a new `SpecDrafterForCausalLM` (initialised from the target's first layers),
    or any causal LM with the target's vocabulary."""

    def new(self, args, target, target_name, target_folder, draft_vocab):
        config = drafter_config_from_target(
            target.config, num_hidden_layers=args.drafter_layers, intermediate_size=args.drafter_intermediate_size or None,
            draft_vocab_size=draft_vocab, target_name_or_path=target_name, target_quantization=args.target_quantization,
            num_draft_tokens_eval=args.num_draft_tokens, target_feature_input=self.reads_target_features)
        drafter = SpecDrafterForCausalLM(config)
        if args.init_from_target:
            init_from_target(drafter, target_folder)
        return drafter

    def logits(self, model, batch):
        if isinstance(unwrap_drafter(model), SpecDrafterForCausalLM):
            out = model(input_ids=batch["input_ids"], logits_to_keep=batch["positions"], use_cache=False, full_vocab_logits=False)
            return out.logits, batch["tgt_ids"]
        return model(input_ids=batch["input_ids"], use_cache=False).logits[batch["positions"]], batch["tgt_ids"]


class EagleDrafter(TokenDrafter):
    """EAGLE-style: the token and the target's hidden state before it in; trained to predict the next token and the
    target's next hidden state, also from its own states fed back (`--unroll-steps`), as drafting ahead does."""

    reads_target_features = True

    def logits(self, model, batch):
        return eagle_passes(model, batch, unroll_steps=0)[0][0], batch["tgt_ids"]

    def loss(self, model, batch, cols, args):
        all_logits, feature_loss = eagle_passes(model, batch, args.unroll_steps)
        tokens = sum(token_loss(logits, batch, cols, args.loss) for logits in all_logits) / len(all_logits)
        return tokens + args.feature_loss_weight * feature_loss, all_logits[0], batch["tgt_ids"]


class MedusaHeads(Adapter):
    """Medusa-1 heads on the target's final hidden state: head i at position j distils the target at j + 1 + i."""

    reads_target_features = True

    def new(self, args, target, target_name, target_folder, draft_vocab):
        config = MedusaConfig.from_target(target.config, num_heads=args.medusa_heads, num_layers=args.medusa_layers,
                                          target_name_or_path=target_name, target_quantization=args.target_quantization,
                                          num_draft_tokens_eval=args.medusa_heads, draft_vocab_size=draft_vocab)
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
            keep = torch.randperm(len(teacher), generator=generator)[: args.medusa_positions].sort().values
            logits = model(batch["features"][source][keep], heads=[i], full_vocab=False)[:, 0]
            ids, lps = batch["tgt_ids"][teacher][keep], batch["tgt_lps"][teacher][keep]
            losses.append(distill_loss(logits, ids, lps, cols, args.loss) * args.medusa_decay**i)
            weights.append(args.medusa_decay**i)
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


class Eagle3(Adapter):
    """EAGLE-3-style: the token and the fused states entering three target layers in; trained with training-time
    test: pass r feeds at each position the drafter's own output of pass r - 1 at the position before, attending to
    the target-fed keys up to r positions back and to its own keys of the passes since, exactly what drafting r tokens
    ahead sees; the passes' losses are weighted decay**r."""

    reads_target_features = True

    def layer_ids(self, target_config, args, folder: str | None) -> list[int]:
        if folder is not None:
            return list(json.loads((Path(folder) / "config.json").read_text())["target_layer_ids"])
        if args.target_layers:
            return [int(i) for i in args.target_layers.split(",")]
        return Eagle3Config.from_target(target_config, draft_vocab_size=1).target_layer_ids

    def check(self, args, folder):
        try:  # the target's config only (a target that cannot load is refused by its loading, with its own message)
            target_config = AutoConfig.from_pretrained(target_folder(args))
        except (OSError, ValueError):
            return
        ids, count = self.layer_ids(target_config, args, folder), target_config.get_text_config().num_hidden_layers
        if not all(1 <= i <= count for i in ids):
            raise InputError(f"--target-layers {','.join(map(str, ids))}: an EAGLE-3 drafter reads three target layers, "
                             f"each in 1..{count} (the state entering layer i).")

    def feature_modules(self, target, args, folder):
        ids = self.layer_ids(target.config, args, folder)
        return entering_layers(target, ids), "layers-" + "-".join(map(str, ids))

    def new(self, args, target, target_name, target_folder, draft_vocab):
        config = Eagle3Config.from_target(
            target.config, draft_vocab_size=draft_vocab, layer_ids=self.layer_ids(target.config, args, None),
            intermediate_size=args.drafter_intermediate_size or None, target_name_or_path=target_name,
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
        all_logits, weights = training_time_test_passes(model, batch, args.ttt_steps, args.ttt_decay)
        losses = [w * token_loss(logits, batch, cols, args.loss) for logits, w in zip(all_logits, weights)]
        return sum(losses) / sum(weights), all_logits[0], batch["tgt_ids"]


class Block(Eagle3):
    """A block drafter: at every position the token and the fused target state before it, as EAGLE-3 reads them,
    trained to predict the next token there; and after `--block-anchors` sampled positions per sequence, the block's
    mask positions, each trained on the token it proposes in decoding (`BlockDrafterModel.block_inputs`: one forward,
    a 4-D mask). Position r of the block weighs decay**r (`--ttt-decay`)."""

    def new(self, args, target, target_name, target_folder, draft_vocab):
        config = BlockDrafterConfig.from_target(
            target.config, draft_vocab_size=draft_vocab, layer_ids=self.layer_ids(target.config, args, None),
            intermediate_size=args.drafter_intermediate_size or None, block_size=args.block_size,
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
        anchors = torch.multinomial(batch["positions"].float().cpu(), args.block_anchors, replacement=True,
                                    generator=generator).to(batch["input_ids"].device)
        logits, offset, teacher = self.block_logits(model, batch, anchors)
        losses, weights = [], []
        for r in range(unwrap_drafter(model).config.block_size):
            chosen = offset == r
            if chosen.any():
                rows = teacher[chosen]
                losses.append(args.ttt_decay**r * distill_loss(logits[chosen], batch["tgt_ids"][rows], batch["tgt_lps"][rows],
                                                               cols, args.loss))
                weights.append(args.ttt_decay**r)
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


def init_from_target(drafter: SpecDrafterForCausalLM, target_folder: str) -> None:
    """Copy the fp32 target's first layers and final norm into the drafter wherever names and shapes match.

    An eagle drafter continues from the target's final hidden state, so it starts from the target's LAST layers."""
    source = AutoModelForCausalLM.from_pretrained(target_folder, dtype=torch.float32)  # never the quantized copy
    src = source.state_dict()
    if drafter.config.target_feature_input:
        n_src, n = source.config.get_text_config().num_hidden_layers, drafter.config.num_hidden_layers
        for i in range(n):
            prefix, src_prefix = f"model.layers.{i}.", f"model.layers.{n_src - n + i}."
            for key in [k for k in src if k.startswith(src_prefix)]:
                src[prefix + key[len(src_prefix):]] = src[key]
    copied = 0
    with torch.no_grad():
        for name, param in drafter.state_dict().items():
            src_name = name if name in src else None
            if src_name is None and name.startswith("model.") and "model." + name[6:] in src:
                src_name = "model." + name[6:]
            if src_name is not None and src[src_name].shape == param.shape and param.is_floating_point():
                param.copy_(src[src_name])
                copied += 1
    del source, src
    print(f"[distill] initialised {copied} drafter tensors from the target's first layers and final norm", flush=True)


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


def medusa_pairs(positions: torch.Tensor, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For head i: a [B, L] mask of the source positions j whose hidden state it reads, and the indices (into the
    flattened teacher rows, i.e. True entries of `positions` in row-major order) of the teacher at j + 1 + i."""
    shift = head + 1
    source = torch.zeros_like(positions)
    source[:, :-shift] = positions[:, shift:]
    rank = positions.flatten().cumsum(0).view_as(positions) - 1  # teacher row of each target position
    teacher = rank[:, shift:][positions[:, shift:]]
    return source, teacher
