"""EAGLE-3 drafters in other projects' layouts, read as `Eagle3DraftModel`s and written back (`hf_specdec.formats`).

- `SPECULATORS` ("speculators-eagle3"): vllm-project/speculators' (`speculators_model_type: eagle3`; RedHatAI's
  `*-speculator.eagle3` repos): its layers in `transformer_layer_config` (Llama or Qwen3, one or more, sliding windows),
  `eagle_aux_hidden_state_layer_ids` (any number; vLLM's meaning, which is hf_specdec's: id i is the state entering
  target layer i), `norm_before_fc` (one norm over the concatenated states), `fc_norm` (one per layer),
  `norm_before_residual`, `norm_output` (EAGLE 3.1: the normed output is fed back), its own `embed_tokens`, and
  `d2t` / `t2d` when the draft vocabulary is reduced; tensors `layers.{i}.*`, `input_norm`, `fc_norm.{i}`.
- `LLAMA` ("vllm-eagle3"): the layout of SafeAILab's EAGLE-3 releases (`yuhuili/EAGLE3-*`), SpecForge's outputs
  (`LlamaForCausalLMEagle3`) and what vLLM's `llama_eagle3.py` and SGLang read: a Llama config plus
  `draft_vocab_size`, `target_hidden_size`; tensors `fc`, `midlayer.*`, `norm`, `lm_head`, `d2t` / `t2d`, with or
  without `embed_tokens` (without: the target's); SpecForge's `fc_norm` and `norm_output: false` (no norm before the
  LM head), vLLM's `norm_before_residual`. Its layer ids: `eagle_aux_hidden_state_layer_ids` in vLLM's meaning, or
  `eagle_config`'s in SGLang's (the output of layer i, i.e. the state entering i + 1), or by default 2, N/2, N - 3.
  hf_specdec's `--format vllm-eagle3` export writes it (serve with `--speculative-config '{"method": "eagle3",
  "model": OUT, "num_speculative_tokens": 5}'`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from ...errors import InputError
from ...formats import PublishedFormat
from ...formats import speculators
from ...formats.serving import llama_config
from .model import Eagle3Config, Eagle3DraftModel, default_layer_ids


def renamed(state: dict, pairs: list[tuple[str, str]]) -> dict:
    """`state` with each key's first matching prefix replaced."""
    out = {}
    for key, value in state.items():
        for old, new in pairs:
            if key.startswith(old):
                key = new + key[len(old):]
                break
        out[key] = value
    return out


def default_ids(target, source: str) -> list[int]:
    if target is None:
        raise InputError(f"{source} names no target layers: they are the target's (2, N/2, N - 3); load it with "
                         "`target=` (AutoDrafter.from_pretrained(..., target=model)), as generate(assistant=...) does.")
    return default_layer_ids(target.config.get_text_config().num_hidden_layers)


def draft_rows(state: dict, draft_vocab: int, vocab: int, source: str) -> torch.Tensor:
    """d2t (target id of draft row i = i + d2t[i]): the checkpoint's when its draft vocabulary is reduced, checked."""
    if draft_vocab == vocab:
        return torch.zeros(vocab, dtype=torch.long)
    d2t = state.get("d2t")
    if d2t is None or d2t.shape != (draft_vocab,):
        raise InputError(f"{source}: a draft vocabulary of {draft_vocab} of {vocab} tokens without its d2t map.")
    ids = torch.arange(draft_vocab) + d2t.long()
    if not (bool((ids[1:] > ids[:-1]).all()) and int(ids.min()) >= 0 and int(ids.max()) < vocab):
        raise InputError(f"{source}: its d2t map does not name {draft_vocab} distinct, sorted target ids.")
    return d2t.long()


