"""`AutoDrafter.from_pretrained(path_or_id, target=None)`: load any drafter the project makes, by reading its config.

    drafter = hf_specdec.AutoDrafter.from_pretrained("someone/smollm2-drafter", target=target)
    target.generate(**inputs, custom_generate=hf_specdec.speculative_generate, assistant=drafter)

`model_type == "hf_specdec_drafter"` -> `SpecDrafterForCausalLM` (token-only, or EAGLE-style when
`config.target_feature_input`), bound to `target` when one is given; any other causal-LM config -> the plain
`AutoModelForCausalLM`. Each kind is saved with its own `save_pretrained`, so saving and loading are symmetric.

This module is also bundled into every saved drafter's `custom_generate/` folder (see `hf_specdec.hub`), where it
runs without hf_specdec installed: it imports only transformers and its sibling modules.
"""

from __future__ import annotations

from transformers import AutoModelForCausalLM, PreTrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from .modeling_drafter import MODEL_TYPE, SpecDrafterForCausalLM
from .modeling_medusa import MEDUSA_MODEL_TYPE, MedusaHeads

#: config.model_type -> the class that loads it. A new drafter kind adds its entry here.
DRAFTER_CLASSES = {MODEL_TYPE: SpecDrafterForCausalLM, MEDUSA_MODEL_TYPE: MedusaHeads}

#: from_pretrained arguments that say WHERE to read (Hub revision, token, cache): the config is read the same way
HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "force_download", "proxies", "subfolder")


class AutoDrafter:
    """Loads a drafter folder or Hub repo of any kind hf_specdec makes; not instantiable itself."""

    def __init__(self):
        raise OSError("AutoDrafter is not instantiable: use `AutoDrafter.from_pretrained(path_or_id, target=...)`.")

    @classmethod
    def from_pretrained(cls, path_or_id, target=None, **kwargs):
        """The drafter at `path_or_id` in eval mode; with `target`, moved to its device and bound to it (drafters
        that borrow the target's embeddings / LM head). Extra kwargs go to the class's `from_pretrained`."""
        path_or_id = str(path_or_id)
        config, _ = PreTrainedConfig.get_config_dict(path_or_id, **{k: kwargs[k] for k in HUB_KWARGS if k in kwargs})
        model_type = config.get("model_type")
        if model_type in DRAFTER_CLASSES:
            model = DRAFTER_CLASSES[model_type].from_pretrained(path_or_id, **kwargs)
        elif model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or "AutoModelForCausalLM" in config.get("auto_map", {}):
            model = AutoModelForCausalLM.from_pretrained(path_or_id, **kwargs)
        else:
            raise ValueError(
                f"{path_or_id!r} holds a model of type {model_type!r}, which is not a drafter: AutoDrafter loads "
                f"hf_specdec drafters (model_type {sorted(DRAFTER_CLASSES)}: token-only or EAGLE-style drafters, Medusa heads) and causal "
                "language models transformers knows (AutoModelForCausalLM, e.g. 'llama', 'qwen2', 'gpt2')."
            )
        model.eval()
        if target is not None:
            model.to(target.device)
            if hasattr(model, "bind_target"):
                model.bind_target(target)
        return model


__all__ = ["AutoDrafter", "DRAFTER_CLASSES", "HUB_KWARGS"]
