"""What the serving-engine exports share (vLLM, SGLang: engines that know neither hf_specdec's classes nor borrowed
weights): the target's embedding and LM-head matrices, a drafter's shape as the `LlamaConfig` the engines read, and the
tokenizer files copied beside an export. Each kind's layouts are its own `kinds/<kind>/formats.py`."""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "tokenizer.model", "vocab.json", "merges.txt")


def target_head(target) -> torch.Tensor:
    """The target's LM-head matrix, if a bias-free linear layer (what the engines' LM heads are) can express it."""
    head = target.get_output_embeddings()
    if not isinstance(head, nn.Linear) or head.bias is not None:
        bias = " with a bias" if getattr(head, "bias", None) is not None else ""
        raise ValueError(f"{type(target).__name__} has a {type(head).__name__} LM head{bias}; an export needs a "
                         "bias-free nn.Linear head, as Llama-like targets have.")
    if not head.weight.is_floating_point():
        raise ValueError("The target's LM head is quantized: load the target in floating point to export.")
    return head.weight.detach()


def target_weights(target) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's embedding and LM-head matrices, if a plain Llama layout can express them."""
    embed = target.get_input_embeddings()
    if type(embed) is not nn.Embedding:
        raise ValueError(f"{type(target).__name__} has {type(embed).__name__} embeddings; an export needs a plain "
                         "nn.Embedding (no scaling), as Llama-like targets have.")
    return embed.weight.detach(), target_head(target)


def llama_config(drafter, vocab_size: int, **overrides) -> LlamaConfig:
    c = drafter.config
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, hidden_act=c.hidden_act,
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        rope_parameters=c.rope_parameters, attention_bias=c.attention_bias, mlp_bias=c.mlp_bias,
        bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id, **overrides,
    )
    # engines on transformers 4.x read rope_theta / rope_scaling, not transformers 5's rope_parameters
    rope = dict(config.rope_parameters or {})
    config.rope_theta = rope.pop("rope_theta", 10000.0)
    if rope.get("rope_type", "default") != "default":
        config.rope_scaling = rope
    return config


__all__ = ["TOKENIZER_FILES", "target_head", "target_weights", "llama_config"]
