"""`export_drafter`: write a drafter in the layout a serving engine loads, by its kind's registered exporter.

    hf-specdec export runs/drafter --format vllm-draft --target default --out runs/drafter-vllm

Each kind's exporter (`hf_specdec/kinds/<kind>/export.py`) writes its layout and says how to serve it; they share the
target's weights and a Llama config as the engines read them (below).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig

from .auto_drafter import AutoDrafter
from .kinds import export_formats, kind_of
from .registry import resolved as exporter
from .shipped import shipped_folder
from .errors import InputError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "tokenizer.model", "vocab.json", "merges.txt")


def check_exportable(drafter_path, format: str, config=None) -> None:
    """Raise `InputError` (naming the fix) when `format` is unknown or cannot hold the drafter's kind; reads only
    config.json (a local folder or shipped drafter; a Hub id is checked when it loads)."""
    formats = export_formats()
    if format not in formats:
        raise InputError(f"Unknown export format {format!r}; choose one of {sorted(formats)}.")
    if config is None:
        folder = Path(drafter_path) if Path(drafter_path).exists() else shipped_folder(str(drafter_path))
        if folder is None:
            return
        if not (Path(folder) / "config.json").is_file():
            raise InputError(f"{drafter_path} holds no config.json: pass a drafter folder (written by save_pretrained or "
                             "training.distill), a shipped drafter's name or a Hub id.")
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    kind = kind_of(config)
    if kind is None:
        raise InputError(f"{drafter_path} is not a drafter of any kind hf_specdec knows; pass a drafter folder.")
    if not kind.exporters:
        raise InputError(f"{drafter_path} is already a standalone model ({kind.description}): serve the folder as it is.")
    if format not in kind.exporters:
        right = ", ".join(f"--format {name}" for name in kind.exporters)
        raise InputError(f"{drafter_path} is {kind.description}, which {format} cannot hold: export it with {right}.")


def export_drafter(drafter_path, target, out, format: str) -> Path:
    """Write the drafter at `drafter_path` (folder, Hub id or shipped name) for a serving engine into `out`."""
    check_exportable(drafter_path, format)
    drafter = AutoDrafter.from_pretrained(drafter_path, target=target, dtype=torch.float32)
    check_exportable(drafter_path, format, config=drafter.config)
    kind = kind_of(drafter.config)
    out = Path(out)
    dtype = getattr(torch, getattr(drafter.config, "save_dtype", None) or "float32")
    exporter(kind.exporters[format])(drafter, target, out, dtype)
    for name in TOKENIZER_FILES:  # engines load the draft's tokenizer from its folder when given one
        if Path(drafter_path, name).is_file():
            shutil.copy2(Path(drafter_path, name), out / name)
    return out


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


__all__ = ["export_drafter", "check_exportable", "exporter", "target_head", "target_weights", "llama_config",
           "TOKENIZER_FILES"]
