"""EAGLE-1/2 drafters in SafeAILab's layout (`yuhuili/EAGLE-*`; eagle-llm), which is also vLLM's EAGLE-1 layout
(`EagleLlamaForCausalLM`, vllm/model_executor/models/llama_eagle.py), read as feature-conditioned
`SpecDrafterForCausalLM`s and written back (`hf_specdec.formats`).

The layout: a plain Llama config (SafeAILab's `bias` says whether `fc` has one); tensors `fc.weight` [hidden,
2 x hidden] fusing (token embedding ; the target's final, normed state at the position before) in that order,
`layers.{i}.*` with NO input norm on layer 0, no final norm, no LM head (the target's draws the logits, from the
layers' output as it is), and `embed_tokens.weight`. Drafting ahead feeds back the layers' output. The config names
nothing that tells it from a draft model: the tensor names do. SafeAILab's current code reads `rope_theta`
(eagle-llm 1.2.1 ignored it and used 10000; Llama 3 drafters say 500000), so hf_specdec does; `qkv_bias` (biases on
q/k/v only) is refused. Serve an export with `--speculative-config '{"method": "eagle", "model": OUT,
"num_speculative_tokens": 5}'`.
"""

from __future__ import annotations

import warnings

from ...errors import InputError
from ...formats import PublishedFormat
from ...formats.serving import llama_config, target_weights
from ..draft_model.model import SpecDrafterConfig, SpecDrafterForCausalLM, drafter_config_from_target
from ..eagle3.formats import renamed, save


class SafeAILabEagle(PublishedFormat):
    name, kind, project = "vllm-eagle", "eagle", "SafeAILab EAGLE-1/2 / vLLM (EagleLlamaForCausalLM)"

    def recognises(self, checkpoint) -> bool:
        config = checkpoint.config
        if "speculators_model_type" in config or "draft_vocab_size" in config or config.get("model_type") != "llama":
            return False
        if "EagleLlamaForCausalLM" in (config.get("architectures") or []):
            return True
        names = checkpoint.tensor_names()
        return "fc.weight" in names and not any(n.startswith(("model.", "lm_head.", "midlayer.")) for n in names)

    def read(self, checkpoint, target=None):
        from transformers import LlamaConfig

        config, source = checkpoint.config, checkpoint.source
        if config.get("qkv_bias"):
            raise InputError(f"{source}: biases on q/k/v alone (qkv_bias) are not implemented in hf_specdec.")
        # (SafeAILab's attention ignores a head_dim: hidden / heads, LlamaConfig's default)
        layers = LlamaConfig(**{k: v for k, v in config.items() if k not in ("architectures", "head_dim", "bias")})
        state = renamed(checkpoint.tensors(), [("fc.", "model.fuse."), ("layers.", "model.layers."),
                                              ("embed_tokens.", "model.embed_tokens."), ("norm.", "model.norm.")])
        drafter_config = drafter_config_from_target(
            layers, num_hidden_layers=layers.num_hidden_layers, target_feature_input=True,
            fuse_bias="model.fuse.bias" in state, first_input_norm="model.layers.0.input_layernorm.weight" in state,
            final_norm="model.norm.weight" in state, own_embeddings="model.embed_tokens.weight" in state)
        return self.built(SpecDrafterForCausalLM, drafter_config, state, checkpoint)

    def write(self, drafter: SpecDrafterForCausalLM, target, out, dtype) -> None:
        """vLLM's (and SafeAILab's) EAGLE-1 Llama checkpoint; hf_specdec's own drafters have the two norms its graph
        has no place for: those are dropped (with a warning), so vLLM drafts differently from hf_specdec."""
        c: SpecDrafterConfig = drafter.config
        own = drafter.model.state_dict()  # fuse.*, layers.{i}.*, norm.weight, embed_tokens (own)
        dropped = [name for name in ("layers.0.input_layernorm.weight", "norm.weight") if name in own]
        embed = own.get("embed_tokens.weight")
        if embed is None:
            embed, _ = target_weights(target)
        tensors = {**renamed({k: v for k, v in own.items() if k.startswith(("fuse.", "layers."))},
                             [("fuse.", "fc.")]), "embed_tokens.weight": embed}
        for name in dropped:
            tensors.pop(name, None)
        config = llama_config(drafter, embed.shape[0], architectures=["EagleLlamaForCausalLM"], dtype=dtype).to_dict()
        config["bias"] = c.fuse_bias  # (SafeAILab's reading of fc's bias)
        save(out, config, tensors, dtype)
        if dropped:
            warnings.warn(f"vLLM's EAGLE Llama graph has no input norm on layer 0 and no final norm: dropped {dropped}, "
                          "so vLLM drafts differently from hf_specdec (outputs stay exact; acceptance may be lower, "
                          "measure it there).", stacklevel=3)


SAFEAILAB = SafeAILabEagle()

__all__ = ["SAFEAILAB", "SafeAILabEagle"]
