"""Cross-tokenizer drafting: a draft model with ANOTHER tokenizer drafts through text.

Each step:
1. the target's token ids are decoded to text (the target tokenizer);
2. that text is re-encoded with the draft tokenizer. Only a window at the end is re-encoded: the draft ids of the text
   before an "anchor" (a draft-token boundary at least `lookbehind_chars` characters back) are kept, so tokens that
   the newly generated text merges with (a word that grew, "\\n" + "\\n") are re-tokenized, and older ones are not;
3. the draft model (with a KV cache of its own, rolled back to the longest prefix it shares with the new draft ids)
   drafts greedily, a few draft tokens per wanted target token;
4. the drafted text is re-encoded with the target tokenizer behind the last `lookbehind` target tokens: when that
   re-encoding starts with the target's actual last tokens, the rest is the proposal (this keeps merges right); else
   the drafted text is encoded on its own. A last token that may be a cut word is dropped.

The proposals are target token ids, verified by the target as usual, so greedy output is identical to plain greedy
decoding. The drafter is deterministic (greedy draft, deterministic conversion), so its proposal distribution is
one-hot and sampled decoding is exact too through the rejection rule (acceptance is then p(proposed token), lower than
with a stochastic draft whose q is known: q over target tokens is not available across tokenizers).
"""

from __future__ import annotations

import math

import torch
from transformers import DynamicCache, PreTrainedModel

from ..cache.keyword import cache_keyword
from .base import Draft, SequenceDrafter, share_of_target


def _special_prefix(tokenizer) -> list[int]:
    """The ids the tokenizer puts before the text (BOS), or []."""
    with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
    without = tokenizer("a", add_special_tokens=False)["input_ids"]
    if without and without[0] in with_special:
        return list(with_special[: with_special.index(without[0])])
    return []