def head_rows(state: dict, d2t: torch.Tensor, target, source: str) -> None:
    """A checkpoint without its LM head drafts through the target's rows of its draft vocabulary (speculators fills
    it so from the verifier)."""
    if "lm_head.weight" in state:
        return
    if target is None:
        raise InputError(f"{source} holds no lm_head: it is its target's; load it with `target=`.")
    ids = torch.arange(len(d2t)) + d2t
    state["lm_head.weight"] = target.get_output_embeddings().weight.detach().float().cpu()[ids]


class SpeculatorsEagle3(PublishedFormat):
    name, kind, project = "speculators-eagle3", "eagle3", "speculators (vllm-project/speculators)"
    algorithm, architecture, model_class = "eagle3", "Eagle3DraftModel", Eagle3DraftModel
    flags = {"draft_vocab_size", "norm_before_residual", "target_hidden_size", "eagle_aux_hidden_state_layer_ids",
             "norm_before_fc", "fc_norm", "norm_output"}
    extra_flags: set = set()  # (P-EAGLE's reading adds its own flags and tensors: kinds/block/formats.py)

    def recognises(self, checkpoint) -> bool:
        return checkpoint.config.get("speculators_model_type") == self.algorithm

    def read(self, checkpoint, target=None):
        config, source = checkpoint.config, checkpoint.source
        speculators.refuse_unknown(config, self.flags | self.extra_flags, source)
        layers = speculators.layer_config(config, source, ("llama", "qwen3"))
        state = checkpoint.tensors()
        count = layers.num_hidden_layers
        state = renamed(state, [("layers.0.", "midlayer."), *[(f"layers.{i}.", f"more_layers.{i - 1}.")
                                                               for i in range(1, count)],
                                ("input_norm.", "state_norm.norms.0."), ("fc_norm.", "state_norm.norms.")])
        vocab, draft_vocab = layers.vocab_size, config.get("draft_vocab_size") or layers.vocab_size
        d2t = draft_rows(state, draft_vocab, vocab, source)
        state["d2t"] = d2t
        state.pop("t2d", None)
        head_rows(state, d2t, target, source)
        ids = config.get("eagle_aux_hidden_state_layer_ids") or default_ids(target, source)
        fields, extra = speculators.layer_fields(layers), self.extra_config(config, state)
        drafter_config = extra.pop("config_class", Eagle3Config)(
            **fields, draft_vocab_size=draft_vocab, target_hidden_size=state["fc.weight"].shape[1] // len(ids),
            target_layer_ids=list(ids), num_hidden_layers=count,
            fc_input_norm="joint" if config.get("norm_before_fc") else "per_layer" if config.get("fc_norm") else None,
            norm_before_residual=bool(config.get("norm_before_residual")),
            feed_back_normed=bool(config.get("norm_output")), own_embeddings="embed_tokens.weight" in state,
            qk_norm=layers.model_type == "qwen3", attention_windows=speculators.attention_windows(layers),
            target_name_or_path=speculators.verifier_name(config),
            num_draft_tokens_eval=speculators.speculative_tokens(config, 5), **extra)
        return self.built(self.model_class, drafter_config, state, checkpoint)

    def extra_config(self, config: dict, state: dict) -> dict:
        """A subclass's further config fields (and its tensors renamed in `state`)."""
        return {}

    def write(self, model, target, out, dtype) -> None:
        c = model.config
        if not c.norm_before_head:
            raise InputError("speculators' EAGLE-3 always norms before its LM head; this drafter does not "
                             "(norm_before_head=False): export it with --format vllm-eagle3.")
        if len(set(c.target_layer_ids)) != len(c.target_layer_ids):
            raise InputError(f"speculators loads only drafters of distinct target layers; this one reads "
                             f"{list(c.target_layer_ids)} (a shallow target's defaults): export it with --format "
                             "vllm-eagle3, or train it with --target-layer-ids naming distinct layers.")
        if c.target_hidden_size != c.hidden_size:
            raise InputError(f"speculators' EAGLE-3 fuses states of its own width ({c.hidden_size}); this drafter's "
                             f"target has {c.target_hidden_size}: export it with --format vllm-eagle3.")
        original = (c.published or {}).get("config") or {}
        tensors = renamed(own_tensors(model, target), [("midlayer.", "layers.0."), *[
            (f"more_layers.{i}.", f"layers.{i + 1}.") for i in range(c.num_hidden_layers - 1)],
            ("state_norm.norms.", "input_norm." if c.fc_input_norm == "joint" else "fc_norm.")])
        if c.fc_input_norm == "joint":
            tensors["input_norm.weight"] = tensors.pop("input_norm.0.weight")
        tensors.update(vocabulary_maps(model))
        config = {
            "speculators_model_type": self.algorithm, "architectures": [self.architecture],
            "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": None,
            "eagle_aux_hidden_state_layer_ids": list(c.target_layer_ids),
            "norm_before_fc": c.fc_input_norm == "joint", "fc_norm": c.fc_input_norm == "per_layer",
            "norm_before_residual": c.norm_before_residual, "norm_output": c.feed_back_normed,
            "embed_requires_grad": False, "tie_word_embeddings": False,
            "transformer_layer_config": speculators.transformer_layer_config(c, c.num_hidden_layers,
                                                                             c.attention_windows),
            "speculators_config": speculators.speculators_block(
                self.algorithm, getattr(c, "block_size", c.num_draft_tokens_eval), c.target_name_or_path,
                [type(target).__name__] if target is not None else [], original),
            "dtype": str(dtype).removeprefix("torch."), **self.extra_written(model, tensors)}
        if "speculators_version" in original:  # (a read checkpoint's, kept)
            config["speculators_version"] = original["speculators_version"]
        save(out, config, tensors, dtype)

    def extra_written(self, model, tensors: dict) -> dict:
        """A subclass's further config.json keys (and its tensors renamed in `tensors`)."""
        return {}


