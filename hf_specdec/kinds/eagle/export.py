"""`hf-specdec export --format vllm-eagle`: the checkpoint layout of vLLM's EAGLE-1 Llama drafter
(`EagleLlamaForCausalLM`, vllm/model_executor/models/llama_eagle.py): `fc.weight` [hidden, 2*hidden] fusing (token
embedding ; target feature) in that order, `layers.{i}.*` without a `model.` prefix (vLLM adds it),
`embed_tokens.weight` (read only under pipeline parallelism), no LM head (vLLM shares the target's). vLLM's graph has
NO input norm on layer 0 and NO final norm, which hf_specdec's drafter has: those two weights are dropped (with a
warning), so vLLM drafts differently from hf_specdec; its output stays exact, measure acceptance there. Serve with
`--speculative-config '{"method": "eagle", "model": OUT, "num_speculative_tokens": 5}'`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file

from ...serving import llama_config, target_weights
from ..draft_model.model import SpecDrafterForCausalLM


def export_vllm_eagle(drafter: SpecDrafterForCausalLM, target, out: Path, dtype: torch.dtype) -> None:
    """vLLM's EAGLE-1 Llama checkpoint, less the two norms its graph has no place for (warns)."""
    embed, _ = target_weights(target)
    own = drafter.model.state_dict()  # fuse.weight, layers.{i}.*, norm.weight
    dropped = ["layers.0.input_layernorm.weight", "norm.weight"]
    tensors = {"fc.weight": own["fuse.weight"], "embed_tokens.weight": embed,
               **{k: v for k, v in own.items() if k.startswith("layers.") and k not in dropped}}
    out.mkdir(parents=True, exist_ok=True)
    llama_config(drafter, embed.shape[0], architectures=["EagleLlamaForCausalLM"], dtype=dtype).save_pretrained(out)
    save_file({k: v.to(dtype).contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    warnings.warn(
        f"vLLM's EAGLE Llama graph has no input norm on layer 0 and no final norm: dropped {dropped}, so vLLM drafts "
        "differently from hf_specdec (outputs stay exact; acceptance may be lower, measure it there).", stacklevel=3)
