"""Self-speculation: the target drafts for itself with only its first L decoder layers.

The draft model is the target truncated to layers 0..L-1, followed by the target's own final norm and LM head (an
"early exit"). Nothing is copied and no second model is loaded: the drafter runs the target's base model with its
layer list temporarily cut to the first L layers (`EarlyExitModel`), and is otherwise a `DraftModelDrafter`: a KV cache
of its own (L layers deep) rolled back to the accepted prefix after each step, ragged batches included.

Greedy decoding drafts the early-exit argmax (deterministic: q one-hot); sampling draws from the early-exit
distribution after the same logits processors the target uses and reports it as q, so the rejection rule keeps the
output distributed exactly as the target's. With L = all layers the draft IS the target and every draft is accepted.

Supported targets: the decoder-only architectures listed in `SUPPORTED_MODEL_TYPES` (layers in `model.model.layers`
for Llama/Mistral/Qwen2/Qwen3, in `transformer.h` for GPT-2).

Each call picks one of two modes. KV reuse (`SharedCacheEarlyExit`; batch 1, Llama / Mistral / Qwen2 / Qwen3): the
drafter runs layers 0..L-1 IN the target's own cache, and its `own_verification` hook then runs only layers L.. on the hidden
states the drafter kept (plus layers 0..L-1 for the last draft, which the drafter proposed but never fed). Every
token passes through each layer once, and rejected drafts are cropped from all layers together by the loop's
roll-back. GPT-2 (learned positions are added to the input embeddings, so the hidden states cannot re-enter the
stack), sliding-window attention, padded prompts and batches > 1 (their rows advance unevenly) keep a separate draft
cache (`OwnCacheEarlyExit`).
"""

from __future__ import annotations

import copy
import threading
from types import SimpleNamespace

import torch
from torch import nn
from transformers import PreTrainedModel

from ...cache.keyword import cache_keyword
from ...cache.ragged import has_sliding_window, takes_4d_masks
from ...speed.cpu_matmul import verifying
from ...drafters.base import Drafter, Drafting, share_of_target
from .drafter import DraftModelDrafter

# architectures whose layer-L hidden states can re-enter the stack as `inputs_embeds` (no scaling, RoPE positions)
KV_REUSE_MODEL_TYPES = {"llama", "mistral", "qwen2", "qwen3"}

# model_type -> (attribute of the base model holding the decoder layers)
SUPPORTED_MODEL_TYPES = {
    "llama": "layers",
    "mistral": "layers",
    "qwen2": "layers",
    "qwen3": "layers",
    "gpt2": "h",
}


def _supported_names() -> str:
    return ", ".join(sorted(SUPPORTED_MODEL_TYPES))


class EarlyExitModel(nn.Module):
    """The target's first `num_layers` decoder layers + its final norm + its LM head, called like a causal LM.

    Holds references to the target's modules (nothing copied); the target is kept outside the module tree so that
    `.eval()`/`.to()` on this wrapper never touch it."""

    def __init__(self, target: PreTrainedModel, base: nn.Module, layers_attr: str, num_layers: int):
        super().__init__()
        self.__dict__["target"] = target  # not a submodule
        self.__dict__["base"] = base
        self.layers_attr = layers_attr
        self.early_layers = list(getattr(base, layers_attr))[:num_layers]
        self.late_layers = list(getattr(base, layers_attr))[num_layers:]  # what verification runs after KV reuse
        self.__dict__["early_base"] = base_running(base, layers_attr, self.early_layers)  # (not submodules)
        self.__dict__["late_base"] = base_running(base, layers_attr, self.late_layers)
        # its own cache (when it has one) holds these layers only: a cache layer that never runs would never fill
        values = {**target.config.to_dict(), "num_hidden_layers": num_layers}
        if values.get("layer_types") is not None:
            values["layer_types"] = values["layer_types"][:num_layers]
        self.config = target.config.__class__.from_dict(values)

    @property
    def device(self) -> torch.device:
        return self.target.device

    def _supports_logits_to_keep(self) -> bool:
        return True

    def forward(self, input_ids, position_ids=None, cache=None, use_cache=True, attention_mask=None, logits_to_keep=0,
                **kwargs):
        if attention_mask is None:  # nothing padded (and GPT-2 stays quiet)
            past = cache.get_seq_length() if cache is not None else 0
            attention_mask = torch.ones(input_ids.shape[0], past + input_ids.shape[1], dtype=torch.long,
                                        device=input_ids.device)
        out = self.early_base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              **{cache_keyword(self.base): cache}, use_cache=use_cache)
        hidden = out.last_hidden_state[:, -logits_to_keep:] if logits_to_keep else out.last_hidden_state
        return SimpleNamespace(logits=self.target.get_output_embeddings()(hidden))


