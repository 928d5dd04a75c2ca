"""DFlash drafters in speculators' layout (`speculators_model_type: dflash`), read as transformers' own DFlash
drafters (`MuseGlimmerAssistantModel`) and written back (`hf_specdec.formats`).

The math is transformers' DFlash for full-attention layers: `fc` over the concatenated target states, normed
(`hidden_norm` there, `encoder.output_norm_enc` here), a block `[newest token, MASK x (B - 1)]` attending to that
context and to itself in every Qwen3-style layer, the target's LM head on the masks' outputs. speculators' layer
ids name the state ENTERING a layer (transformers' `hidden_states[i]`); transformers' DFlash names layer i's output
(`hidden_states[i + 1]`): id i here is i - 1 there. Refused by name: the embeddings (id 0) and the last layer's
pre-norm output (id N: transformers' DFlash reads the normed one) as context, a reduced draft vocabulary (DFlash
drafts through the target's whole LM head), `sample_from_anchor` (the anchor's slot drafting too), attention biases,
and sliding-window layers causal inside the block (transformers' are bidirectional there: speculators'
`sliding_window_non_causal: true`, which is read, and written for transformers' sliding layers; their windows count
from the anchor in speculators and from each slot in transformers, which differ only past the window). speculators' `dflash2`, `dspark` and `xpress` add heads no kind here computes: refused.
"""

from __future__ import annotations

from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

from ...errors import InputError
from ...formats import PublishedFormat, speculators
from ..eagle3.formats import renamed, save


class SpeculatorsDFlash(PublishedFormat):
    name, kind, project = "speculators-dflash", "dflash", "speculators (vllm-project/speculators)"
    flags = {"draft_vocab_size", "block_size", "target_hidden_size", "aux_hidden_state_layer_ids", "mask_token_id",
             "sliding_window_non_causal", "sample_from_anchor"}

    def recognises(self, checkpoint) -> bool:
        return checkpoint.config.get("speculators_model_type") == "dflash"

    def read(self, checkpoint, target=None):
        config, source = checkpoint.config, checkpoint.source
        speculators.refuse_unknown(config, self.flags, source)
        layers = speculators.layer_config(config, source, ("qwen3",))
        ids = list(config.get("aux_hidden_state_layer_ids") or [])
        refused = [what for what, present in (
            ("no aux_hidden_state_layer_ids", not ids), ("the embeddings as context (layer id 0)", 0 in ids),
            ("a reduced draft vocabulary", (config.get("draft_vocab_size") or layers.vocab_size) != layers.vocab_size),
            ("sample_from_anchor", config.get("sample_from_anchor")),
            ("sliding-window layers causal inside the block", speculators.attention_windows(layers) is not None
             and not config.get("sliding_window_non_causal")),
            ("attention biases", getattr(layers, "attention_bias", False))) if present]
        if target is not None and max(ids) >= target.config.get_text_config().num_hidden_layers:
            refused.append("the last layer's pre-norm output as context (transformers' DFlash reads the normed one)")
        if refused:
            raise InputError(f"{source}: a speculators DFlash drafter with {'; '.join(refused)}: transformers' DFlash, "
                             "which hf_specdec decodes it as, cannot draft as it was trained to.")
        fields, windows = speculators.layer_fields(layers), speculators.attention_windows(layers)
        windows_size = next((w for w in windows or [] if w), None)
        drafter_config = MuseGlimmerAssistantConfig(
            hidden_size=fields["hidden_size"], intermediate_size=fields["intermediate_size"],
            num_hidden_layers=layers.num_hidden_layers, num_attention_heads=fields["num_attention_heads"],
            num_key_value_heads=fields["num_key_value_heads"], head_dim=fields["head_dim"],
            rms_norm_eps=fields["rms_norm_eps"], rope_parameters=fields["rope_parameters"],
            max_position_embeddings=fields["max_position_embeddings"],
            target_layer_ids=[i - 1 for i in ids], block_size=int(config.get("block_size") or 8),
            mask_token_id=int(config["mask_token_id"]), **({"sliding_window": windows_size} if windows_size else {}),
            layer_types=["sliding_attention" if w else "full_attention" for w in windows or [None] * layers.num_hidden_layers],
            bos_token_id=None, eos_token_id=None, pad_token_id=None)
        state = renamed(checkpoint.tensors(), [("fc.", "encoder.fc."), ("hidden_norm.", "encoder.output_norm_enc.")])
        state = {k: v for k, v in state.items() if k not in ("lm_head.weight", "embed_tokens.weight")}  # the target's
        model = self.built(MuseGlimmerAssistantModel, drafter_config, state, checkpoint)
        model.config.target_name_or_path = speculators.verifier_name(config)
        return model

    def write(self, model: MuseGlimmerAssistantModel, target, out, dtype) -> None:
        c, published = model.config, getattr(model.config, "published", None) or {}
        original = (published.get("config") or {}).get("transformer_layer_config") or {}
        vocab = target.config.get_text_config().vocab_size if target is not None else original.get("vocab_size")
        if vocab is None:
            raise InputError("speculators' DFlash layout records the target's vocabulary: export with --target.")
        tensors = renamed({k: v for k, v in model.state_dict().items()},
                          [("encoder.fc.", "fc."), ("encoder.output_norm_enc.", "hidden_norm.")])
        layers = dict(model_type="qwen3", vocab_size=vocab, hidden_size=c.hidden_size,
                      intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
                      num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                      head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps, rope_parameters=c.rope_parameters,
                      max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=False)
        if any(kind == "sliding_attention" for kind in c.layer_types or []):
            layers.update(sliding_window=c.sliding_window, layer_types=list(c.layer_types))
        config = {"speculators_model_type": "dflash", "architectures": ["DFlashDraftModel"],
                  "draft_vocab_size": vocab, "block_size": c.block_size, "mask_token_id": c.mask_token_id,
                  "aux_hidden_state_layer_ids": [i + 1 for i in c.target_layer_ids], "sample_from_anchor": False,
                  "sliding_window_non_causal": True, "transformer_layer_config": layers,
                  "speculators_config": speculators.speculators_block(
                      "dflash", c.block_size - 1, getattr(c, "target_name_or_path", None),
                      [type(target).__name__] if target is not None else [], published.get("config")),
                  "dtype": str(dtype).removeprefix("torch.")}
        save(out, config, tensors, dtype)


SPECULATORS = SpeculatorsDFlash()

__all__ = ["SPECULATORS", "SpeculatorsDFlash"]
