"""A small drafter that borrows its target's input embeddings and LM head.

`SpecDrafterForCausalLM` is a few Llama decoder layers plus a final norm. Its token embeddings and output head are the
TARGET's own modules, bound at run time with `bind_target(target)` (shared tensors, never copied into the drafter's
state dict, never saved), so a drafter for SmolLM2-135M is a ~15 MB file instead of a copy of the 28M-parameter
embedding matrix.

Reduced output vocabulary (FR-Spec style): with `draft_vocab_size=N` the drafter keeps a `draft_vocab` buffer, the ids
of the N target tokens it may propose (the most frequent ones in its training data), and computes logits only for
those rows of the target's LM head: on a CPU the 49152-row head is most of a small drafter's cost. `forward` still
returns FULL-vocabulary logits, -inf outside the subset, so `DraftModelDrafter`, greedy and sampling stay exact: the
target verifies every token, a drafter only decides how many are accepted.

    drafter = hf_specdec.AutoDrafter.from_pretrained("path/to/drafter")  # (AutoModelForCausalLM loads it too, once
                                                                         #  any hf_specdec name has been used)
    target.generate(**inputs, custom_generate=hf_specdec.speculative_generate, assistant=drafter, do_sample=False)

`speculative_generate` binds the drafter to the target it decodes with; call `drafter.bind_target(target)` yourself
to use the drafter on its own (training, `drafter.generate()`).
"""

from __future__ import annotations

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import DynamicCache, GenerationMixin, PreTrainedModel
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding
from transformers.utils.deprecation import deprecate_kwarg

from ...cache.keyword import CACHE
from ...models.borrowed import NOT_BOUND, BorrowedEmbedding, BorrowedLMHead, BorrowsFromTarget, TargetLink, TargetNotBoundError
from ...models.config import LlamaLayerConfig
from ...models.saving import DrafterSaving

MODEL_TYPE = "hf_specdec_drafter"


@strict
class SpecDrafterConfig(LlamaLayerConfig):
    r"""Configuration of a `SpecDrafterForCausalLM` (a few Llama layers), plus what the drafter is for (`DrafterConfig`).

    draft_vocab_size: size of the reduced output vocabulary (0 or None: the full vocabulary).
    target_feature_input: EAGLE-style drafter: each position's input is its token embedding fused with the TARGET's
        final hidden state at the previous position (`target_features`); while drafting ahead the drafter feeds its
        own output hidden state instead. `hf_specdec.drafters.EagleDrafter` runs such drafters.
    fuse_bias, first_input_norm, final_norm, own_embeddings: the layout of SafeAILab's EAGLE-1/2 drafters, which
        `kinds/eagle/formats.py` reads (a bias on the fusing layer, no input norm on the first layer, no final norm,
        embeddings of their own); hf_specdec's own have no bias, both norms, and borrow the target's embeddings.
    """

    model_type = MODEL_TYPE

    draft_vocab_size: int | None = 0
    target_feature_input: bool = False
    fuse_bias: bool = False
    first_input_norm: bool = True
    final_norm: bool = True
    own_embeddings: bool = False

    def __post_init__(self, **kwargs):
        if self.draft_vocab_size and not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size must be in 1..vocab_size={self.vocab_size} (or 0 for the full vocabulary).")
        super().__post_init__(**kwargs)


class SpecDrafterPreTrainedModel(DrafterSaving, PreTrainedModel):
    config: SpecDrafterConfig
    config_class = SpecDrafterConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LlamaDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True