class CrossTokenizerDrafter(SequenceDrafter):
    """Drafts with a causal LM whose tokenizer differs from the target's, converting through text.

    Args:
        draft_model: a decoder-only causal LM (`PreTrainedModel`) for `draft_tokenizer`.
        draft_tokenizer, target_tokenizer: the two tokenizers (fast tokenizers: the windowed re-encoding uses their
            offsets; slow ones re-encode the whole text every step).
        lookbehind: target tokens re-encoded together with the drafted text (step 4).
        lookbehind_chars: characters at the end of the text whose draft tokenization is redone every step (step 2).
        draft_tokens_per_target_token: draft-model tokens drafted per wanted target token; None: estimated from the
            prompt (its draft-token count over its target-token count), clipped to [1, 4].
    """

    default_num_draft_tokens = 4

    def __init__(
        self,
        draft_model: PreTrainedModel,
        draft_tokenizer,
        target_tokenizer,
        lookbehind: int = 8,
        lookbehind_chars: int = 64,
        draft_tokens_per_target_token: float | None = None,
    ):
        if not isinstance(draft_model, PreTrainedModel) or not hasattr(draft_model, "get_output_embeddings"):
            raise TypeError(f"CrossTokenizerDrafter needs a causal-LM PreTrainedModel, got {type(draft_model).__name__}.")
        if draft_model.config.is_encoder_decoder:
            raise ValueError("The draft model must be a decoder-only causal LM.")
        for name, tok in (("draft_tokenizer", draft_tokenizer), ("target_tokenizer", target_tokenizer)):
            if not (callable(tok) and hasattr(tok, "decode")):
                raise TypeError(f"{name} must be a transformers tokenizer, got {type(tok).__name__}.")
        if lookbehind < 1 or lookbehind_chars < 1:
            raise ValueError("lookbehind and lookbehind_chars must be >= 1.")
        self.model = draft_model.eval()
        self.draft_tokenizer, self.target_tokenizer = draft_tokenizer, target_tokenizer
        self.lookbehind, self.lookbehind_chars = lookbehind, lookbehind_chars
        self.ratio_setting = draft_tokens_per_target_token
        self.windowed = bool(getattr(draft_tokenizer, "is_fast", False))
        self.draft_prefix = _special_prefix(draft_tokenizer)
        eos = draft_model.generation_config.eos_token_id if draft_model.generation_config is not None else None
        if eos is None:
            eos = draft_tokenizer.eos_token_id
        self.draft_eos = set([eos] if isinstance(eos, int) else list(eos or []))
        self.cache = None
        self.cached_ids = None
        self.target_eos = None
        self._reset_text_state()

    def vocab_size(self) -> int | None:
        return None  # proposes target token ids

    def draft_cost(self, target_model):
        return share_of_target(target_model, self.model)

    # --- per-call state ---
    def _reset_text_state(self) -> None:
        self.anchor_chars = 0  # the draft ids of text[:anchor_chars] are frozen in anchor_ids
        self.anchor_ids: list[int] = list(self.draft_prefix)
        self.anchor_text = ""
        self.ratio = self.ratio_setting

    def start(self, target, input_ids, settings):
        super().start(target, input_ids, settings)
        if self.model.device != target.device:
            raise ValueError(
                f"The draft model is on {self.model.device} but the target is on {target.device}; "
                f"move it first: `drafter.model.to({str(target.device)!r})`."
            )
        target_vocab = target.config.get_text_config().vocab_size
        if len(self.target_tokenizer) > target_vocab:
            raise ValueError(
                f"target_tokenizer has {len(self.target_tokenizer)} tokens but the target's vocabulary has "
                f"{target_vocab}: pass the target's own tokenizer as target_tokenizer."
            )
        eos = settings.generation_config.eos_token_id
        self.target_eos = eos if isinstance(eos, int) else (list(eos)[0] if eos is not None and len(eos) else None)
        self.cache = self._new_cache()
        self.cached_ids = input_ids.new_zeros(1, 0)
        self._reset_text_state()

    # --- step 1-2: target ids -> text -> draft ids ---
    def _target_text(self, ids: list[int]) -> str:
        return self.target_tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _draft_ids(self, text: str) -> list[int]:
        """Draft-token ids of `text`: the frozen ids before the anchor plus a fresh encoding of the rest."""
        if not self.windowed:
            return list(self.draft_prefix) + self.draft_tokenizer(text, add_special_tokens=False)["input_ids"]
        if not text.startswith(self.anchor_text):  # not an extension of what was anchored: start over
            self._reset_text_state()
        tail = text[self.anchor_chars :]
        enc = self.draft_tokenizer(tail, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        if len(tail) > 2 * self.lookbehind_chars:
            # Move the anchor to a token boundary about lookbehind_chars from the end: later text can no longer
            # change how the text before it is tokenized (only the last few tokens ever do).
            limit = len(tail) - self.lookbehind_chars
            cut = 0
            for j in range(1, len(ids)):
                start, prev_end = offsets[j][0], offsets[j - 1][1]
                if start > limit:
                    break
                if start == prev_end and start > 0:  # a clean boundary (no trimmed whitespace in between)
                    cut = j
            if cut:
                chars = offsets[cut][0]
                self.anchor_ids = self.anchor_ids + ids[:cut]
                self.anchor_chars += chars
                self.anchor_text = text[: self.anchor_chars]
                ids = ids[cut:]
        return self.anchor_ids + ids

    # --- step 3: the draft model ---
    def _new_cache(self) -> DynamicCache:
        cache = DynamicCache(config=self.model.config)
        cache.activate_past_recording()  # sliding-window draft models can then be rolled back past their window
        return cache

    def _roll_back_to(self, draft_ids: torch.Tensor) -> None:
        cached = self.cached_ids.shape[1]
        common = min(cached, draft_ids.shape[1] - 1)  # always leave at least one token to feed
        mismatch = (self.cached_ids[:, :common] != draft_ids[:, :common]).any(dim=0).nonzero()
        if mismatch.numel():
            common = int(mismatch[0])
        if common < cached:
            self.cache.crop(common - cached)
            self.cached_ids = self.cached_ids[:, :common]

    def _forward(self, new_ids: torch.Tensor) -> torch.Tensor:
        start = self.cached_ids.shape[1]
        positions = torch.arange(start, start + new_ids.shape[1], device=new_ids.device)[None]
        out = self.model(input_ids=new_ids, position_ids=positions, **{cache_keyword(self.model): self.cache},
                         use_cache=True, logits_to_keep=1)
        self.cached_ids = torch.cat([self.cached_ids, new_ids], dim=1)
        return out.logits[:, -1]

    def _draft_tokens(self, draft_ids: list[int], num: int) -> tuple[list[int], bool]:
        """Greedy continuation of `draft_ids` by the draft model: (up to `num` draft ids, whether it ended at EOS)."""
        device = self.model.device
        ids = torch.tensor([draft_ids], dtype=torch.long, device=device)
        if self.cached_ids is None:
            self.cache, self.cached_ids = self._new_cache(), ids[:, :0]
        self._roll_back_to(ids)
        new_ids = ids[:, self.cached_ids.shape[1] :]
        out = []
        for _ in range(num):
            token = int(self._forward(new_ids).argmax(dim=-1))
            if token in self.draft_eos:
                return out, True
            out.append(token)
            new_ids = torch.tensor([[token]], dtype=torch.long, device=device)
        return out, False

    # --- step 4: drafted text -> target ids ---
    def _drafted_text(self, draft_ids: list[int], drafted: list[int]) -> str:
        context = draft_ids[-4:]  # decode with a little context so leading spaces come out right
        decode = self.draft_tokenizer.decode
        before = decode(context, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        after = decode(context + drafted, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if after.startswith(before):
            return after[len(before) :]
        return decode(drafted, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _to_target_ids(self, target_ids: list[int], text: str) -> list[int]:
        encode = self.target_tokenizer
        context = target_ids[-self.lookbehind :]
        joined = encode(self._target_text(context) + text, add_special_tokens=False)["input_ids"]
        if joined[: len(context)] == context:
            return joined[len(context) :]
        return encode(text, add_special_tokens=False)["input_ids"]

    def _draft_ratio(self, draft_ids: list[int], target_len: int) -> float:
        if self.ratio is None:
            self.ratio = min(4.0, max(1.0, len(draft_ids) / max(target_len, 1)))
        return self.ratio

    @torch.no_grad()
    def propose(self, input_ids, max_tokens):
        if input_ids.shape[0] != 1:
            raise ValueError("CrossTokenizerDrafter drafts for one sequence at a time.")
        if max_tokens <= 0:
            return Draft(input_ids[:, :0])
        target_ids = input_ids[0].tolist()
        draft_ids = self._draft_ids(self._target_text(target_ids))
        budget = math.ceil(max_tokens * self._draft_ratio(draft_ids, len(target_ids))) + 1
        drafted, hit_eos = self._draft_tokens(draft_ids, budget)
        text = self._drafted_text(draft_ids, drafted) if drafted else ""
        proposal = self._to_target_ids(target_ids, text) if text else []
        if len(proposal) > max_tokens:
            proposal = proposal[:max_tokens]
        elif hit_eos:
            if self.target_eos is not None and len(proposal) < max_tokens:
                proposal.append(self.target_eos)  # the draft ended its text: guess the target ends it too
        elif len(proposal) > 1 and text[-1:].isalnum():
            proposal = proposal[:-1]  # the drafted text may end inside a word: its last target token is a guess
        return Draft(torch.tensor([proposal], dtype=torch.long, device=input_ids.device).view(1, -1))
