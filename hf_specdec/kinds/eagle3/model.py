"""An EAGLE-3-style drafter: one decoder layer reading the target's low, middle and high hidden states.

At each position j the drafter gets the token t_j and the hidden states the target computed at j - 1 entering three of
its layers (`target_layer_ids`, by default 2, N/2 and N - 3 of N: the layout vLLM and SGLang read), fused to the
hidden size by `fc`. Its one layer attends over `[norm(embedding(t_j)) ; norm(fused)]` (twice the hidden width),
with the fused state as the residual; the layer's output goes through a final norm into its own LM head over a reduced
draft vocabulary (`draft_vocab_size` rows, initialised from the target's, mapped to target ids by `d2t`). While
drafting ahead it has no target states for its own tokens, so it feeds back its layer's output (before the norm) in
place of the fused state, which is how training-time test trains it (`training.py` beside this file).

The input embeddings are the target's, borrowed at run time (`bind_target`) and never saved, so a drafter for
SmolLM2-135M is about 10M parameters (19 MB in fp16).

The drafters others publish in this family (speculators' EAGLE-3, SafeAILab's and SpecForge's; `formats.py` beside
this file reads them) vary it, each variant a config field: any number of target layers (0 is the embeddings' output),
a norm over the fused states before `fc` (`fc_input_norm`), the normed state as the residual
(`norm_before_residual`), the normed output fed back (`feed_back_normed`), no final norm before the LM head
(`norm_before_head=False`), embeddings of its own (`own_embeddings`), Qwen3-style per-head q/k norms (`qk_norm`),
further plain decoder layers after the first (`num_hidden_layers`), and sliding-window layers (`attention_windows`).

    drafter = AutoDrafter.from_pretrained("runs/eagle3", target=target)
    target.generate(**inputs, custom_generate=hf_specdec.speculative_generate, assistant=drafter)
"""

from __future__ import annotations

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import DynamicCache, PreTrainedModel
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.llama.modeling_llama import (LlamaAttention, LlamaDecoderLayer, LlamaMLP, LlamaRMSNorm,
                                                      LlamaRotaryEmbedding)
from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3DecoderLayer

from ...cache.keyword import CACHE
from ...models.borrowed import NOT_BOUND, BorrowedEmbedding, BorrowsFromTarget, TargetLink, TargetNotBoundError
from ...models.config import LlamaLayerConfig
from ...models.saving import DrafterSaving
from ..draft_model.model import drafter_config_from_target

MODEL_TYPE = "hf_specdec_eagle3"


