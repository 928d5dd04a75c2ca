"""The speculative decoding loop: `speculative_generate`, a `custom_generate` callable for `model.generate()`.

`generate()` prepares the generation config, the logits processors (warpers included), the stopping criteria and the
cache, then calls this loop. Each step (see `speculative_step`) reads top to bottom: draft k tokens, verify them with
ONE target forward, accept a prefix by an exact rule, roll the cache back, append, check stopping token by token.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .draft_length import policy_for_call
from .ragged_cache import RaggedKV
from .drafters import Draft, Drafter, as_drafter
from .drafters.per_row import PerRowDrafter
from .verification import (
    greedy_accept,
    greedy_accept_tree,
    one_hot_probs,
    rejection_sample,
    rejection_sample_tree,
    typical_accept,
    typical_accept_tree,
)

_MODEL_KWARGS_HANDLED = {"attention_mask", "position_ids", "cache", "use_cache", "logits_to_keep"}


@dataclass
class SpeculationStats:
    """What speculation did during one or more `generate()` calls (accumulates when passed to several).

    Counted per row: a batched target forward counts once for each row it verified, so `mean_accepted_tokens` is the
    tokens a row gains per target forward whatever the batch size.
    """

    target_forwards: int = 0
    emitted_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    #: per row of the input batch (row b of every call): drafts proposed and accepted
    drafted_by_row: list[int] = field(default_factory=list)
    accepted_by_row: list[int] = field(default_factory=list)
    #: batched steps in which the rows accepted different numbers of drafts (each row then keeps its own prefix)
    uneven_steps: int = 0
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

    def record_step(self, num_drafted: list[int], num_accepted: list[int], rows: list[int]) -> None:
        """One verification step: row `rows[i]` of the input batch proposed `num_drafted[i]` drafts (a tree: its depth)
        and kept `num_accepted[i]` of them, then the target's own token."""
        width = max(num_drafted, default=0)
        self.drafted_by_position += [0] * (width - len(self.drafted_by_position))
        self.accepted_by_position += [0] * (width - len(self.accepted_by_position))
        height = max(rows, default=-1) + 1
        self.drafted_by_row += [0] * (height - len(self.drafted_by_row))
        self.accepted_by_row += [0] * (height - len(self.accepted_by_row))
        for drafted, accepted, row in zip(num_drafted, num_accepted, rows):
            self.target_forwards += 1
            self.emitted_tokens += accepted + 1
            self.drafted_tokens += drafted
            self.accepted_tokens += accepted
            self.drafted_by_row[row] += drafted
            self.accepted_by_row[row] += accepted
            for i in range(drafted):
                self.drafted_by_position[i] += 1
                self.accepted_by_position[i] += int(i < accepted)
        self.uneven_steps += len(set(num_accepted)) > 1

    def as_dict(self) -> dict:
        return {
            "target_forwards": self.target_forwards,
            "emitted_tokens": self.emitted_tokens,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "mean_accepted_tokens": self.mean_accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_by_position": self.acceptance_by_position,
            "drafted_by_row": self.drafted_by_row,
            "accepted_by_row": self.accepted_by_row,
            "uneven_steps": self.uneven_steps,
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


@dataclass(frozen=True)
class AcceptRule:
    """The verification rule of a call: greedy and rejection sampling are exact; `typical` = (threshold, alpha) is
    Medusa's lossy typical acceptance, used only when asked for."""

    do_sample: bool
    typical: tuple[float, float] | None = None


def accept_rule(verification: str, generation_config, threshold: float, alpha: float) -> AcceptRule:
    if verification == "exact":
        return AcceptRule(bool(generation_config.do_sample))
    if verification != "typical":
        raise ValueError(f"verification must be 'exact' (the default) or 'typical' (lossy), got {verification!r}.")
    if not generation_config.do_sample:
        raise ValueError("verification='typical' is a sampling rule; greedy decoding is always verified exactly "
                         "(drop verification= or pass do_sample=True).")
    if not (0 <= threshold <= 1) or alpha < 0:
        raise ValueError(f"typical acceptance needs 0 <= typical_threshold <= 1 and typical_alpha >= 0 "
                         f"(got {threshold}, {alpha}).")
    warnings.warn("verification='typical' is lossy: the output no longer follows the target's distribution exactly "
                  "(Medusa's typical acceptance). Use the default verification='exact' for exact sampling.", stacklevel=3)
    return AcceptRule(True, (float(threshold), float(alpha)))


def validate_batch(model, drafter: Drafter, batch_size: int, generation_config, cache) -> None:
    """What batch > 1 needs beyond batch 1 (see the design note in ragged_cache.py)."""
    if batch_size == 1:
        return
    if any(t == "sliding_attention" for t in (getattr(model.config, "layer_types", None) or [])):
        raise ValueError("Batched speculative decoding does not support sliding-window attention targets; use batch 1.")
    if not isinstance(cache, DynamicCache) or type(cache).__name__ != "DynamicCache":
        raise ValueError("Batched speculative decoding needs a DynamicCache; drop cache_implementation for batch > 1.")
    if generation_config.return_dict_in_generate and (generation_config.output_scores or generation_config.output_logits):
        raise ValueError("output_scores / output_logits are supported for batch 1 only.")
    if generation_config._pad_token_tensor is None:
        raise ValueError("Batched generation needs a pad token: set pad_token_id.")


def speculative_step(batch, drafter, target: RaggedKV, max_draft, logits_processor, rule: AcceptRule, stats):
    """One step for every active row: draft, verify in ONE target forward, accept a prefix per row, roll back.

    Returns `(emitted [B, k+1], num_emitted [B], raw_logits [B, k+1, V], scores [B, k+1, V], num_drafted,
    stopped_early)` (see `Draft.stopped_early`); row b
    emits `emitted[b, :num_emitted[b]]` (its accepted drafts, then the target's own token).
    """
    # 1. Draft up to `max_draft` tokens per row (a drafter may propose fewer, or none).
    t0 = time.perf_counter()
    draft: Draft = drafter_propose(drafter, batch, max_draft)
    if draft.parents is not None and draft.num_tokens:
        return tree_step(batch, drafter, draft, target, logits_processor, rule, stats, t0)
    k = draft.num_tokens
    num_valid = draft.num_valid if draft.num_valid is not None else torch.full_like(batch.lengths, k)
    t1 = time.perf_counter()

    # 2. Verify: each row's uncached tokens (its last token; the whole prompt at first) plus all drafts, one forward.
    pending, pending_valid = batch.uncached_block()  # [B, u]; the same u for every row
    valid = torch.arange(k, device=num_valid.device)[None] < num_valid[:, None]
    new_ids = torch.cat([pending, draft.tokens], dim=1)
    new_valid = torch.cat([pending_valid, valid], dim=1)
    if drafter.shares_target_cache:  # self-speculation: the drafter already ran the first layers for its drafts
        raw_logits = drafter.verify(target, new_ids, new_valid, k + 1)
    else:
        raw_logits = target.forward(new_ids, new_valid, k + 1)
    if drafter.uses_target_hidden:  # feature drafters (EAGLE, Medusa) read what this forward computed
        drafter.observe_target(target.last_hidden, new_valid)
    scores = raw_logits.clone()
    if logits_processor:
        for b in range(batch.size):  # each row's processors see the exact prefix that position is conditioned on
            row = torch.cat([batch.row(b), draft.tokens[b]])[None]
            for i in range(k + 1):
                length = int(batch.lengths[b]) + i
                scores[b : b + 1, i] = logits_processor(row[:, :length], raw_logits[b : b + 1, i].clone())
    stats.draft_seconds += t1 - t0
    stats.target_seconds += time.perf_counter() - t1

    # 3. Accept a prefix per row by an exact rule; the next token always comes from the target.
    if rule.typical:
        num_accepted, next_token = typical_accept(draft.tokens, scores.softmax(dim=-1), *rule.typical, num_valid=num_valid)
    elif rule.do_sample:
        q = draft.probs if draft.probs is not None else one_hot_probs(draft.tokens, scores.shape[-1])
        num_accepted, next_token = rejection_sample(draft.tokens, q, scores.softmax(dim=-1), num_valid=num_valid)
    else:
        num_accepted, next_token = greedy_accept(draft.tokens, scores, num_valid=num_valid)

    # 4. Keep the cache slots of each row's accepted tokens; rejected ones become holes or are cropped.
    target.keep(num_new=k, num_kept=num_accepted)
    emitted = torch.cat([draft.tokens, next_token[:, None]], dim=1)
    emitted.scatter_(1, num_accepted[:, None], next_token[:, None])  # the target's token right after the prefix
    stats.record_step(num_valid.tolist(), num_accepted.tolist(), batch.original_index)
    return emitted, num_accepted + 1, raw_logits, scores, k, draft.stopped_early


def tree_step(batch, drafter, draft, target: RaggedKV, logits_processor, rule: AcceptRule, stats, t0):
    """`speculative_step` for a tree of candidates: ONE forward with a tree attention mask, then per row the longest
    accepted root-to-node path (greedy), or recursive rejection over siblings (sampling); the cache keeps that path.
    Returns the same as `speculative_step`, with scores / logits in the order of the emitted tokens."""
    parents, tokens = draft.parents, draft.tokens
    size = parents.shape[0]
    t1 = time.perf_counter()
    pending, pending_valid = batch.uncached_block()
    raw = target.forward_tree(pending, pending_valid, tokens, parents)  # [B, T + 1, V]: row 0 = after the root
    scores = raw.clone()
    ancestors = [[] for _ in range(size)]  # node i's path from the root, i included
    for i, parent in enumerate(parents.tolist()):
        ancestors[i] = (ancestors[parent] if parent >= 0 else []) + [i]
    if logits_processor:
        for b in range(batch.size):
            for r in range(size + 1):  # row r follows the root (r = 0) or node r - 1: its prefix is that path
                path = tokens[b, ancestors[r - 1]] if r else tokens[b, :0]
                prefix = torch.cat([batch.row(b), path])[None]
                scores[b : b + 1, r] = logits_processor(prefix, raw[b : b + 1, r].clone())
    stats.draft_seconds += t1 - t0
    stats.target_seconds += time.perf_counter() - t1

    paths, next_tokens = [], []
    for b in range(batch.size):
        if rule.typical:
            path, next_token = typical_accept_tree(tokens[b], parents, scores[b].softmax(dim=-1), *rule.typical)
        elif rule.do_sample:
            path, next_token = rejection_sample_tree(tokens[b], parents, scores[b].softmax(dim=-1))
        else:
            path, next_token = greedy_accept_tree(tokens[b], parents, scores[b])
        paths.append(path)
        next_tokens.append(next_token)
    keep = torch.zeros(batch.size, size, dtype=torch.bool, device=tokens.device)
    for b, path in enumerate(paths):
        keep[b, path] = True
    if drafter.uses_target_hidden:  # the hidden states of the row's pending tokens, then of its path, in order
        u = pending.shape[1]
        rows = [torch.cat([target.last_hidden[b, :u][pending_valid[b]], target.last_hidden[b, u:][path]]) for b, path in enumerate(paths)]
        width = max(len(r) for r in rows)
        hidden = torch.stack([torch.nn.functional.pad(r, (0, 0, 0, width - len(r))) for r in rows])
        valid = torch.arange(width, device=hidden.device)[None] < torch.tensor([len(r) for r in rows], device=hidden.device)[:, None]
        drafter.observe_target(hidden, valid)
    target.keep_tree(size, keep)

    depth = max(len(a) for a in ancestors)
    num_accepted = torch.tensor([len(p) for p in paths], device=tokens.device)
    emitted = tokens.new_zeros(batch.size, depth + 1)
    order = torch.zeros(batch.size, depth + 1, dtype=torch.long, device=tokens.device)  # score row of each emitted token
    for b, path in enumerate(paths):
        emitted[b, : len(path)] = tokens[b, path]
        emitted[b, len(path)] = next_tokens[b]
        order[b, 1 : len(path) + 1] = torch.tensor(path, dtype=torch.long) + 1
    gather = order[..., None].expand(-1, -1, raw.shape[-1])
    stats.record_step([depth] * batch.size, num_accepted.tolist(), batch.original_index)
    return emitted, num_accepted + 1, raw.gather(1, gather), scores.gather(1, gather), depth, False


def drafter_propose(drafter: Drafter, batch: "RowBatch", max_draft: int) -> Draft:
    if max_draft <= 0:
        return Draft(batch.lengths.new_zeros(batch.size, 0))
    if drafter.supports_batch:
        return drafter.propose(batch.right_padded(), max_draft, lengths=batch.lengths)
    return drafter.propose(batch.row(0)[None], max_draft)


class RowBatch:
    """The active rows' sequences (prompt with its own left padding, then generated tokens), growing independently."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pad_token_id: int):
        self.rows = [row for row in input_ids]
        self.prompt_mask = attention_mask.bool()
        self.original_index = list(range(input_ids.shape[0]))
        self.pad = pad_token_id
        self.device = input_ids.device
        self.cached_upto = 0  # tokens of every row already in the target cache (rows stay in step: see uncached_block)
        self._update()

    def _update(self):
        self.lengths = torch.tensor([len(r) for r in self.rows], dtype=torch.long, device=self.device)

    @property
    def size(self) -> int:
        return len(self.rows)

    def row(self, b: int) -> torch.Tensor:
        return self.rows[b]

    def right_padded(self) -> torch.Tensor:
        return torch.nn.utils.rnn.pad_sequence(self.rows, batch_first=True, padding_value=self.pad)

    def uncached_block(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens not yet in the target cache and which are real: at the first step the (equal-length, left-padded)
        prompts; afterwards each row's last token, the target's own pick from the previous step."""
        if self.cached_upto == 0:
            self.cached_upto = 1
            return torch.stack(self.rows), self.prompt_mask
        last = torch.stack([r[-1:] for r in self.rows])
        return last, torch.ones_like(last, dtype=torch.bool)

    def append(self, b: int, tokens: torch.Tensor) -> None:
        self.rows[b] = torch.cat([self.rows[b], tokens])

    def select(self, keep: list[int]) -> None:
        self.rows = [self.rows[b] for b in keep]
        self.original_index = [self.original_index[b] for b in keep]
        self._update()


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
    verification: str = "exact",
    typical_threshold: float = 0.09,
    typical_alpha: float = 0.3,
    **model_kwargs,
):
    """Exact speculative decoding, used as `model.generate(..., custom_generate=speculative_generate, assistant=...)`.

    Greedy output is token-identical to plain greedy `generate()` (row by row for left-padded batches); sampled output
    has exactly the target's distribution (after every logits processor and warper `generate()` built). Extra
    arguments: `assistant` (draft model, Drafter, 'ngram' or CandidateGenerator), `num_draft_tokens` (max drafts per
    step), `speculation_stats` (a `SpeculationStats` to accumulate into), `draft_length` ('constant', 'adaptive' or a
    policy, see `draft_length.py`; `num_draft_tokens` stays the cap), `fast_cpu_verify` (see `cpu_matmul`),
    `verification` ('exact', or 'typical': Medusa's typical acceptance with `typical_threshold` / `typical_alpha`,
    sampling only, LOSSY: faster, but the output no longer has exactly the target's distribution).
    """
    drafter, k = validate_request(model, input_ids, generation_config, assistant, num_draft_tokens)
    rule = accept_rule(verification, generation_config, typical_threshold, typical_alpha)
    policy = policy_for_call(draft_length, assistant, model, input_ids.shape[0])
    unsupported = set(key for key, v in model_kwargs.items() if v is not None) - _MODEL_KWARGS_HANDLED
    if unsupported:
        raise ValueError(f"Speculative decoding does not support these generate() inputs: {sorted(unsupported)}.")
    if synced_gpus:
        raise ValueError("synced_gpus is not supported with speculative decoding.")
    batch_size = input_ids.shape[0]
    cache = model_kwargs.get("cache")
    if cache is None:
        cache = DynamicCache(config=model.config)
    validate_batch(model, drafter, batch_size, generation_config, cache)
    if batch_size > 1 and not drafter.supports_batch:
        drafter = PerRowDrafter(drafter)  # drafts row by row; the target still verifies the whole batch at once
    if cache.get_seq_length() != 0:
        raise ValueError("Speculative decoding starts from an empty cache; pass a fresh cache (or none).")
    if not cache.is_croppable:
        raise ValueError("This target's cache cannot be rolled back (crop), which speculative decoding needs.")
    streamer = hf_specdec_streamer
    stats = speculation_stats if speculation_stats is not None else SpeculationStats()
    attention_mask = model_kwargs.get("attention_mask")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)

    policy.start(k)
    drafter.confidence_threshold = policy.confidence_threshold  # drafters that know their confidence may stop early
    if drafter.supports_batch:
        drafter.start(model, input_ids, generation_config, logits_processor, attention_mask=attention_mask)
    else:
        drafter.start(model, input_ids, generation_config, logits_processor)
    cache.activate_past_recording()
    target = RaggedKV(model, cache, attention_mask[:, :0], fast_cpu_verify, capture_hidden=drafter.uses_target_hidden)
    if drafter.shares_target_cache:
        drafter.share_target_cache(target)

    want_scores = generation_config.return_dict_in_generate and generation_config.output_scores
    want_logits = generation_config.return_dict_in_generate and generation_config.output_logits
    scores_out, logits_out = [], []
    max_length = generation_config.max_length
    pad = generation_config._pad_token_tensor
    pad_id = int(pad) if pad is not None else 0
    batch = RowBatch(input_ids, attention_mask, pad_id)
    finished_rows: dict[int, torch.Tensor] = {}
    if streamer is not None:
        streamer.put(input_ids.cpu())

    while batch.size and input_ids.shape[1] < max_length:
        # Drafts past max_length could never be emitted: the step emits up to max_draft + 1 tokens.
        max_draft = min(policy.next_length(), max_length - int(batch.lengths.max()) - 1)
        step_start, draft_before = time.perf_counter(), stats.draft_seconds
        emitted, num_emitted, raw_logits, scores, num_drafted, stopped_early = speculative_step(
            batch, drafter, target, max_draft, logits_processor, rule, stats
        )
        # A confidence stop is a miss at the next position: choosing a longer length bought nothing there.
        num_tried = num_drafted + int(stopped_early)
        policy.update(num_tried, int(num_emitted.min()) - 1)
        done = []
        for b in range(batch.size):
            n_b = int(num_emitted[b])
            # Append token by token so that every stopping criterion (EOS, stop strings, custom) cuts exactly where
            # plain decoding would have stopped.
            for j in range(n_b):
                batch.append(b, emitted[b, j : j + 1])
                if want_scores:
                    scores_out.append(scores[b : b + 1, j])
                if want_logits:
                    logits_out.append(raw_logits[b : b + 1, j])
                if stopping_criteria(batch.row(b)[None], scores[b : b + 1, j]).any():
                    done.append(b)
                    n_b = j + 1
                    break
            if streamer is not None:
                streamer.put(emitted[b : b + 1, :n_b].cpu())
        keep = [b for b in range(batch.size) if b not in done]
        for b in done:
            finished_rows[batch.original_index[b]] = batch.row(b)
        if done and keep:  # finished rows leave the batch and stop costing work
            rows = torch.tensor(keep, device=input_ids.device)
            target.select_rows(rows)
            if drafter.supports_batch:
                drafter.select_rows(rows)
        batch.select(keep)
        if keep:
            num_accepted = num_emitted[keep] - 1
            if drafter.supports_batch:
                drafter.accepted(batch.right_padded(), num_accepted, lengths=batch.lengths)
            else:
                drafter.accepted(batch.row(0)[None], num_accepted)
        if hasattr(policy, "record_costs"):  # policies that weigh acceptance against what a whole step costs
            draft_seconds = stats.draft_seconds - draft_before
            policy.record_costs(num_drafted, draft_seconds, time.perf_counter() - step_start - draft_seconds,
                                num_tried=num_tried)
    for b, row in zip(batch.original_index, batch.rows):
        finished_rows[b] = row

    if streamer is not None:
        streamer.end()
    sequences = torch.nn.utils.rnn.pad_sequence(
        [finished_rows[b] for b in range(batch_size)], batch_first=True, padding_value=pad_id
    )
    model._hf_specdec_last_stats = stats
    if generation_config.return_dict_in_generate:
        return SpeculativeDecoderOnlyOutput(
            sequences=sequences,
            scores=tuple(scores_out) if want_scores else None,
            logits=tuple(logits_out) if want_logits else None,
            cache=cache,
            speculation_stats=stats,
        )
    return sequences
