"""The registry of drafter kinds: every kind of drafter the project knows, each joining with one line.

A kind is what `assistant=`, `AutoDrafter`, the command line, the trainer and the exports look up; none of them names
a kind. A kind either builds its drafter from a name (`build`: `assistant="ngram"` or `"self:12"`), or loads a drafter
model (`config_class` / `model_class` / `drafter_class`), or both. The built-in kinds are one folder each under
`hf_specdec/kinds/`, and their lines are `kinds/__init__.py`; this module holds only the registry, and names no kind.
Adding a kind is its code plus one line, from any package (as peft's `register_peft_method`):

    register_drafter_kind(DrafterKind("my-kind", MyConfig, MyModel, MyDrafter, options=MyOptions,
                                      exporters={"vllm-x": export_x}, training="my_package.train:MyAdapter"))
    register_drafter_kind(DrafterKind("my-lookup", build=MyLookup.for_target, description="..."))

A kind's `options` (`kind_options.py`) is its one options class: the trainer's flags, a new drafter's config fields,
its drafter's keywords and what follows ':' in its name ("runs/heads:chain", "self:12").

Several kinds may share a config class (token-only and EAGLE-style drafters are both `SpecDrafterConfig`); `matches`
then tells them apart. `build`, exporters and `training` are callables or the "module:attribute" that names one, so
that what is not used is never imported: decoding (and the `custom_generate/` copy of it) never loads export or
training code. Exporters are `exporter(model, target, out_folder, dtype)`; `training` is the kind's training adapter (a
subclass of `hf_specdec.training.adapters.Adapter`: how to build, feed and score the kind), which
`training/distill.py --drafter <kind name>` loads. The lookups import the modules named by `register_kinds_from` first
(the package names `hf_specdec.kinds`), so that `import hf_specdec` costs no torch import.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

from .kind_options import KindOptions


@dataclass(frozen=True)
class DrafterKind:
    name: str
    config_class: type | None = None  # None, with a model class: any config transformers maps to a causal LM
    model_class: type | None = None  # what `AutoDrafter` loads with (`from_pretrained`); None: no model to load
    drafter_class: Callable | None = None  # model -> the Drafter that decodes with it
    matches: Callable[[object], bool] | None = None  # tells apart kinds that share a config class
    exporters: dict = field(default_factory=dict)  # format -> exporter(model, target, out, dtype), or its "module:name"
    training: str | None = None  # "module:attribute" of its training adapter
    description: str = ""
    tag: str | None = None  # its Hub tag, when not its name
    build: Callable | str | None = None  # a name's drafter: build(target, options) -> Drafter, or "module:name"
    options: type = KindOptions  # its options (kind_options.py): trainer flags, config fields, drafter keywords, ':arg'
    by_class: bool = False  # its models have no config of their own (transformers' MTP layers are built from the
    #   target's): a model is of this kind by its class, a config never is
    formats: tuple = ()  # other projects' layouts of its drafters it reads (and writes): "module:NAME" of each
    #   `hf_specdec.formats.PublishedFormat` instance

    @property
    def hub_tag(self) -> str:
        return self.tag or self.name

    @property
    def usage(self) -> str:
        """How its name is written (kinds built from a name)."""
        return self.options.usage(self.name)

    def builder(self) -> Callable:
        return resolved(self.build)

    def drafter_for(self, model, options=None):
        """The Drafter that decodes with a model of this kind (with `options`' drafter keywords: default, a name's
        ':arg', the trainer's flags)."""
        return self.drafter_class(model, **(options or self.options()).drafter_keywords())

    def accepts(self, config) -> bool:
        if self.model_class is None:
            return False
        if self.by_class:
            return False
        if self.config_class is None:
            from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

            model_type = getattr(config, "model_type", None)
            auto_map = getattr(config, "auto_map", None) or {}
            return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or "AutoModelForCausalLM" in auto_map
        if getattr(config, "model_type", None) != self.config_class.model_type:
            return False
        return self.matches is None or bool(self.matches(config))


_KINDS: dict[str, DrafterKind] = {}
_PENDING: list[str] = []  # modules that register kinds, not imported yet (`register_kinds_from`)
CAUSAL_LM = "causal-lm"  # the kind any causal LM with the target's vocabulary is (kinds/__init__.py)


def register_drafter_kind(kind: DrafterKind) -> DrafterKind:
    """Add a kind (a kind registered again under the same name replaces the old one)."""
    _KINDS[kind.name] = kind
    # the installed package registers its configs with transformers' Auto classes; a copy bundled into a drafter's
    # custom_generate/ folder must not re-register its own classes over them
    if kind.config_class is not None and __name__.startswith("hf_specdec."):
        from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin

        AutoConfig.register(kind.config_class.model_type, kind.config_class, exist_ok=True)
        if issubclass(kind.model_class, GenerationMixin):  # a causal LM: AutoModelForCausalLM loads it too
            AutoModelForCausalLM.register(kind.config_class, kind.model_class, exist_ok=True)
    return kind


def drafter_kinds() -> list[DrafterKind]:
    return list(_registered().values())


def named_kinds() -> dict[str, DrafterKind]:
    """The kinds an assistant name builds (`assistant="ngram"`), by name."""
    return {kind.name: kind for kind in _registered().values() if kind.build is not None}


def loading_kinds() -> list[DrafterKind]:
    """The kinds that load a drafter model."""
    return [kind for kind in _registered().values() if kind.model_class is not None]


def kind_of(config) -> DrafterKind | None:
    """The kind of a drafter model's config (a dict or a PretrainedConfig), or None."""
    if isinstance(config, dict):
        config = _AttributeView(config)
    kinds = _registered().values()
    return next((kind for kind in kinds if kind.config_class is not None and kind.accepts(config)),
                next((kind for kind in kinds if kind.config_class is None and kind.accepts(config)), None))


def kind_of_folder(source, config: dict) -> DrafterKind | None:
    """The kind of a saved drafter's config, or of the kind another project's layout there maps onto
    (`hf_specdec.formats`), or None."""
    kind = kind_of(config)
    if (kind is None or kind.config_class is None) and __name__.startswith("hf_specdec."):
        found = resolved("hf_specdec.formats:published_format")(source, config)
        if found is not None:
            return _registered()[found.kind]
    return kind


def kind_of_model(model) -> DrafterKind | None:
    """The kind of a drafter model object: a kind with no config of its own (transformers' MTP layers, built from the
    target's config) by its class, any other by its config; a model that generates with an LM head whose config no
    kind claims (a multimodal model's text part) is a causal LM; None: no drafter."""
    kinds = _registered()
    by_class = next((kind for kind in kinds.values() if kind.by_class and isinstance(model, kind.model_class)), None)
    if by_class is not None:
        return by_class
    kind = kind_of(model.config)
    if kind is not None and kind.config_class is not None:
        return kind
    generates = (callable(getattr(model, "generate", None)) and not model.config.is_encoder_decoder
                 and model.get_output_embeddings() is not None)
    return kinds[CAUSAL_LM] if generates else None


def kind_classes() -> dict[str, type]:
    """The options, config, model and drafter classes of the kinds hf_specdec defines (its public `hf_specdec.<Model>`,
    `hf_specdec.drafters.<Drafter>`), by name: a kind's folder and its registry line are all that name it."""
    return {cls.__name__: cls for kind in _registered().values()
            for cls in (kind.options, kind.config_class, kind.model_class, kind.drafter_class)
            if isinstance(cls, type) and cls.__module__.startswith("hf_specdec.kinds.")}


def published_formats() -> list:
    """Every registered kind's readers of other projects' layouts (`hf_specdec.formats`), imported at first use."""
    if not __name__.startswith("hf_specdec."):  # (a custom_generate/ copy decodes its own folder's drafter only)
        return []
    return [resolved(spec) for kind in _registered().values() for spec in kind.formats]


def published_reader() -> Callable | None:
    """`hf_specdec.formats.read_published`, imported by name (so that a custom_generate/ copy, which loads its own
    folder's drafter, carries none of the formats), or None in such a copy."""
    return resolved("hf_specdec.formats:read_published") if __name__.startswith("hf_specdec.") else None


def export_formats() -> dict[str, DrafterKind]:
    """Every export format, and the kind it exports."""
    return {fmt: kind for kind in _registered().values() for fmt in kind.exporters}


def drafter_config(source):
    """A saved drafter's config (a folder or Hub id, of any registered kind, or a causal LM's), read once every kind
    has registered its config class with transformers' `AutoConfig`."""
    from transformers import AutoConfig

    _registered()
    return AutoConfig.from_pretrained(source)


def register_kinds_from(module: str) -> None:
    """Name a module whose import registers kinds, imported at the first lookup: `hf_specdec/__init__.py` names the
    built-in kinds' package so, which keeps `import hf_specdec` light and this module ignorant of every kind."""
    if module not in _PENDING:
        _PENDING.append(module)


def _registered() -> dict[str, DrafterKind]:
    """Every kind: the modules named by `register_kinds_from` imported first (once)."""
    while _PENDING:
        module = _PENDING.pop(0)  # (first: a lookup made while it imports finds it done)
        try:
            importlib.import_module(module)
        except BaseException:
            _PENDING.insert(0, module)
            raise
    return _KINDS


def resolved(spec):
    """A registered callable: itself, or the one its "module:name" (name may be dotted: "Class.method") names."""
    if callable(spec):
        return spec
    module, _, name = spec.partition(":")
    value = importlib.import_module(module)
    for part in name.split("."):
        value = getattr(value, part)
    return value


class _AttributeView:
    """A config.json dict read like a config object (`kind_of` before anything is loaded)."""

    def __init__(self, values: dict):
        self.__dict__.update(values)

    def __getattr__(self, name):
        return None


__all__ = ["DrafterKind", "register_drafter_kind", "drafter_kinds", "loading_kinds", "named_kinds", "kind_of", "kind_of_folder", "kind_of_model",
           "kind_classes", "export_formats", "published_formats", "drafter_config", "resolved", "register_kinds_from"]