def default_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's low, middle and high layers (2, N/2, N - 3), kept inside 1..N for shallow targets."""
    return [min(max(i, 1), num_layers) for i in (2, num_layers // 2, num_layers - 3)]


@strict
class Eagle3Config(LlamaLayerConfig):
    r"""vocab_size: the TARGET's vocabulary; draft_vocab_size: the rows of the drafter's own LM head.
    target_layer_ids: the target layers whose INPUT hidden states are fused (i in 0..N: 0 is the embeddings' output,
    i = N the last layer's output before the final norm; three for the drafters hf_specdec trains).
    target_hidden_size: their width. The rest is a Llama layer's shape and what every drafter records
    (`LlamaLayerConfig`), and the published variants (the module docstring):
    fc_input_norm: None, "joint" (one RMSNorm over the concatenated states) or "per_layer" (one per target layer).
    norm_before_residual: the first layer adds to the normed fused state, not the raw one.
    feed_back_normed: drafting ahead feeds back the final norm's output, not the last layer's.
    norm_before_head: the final norm runs before the LM head (False: the head reads the last layer's output).
    own_embeddings: the drafter has input embeddings of its own (saved), instead of borrowing the target's.
    qk_norm: Qwen3-style RMSNorm of each head's queries and keys. attention_windows: per drafter layer, the sliding
    window it attends over (None: all of it)."""

    model_type = MODEL_TYPE

    draft_vocab_size: int = 8192
    target_hidden_size: int | None = None
    target_layer_ids: list[int] | None = None
    num_hidden_layers: int = 1  # the first (fusing) layer, then plain decoder layers
    fc_input_norm: str | None = None
    norm_before_residual: bool = False
    feed_back_normed: bool = False
    norm_before_head: bool = True
    own_embeddings: bool = False
    qk_norm: bool = False
    attention_windows: list[int | None] | None = None

    def __post_init__(self, **kwargs):
        if self.target_hidden_size is None:
            self.target_hidden_size = self.hidden_size
        if self.target_layer_ids is None:
            self.target_layer_ids = default_layer_ids(32)
        if not self.target_layer_ids or min(self.target_layer_ids) < 0:
            raise ValueError(f"target_layer_ids must be target layers in 0..N (got {self.target_layer_ids}).")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size must be in 1..vocab_size={self.vocab_size}.")
        if self.fc_input_norm not in (None, "joint", "per_layer"):
            raise ValueError(f"fc_input_norm must be None, 'joint' or 'per_layer' (got {self.fc_input_norm!r}).")
        if self.attention_windows is not None and len(self.attention_windows) != self.num_hidden_layers:
            raise ValueError(f"attention_windows needs one entry per drafter layer ({self.num_hidden_layers}).")
        super().__post_init__(**kwargs)

    @classmethod
    def from_target(cls, target_config, draft_vocab_size: int = 8192, target_layer_ids=None, **kwargs) -> "Eagle3Config":
        """The target's width, heads, RoPE and vocabulary; its low, middle and high layers unless `target_layer_ids`."""
        text = target_config.get_text_config()
        base = drafter_config_from_target(target_config, num_hidden_layers=1).to_dict()
        keep = {k: base[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                                     "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                                     "rope_parameters", "attention_bias", "mlp_bias", "pad_token_id", "bos_token_id",
                                     "eos_token_id", "vocab_size")}
        ids = list(target_layer_ids) if target_layer_ids else default_layer_ids(text.num_hidden_layers)
        if max(ids) > text.num_hidden_layers:
            raise ValueError(f"target_layer_ids {ids}: the target has {text.num_hidden_layers} layers.")
        size = draft_vocab_size or text.vocab_size
        overrides = {k: v for k, v in kwargs.items() if v is not None}  # e.g. intermediate_size
        return cls(**{**keep, "target_hidden_size": text.hidden_size, "target_layer_ids": ids, "draft_vocab_size": size,
                      **overrides})


class Eagle3Layer(nn.Module):
    """A Llama (or, with `qk_norm`, Qwen3) layer whose attention reads `[norm(embedding) ; norm(hidden)]`
    (2 x hidden) and adds to `hidden` (or to `norm(hidden)`: `norm_before_residual`)."""

    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.norm_before_residual = config.norm_before_residual
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = (Qwen3Attention if config.qk_norm else LlamaAttention)(config, layer_idx=0)
        heads, kv, width = config.num_attention_heads, config.num_key_value_heads, 2 * config.hidden_size
        for name, rows in (("q_proj", heads), ("k_proj", kv), ("v_proj", kv)):
            setattr(self.self_attn, name, nn.Linear(width, rows * config.head_dim, bias=config.attention_bias))
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, embeds, hidden, **attention_kwargs) -> torch.Tensor:
        normed = self.hidden_norm(hidden)
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        hidden = (normed if self.norm_before_residual else hidden) + self.self_attn(x, **attention_kwargs)[0]
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class StateNorm(nn.Module):
    """The norm over the concatenated target states before `fc`: one over all of them ("joint", weight
    [n x target hidden]) or one per target layer ("per_layer", `layers.i.weight` [target hidden])."""

    def __init__(self, config: Eagle3Config):
        super().__init__()
        width, count = config.target_hidden_size, len(config.target_layer_ids)
        self.joint = config.fc_input_norm == "joint"
        sizes = [width * count] if self.joint else [width] * count
        self.norms = nn.ModuleList(LlamaRMSNorm(size, eps=config.rms_norm_eps) for size in sizes)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        chunks = states.split(self.norms[0].weight.shape[0], dim=-1)
        return torch.cat([norm(chunk) for norm, chunk in zip(self.norms, chunks)], dim=-1)


class Eagle3DraftModel(DrafterSaving, BorrowsFromTarget, PreTrainedModel):
    """The drafter (see the module docstring). `forward(input_ids, target_features=...)` takes per position the fused
    target state (`fuse(target_states)`) or its own previous output, and returns logits and its new hidden states."""

    config: Eagle3Config
    config_class = Eagle3Config
    base_model_prefix = "eagle3"
    _no_split_modules = ["Eagle3Layer"]
    _supports_sdpa = True
    _supports_attention_backend = True

    def __init__(self, config: Eagle3Config):
        super().__init__(config)
        self.embed_tokens = (nn.Embedding(config.vocab_size, config.hidden_size) if config.own_embeddings
                             else BorrowedEmbedding())
        self.state_norm = StateNorm(config) if config.fc_input_norm else None
        self.fc = nn.Linear(len(config.target_layer_ids) * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(config)
        layer = Qwen3DecoderLayer if config.qk_norm else LlamaDecoderLayer
        self.more_layers = nn.ModuleList(layer(config, i) for i in range(1, config.num_hidden_layers))
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        # the target id of draft row i is i + d2t[i] (the serving engines' map); draft_vocab = arange + d2t
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.post_init()

    # --- the target ---
    def bind_target(self, target: PreTrainedModel) -> "Eagle3DraftModel":
        """Borrow `target`'s input embeddings (shared, not copied; a drafter with embeddings of its own only checks the
        shapes). Idempotent; returns self."""
        if self.is_bound and self.__dict__["_target"].target is target:
            return self
        text = target.config.get_text_config()
        if text.vocab_size != self.config.vocab_size or text.hidden_size != self.config.target_hidden_size:
            raise ValueError(f"This drafter was trained for a target with a {self.config.vocab_size}-token vocabulary and "
                             f"hidden size {self.config.target_hidden_size} ({self.config.target_name_or_path!r}); this "
                             f"target has {text.vocab_size} and {text.hidden_size}.")
        if text.num_hidden_layers < max(self.config.target_layer_ids):
            raise ValueError(f"This drafter reads target layers {self.config.target_layer_ids}; the target has only "
                             f"{text.num_hidden_layers}.")
        link = TargetLink(target)
        if isinstance(self.embed_tokens, BorrowedEmbedding):
            self.embed_tokens.link = link
        self.__dict__["_target"] = link  # (outside the module tree: shared by copies, never pickled)
        return self

    @property
    def is_bound(self) -> bool:
        return self.__dict__.get("_target") is not None

    def get_input_embeddings(self):
        return self.embed_tokens

    @property
    def draft_vocab(self) -> torch.Tensor:
        """Target ids of the draft vocabulary's rows (sorted)."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def set_draft_vocab(self, token_ids, target: PreTrainedModel | None = None) -> None:
        """Draft over these target ids (sorted, `draft_vocab_size` of them); with `target`, start the LM head from
        the target's rows for them."""
        ids = torch.as_tensor(token_ids, dtype=torch.long).unique()
        if ids.numel() != self.config.draft_vocab_size or int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size:
            raise ValueError(f"Expected {self.config.draft_vocab_size} distinct ids in [0, {self.config.vocab_size}).")
        with torch.no_grad():
            self.d2t.copy_(ids.to(self.d2t.device) - torch.arange(len(ids), device=self.d2t.device))
            if target is not None:
                rows = target.get_output_embeddings().weight.detach()[ids.to(target.device)]
                self.lm_head.weight.copy_(rows.to(self.lm_head.weight))

    def fuse(self, target_states: torch.Tensor) -> torch.Tensor:
        """[..., n x target hidden] (the layers' states, concatenated in `target_layer_ids` order) -> [..., hidden]."""
        states = target_states.to(self.fc.weight.dtype)
        return self.fc(states if self.state_norm is None else self.state_norm(states))

    # --- forward ---
    def forward(self, input_ids, target_features, attention_mask=None, position_ids=None, cache=None, use_cache=None,
                logits_to_keep: int | torch.Tensor = 0, full_vocab_logits: bool = True, inputs_embeds=None,
                **kwargs) -> CausalLMOutputWithPast:
        """`target_features` [B, L, hidden]: per position the fused target state before it (`fuse(...)`), or the
        drafter's own output there. Returns logits over the target's vocabulary (-inf outside the draft vocabulary), or over the draft
        vocabulary (`full_vocab_logits=False`, what training uses), and in `hidden_states[0]` the layer's output at
        every position (what drafting ahead feeds back). `logits_to_keep` may be a [B, L] bool mask; `inputs_embeds`
        replaces the token embeddings (a block drafter's mask positions)."""
        if not self.is_bound:
            raise TargetNotBoundError(NOT_BOUND.replace("SpecDrafterForCausalLM", "Eagle3DraftModel"))
        for unused in ("output_attentions", "output_hidden_states", "return_dict"):
            kwargs.pop(unused, None)
        embeds = (self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds).to(self.fc.weight.dtype)
        hidden = target_features.to(embeds.dtype)
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        if position_ids is None:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(past, past + hidden.shape[1], device=hidden.device)[None]
        windows = self.config.attention_windows or [None] * self.config.num_hidden_layers
        masks = {window: self.attention_mask(window, hidden, attention_mask, cache, position_ids) for window in set(windows)}
        attention = dict(position_ids=position_ids, position_embeddings=self.rotary_emb(hidden, position_ids=position_ids),
                         **{CACHE: cache}, **kwargs)
        out = self.midlayer(embeds, hidden, attention_mask=masks[windows[0]], **attention)
        for layer, window in zip(self.more_layers, windows[1:]):
            out = layer(out, attention_mask=masks[window], use_cache=use_cache, **attention)
        kept = out
        if isinstance(logits_to_keep, int):
            kept = out[:, -logits_to_keep:] if logits_to_keep else out
        elif logits_to_keep.dtype == torch.bool and logits_to_keep.dim() == 2:
            kept = out[logits_to_keep]
        logits = self.lm_head(self.head_input(kept))
        if full_vocab_logits:
            full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
            logits = full.index_copy_(-1, self.draft_vocab, logits)
        fed_back = self.norm(out) if self.config.feed_back_normed else out
        return CausalLMOutputWithPast(logits=logits, **{CACHE: cache}, hidden_states=(fed_back,))

    def head_input(self, out: torch.Tensor) -> torch.Tensor:
        """What the LM head reads of the last layer's output: its final norm (unless `norm_before_head=False`)."""
        return self.norm(out) if self.config.norm_before_head else out

    def attention_mask(self, window, hidden, attention_mask, cache, position_ids):
        """The 4-D mask of the layers attending over `window` tokens (None: all): causal over the cache's slots and
        the new ones, without the holes a 2-D `attention_mask` marks; a 4-D one is taken as it is (training's)."""
        if attention_mask is not None and attention_mask.dim() == 4:
            return attention_mask
        past = cache.get_seq_length() if cache is not None else 0
        if window is None or past + hidden.shape[1] <= window:  # (nothing is that far back)
            return create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask,
                                      **{CACHE: cache}, position_ids=position_ids)
        batch, width, device = hidden.shape[0], past + hidden.shape[1], hidden.device
        slots = (torch.ones(batch, width, dtype=torch.bool, device=device) if attention_mask is None
                 else attention_mask.bool())
        key_positions = slots.long().cumsum(-1) - 1  # a row's real tokens sit in its slots in order
        query_slots = torch.arange(past, width, device=device)[:, None]
        key_slots = torch.arange(width, device=device)[None]
        # causal by slot, within the window by position (holes do not count), each slot seeing itself (padding too)
        allowed = (slots[:, None] & (key_slots <= query_slots)
                   & (position_ids.expand(batch, -1)[:, :, None] - key_positions[:, None] < window)) | (key_slots == query_slots)
        return allowed[:, None]

    def _supports_logits_to_keep(self) -> bool:  # what the decoding loop asks of a causal LM
        return True


__all__ = ["Eagle3Config", "Eagle3DraftModel", "default_layer_ids"]
