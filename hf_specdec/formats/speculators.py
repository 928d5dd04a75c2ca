"""What speculators' layouts (vllm-project/speculators: `speculators_model_type`, RedHatAI's `*-speculator.*` repos)
share: the drafter's decoder shape in `transformer_layer_config` (a transformers config, written as its difference
from that class's defaults), the verifier it was trained for, and the `speculators_config` block written back."""

from __future__ import annotations

from ..errors import InputError

#: the keys every speculators config.json may hold besides a kind's own (bookkeeping, and training-only flags)
COMMON_KEYS = {"speculators_model_type", "speculators_version", "speculators_config", "architectures", "auto_map",
               "transformer_layer_config", "dtype", "torch_dtype", "transformers_version", "tie_word_embeddings",
               "embed_requires_grad", "_name_or_path"}


def layer_config(config: dict, source: str, model_types: tuple[str, ...]):
    """The drafter layers' transformers config (missing keys: that class's defaults, as speculators reads them)."""
    from transformers import AutoConfig

    values = dict(config.get("transformer_layer_config") or {})
    model_type = values.pop("model_type", "qwen3")
    if model_type not in model_types:
        raise InputError(f"{source}: its layers are {model_type!r}; hf_specdec reads speculators drafters whose layers "
                         f"are {' or '.join(model_types)}.")
    return AutoConfig.for_model(model_type, **values)


def layer_fields(layers) -> dict:
    """A drafter config's Llama-layer fields (`LlamaLayerConfig`) from the layers' transformers config."""
    heads = layers.num_attention_heads
    rope = dict(getattr(layers, "rope_parameters", None) or {})
    if rope and "rope_type" not in rope:  # per layer type: the sliding layers' (speculators' choice)
        rope = rope.get("sliding_attention") or next(iter(rope.values()))
    return dict(vocab_size=layers.vocab_size, hidden_size=layers.hidden_size, intermediate_size=layers.intermediate_size,
                num_attention_heads=heads, num_key_value_heads=getattr(layers, "num_key_value_heads", None) or heads,
                head_dim=getattr(layers, "head_dim", None) or layers.hidden_size // heads, hidden_act=layers.hidden_act,
                max_position_embeddings=layers.max_position_embeddings, rms_norm_eps=layers.rms_norm_eps,
                rope_parameters=rope or None, attention_bias=bool(getattr(layers, "attention_bias", False)),
                mlp_bias=bool(getattr(layers, "mlp_bias", False)))


def attention_windows(layers) -> list | None:
    """Per drafter layer, the sliding window it attends over (None: full attention), or None if all are full."""
    types = getattr(layers, "layer_types", None) or []
    window = getattr(layers, "sliding_window", None)
    windows = [window if kind == "sliding_attention" else None for kind in types]
    return windows if any(w is not None for w in windows) else None


def verifier_name(config: dict) -> str | None:
    return ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")


def speculative_tokens(config: dict, default: int) -> int:
    methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    return int(methods[0].get("speculative_tokens") or default)


def refuse_unknown(config: dict, known: set, source: str) -> None:
    """Refuse, by name, a flag this reading does not know, set to anything but off (it would change the math)."""
    unknown = sorted(k for k, v in config.items() if k not in known | COMMON_KEYS and v not in (None, False, 0, [], {}))
    if unknown:
        raise InputError(f"{source}: speculators flags hf_specdec does not implement: {', '.join(unknown)} (a newer "
                         "speculators release?); it cannot draft as that checkpoint was trained to.")


def speculators_block(algorithm: str, tokens: int, verifier: str | None, architectures: list | None,
                      original: dict | None = None) -> dict:
    """`speculators_config`: the original's if it had one (its verifier and proposal methods kept), else a greedy
    proposal of `tokens` for this verifier."""
    if original and original.get("speculators_config"):
        return original["speculators_config"]
    return {"algorithm": algorithm, "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": tokens, "verifier_accept_k": 1,
                                  "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier, "architectures": list(architectures or [])}}


def transformer_layer_config(config, num_layers: int, windows=None) -> dict:
    """The drafter layers as speculators writes them: a Llama (or, with q/k norms, Qwen3) config's values."""
    values = dict(model_type="qwen3" if getattr(config, "qk_norm", False) else "llama", vocab_size=config.vocab_size,
                  hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                  num_hidden_layers=num_layers, num_attention_heads=config.num_attention_heads,
                  num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim, hidden_act=config.hidden_act,
                  max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.rms_norm_eps,
                  rope_parameters=config.rope_parameters, attention_bias=config.attention_bias,
                  tie_word_embeddings=False)
    if values["model_type"] == "llama":
        values["mlp_bias"] = config.mlp_bias
    if windows and any(w is not None for w in windows):
        values["sliding_window"] = next(w for w in windows if w is not None)
        values["layer_types"] = ["sliding_attention" if w is not None else "full_attention" for w in windows]
    return values


__all__ = ["layer_config", "layer_fields", "attention_windows", "verifier_name", "speculative_tokens", "refuse_unknown",
           "speculators_block", "transformer_layer_config", "COMMON_KEYS"]