class SpecDrafterModel(SpecDrafterPreTrainedModel):
    """The decoder stack: borrowed embeddings -> Llama decoder layers -> own final norm."""

    def __init__(self, config: SpecDrafterConfig):
        super().__init__(config)
        self.embed_tokens = (nn.Embedding(config.vocab_size, config.hidden_size) if config.own_embeddings
                             else BorrowedEmbedding())
        # EAGLE-style: [token embedding ; target feature of the previous position] -> hidden size
        self.fuse = (nn.Linear(2 * config.hidden_size, config.hidden_size, bias=config.fuse_bias)
                     if config.target_feature_input else None)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        if not config.first_input_norm:  # (SafeAILab's EAGLE: the fused input goes into attention as it is)
            self.layers[0].input_layernorm = nn.Identity()
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps) if config.final_norm else nn.Identity()
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                use_cache=None, target_features=None, **kwargs) -> torch.Tensor:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        hidden = inputs_embeds.to(self.layers[0].mlp.down_proj.weight.dtype)
        if self.fuse is not None:
            if target_features is None or target_features.shape[:-1] != hidden.shape[:-1]:
                raise ValueError(
                    "This drafter is feature-conditioned (config.target_feature_input): pass `target_features` "
                    "[batch, length, hidden], the target's final hidden state at each previous position; "
                    "`speculative_generate` does this for you."
                )
            hidden = self.fuse(torch.cat([hidden, target_features.to(hidden.dtype)], dim=-1))
        elif target_features is not None:
            raise ValueError("target_features given to a drafter without config.target_feature_input.")
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        if position_ids is None:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(past, past + hidden.shape[1], device=hidden.device)[None]
        mask = create_causal_mask(
            config=self.config, inputs_embeds=hidden, attention_mask=attention_mask, **{CACHE: cache},
            position_ids=position_ids,
        )
        position_embeddings = self.rotary_emb(hidden, position_ids=position_ids)
        for layer in self.layers:
            hidden = layer(
                hidden, attention_mask=mask, position_embeddings=position_embeddings, position_ids=position_ids,
                **{CACHE: cache}, use_cache=use_cache, **kwargs,
            )
        return self.norm(hidden), cache


