"""The registry of drafter kinds: the one place that knows what kinds of drafter models exist.

A kind is registered once: its name (also its Hub tag), its config and model classes, the `Drafter` class that decodes
with it, the serving-engine formats it exports to, and its training adapter. `AutoDrafter` (loading), `as_drafter`
(decoding), model cards (tags), `export` and `training/` read the registry; none of them names a kind.

A kind is one folder, `kinds/<kind>/` (as peft keeps one per method): `model.py` (its config and model), `drafter.py`
(how it decodes), `training.py` (its training adapter) and `export.py` (its serving-engine layout). Adding a kind is
that folder plus one registration line (as peft's `register_peft_method`), here or in your own package:

    register_drafter_kind(DrafterKind("my-kind", MyConfig, MyModel, MyDrafter, exporters={"vllm-x": export_x},
                                      training="my_package.train:MyAdapter"))

Several kinds may share a config class (token-only and EAGLE-style drafters are both `SpecDrafterConfig`); `matches`
then tells them apart. Exporters are `exporter(model, target, out_folder, dtype)`, or their "module:name" (the
built-in ones are named, so that decoding, and the `custom_generate/` copy of it, never loads export code). `training`
names the `module:attribute` of the kind's training adapter (a subclass of `training.adapters.Adapter`: how to build,
feed and score the kind, and its `Options` dataclass), which `training/distill.py --drafter <kind name>` loads; it
builds on the trainer in the checkout's `training/`, so it is named, not imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from .block import BlockDrafter, BlockDrafterConfig, BlockDrafterModel
from .draft_model import DraftModelDrafter, SpecDrafterConfig, SpecDrafterForCausalLM
from .eagle import EagleDrafter
from .eagle3 import Eagle3Config, Eagle3DraftModel, Eagle3Drafter
from .medusa import MedusaConfig, MedusaDrafter, MedusaHeads

@dataclass(frozen=True)
class DrafterKind:
    name: str
    config_class: type | None  # None: any config transformers maps to a causal LM
    model_class: type  # what `AutoDrafter` loads with (`from_pretrained`)
    drafter_class: Callable  # model -> the Drafter that decodes with it
    matches: Callable[[object], bool] | None = None  # tells apart kinds that share a config class
    exporters: dict = field(default_factory=dict)  # format -> exporter(model, target, out, dtype), or its "module:name"
    training: str | None = None  # "module:attribute" of its training adapter
    description: str = ""
    tag: str | None = None  # its Hub tag, when not its name

    @property
    def hub_tag(self) -> str:
        return self.tag or self.name

    def accepts(self, config) -> bool:
        if self.config_class is None:
            model_type = getattr(config, "model_type", None)
            auto_map = getattr(config, "auto_map", None) or {}
            return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or "AutoModelForCausalLM" in auto_map
        if getattr(config, "model_type", None) != self.config_class.model_type:
            return False
        return self.matches is None or bool(self.matches(config))


_KINDS: dict[str, DrafterKind] = {}


def register_drafter_kind(kind: DrafterKind) -> DrafterKind:
    """Add a kind (a kind registered again under the same name replaces the old one)."""
    _KINDS[kind.name] = kind
    # the installed package registers its configs with transformers' Auto classes; a copy bundled into a drafter's
    # custom_generate/ folder must not re-register its own classes over them
    if kind.config_class is not None and __name__.startswith("hf_specdec."):
        AutoConfig.register(kind.config_class.model_type, kind.config_class, exist_ok=True)
        if issubclass(kind.model_class, GenerationMixin):  # a causal LM: AutoModelForCausalLM loads it too
            AutoModelForCausalLM.register(kind.config_class, kind.model_class, exist_ok=True)
    return kind


def drafter_kinds() -> list[DrafterKind]:
    return list(_KINDS.values())


def kind_of(config) -> DrafterKind | None:
    """The kind of a drafter model's config (a dict or a PretrainedConfig), or None."""
    if isinstance(config, dict):
        config = _AttributeView(config)
    return next((kind for kind in _KINDS.values() if kind.config_class is not None and kind.accepts(config)),
                next((kind for kind in _KINDS.values() if kind.config_class is None and kind.accepts(config)), None))


def export_formats() -> dict[str, DrafterKind]:
    """Every export format, and the kind it exports."""
    return {fmt: kind for kind in _KINDS.values() for fmt in kind.exporters}


class _AttributeView:
    """A config.json dict read like a config object (`kind_of` before anything is loaded)."""

    def __init__(self, values: dict):
        self.__dict__.update(values)

    def __getattr__(self, name):
        return None


# one line a kind: its folder holds the config, model, drafter, exporter and training adapter named here
register_drafter_kind(DrafterKind(
    "draft-model", SpecDrafterConfig, SpecDrafterForCausalLM, DraftModelDrafter,
    matches=lambda config: not config.target_feature_input, exporters={"vllm-draft": f"{__name__}.draft_model.export:export_vllm_draft"},
    training=f"{__name__}.draft_model.training:TokenTraining", description="a token-only drafter that borrows the target's embeddings"))
register_drafter_kind(DrafterKind(
    "eagle", SpecDrafterConfig, SpecDrafterForCausalLM, EagleDrafter,
    matches=lambda config: bool(config.target_feature_input), exporters={"vllm-eagle": f"{__name__}.eagle.export:export_vllm_eagle"},
    training=f"{__name__}.eagle.training:EagleTraining", description="an EAGLE-style drafter reading the target's hidden states"))
register_drafter_kind(DrafterKind(
    "eagle3", Eagle3Config, Eagle3DraftModel, Eagle3Drafter, exporters={"vllm-eagle3": f"{__name__}.eagle3.export:export_vllm_eagle3"},
    training=f"{__name__}.eagle3.training:Eagle3Training", description="an EAGLE-3-style drafter fusing the target's low, middle and high layers"))
register_drafter_kind(DrafterKind(
    "medusa", MedusaConfig, MedusaHeads, MedusaDrafter, exporters={"vllm-medusa": f"{__name__}.medusa.export:export_vllm_medusa"},
    training=f"{__name__}.medusa.training:MedusaTraining", description="Medusa heads on the target's final hidden state"))
register_drafter_kind(DrafterKind(
    "block", BlockDrafterConfig, BlockDrafterModel, BlockDrafter, training=f"{__name__}.block.training:BlockTraining",
    description="a block drafter: one forward proposes several tokens, reading the target's fused layer states"))
register_drafter_kind(DrafterKind(
    "causal-lm", None, AutoModelForCausalLM, DraftModelDrafter, training=f"{__name__}.draft_model.training:CausalLMTraining",
    description="a causal LM with the target's vocabulary (transformers' AutoModelForCausalLM)", tag="draft-model"))

__all__ = ["DrafterKind", "register_drafter_kind", "drafter_kinds", "kind_of", "export_formats"]
