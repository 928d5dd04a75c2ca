"""The speculative decoding loop: `speculative_generate`, a `custom_generate` callable for `model.generate()`.

`generate()` prepares the generation config, the logits processors (warpers included), the stopping criteria and the
cache, then calls this loop. Each step (see `speculative_step`) reads top to bottom: draft k tokens, verify them with
ONE target forward, accept a prefix by an exact rule, roll the cache back, append, check stopping token by token.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .cpu_matmul import small_m_linear
from .draft_length import as_draft_length_policy
from .drafters import Draft, Drafter, as_drafter
from .verification import greedy_accept, one_hot_probs, rejection_sample

_MODEL_KWARGS_HANDLED = {"attention_mask", "position_ids", "cache", "use_cache", "logits_to_keep"}


@dataclass
class SpeculationStats:
    """What speculation did during one or more `generate()` calls (accumulates when passed to several)."""

    target_forwards: int = 0
    emitted_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        """Tokens emitted per target forward, the bonus token included (plain decoding = 1.0)."""
        return self.emitted_tokens / max(self.target_forwards, 1)

    @property
    def acceptance_by_position(self) -> list[float]:
        """P(draft i accepted | draft i was proposed), for i = 0..k-1."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_position, self.drafted_by_position)]

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / max(self.drafted_tokens, 1)

    def record(self, num_drafted: int, num_accepted: int, num_emitted: int) -> None:
        self.target_forwards += 1
        self.emitted_tokens += num_emitted
        self.drafted_tokens += num_drafted
        self.accepted_tokens += num_accepted
        while len(self.drafted_by_position) < num_drafted:
            self.drafted_by_position.append(0)
            self.accepted_by_position.append(0)
        for i in range(num_drafted):
            self.drafted_by_position[i] += 1
            self.accepted_by_position[i] += int(i < num_accepted)

    def as_dict(self) -> dict:
        return {
            "target_forwards": self.target_forwards,
            "emitted_tokens": self.emitted_tokens,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "mean_accepted_tokens": self.mean_accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_by_position": self.acceptance_by_position,
            "draft_seconds": self.draft_seconds,
            "target_seconds": self.target_seconds,
        }


@dataclass
class SpeculativeDecoderOnlyOutput(GenerateDecoderOnlyOutput):
    """`GenerateDecoderOnlyOutput` plus what speculation did."""

    speculation_stats: SpeculationStats | None = None


def validate_request(model, input_ids, generation_config, assistant, num_draft_tokens) -> tuple[Drafter, int]:
    """Every check that can fail, done before any forward pass, so a bad call leaves the model untouched."""
    if assistant is None:
        raise ValueError("Speculative decoding needs a drafter: pass `assistant=` (a draft model, 'ngram', a Drafter).")
    if model.config.is_encoder_decoder:
        raise ValueError("hf_specdec supports decoder-only targets; encoder-decoder models are not supported.")
    if generation_config.num_beams != 1:
        raise ValueError(f"Speculative decoding does not do beam search: set num_beams=1 (got {generation_config.num_beams}).")
    if generation_config.num_return_sequences != 1:
        raise ValueError(
            "Speculative decoding returns one sequence per prompt: set num_return_sequences=1 "
            f"(got {generation_config.num_return_sequences}); repeat the prompt in the batch instead."
        )
    if generation_config.output_attentions or generation_config.output_hidden_states:
        raise ValueError("output_attentions / output_hidden_states are not supported with speculative decoding.")
    if input_ids.shape[0] != 1:
        raise ValueError(f"Speculative decoding runs one prompt at a time for now (got a batch of {input_ids.shape[0]}).")
    drafter = as_drafter(assistant)
    k = drafter.default_num_draft_tokens if num_draft_tokens is None else num_draft_tokens
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"num_draft_tokens must be an integer >= 1, got {num_draft_tokens!r}.")
    target_vocab = model.config.get_text_config().vocab_size
    drafter_vocab = drafter.vocab_size()
    if drafter_vocab is not None and drafter_vocab != target_vocab:
        raise ValueError(
            f"The drafter's vocabulary ({drafter_vocab} tokens) differs from the target's ({target_vocab}): a drafter "
            "must share the target's tokenizer. Use a drafter trained for this target (see training/distill.py), or "
            "assistant='ngram'."
        )
    return drafter, k