class SpecDrafterForCausalLM(SpecDrafterPreTrainedModel, BorrowsFromTarget, GenerationMixin):
    """A small Llama-style drafter whose input embeddings and LM head are its target's (see the module docstring)."""

    def __init__(self, config: SpecDrafterConfig):
        super().__init__(config)
        self.model = SpecDrafterModel(config)
        self.lm_head = BorrowedLMHead(config)
        self.post_init()

    # --- the target's modules ---
    def bind_target(self, target: PreTrainedModel) -> "SpecDrafterForCausalLM":
        """Borrow `target`'s input embeddings and LM head (shared, not copied). Idempotent; returns self."""
        link = self.lm_head.link
        if link is not None and link.target is target:
            return self
        text = target.config.get_text_config()
        if text.vocab_size != self.config.vocab_size:
            raise ValueError(
                f"This drafter proposes ids of a {self.config.vocab_size}-token vocabulary but the target has "
                f"{text.vocab_size}: it was trained for another target ({self.config.target_name_or_path!r})."
            )
        embed = self.model.embed_tokens if self.config.own_embeddings else target.get_input_embeddings()
        head = target.get_output_embeddings()
        if embed is None or head is None or getattr(head, "weight", None) is None:
            raise ValueError(f"The target {type(target).__name__} exposes no input embeddings / LM head to borrow.")
        if not head.weight.is_floating_point():
            raise ValueError("The target's LM head is quantized; keep it in floating point (bitsandbytes skips it by default).")
        hidden = self.config.hidden_size
        if head.weight.shape[-1] != hidden or embed.weight.shape[-1] != hidden:
            raise ValueError(
                f"The drafter's hidden size is {hidden} but the target's embeddings / LM head have width "
                f"{embed.weight.shape[-1]} / {head.weight.shape[-1]}: it was trained for another target "
                f"({self.config.target_name_or_path!r})."
            )
        if head.weight.shape[0] < self.config.vocab_size:
            raise ValueError(f"The target's LM head has {head.weight.shape[0]} rows, fewer than its vocabulary.")
        link = TargetLink(target)
        if isinstance(self.model.embed_tokens, BorrowedEmbedding):
            self.model.embed_tokens.link = link
        self.lm_head.link = link
        self.lm_head._rows = None
        return self

    @property
    def is_bound(self) -> bool:
        return self.lm_head.link is not None

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    @property
    def draft_vocab(self) -> torch.Tensor | None:
        """Ids of the target tokens the drafter may propose (None: all of them)."""
        return self.lm_head.draft_vocab

    def set_draft_vocab(self, token_ids) -> None:
        """Set the reduced output vocabulary (ids are sorted; their number must equal `config.draft_vocab_size`)."""
        ids = torch.as_tensor(token_ids, dtype=torch.long).unique()  # sorted, distinct
        if self.lm_head.draft_vocab is None or ids.numel() != self.config.draft_vocab_size:
            raise ValueError(f"Expected {self.config.draft_vocab_size} distinct ids, got {ids.numel()}.")
        if int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size:
            raise ValueError("draft vocabulary ids must lie in [0, vocab_size).")
        self.lm_head.draft_vocab.copy_(ids.to(self.lm_head.draft_vocab.device))
        self.lm_head._rows = None

    # --- forward ---
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache=None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        full_vocab_logits: bool = True,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """As `LlamaForCausalLM.forward`, plus: `full_vocab_logits=False` returns only the draft-vocabulary columns
        (in `draft_vocab` order), and `logits_to_keep` may be a `[B, L]` bool mask (logits `[N, V]` for its True
        positions, row-major)."""
        if not self.is_bound:
            raise TargetNotBoundError(NOT_BOUND)
        for unused in ("output_attentions", "output_hidden_states", "return_dict"):
            kwargs.pop(unused, None)
        hidden, cache = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
            inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs,
        )
        all_hidden = hidden  # the (normed) output at every position: a feature-conditioned drafter feeds it back
        if isinstance(logits_to_keep, int):
            hidden = hidden[:, -logits_to_keep:] if logits_to_keep else hidden
        elif logits_to_keep.dtype == torch.bool and logits_to_keep.dim() == 2:
            hidden = hidden[logits_to_keep]  # [B, L] mask -> [N, hidden]: only the positions a loss needs
        else:
            hidden = hidden[:, logits_to_keep]
        logits = self.lm_head(hidden, full_vocab=full_vocab_logits)
        loss = None
        if labels is not None:  # plain next-token cross-entropy, over the full vocabulary
            shift = logits[:, :-1].float()
            loss = nn.functional.cross_entropy(shift.reshape(-1, shift.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE: cache}, hidden_states=(all_hidden,))


def drafter_config_from_target(target_config, num_hidden_layers: int = 2, intermediate_size: int | None = None,
                               draft_vocab_size: int = 0, **kwargs) -> SpecDrafterConfig:
    """A drafter config with the target's width, heads, RoPE and vocabulary (Llama-like text configs)."""
    text = target_config.get_text_config()
    rope = getattr(text, "rope_parameters", None)
    if rope is not None and "rope_type" not in rope:  # per-layer-type RoPE: take the full-attention one
        rope = rope.get("full_attention", next(iter(rope.values())))
    heads = text.num_attention_heads
    return SpecDrafterConfig(
        vocab_size=text.vocab_size,
        hidden_size=text.hidden_size,
        intermediate_size=intermediate_size or getattr(text, "intermediate_size", 4 * text.hidden_size),
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=heads,
        num_key_value_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        hidden_act=getattr(text, "hidden_act", "silu"),
        max_position_embeddings=getattr(text, "max_position_embeddings", 8192),
        rms_norm_eps=getattr(text, "rms_norm_eps", 1e-5),
        rope_parameters=dict(rope) if rope else None,
        attention_bias=getattr(text, "attention_bias", False),
        mlp_bias=getattr(text, "mlp_bias", False),
        pad_token_id=text.pad_token_id,
        bos_token_id=text.bos_token_id,
        eos_token_id=text.eos_token_id,
        draft_vocab_size=draft_vocab_size,
        **kwargs,
    )


__all__ = [
    "SpecDrafterConfig",
    "SpecDrafterModel",
    "SpecDrafterForCausalLM",
    "TargetNotBoundError",
    "drafter_config_from_target",
]
