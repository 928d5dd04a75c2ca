"""Training token-only and EAGLE-style drafters (`SpecDrafterForCausalLM`), and any causal LM continued as a drafter."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM

from hf_specdec.models.spec_drafter import SpecDrafterForCausalLM, drafter_config_from_target

from .adapters import Adapter, check_ranges
from .losses import token_loss


@dataclass
class TokenOptions:
    drafter_layers: int = field(default=2, metadata={"help": "decoder layers of a new drafter"})
    drafter_intermediate_size: int = field(default=0, metadata={"help": "its MLP width; 0: the target's"})
    init_from_target: bool = field(default=True, metadata={"help": "start from the target's first layers (eagle: its last layers) and final norm"})

    def __post_init__(self):
        check_ranges(self, positive=("drafter_layers",), non_negative=("drafter_intermediate_size",))


@dataclass
class EagleOptions(TokenOptions):
    feature_loss_weight: float = field(default=1.0, metadata={"help": "weight of the smooth-L1 loss between the drafter's and the target's hidden states"})
    unroll_steps: int = field(default=1, metadata={"help": "extra training passes that feed the drafter its own hidden states, as drafting ahead does"})

    def __post_init__(self):
        super().__post_init__()
        check_ranges(self, non_negative=("unroll_steps",))


class TokenTraining(Adapter):
    """A new `SpecDrafterForCausalLM` that reads tokens only (initialised from the target's first layers)."""

    Options = TokenOptions
    reduced_vocabulary = True

    def new(self, args, target, target_name, target_folder, draft_vocab):
        o = self.options
        config = drafter_config_from_target(
            target.config, num_hidden_layers=o.drafter_layers, intermediate_size=o.drafter_intermediate_size or None,
            draft_vocab_size=draft_vocab, target_name_or_path=target_name, target_quantization=args.target_quantization,
            num_draft_tokens_eval=args.num_draft_tokens, target_feature_input=self.reads_target_features)
        drafter = SpecDrafterForCausalLM(config)
        if o.init_from_target:
            init_from_target(drafter, target_folder)
        return drafter

    def logits(self, model, batch):
        out = model(input_ids=batch["input_ids"], logits_to_keep=batch["positions"], use_cache=False, full_vocab_logits=False)
        return out.logits, batch["tgt_ids"]


class CausalLMTraining(Adapter):
    """Any causal LM with the target's vocabulary, continued from its folder (its own vocabulary, nothing borrowed)."""

    def logits(self, model, batch):
        return model(input_ids=batch["input_ids"], use_cache=False).logits[batch["positions"]], batch["tgt_ids"]


class EagleTraining(TokenTraining):
    """EAGLE-style: the token and the target's hidden state before it in; trained to predict the next token and the
    target's next hidden state, also from its own states fed back (`--unroll-steps`), as drafting ahead does."""

    Options = EagleOptions
    reads_target_features = True

    def logits(self, model, batch):
        return eagle_passes(model, batch, unroll_steps=0)[0][0], batch["tgt_ids"]

    def loss(self, model, batch, cols, args):
        all_logits, feature_loss = eagle_passes(model, batch, self.options.unroll_steps)
        tokens = sum(token_loss(logits, batch, cols, args.loss) for logits in all_logits) / len(all_logits)
        return tokens + self.options.feature_loss_weight * feature_loss, all_logits[0], batch["tgt_ids"]


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
