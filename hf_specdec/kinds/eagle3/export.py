"""`hf-specdec export --format vllm-eagle3`: the checkpoint of vLLM's EAGLE-3 Llama drafter (`Eagle3LlamaForCausalLM`,
vllm/model_executor/models/llama_eagle3.py; SGLang's `LlamaForCausalLMEagle3` reads the same names): `architectures:
["LlamaForCausalLMEagle3"]`, `num_hidden_layers: 1`, `draft_vocab_size`, `target_hidden_size`,
`eagle_aux_hidden_state_layer_ids` (vLLM's meaning, which is hf_specdec's: id i is the state ENTERING target layer i);
tensors `fc.weight` [hidden, 3*target hidden], `midlayer.*` (q/k/v read 2*hidden: the normed embedding, then the normed
fused state), `norm.weight`, `lm_head.weight` [draft vocab, hidden], `d2t` (int64: target id = draft row + d2t[row])
and `t2d` (bool over the target vocabulary; vLLM skips it). No `embed_tokens`: both engines share the target's. Serve
with `--speculative-config '{"method": "eagle3", "model": OUT, "num_speculative_tokens": 5}'`. (SGLang adds one to
explicitly configured ids in some versions; the default ids, 2, N/2, N-3, mean the same there.)
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from ...serving import llama_config
from .model import Eagle3DraftModel


def export_vllm_eagle3(drafter: Eagle3DraftModel, target, out: Path, dtype: torch.dtype) -> None:
    """vLLM's (and SGLang's) EAGLE-3 Llama checkpoint: every weight of the drafter as it is, plus d2t / t2d."""
    c = drafter.config
    tensors = {k: v.detach().to(dtype).clone() for k, v in drafter.state_dict().items() if k != "d2t"}
    tensors["d2t"] = drafter.d2t.detach().cpu().long().clone()
    t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
    t2d[drafter.draft_vocab.cpu()] = True
    tensors["t2d"] = t2d
    config = llama_config(drafter, c.vocab_size, architectures=["LlamaForCausalLMEagle3"], dtype=dtype,
                           tie_word_embeddings=False)
    config.update({"draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.target_hidden_size,
                   "eagle_aux_hidden_state_layer_ids": list(c.target_layer_ids),
                   "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(c.target_layer_ids),
                                    "use_aux_hidden_state": True}})
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
