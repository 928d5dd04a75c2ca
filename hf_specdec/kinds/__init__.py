"""The built-in drafter kinds: their lines in the registry (`hf_specdec/registry.py`), and the kinds that load a
model, one folder each.

A kind's folder, `kinds/<kind>/` (as peft keeps one per method), holds `options.py` (its options: trainer flags,
config fields, drafter keywords, a name's ':arg'), `model.py` (its config and model), `drafter.py` (how it decodes),
`training.py` (its training adapter) and `formats.py` (other projects' layouts of its drafters: vLLM's, speculators',
SafeAILab's..., read and written: `hf_specdec/formats/`). Importing this package registers them (and their configs
with transformers' Auto classes); the registry imports it at its first lookup (`hf_specdec/__init__.py` names it so).
The kinds built from a name alone have no folder: their drafters are in `hf_specdec/drafters/` (n-gram lookup, suffix
decoding, token recycling) or are draft models cut from the target (`draft_model/`: "self", "layers:N").
"""

from __future__ import annotations

from transformers import AutoModelForCausalLM

from ..registry import DrafterKind, register_drafter_kind
from .block import BlockDrafter, BlockDrafterConfig, BlockDrafterModel, BlockOptions
from .draft_model import (DraftModelDrafter, LayersOptions, SelfOptions, SpecDrafterConfig, SpecDrafterForCausalLM,
                          TokenOptions)
from .eagle import EagleDrafter, EagleOptions
from .eagle3 import Eagle3Config, Eagle3DraftModel, Eagle3Drafter, Eagle3Options
from .medusa import MedusaConfig, MedusaDrafter, MedusaHeads, MedusaOptions

# the kinds built from a name alone, one line each
_DRAFTERS = "hf_specdec.drafters"
register_drafter_kind(DrafterKind("ngram", build=f"{_DRAFTERS}.ngram:NgramDrafter.for_target",
                                  description="n-gram lookup over the prompt and the output so far"))
register_drafter_kind(DrafterKind("suffix", build=f"{_DRAFTERS}.suffix:SuffixDrafter.for_target",
                                  description="suffix decoding: what followed the text's suffix in earlier calls (kept "
                                              "with the target) and in this one"))
register_drafter_kind(DrafterKind("recycle", build=f"{_DRAFTERS}.recycle:RecycleDrafter.for_target",
                                  description="token recycling: the target's own top-k successors"))
register_drafter_kind(DrafterKind("none", build=f"{_DRAFTERS}.plain:PlainDrafter.for_target",
                                  description="no drafts: plain steps through hf_specdec's loop"))
register_drafter_kind(DrafterKind("self", options=SelfOptions, description="the target's own first N layers (default: half)",
                                  build=f"{__name__}.draft_model.self_speculative:SelfSpeculativeDrafter.for_target"))
register_drafter_kind(DrafterKind("layers", options=LayersOptions, description="an untrained draft model cut from the first N layers",
                                  build=f"{__name__}.draft_model.drafter:DraftModelDrafter.for_target"))

# one line a kind: its folder holds the config, model, drafter, options, exporter and training adapter named here
register_drafter_kind(DrafterKind(
    "draft-model", SpecDrafterConfig, SpecDrafterForCausalLM, DraftModelDrafter, options=TokenOptions,
    matches=lambda config: not config.target_feature_input, exporters={"vllm-draft": f"{__name__}.draft_model.formats:export_vllm_draft"},
    training=f"{__name__}.draft_model.training:TokenTraining", description="a token-only drafter that borrows the target's embeddings"))
register_drafter_kind(DrafterKind(
    "eagle", SpecDrafterConfig, SpecDrafterForCausalLM, EagleDrafter, options=EagleOptions,
    matches=lambda config: bool(config.target_feature_input), exporters={"vllm-eagle": f"{__name__}.eagle.formats:SAFEAILAB.write"},
    formats=(f"{__name__}.eagle.formats:SAFEAILAB",),
    training=f"{__name__}.eagle.training:EagleTraining", description="an EAGLE-style drafter reading the target's hidden states"))
