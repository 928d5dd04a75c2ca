"""`hf-specdec export --format vllm-draft`: a standalone `LlamaForCausalLM` folder, the drafter's layers and final norm
plus the TARGET's input embeddings and LM head copied in, full vocabulary (a reduced draft vocabulary disappears: the
copy proposes from every token). Serve it as a draft model: `--speculative-config '{"model": OUT,
"num_speculative_tokens": 5}'`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from ...formats.serving import llama_config, target_weights
from .model import SpecDrafterForCausalLM


def export_vllm_draft(drafter: SpecDrafterForCausalLM, target, out: Path, dtype: torch.dtype) -> None:
    """A standalone LlamaForCausalLM: the drafter's layers + final norm, the target's embeddings + LM head."""
    embed, head = target_weights(target)
    tied = embed.data_ptr() == head.data_ptr()
    model = LlamaForCausalLM(llama_config(drafter, embed.shape[0], tie_word_embeddings=tied))
    own = {k: v for k, v in drafter.state_dict().items() if k.startswith(("model.layers.", "model.norm."))}
    model.load_state_dict({**own, "model.embed_tokens.weight": embed, "lm_head.weight": head}, strict=True)
    model.to(dtype).save_pretrained(out)
