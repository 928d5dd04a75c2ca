"""Training token-only drafters (`SpecDrafterForCausalLM`), and any causal LM continued as a drafter. EAGLE-style drafters
(the same model reading the target's hidden states) build on it (`kinds/eagle/training.py`)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from .model import SpecDrafterForCausalLM, drafter_config_from_target

from ...training.adapters import Adapter


class TokenTraining(Adapter):
    """A new `SpecDrafterForCausalLM` that reads tokens only (initialised from the target's first layers)."""

    reduced_vocabulary = True

    def new(self, args, target, target_name, target_folder, draft_vocab):
        o = self.options
        config = drafter_config_from_target(
            target.config, **o.config_fields(), draft_vocab_size=draft_vocab, target_name_or_path=target_name,
            target_quantization=args.target_quantization, num_draft_tokens_eval=args.num_draft_tokens,
            target_feature_input=self.reads_target_features)
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