def base_running(base: nn.Module, layers_attr: str, layers: list) -> nn.Module:
    """The target's base model as it runs with only `layers`: a shallow copy that shares every module, parameter and
    buffer and has a layer list of its own. The target itself is never changed, so a forward of it in another thread
    (a concurrent call, a plain generate()) still runs every layer."""
    view = copy.copy(base)
    view.__dict__["_modules"] = {**base._modules, layers_attr: nn.ModuleList(layers)}
    return view


class OwnCacheEarlyExit(DraftModelDrafter):
    """The early-exit model drafting in a cache of its own (L layers deep), rolled back after each step like any
    draft model's: batches, padded prompts, sliding windows and GPT-2."""

    compiles_model = False  # it runs a view of the target's base model made per call (a compile per call)

    def __init__(self, model: EarlyExitModel):
        self.model, self.kv = model, None  # not a PreTrainedModel: it borrows the target's modules


class SharedCacheEarlyExit(Drafter):
    """KV reuse (one unpadded row): the early layers draft IN the target's own cache, and verification runs only the
    layers after them on the hidden states drafting kept. The loop's roll-back of the target's cache is the drafter's
    too, so `accepted` has nothing to do."""

    def __init__(self, model: EarlyExitModel):
        self.model = model

    def start(self, target, seqs, settings):
        super().start(target, seqs, settings)
        self.shared = target
        self.early_hidden = None  # layer-L hidden states of the tokens fed this step (pending tokens, drafts but last)

    def _layers(self, view, cache_len: int, input_ids=None, inputs_embeds=None):
        """Run the target's base model with some of its layers (`view`: `base_running`) on new tokens after
        `cache_len` cached ones (batch 1, causal); returns (hidden states entering the final norm, final-norm output)."""
        x = input_ids if input_ids is not None else inputs_embeds
        n, device = x.shape[1], x.device
        target = self.model.target
        dtype = target.dtype if target.dtype.is_floating_point else torch.float32
        allowed = torch.ones(n, cache_len + n, dtype=torch.bool, device=device).tril(cache_len)
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
        positions = torch.arange(cache_len, cache_len + n, device=device)[None]
        captured, thread = [], threading.get_ident()
        # (a hook is the module's, for every thread: keep this thread's forward only)
        hook = view.norm.register_forward_pre_hook(
            lambda module, args: captured.append(args[0]) if threading.get_ident() == thread else None)
        try:
            out = view(input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=mask[None, None],
                       position_ids=positions, **{cache_keyword(view): self.shared.cache}, use_cache=True)
        finally:
            hook.remove()
        return captured[0], out.last_hidden_state

    @torch.no_grad()
    def propose(self, seqs, max_tokens):
        row = seqs.ids(0)[None]
        cached = self.shared.slots  # every layer holds these; layers 0..L-1 will also hold what is fed here
        block = row[:, cached:]  # the uncached tokens: the prompt at first, then the target's last token
        fed, hidden = 0, []
        head = self.model.target.get_output_embeddings()
        drafting = Drafting(self.settings, seqs, row.device)
        for i in range(max_tokens):
            h, normed = self._layers(self.model.early_base, cached + fed, input_ids=block)
            fed += block.shape[1]
            hidden.append(h)
            if not drafting.step(head(normed[:, -1]).float()):
                break
            block = drafting.token[:, None]
        self.early_hidden = torch.cat(hidden, dim=1)
        return drafting.draft()

    def own_verification(self, target, pending, pending_valid, draft):
        """The verification forward, minus what drafting already computed: layers 0..L-1 for the tokens not fed yet
        (the last draft), then layers L.. for all of the block from their layer-L hidden states. Logits [1, n, V]."""
        new_ids = torch.cat([pending, draft.tokens], dim=1)
        cached = target.slots
        done = 0 if self.early_hidden is None else self.early_hidden.shape[1]
        parts = [] if self.early_hidden is None else [self.early_hidden]
        if done < new_ids.shape[1]:
            parts.append(self._layers(self.model.early_base, cached + done, input_ids=new_ids[:, done:])[0])
        self.early_hidden = None
        with verifying(target.fast):
            _, normed = self._layers(self.model.late_base, cached, inputs_embeds=torch.cat(parts, dim=1))
            logits = self.model.target.get_output_embeddings()(normed[:, -(draft.num_tokens + 1) :])
        target.append_slots(torch.ones(new_ids.shape, dtype=torch.bool))
        return logits.float()


