"""The target's hidden states that feature drafters read, taken from the verification forward itself with forward
hooks: no extra target call.

`final_norm(model)` is the module whose output feeds the LM head (what drafters reading the final state read);
`decoder_layers(model)` are the layers whose states a drafter fusing several of them reads (a low, a middle and a high
layer).
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch import nn


def final_norm(model) -> nn.Module:
    """The module whose output is the target's final hidden state (the LM head's input), for feature drafters."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    for name in ("norm", "ln_f", "final_layernorm", "final_layer_norm"):
        module = getattr(decoder, name, None)
        if isinstance(module, nn.Module):
            return module
    raise ValueError(
        f"{type(model).__name__} exposes no final norm (decoder.norm / ln_f) whose output a feature-conditioned "
        "drafter could read; use a token-only drafter (or n-gram lookup) with this target."
    )


def decoder_layers(model) -> nn.ModuleList:
    """The target's decoder blocks, in order (`model.layers` for Llama-likes, `transformer.h` for GPT-2)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    for name in ("layers", "h", "blocks"):
        layers = getattr(decoder, name, None)
        if isinstance(layers, nn.ModuleList):
            return layers
    raise ValueError(f"{type(model).__name__} exposes no list of decoder layers a feature drafter could read.")


def entering_layers(model, layer_ids) -> list[nn.Module]:
    """The modules whose outputs are the hidden states ENTERING these decoder layers (i in 1..N: layer i - 1's output,
    the residual stream before layer i; i = N is the last layer's output, before the final norm; 0: the input
    embeddings'), EAGLE-3's ids (transformers' `hidden_states[i]`)."""
    layers = decoder_layers(model)
    return [layers[i - 1] if i else model.get_input_embeddings() for i in layer_ids]


class HiddenCapture:
    """Records the outputs of `modules` during a forward, concatenated along the hidden dimension: [B, m, H * n]."""

    def __init__(self, modules: list[nn.Module]):
        self.modules = list(modules)
        self.hidden: torch.Tensor | None = None

    @contextlib.contextmanager
    def recording(self):
        outputs: list = [None] * len(self.modules)
        thread = threading.get_ident()

        def hook(i):
            def record(module, args, output):
                if threading.get_ident() == thread:  # a hook is the module's, for every thread: keep this forward's
                    outputs[i] = output[0] if isinstance(output, tuple) else output
            return record

        handles = [m.register_forward_hook(hook(i)) for i, m in enumerate(self.modules)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            self.hidden = torch.cat(outputs, dim=-1) if all(o is not None for o in outputs) else None
