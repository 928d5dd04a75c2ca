"""The fields drafter configs share: what every drafter records about its target and training (`DrafterConfig`), and
the shape of a Llama decoder layer for those built from one (`LlamaLayerConfig`)."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig
from transformers.modeling_rope_utils import RopeParameters


@strict
class DrafterConfig(PreTrainedConfig):
    r"""save_dtype: dtype of the weights on disk ("float16" halves the file; weights are cast back on load).
    target_name_or_path / target_quantization: the target this drafter was trained for, as deployed ("none", "8bit" or
    "4bit" bitsandbytes). num_draft_tokens_eval: the draft length k of the acceptance figures in `measured`.
    training: how it was trained (data, loss, steps, command...). measured: what the evaluation measured.
    published: for a drafter read from another project's layout (`hf_specdec.formats`), that layout's name and its
    original config.json, so that it saves in that layout again."""

    save_dtype: str | None = "float16"
    target_name_or_path: str | None = None
    target_quantization: str | None = "none"
    num_draft_tokens_eval: int = 5
    training: dict | None = None
    measured: dict | None = None
    published: dict | None = None


@strict
class LlamaLayerConfig(DrafterConfig):
    r"""A drafter made of Llama decoder layers: their shape. vocab_size is the TARGET's full vocabulary (a drafter
    proposes target token ids)."""

    vocab_size: int = 49152
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_hidden_layers: int = 2
    num_attention_heads: int = 9
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-5
    rope_parameters: RopeParameters | dict | None = None
    attention_bias: bool = False
    attention_dropout: float | int = 0.0
    mlp_bias: bool = False
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        super().__post_init__(**kwargs)


__all__ = ["DrafterConfig", "LlamaLayerConfig"]