def reuses_target_cache(target, seqs) -> bool:
    """KV reuse needs one unpadded row, positions the hidden states can re-enter, no sliding window, and a model that
    takes the 4-D mask of a causal block over the shared cache (under flash attention it keeps a cache of its own)."""
    config = target.model.config
    return (seqs.size == 1 and config.model_type in KV_REUSE_MODEL_TYPES and takes_4d_masks(target.model)
            and not has_sliding_window(config) and bool(seqs.prompt_mask.numpy().all()))


class SelfSpeculativeDrafter(Drafter):
    """Drafts with the target's first `num_layers` decoder layers plus its final norm and LM head.

    Each call chooses its mode once: `SharedCacheEarlyExit` where the target's cache can be shared, otherwise
    `OwnCacheEarlyExit`; every hook is that mode's.

    Args:
        num_layers: how many of the target's decoder layers the draft runs (1 .. all). More layers: better drafts,
            dearer drafting. None: half of the target's layers.
    """

    default_num_draft_tokens = 4

    def __init__(self, num_layers: int | None = None):
        if num_layers is not None and (not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1):
            raise ValueError(f"num_layers must be None or an integer >= 1, got {num_layers!r}.")
        self.requested_layers = num_layers
        self.num_layers = num_layers
        self.mode: Drafter | None = None

    def __repr__(self) -> str:
        return f"SelfSpeculativeDrafter(num_layers={self.requested_layers})"

    def vocab_size(self):
        return None  # the target's own head: always the same vocabulary

    def early_exit_model(self, target) -> EarlyExitModel:
        if not isinstance(target, PreTrainedModel):
            raise TypeError(f"SelfSpeculativeDrafter needs a transformers PreTrainedModel target, got {type(target).__name__}.")
        model_type = getattr(target.config, "model_type", None)
        layers_attr = SUPPORTED_MODEL_TYPES.get(model_type)
        base = getattr(target, getattr(target, "base_model_prefix", ""), None)
        layers = getattr(base, layers_attr, None) if layers_attr else None
        lm_head = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else None
        if layers_attr is None or not isinstance(layers, nn.ModuleList) or lm_head is None:
            raise ValueError(
                f"SelfSpeculativeDrafter does not support {type(target).__name__} (model_type={model_type!r}); "
                f"supported decoder-only architectures: {_supported_names()} (layers in model.model.layers or "
                "transformer.h, with a final norm and an LM head)."
            )
        total = len(layers)
        num_layers = self.requested_layers if self.requested_layers is not None else max(1, total // 2)
        if num_layers > total:
            raise ValueError(f"num_layers={num_layers} exceeds the target's {total} decoder layers.")
        self.num_layers = num_layers
        return EarlyExitModel(target, base, layers_attr, num_layers)

    def draft_cost(self, target_model):
        model = self.early_exit_model(target_model)
        return share_of_target(target_model, *model.early_layers, target_model.get_output_embeddings())

    def start(self, target, seqs, settings):
        super().start(target, seqs, settings)
        model = self.early_exit_model(target.model)
        self.mode = SharedCacheEarlyExit(model) if reuses_target_cache(target, seqs) else OwnCacheEarlyExit(model)
        self.mode.start(target, seqs, settings)

    def propose(self, seqs, max_tokens):
        return self.mode.propose(seqs, max_tokens)

    def own_verification(self, target, pending, pending_valid, draft):
        return self.mode.own_verification(target, pending, pending_valid, draft)

    def accepted(self, seqs, verified):
        self.mode.accepted(seqs, verified)

    def select_rows(self, rows):
        self.mode.select_rows(rows)

    def end(self):
        self.mode.end()
