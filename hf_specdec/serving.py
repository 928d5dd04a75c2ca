"""Serving-engine layouts of drafters (vLLM, SGLang), which know neither hf_specdec's classes nor borrowed weights.

Each exporter writes one drafter kind's checkpoint; the kinds registry (`kinds.py`) says which kind exports to which
format, and `hf_specdec.export.export_drafter` (`hf-specdec export`) picks the exporter from there.

- `vllm-draft` (token-only `SpecDrafterForCausalLM`): a standalone `LlamaForCausalLM` folder, the drafter's layers
  and final norm plus the TARGET's input embeddings and LM head copied in, full vocabulary (a reduced draft vocabulary
  disappears: the copy proposes from every token). Serve it as a draft model:
  `--speculative-config '{"model": OUT, "num_speculative_tokens": 5}'`.
- `vllm-eagle` (EAGLE-style, `config.target_feature_input`): the checkpoint layout of vLLM's EAGLE-1 Llama drafter
  (`EagleLlamaForCausalLM`, vllm/model_executor/models/llama_eagle.py): `fc.weight` [hidden, 2*hidden] fusing
  (token embedding ; target feature) in that order, `layers.{i}.*` without a `model.` prefix (vLLM adds it),
  `embed_tokens.weight` (read only under pipeline parallelism), no LM head (vLLM shares the target's). vLLM's graph
  has NO input norm on layer 0 and NO final norm, which hf_specdec's drafter has: those two weights are dropped (with
  a warning), so vLLM drafts differently from hf_specdec; its output stays exact, measure acceptance there.
  Serve with `--speculative-config '{"method": "eagle", "model": OUT, "num_speculative_tokens": 5}'`.
- `vllm-eagle3` (`Eagle3DraftModel`): the checkpoint of vLLM's EAGLE-3 Llama drafter (`Eagle3LlamaForCausalLM`,
  vllm/model_executor/models/llama_eagle3.py; SGLang's `LlamaForCausalLMEagle3` reads the same names):
  `architectures: ["LlamaForCausalLMEagle3"]`, `num_hidden_layers: 1`, `draft_vocab_size`, `target_hidden_size`,
  `eagle_aux_hidden_state_layer_ids` (vLLM's meaning, which is hf_specdec's: id i is the state ENTERING target layer
  i); tensors `fc.weight` [hidden, 3*target hidden], `midlayer.*` (q/k/v read 2*hidden: the normed embedding, then
  the normed fused state), `norm.weight`, `lm_head.weight` [draft vocab, hidden], `d2t` (int64: target id = draft
  row + d2t[row]) and `t2d` (bool over the target vocabulary; vLLM skips it). No `embed_tokens`: both engines share
  the target's. Serve with `--speculative-config '{"method": "eagle3", "model": OUT, "num_speculative_tokens": 5}'`.
  (SGLang adds one to explicitly configured ids in some versions; the default ids, 2, N/2, N-3, mean the same there.)
- `vllm-medusa` (`MedusaHeads`): the checkpoint of vLLM's `Medusa` (vllm/model_executor/models/medusa.py, config
  vllm/transformers_utils/configs/medusa.py): `model_type: medusa`, `blocks.{i}.layers.{j}.weight/bias` (so
  `medusa_fc_bias: true`), `lm_heads.{i}.weight`. Heads that borrow the target's LM head get a copy of it in every
  `lm_heads.{i}` (`original_lm_head: true` lets vLLM keep one); a reduced draft vocabulary becomes vLLM's
  `truncated_vocab_size` plus a `token_map` tensor (row r of a head <-> target token `token_map[r]`). vLLM proposes the
  heads' top-1 chain (no tree). Serve with `--speculative-config '{"method": "medusa", "model": OUT,
  "num_speculative_tokens": K}'` (K <= the number of heads).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from .models.eagle3 import Eagle3DraftModel
from .models.medusa import MedusaHeads
from .models.spec_drafter import SpecDrafterForCausalLM

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "tokenizer.model", "vocab.json", "merges.txt")


def _target_head(target) -> torch.Tensor:
    """The target's LM-head matrix, if a bias-free linear layer (what the engines' LM heads are) can express it."""
    head = target.get_output_embeddings()
    if not isinstance(head, nn.Linear) or head.bias is not None:
        bias = " with a bias" if getattr(head, "bias", None) is not None else ""
        raise ValueError(f"{type(target).__name__} has a {type(head).__name__} LM head{bias}; an export needs a "
                         "bias-free nn.Linear head, as Llama-like targets have.")
    if not head.weight.is_floating_point():
        raise ValueError("The target's LM head is quantized: load the target in floating point to export.")
    return head.weight.detach()


def _target_weights(target) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's embedding and LM-head matrices, if a plain Llama layout can express them."""
    embed = target.get_input_embeddings()
    if type(embed) is not nn.Embedding:
        raise ValueError(f"{type(target).__name__} has {type(embed).__name__} embeddings; an export needs a plain "
                         "nn.Embedding (no scaling), as Llama-like targets have.")
    return embed.weight.detach(), _target_head(target)