class LlamaEagle3(PublishedFormat):
    name, kind = "vllm-eagle3", "eagle3"
    project = "SafeAILab EAGLE-3 / SpecForge / vLLM / SGLang (LlamaForCausalLMEagle3)"
    flags = {"draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids", "eagle_config", "fc_norm",
             "norm_output", "norm_before_residual", "bias", "architectures", "dtype", "torch_dtype",
             "transformers_version", "rope_theta", "rope_scaling", "_name_or_path"}

    def recognises(self, checkpoint) -> bool:
        config = checkpoint.config
        if "speculators_model_type" in config or "draft_vocab_size" not in config:
            return False
        if any("Eagle3" in name for name in config.get("architectures") or []):
            return True
        return any(name.startswith("midlayer.") for name in checkpoint.tensor_names())

    def read(self, checkpoint, target=None):
        from transformers import LlamaConfig

        config, source = checkpoint.config, checkpoint.source
        known = self.flags | set(LlamaConfig().to_dict())
        unknown = sorted(k for k, v in config.items() if k not in known and v not in (None, False, 0, [], {}))
        if unknown:
            raise InputError(f"{source}: EAGLE-3 flags hf_specdec does not implement: {', '.join(unknown)}.")
        layers = LlamaConfig(**{k: v for k, v in config.items() if k in LlamaConfig().to_dict() or k.startswith("rope")})
        state = renamed(checkpoint.tensors(), [("draft_model.", ""), ("layers.0.", "midlayer."),
                                              ("fc_norm.", "state_norm.norms.")])
        vocab, draft_vocab = layers.vocab_size, config.get("draft_vocab_size") or layers.vocab_size
        d2t = draft_rows(state, draft_vocab, vocab, source)  # (SafeAILab ignores a map over the whole vocabulary)
        state["d2t"] = d2t
        state.pop("t2d", None)
        head_rows(state, d2t, target, source)
        ids = config.get("eagle_aux_hidden_state_layer_ids")
        if not ids and (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"):
            ids = [i + 1 for i in config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]  # SGLang's: outputs
        ids = ids or default_ids(target, source)
        drafter_config = Eagle3Config(
            **speculators.layer_fields(layers), draft_vocab_size=draft_vocab,
            target_hidden_size=state["fc.weight"].shape[1] // len(ids), target_layer_ids=list(ids),
            fc_input_norm="per_layer" if config.get("fc_norm") else None,
            norm_before_residual=bool(config.get("norm_before_residual")),
            norm_before_head=config.get("norm_output", True) is not False,
            own_embeddings="embed_tokens.weight" in state)
        return self.built(Eagle3DraftModel, drafter_config, state, checkpoint)

    def write(self, model: Eagle3DraftModel, target, out, dtype) -> None:
        """Every weight of the drafter as it is, plus d2t / t2d (no `embed_tokens` unless it has its own: the engines
        share the target's)."""
        c = model.config
        cannot = [what for what, present in (
            ("one norm over the concatenated states (norm_before_fc)", c.fc_input_norm == "joint"),
            ("the normed output fed back (norm_output)", c.feed_back_normed), ("Qwen3 q/k norms", c.qk_norm),
            ("more than one layer", c.num_hidden_layers > 1), ("sliding windows", bool(c.attention_windows)),
            ("more or fewer than three target layers", len(c.target_layer_ids) != 3)) if present]
        if cannot:
            raise InputError(f"vLLM's and SGLang's Llama EAGLE-3 layout cannot hold {', '.join(cannot)}: export it "
                             "with --format speculators.")
        tensors = renamed(own_tensors(model, None), [("state_norm.norms.", "fc_norm.")])
        tensors.update(vocabulary_maps(model, always=True))
        config = llama_config(model, c.vocab_size, architectures=["LlamaForCausalLMEagle3"], dtype=dtype,
                              tie_word_embeddings=False).to_dict()
        ids = list(c.target_layer_ids)
        config.update({"draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.target_hidden_size,
                       "eagle_aux_hidden_state_layer_ids": ids,  # vLLM's meaning: the state entering layer i
                       # SGLang's: the output of layer i (it adds one); SpecForge's flags
                       "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in ids],
                                        "use_aux_hidden_state": True},
                       "fc_norm": c.fc_input_norm == "per_layer", "norm_output": c.norm_before_head,
                       "norm_before_residual": c.norm_before_residual})
        if min(ids) < 1:
            raise InputError("SGLang's layer ids cannot name the embeddings (id 0): export with --format speculators.")
        save(out, config, tensors, dtype)


