"""The classic drafter: a small causal LM with the target's vocabulary and a KV cache of its own."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from ...cache.ragged import RaggedKV
from ...errors import InputError
from ...models.borrowed import bind_if_borrowing
from ...drafters.base import Drafter, Drafting, borrowed_head, check_device, share_of_target


class DraftModelDrafter(Drafter):
    """Drafts k tokens autoregressively with a small causal LM, for one row or a batch.

    Greedy decoding drafts the argmax; sampling draws from the drafter's distribution after the same logits processors
    the target uses (so temperature/top-k/top-p shape q like p) and reports that distribution as q. Its KV cache keeps
    each row's accepted tokens, so rejected drafts cost nothing later: what it holds is counted on the host, so
    rolling back needs no look at the device.

    With `compile_drafter=True` its forward runs through `torch.compile` (dynamic shapes: the blocks it feeds vary in
    length). A small drafter's forward is mostly Python dispatch, which compilation removes; the draft is verified as
    ever, so the output is unchanged. The first call compiles (tens of seconds on a CPU; later calls and processes
    reuse the compiled code where torch's caches allow).
    """

    compiles_model = True

    def __init__(self, model: PreTrainedModel):
        if not isinstance(model, PreTrainedModel) or not hasattr(model, "get_output_embeddings"):
            raise TypeError(f"DraftModelDrafter needs a causal-LM PreTrainedModel, got {type(model).__name__}.")
        self.model = model.eval()
        self.kv = None

    def vocab_size(self) -> int:
        return self.model.config.get_text_config().vocab_size

    def draft_cost(self, target_model):
        return share_of_target(target_model, self.model, *borrowed_head(self.model, target_model))

    def start(self, target, seqs, settings):
        super().start(target, seqs, settings)
        if self.model.config.is_encoder_decoder:
            raise ValueError("The draft model must be a decoder-only causal LM.")
        check_device(self.model, target.model, "draft model")
        bind_if_borrowing(self.model, target.model)  # drafters that borrow the target's embeddings / LM head
        # (a fresh torch.compile wrapper per call is cheap: the compiled code is cached with the model's forward)
        forward = torch.compile(self.model, dynamic=True) if settings.compile else None
        self.kv = RaggedKV(self.model, DynamicCache(config=self.model.config), seqs.size, forward=forward)
        self.cached = [0] * seqs.size  # per row: how many of its tokens (a prefix) the draft cache holds
        self.fed_drafts = [0] * seqs.size  # per row: this step's drafts fed into the cache after them

    def select_rows(self, rows):
        self.kv.select_rows(rows)
        self.cached = [self.cached[b] for b in rows]
        self.fed_drafts = [self.fed_drafts[b] for b in rows]

    def accepted(self, seqs, verified):
        # the row kept its first `a` drafts: those fed stay in the cache, the rest are discarded
        kept = [min(a, fed) for a, fed in zip(verified.num_accepted, self.fed_drafts)]
        self.kv.discard_last([fed - k for fed, k in zip(self.fed_drafts, kept)])
        self.cached = [c + k for c, k in zip(self.cached, kept)]
        self.fed_drafts = [0] * len(self.cached)

    def _catch_up(self, seqs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """The block of each row's tokens the cache lacks (right-padded), its host validity, how many of the block's
        last logits reach every row's last token (`width`), and each row's last token's index among those."""
        todo = [seqs.ids(b)[self.cached[b] :] for b in range(seqs.size)]
        counts = [len(t) for t in todo]
        block = torch.nn.utils.rnn.pad_sequence(todo, batch_first=True)
        valid = torch.arange(block.shape[1])[None] < torch.tensor(counts)[:, None]
        self.cached = [c + n for c, n in zip(self.cached, counts)]
        width = block.shape[1] - min(counts) + 1  # (one row at batch 1: the LM head runs on the last token only)
        return block, valid, torch.tensor([n - min(counts) for n in counts], device=block.device), width

    @torch.inference_mode()  # (its cache is its own: inference tensors from the first call, one mode to compile for)
    def propose(self, seqs, max_tokens):
        block, valid, last, width = self._catch_up(seqs)
        everyone = torch.arange(seqs.size, device=block.device)
        drafting = Drafting(self.settings, seqs, block.device)
        for i in range(max_tokens):
            logits = self.kv.forward(block, width, valid=valid)
            if not drafting.step(logits[everyone, last]):
                break
            if i + 1 < max_tokens:  # the last draft is fed next step, if it is accepted
                block, valid, last, width = drafting.token[:, None], drafting.still[:, None], last * 0, 1
        draft = drafting.draft()
        self.fed_drafts = [min(n, max_tokens - 1) for n in draft.depth_by_row()]
        return draft

    @classmethod
    def for_target(cls, target, options) -> "DraftModelDrafter":
        """`layers:N` (`options.num_layers`)."""
        return cls.from_early_layers(target, options.num_layers)

    @classmethod
    def from_early_layers(cls, target, num_layers: int) -> "DraftModelDrafter":
        """`layers:N`: an untrained draft model cut from the target's first N layers (a baseline)."""
        if target is None:
            raise InputError(f"assistant='layers:{num_layers}' cuts a draft model from the target: pass the target too.")
        return cls(early_layers_draft_model(target, num_layers))


def early_layers_draft_model(target, num_layers: int):
    """An (untrained) draft model cut from the target: its first `num_layers` layers, final norm and LM head, on the
    target's device and in its dtype."""
    config = target.config.__class__.from_dict(target.config.to_dict())
    total = config.num_hidden_layers
    if not 1 <= num_layers <= total:
        raise InputError(f"layers:{num_layers} needs 1 <= N <= the target's {total} layers.")
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:num_layers]
    drafter = target.__class__(config).to(device=target.device, dtype=target.dtype)
    drafter.load_state_dict(target.state_dict(), strict=False)
    return drafter.eval()
