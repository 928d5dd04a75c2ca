"""`hf-specdec export --format vllm-medusa`: the checkpoint of vLLM's `Medusa` (vllm/model_executor/models/medusa.py,
config vllm/transformers_utils/configs/medusa.py): `model_type: medusa`, `blocks.{i}.layers.{j}.weight/bias` (so
`medusa_fc_bias: true`), `lm_heads.{i}.weight`. Heads that borrow the target's LM head get a copy of it in every
`lm_heads.{i}` (`original_lm_head: true` lets vLLM keep one); a reduced draft vocabulary becomes vLLM's
`truncated_vocab_size` plus a `token_map` tensor (row r of a head <-> target token `token_map[r]`). vLLM proposes the
heads' top-1 chain (no tree). Serve with `--speculative-config '{"method": "medusa", "model": OUT,
"num_speculative_tokens": K}'` (K <= the number of heads).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from ...serving import target_head
from .model import MedusaHeads


def export_vllm_medusa(heads: MedusaHeads, target, out: Path, dtype: torch.dtype) -> None:
    """vLLM's Medusa checkpoint: the residual blocks as they are, an LM head per head (the target's, if borrowed)."""
    c, vocab = heads.config, heads.draft_vocab
    tensors = {f"blocks.{i}.layers.{j}.{name}": tensor for i, head in enumerate(heads.heads)
               for j, block in enumerate(head) for name, tensor in block.linear.named_parameters()}
    if c.share_lm_head:
        shared = target_head(target)
        shared = shared if vocab is None else shared[vocab.to(shared.device)]  # row r <-> token_map[r]
        lm_heads = [shared] * c.num_heads
    else:
        lm_heads = [lm_head.weight for lm_head in heads.lm_heads]
    tensors.update({f"lm_heads.{i}.weight": w for i, w in enumerate(lm_heads)})
    tensors = {k: v.detach().to(dtype).clone() for k, v in tensors.items()}  # clone: safetensors refuses shared storage
    if vocab is not None:
        tensors["token_map"] = vocab.detach().cpu().long().clone()  # an index: stays int64
    config = {
        "model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": c.hidden_size,
        "vocab_size": c.vocab_size, "num_heads": c.num_heads, "num_hidden_layers": c.num_layers,
        "truncated_vocab_size": c.vocab_size if vocab is None else len(vocab),
        "medusa_fc_bias": True,  # hf_specdec's blocks have a bias; vLLM's default is none
        "original_lm_head": bool(c.share_lm_head),  # one LM head in vLLM's memory (it reads lm_heads.0.weight)
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