def own_tensors(model, target) -> dict:
    """The drafter's weights by their hf_specdec names, without d2t; with `target`, borrowed embeddings written out
    (layouts that always carry them)."""
    tensors = {k: v for k, v in model.state_dict().items() if k != "d2t"}
    if target is not None and "embed_tokens.weight" not in tensors:
        tensors["embed_tokens.weight"] = target.get_input_embeddings().weight
    return tensors


def vocabulary_maps(model, always: bool = False) -> dict:
    """d2t (int64: target id = draft row + d2t[row]) and t2d (bool over the target vocabulary), when the draft
    vocabulary is reduced (or `always`)."""
    c = model.config
    if c.draft_vocab_size == c.vocab_size and not always:
        return {}
    t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
    t2d[model.draft_vocab.cpu()] = True
    return {"d2t": model.d2t.detach().cpu().long(), "t2d": t2d}


def save(out, config: dict, tensors: dict, dtype: torch.dtype) -> None:
    import json

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tensors = {k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).cpu().contiguous().clone()
               for k, v in tensors.items()}  # (clone: safetensors refuses shared storage)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


SPECULATORS = SpeculatorsEagle3()
LLAMA = LlamaEagle3()

__all__ = ["SPECULATORS", "LLAMA", "SpeculatorsEagle3", "LlamaEagle3", "renamed", "save"]
