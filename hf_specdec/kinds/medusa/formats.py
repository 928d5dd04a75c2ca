"""Medusa heads in other projects' layouts, read as `MedusaHeads` and written back (`hf_specdec.formats`).

- `MEDUSA` ("medusa"): FasterDecoding's Medusa-1 (medusa-llm; `FasterDecoding/medusa-*`): a `config.json` with
  `medusa_num_heads`, `medusa_num_layers` and `base_model_name_or_path` (no `model_type`) beside
  `medusa_lm_head.safetensors` or `.pt`, whose tensors are head i's residual blocks `{i}.{j}.linear.{weight,bias}`
  (`x + SiLU(W x + b)`, on the target's final, normed state) and its own LM head `{i}.{num_layers}.weight`; head i
  proposes the token i + 2 positions ahead. Medusa-2 (`medusa-1.0-*`) ships the whole fine-tuned model with the heads
  as `medusa_head.*` and the Medusa fields in its config: its heads are read from it (the target is that checkpoint's
  own model, loaded as a causal LM), and a fine-tune writes Medusa-1's layout (the heads alone). medusa-llm repeats
  one block module `num_layers` times (`[ResBlock] * n`): hf_specdec gives each its own copy of the same weights.
- `VLLM` ("vllm-medusa", written only): vLLM's `Medusa` (vllm/model_executor/models/medusa.py): `model_type: medusa`,
  `blocks.{i}.layers.{j}.weight/bias` (so `medusa_fc_bias: true`), `lm_heads.{i}.weight`. Heads that borrow the
  target's LM head get a copy of it in every `lm_heads.{i}` (`original_lm_head: true` lets vLLM keep one); a reduced
  draft vocabulary becomes vLLM's `truncated_vocab_size` plus a `token_map` tensor (row r of a head <-> target token
  `token_map[r]`). vLLM proposes the heads' top-1 chain (no tree). Serve with `--speculative-config '{"method":
  "medusa", "model": OUT, "num_speculative_tokens": K}'` (K <= the number of heads).
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file

from ...errors import InputError
from ...formats import PublishedFormat
from ...formats.serving import target_head
from .model import MedusaConfig, MedusaHeads

HEAD_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")


class FasterDecodingMedusa(PublishedFormat):
    name, kind, project = "medusa", "medusa", "FasterDecoding Medusa (medusa-llm)"

    def recognises(self, checkpoint) -> bool:
        return "medusa_num_heads" in checkpoint.config

    def read(self, checkpoint, target=None):
        config, source = checkpoint.config, checkpoint.source
        if any(checkpoint.has(name) for name in HEAD_FILES):
            state = checkpoint.tensors(HEAD_FILES)
        else:  # Medusa-2: the whole model, its heads under medusa_head.
            state = checkpoint.tensors(prefix="medusa_head.")
        if not state:
            raise InputError(f"{source}: a Medusa config without its heads ({' or '.join(HEAD_FILES)}, or "
                             "medusa_head.* tensors in the model's weights).")
        layers = int(config.get("medusa_num_layers", 1))
        heads = 1 + max(int(key.split(".")[0]) for key in state)
        if heads != config.get("medusa_num_heads"):
            warnings.warn(f"{source}: its config says {config.get('medusa_num_heads')} heads, its weights hold {heads}: "
                          "all of them draft.", stacklevel=4)
        vocab, hidden = state[f"0.{layers}.weight"].shape
        if any(re.fullmatch(r"\d+\.\d+\.linear\.weight", key) is None for key in state if key.endswith("linear.weight")):
            raise InputError(f"{source}: Medusa tensors hf_specdec does not know.")
        native = {}
        for key, value in state.items():
            head, block, rest = key.split(".", 2)
            native[f"lm_heads.{head}.{rest}" if int(block) == layers else f"heads.{head}.{block}.{rest}"] = value
        medusa_config = MedusaConfig(num_heads=heads, num_layers=layers, hidden_size=hidden, vocab_size=vocab,
                                     share_lm_head=False, target_name_or_path=config.get("base_model_name_or_path")
                                     or config.get("_name_or_path"))
        return self.built(MedusaHeads, medusa_config, native, checkpoint)

    def write(self, heads: MedusaHeads, target, out, dtype) -> None:
        """Medusa-1's layout: the heads (each with an LM head: the target's rows, where they share it) and the config
        medusa-llm reads."""
        c = heads.config
        tensors = {f"{i}.{j}.linear.{name}": tensor for i, head in enumerate(heads.heads)
                   for j, block in enumerate(head) for name, tensor in block.linear.named_parameters()}
        tensors.update({f"{i}.{c.num_layers}.weight": w for i, w in enumerate(lm_head_weights(heads, target, full=True))})
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().to(dtype).cpu().contiguous().clone() for k, v in tensors.items()},
                  str(out / HEAD_FILES[0]), metadata={"format": "pt"})
        config = {"medusa_num_heads": c.num_heads, "medusa_num_layers": c.num_layers,
                  "base_model_name_or_path": c.target_name_or_path}
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


class VllmMedusa(PublishedFormat):
    """Written only: hf_specdec's own folders carry what vLLM's layout drops (the draft vocabulary's tree accuracy)."""

    name, kind, project = "vllm-medusa", "medusa", "vLLM (Medusa)"

    def write(self, heads: MedusaHeads, target, out: Path, dtype: torch.dtype) -> None:
        """vLLM's Medusa checkpoint: the residual blocks as they are, an LM head per head (the target's, if borrowed)."""
        c, vocab = heads.config, heads.draft_vocab
        tensors = {f"blocks.{i}.layers.{j}.{name}": tensor for i, head in enumerate(heads.heads)
                   for j, block in enumerate(head) for name, tensor in block.linear.named_parameters()}
        tensors.update({f"lm_heads.{i}.weight": w for i, w in enumerate(lm_head_weights(heads, target))})
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
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def lm_head_weights(heads: MedusaHeads, target, full: bool = False) -> list[torch.Tensor]:
    """Each head's LM-head matrix: its own, or the target's (its draft vocabulary's rows, unless `full`: a layout
    without a token map proposes over the whole vocabulary, so rows outside the draft vocabulary are the target's)."""
    c = heads.config
    if not c.share_lm_head:
        return [lm_head.weight for lm_head in heads.lm_heads]
    shared = target_head(target)
    if heads.draft_vocab is not None and not full:
        shared = shared[heads.draft_vocab.to(shared.device)]  # row r <-> token_map[r]
    return [shared] * c.num_heads


MEDUSA = FasterDecodingMedusa()
VLLM = VllmMedusa()

__all__ = ["MEDUSA", "VLLM", "FasterDecodingMedusa", "VllmMedusa"]