def _llama_config(drafter: SpecDrafterForCausalLM, vocab_size: int, **overrides) -> LlamaConfig:
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


def export_vllm_draft(drafter: SpecDrafterForCausalLM, target, out: Path, dtype: torch.dtype) -> None:
    """A standalone LlamaForCausalLM: the drafter's layers + final norm, the target's embeddings + LM head."""
    embed, head = _target_weights(target)
    tied = embed.data_ptr() == head.data_ptr()
    model = LlamaForCausalLM(_llama_config(drafter, embed.shape[0], tie_word_embeddings=tied))
    own = {k: v for k, v in drafter.state_dict().items() if k.startswith(("model.layers.", "model.norm."))}
    model.load_state_dict({**own, "model.embed_tokens.weight": embed, "lm_head.weight": head}, strict=True)
    model.to(dtype).save_pretrained(out)


def export_vllm_eagle(drafter: SpecDrafterForCausalLM, target, out: Path, dtype: torch.dtype) -> None:
    """vLLM's EAGLE-1 Llama checkpoint, less the two norms its graph has no place for (warns)."""
    embed, _ = _target_weights(target)
    own = drafter.model.state_dict()  # fuse.weight, layers.{i}.*, norm.weight
    dropped = ["layers.0.input_layernorm.weight", "norm.weight"]
    tensors = {"fc.weight": own["fuse.weight"], "embed_tokens.weight": embed,
               **{k: v for k, v in own.items() if k.startswith("layers.") and k not in dropped}}
    out.mkdir(parents=True, exist_ok=True)
    _llama_config(drafter, embed.shape[0], architectures=["EagleLlamaForCausalLM"], dtype=dtype).save_pretrained(out)
    save_file({k: v.to(dtype).contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    warnings.warn(
        f"vLLM's EAGLE Llama graph has no input norm on layer 0 and no final norm: dropped {dropped}, so vLLM drafts "
        "differently from hf_specdec (outputs stay exact; acceptance may be lower, measure it there).", stacklevel=3)


def export_vllm_eagle3(drafter: Eagle3DraftModel, target, out: Path, dtype: torch.dtype) -> None:
    """vLLM's (and SGLang's) EAGLE-3 Llama checkpoint: every weight of the drafter as it is, plus d2t / t2d."""
    c = drafter.config
    tensors = {k: v.detach().to(dtype).clone() for k, v in drafter.state_dict().items() if k != "d2t"}
    tensors["d2t"] = drafter.d2t.detach().cpu().long().clone()
    t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
    t2d[drafter.draft_vocab.cpu()] = True
    tensors["t2d"] = t2d
    config = _llama_config(drafter, c.vocab_size, architectures=["LlamaForCausalLMEagle3"], dtype=dtype,
                           tie_word_embeddings=False)
    config.update({"draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.target_hidden_size,
                   "eagle_aux_hidden_state_layer_ids": list(c.target_layer_ids),
                   "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(c.target_layer_ids),
                                    "use_aux_hidden_state": True}})
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})


def export_vllm_medusa(heads: MedusaHeads, target, out: Path, dtype: torch.dtype) -> None:
    """vLLM's Medusa checkpoint: the residual blocks as they are, an LM head per head (the target's, if borrowed)."""
    c, vocab = heads.config, heads.draft_vocab
    tensors = {f"blocks.{i}.layers.{j}.{name}": tensor for i, head in enumerate(heads.heads)
               for j, block in enumerate(head) for name, tensor in block.linear.named_parameters()}
    if c.share_lm_head:
        shared = _target_head(target)
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


__all__ = ["export_vllm_draft", "export_vllm_eagle", "export_vllm_eagle3", "export_vllm_medusa", "TOKENIZER_FILES"]