class _TargetRunner:
    """Feeds the target the tokens its cache lacks plus the drafts, with the right positions and mask."""

    def __init__(self, model, cache, attention_mask, fast_cpu_verify: bool):
        self.model = model
        self.cache = cache
        self.attention_mask = attention_mask  # 2D, covers the accepted sequence; None when nothing is padded
        params = inspect.signature(model.forward).parameters
        self.pass_positions = "position_ids" in params
        self.keep_logits = model._supports_logits_to_keep()
        self.fast_cpu_verify = fast_cpu_verify and model.device.type == "cpu"

    @property
    def cached(self) -> int:
        return int(self.cache.get_seq_length())

    def forward(self, new_ids: torch.Tensor, num_logits: int) -> torch.Tensor:
        start = self.cached
        kwargs = {}
        if self.attention_mask is not None:
            pending = start + new_ids.shape[1] - self.attention_mask.shape[1]
            mask = torch.cat([self.attention_mask, self.attention_mask.new_ones(1, pending)], dim=1)
            kwargs["attention_mask"] = mask
            if self.pass_positions:
                positions = mask.long().cumsum(-1) - 1
                kwargs["position_ids"] = positions.masked_fill(mask == 0, 1)[:, start:]
        elif self.pass_positions:
            kwargs["position_ids"] = torch.arange(start, start + new_ids.shape[1], device=new_ids.device)[None]
        if self.keep_logits:
            kwargs["logits_to_keep"] = num_logits
        with small_m_linear(self.fast_cpu_verify):
            out = self.model(input_ids=new_ids, cache=self.cache, use_cache=True, **kwargs)
        return out.logits[:, -num_logits:].float()

    def keep_accepted(self, num_rejected: int, num_emitted: int) -> None:
        if num_rejected:
            self.cache.crop(-num_rejected)
        if self.attention_mask is not None:
            self.attention_mask = torch.cat([self.attention_mask, self.attention_mask.new_ones(1, num_emitted)], 1)


def speculative_step(sequence, drafter, target, max_draft, logits_processor, do_sample, stats):
    """One step: draft, verify in one target forward, accept a prefix, roll the cache back.

    Returns `(emitted [1, n+1], num_drafted k, num_accepted n, raw_logits [1, k+1, V], scores [1, k+1, V])`.
    """
    # 1. Draft up to `max_draft` tokens (a drafter may propose fewer, or none).
    t0 = time.perf_counter()
    draft: Draft = drafter.propose(sequence, max_draft) if max_draft > 0 else Draft(sequence[:, :0])
    k = draft.num_tokens
    t1 = time.perf_counter()

    # 2. Verify: the uncached tail of the sequence plus all drafts in ONE target forward; k+1 next-token logits.
    raw_logits = target.forward(torch.cat([sequence[:, target.cached :], draft.tokens], dim=1), k + 1)
    candidate = torch.cat([sequence, draft.tokens], dim=1)
    scores = raw_logits.clone()
    if logits_processor:
        for i in range(k + 1):  # the processors see the exact prefix each position is conditioned on
            scores[:, i] = logits_processor(candidate[:, : sequence.shape[1] + i], raw_logits[:, i].clone())
    stats.draft_seconds += t1 - t0
    stats.target_seconds += time.perf_counter() - t1

    # 3. Accept a prefix by an exact rule; the next token always comes from the target.
    if do_sample:
        q = draft.probs if draft.probs is not None else one_hot_probs(draft.tokens, scores.shape[-1])
        num_accepted, next_token = rejection_sample(draft.tokens, q, scores.softmax(dim=-1))
    else:
        num_accepted, next_token = greedy_accept(draft.tokens, scores)
    n = int(num_accepted[0])

    # 4. Keep the cache entries of the accepted tokens only.
    target.keep_accepted(num_rejected=k - n, num_emitted=n + 1)
    emitted = torch.cat([draft.tokens[:, :n], next_token[:, None]], dim=1)
    stats.record(num_drafted=k, num_accepted=n, num_emitted=n + 1)
    return emitted, k, n, raw_logits, scores