_EAGLE3 = f"{__name__}.eagle3.formats"
register_drafter_kind(DrafterKind(
    "eagle3", Eagle3Config, Eagle3DraftModel, Eagle3Drafter, options=Eagle3Options,
    exporters={"vllm-eagle3": f"{_EAGLE3}:LLAMA.write", "speculators": f"{_EAGLE3}:SPECULATORS.write"},
    formats=(f"{_EAGLE3}:SPECULATORS", f"{_EAGLE3}:LLAMA"), training=f"{__name__}.eagle3.training:Eagle3Training",
    description="an EAGLE-3-style drafter fusing the target's low, middle and high layers"))
register_drafter_kind(DrafterKind(
    "medusa", MedusaConfig, MedusaHeads, MedusaDrafter, options=MedusaOptions, exporters={"vllm-medusa": f"{__name__}.medusa.formats:VLLM.write", "medusa": f"{__name__}.medusa.formats:MEDUSA.write"},
    formats=(f"{__name__}.medusa.formats:MEDUSA",),
    training=f"{__name__}.medusa.training:MedusaTraining", description="Medusa heads on the target's final hidden state"))
register_drafter_kind(DrafterKind(
    "block", BlockDrafterConfig, BlockDrafterModel, BlockDrafter, options=BlockOptions, training=f"{__name__}.block.training:BlockTraining",
    formats=(f"{__name__}.block.formats:SPECULATORS",), exporters={"speculators": f"{__name__}.block.formats:SPECULATORS.write"},
    description="a block drafter: one forward proposes several tokens, reading the target's fused layer states"))
register_drafter_kind(DrafterKind(
    "causal-lm", None, AutoModelForCausalLM, DraftModelDrafter, training=f"{__name__}.draft_model.training:CausalLMTraining",
    description="a causal LM with the target's vocabulary (transformers' AutoModelForCausalLM)", tag="draft-model"))
# the drafters transformers ships (MTP layers, DFlash, Gemma 4 assistants), where the installed release has them (5.25 does)
try:
    from transformers.modeling_layers import MtpModel

    from .mtp import MtpDrafter
except ImportError:
    pass
else:
    register_drafter_kind(DrafterKind(
        "mtp", None, MtpModel, MtpDrafter, by_class=True, build=MtpDrafter.for_target,
        description="the target's own multi-token-prediction layers (DeepSeek-V3, GLM-4-MoE, ...: transformers' use_mtp=True)"))
try:
    from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    from .dflash import DFlashDrafter, DFlashOptions
except ImportError:
    pass
else:
    register_drafter_kind(DrafterKind(
        "dflash", MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel, DFlashDrafter, options=DFlashOptions,
        training=f"{__name__}.dflash.training:DFlashTraining", formats=(f"{__name__}.dflash.formats:SPECULATORS",),
        exporters={"speculators": f"{__name__}.dflash.formats:SPECULATORS.write"},
        description="a DFlash block drafter: one forward fills a block from the target's states at several layers "
                    "(transformers' speculation_type='dflash')"))
try:
    from transformers.models.gemma4_assistant import Gemma4AssistantConfig, Gemma4AssistantForCausalLM
    from transformers.models.gemma4_unified_assistant import Gemma4UnifiedAssistantConfig, Gemma4UnifiedAssistantForCausalLM

    from .gemma4_assistant import Gemma4AssistantDrafter
except ImportError:
    pass
else:
    for config_class, model_class in ((Gemma4AssistantConfig, Gemma4AssistantForCausalLM),
                                      (Gemma4UnifiedAssistantConfig, Gemma4UnifiedAssistantForCausalLM)):
        register_drafter_kind(DrafterKind(
            config_class.model_type.replace("_", "-"), config_class, model_class, Gemma4AssistantDrafter,
            training=f"{__name__}.gemma4_assistant.training:Gemma4AssistantTraining",
            description="a Gemma 4 assistant: drafts from its Gemma 4 target's final state and stored K/V"))