@torch.no_grad()
def speculative_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    assistant=None,
    num_draft_tokens: int | None = None,
    speculation_stats: SpeculationStats | None = None,
    draft_length="constant",
    fast_cpu_verify: bool = True,
    hf_specdec_streamer=None,
    **model_kwargs,
):
    """Exact speculative decoding, used as `model.generate(..., custom_generate=speculative_generate, assistant=...)`.

    Greedy output is token-identical to plain greedy `generate()`; sampled output has exactly the target's
    distribution (after every logits processor and warper `generate()` built). Extra arguments:
    `assistant` (draft model, Drafter, 'ngram' or CandidateGenerator), `num_draft_tokens` (max drafts per step),
    `speculation_stats` (a `SpeculationStats` to accumulate into), `draft_length` ('constant', 'adaptive' or a policy,
    see `draft_length.py`; `num_draft_tokens` stays the cap), `fast_cpu_verify` (see `cpu_matmul`).
    """
    drafter, k = validate_request(model, input_ids, generation_config, assistant, num_draft_tokens)
    policy = as_draft_length_policy(draft_length)
    unsupported = set(k for k, v in model_kwargs.items() if v is not None) - _MODEL_KWARGS_HANDLED
    if unsupported:
        raise ValueError(f"Speculative decoding does not support these generate() inputs: {sorted(unsupported)}.")
    if synced_gpus:
        raise ValueError("synced_gpus is not supported with speculative decoding.")
    streamer = hf_specdec_streamer
    stats = speculation_stats if speculation_stats is not None else SpeculationStats()
    policy.start(k)
    drafter.confidence_threshold = policy.confidence_threshold  # drafters that know their confidence may stop early
    drafter.start(model, input_ids, generation_config, logits_processor)

    cache = model_kwargs.get("cache")
    if cache is None:
        cache = DynamicCache(config=model.config)
    if not cache.is_croppable:
        raise ValueError("This target's cache cannot be rolled back (crop), which speculative decoding needs.")
    cache.activate_past_recording()
    target = _TargetRunner(model, cache, model_kwargs.get("attention_mask"), fast_cpu_verify)

    want_scores = generation_config.return_dict_in_generate and generation_config.output_scores
    want_logits = generation_config.return_dict_in_generate and generation_config.output_logits
    scores_out, logits_out = [], []
    max_length = generation_config.max_length
    sequence = input_ids
    if streamer is not None:
        streamer.put(input_ids.cpu())

    finished = sequence.shape[1] >= max_length
    while not finished:
        # Drafts past max_length could never be emitted: the step emits up to max_draft + 1 tokens.
        max_draft = min(policy.next_length(), max_length - sequence.shape[1] - 1)
        emitted, num_drafted, n, raw_logits, scores = speculative_step(
            sequence, drafter, target, max_draft, logits_processor, generation_config.do_sample, stats
        )
        policy.update(num_drafted, n)
        # Append token by token so that every stopping criterion (EOS, stop strings, custom) cuts exactly where
        # plain decoding would have stopped.
        for j in range(n + 1):
            sequence = torch.cat([sequence, emitted[:, j : j + 1]], dim=1)
            if want_scores:
                scores_out.append(scores[:, j])
            if want_logits:
                logits_out.append(raw_logits[:, j])
            if stopping_criteria(sequence, scores[:, j]).any():
                finished = True
                emitted = emitted[:, : j + 1]
                break
        if streamer is not None:
            streamer.put(emitted.cpu())
        if not finished:
            drafter.accepted(sequence, torch.tensor([n], device=sequence.device))

    if streamer is not None:
        streamer.end()
    model._hf_specdec_last_stats = stats
    if generation_config.return_dict_in_generate:
        return SpeculativeDecoderOnlyOutput(
            sequences=sequence,
            scores=tuple(scores_out) if want_scores else None,
            logits=tuple(logits_out) if want_logits else None,
            cache=cache,
            speculation_stats=stats,
        )
    return sequence
