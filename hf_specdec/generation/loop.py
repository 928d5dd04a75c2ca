"""The speculative decoding loop: `speculative_generate`, a `custom_generate` callable for `model.generate()`.

`generate()` prepares the generation config, the logits processors (warpers included), the stopping criteria and the
cache, then calls this loop, which reads as four phases:

    1. validate   every check that can fail, before any forward pass            (validate.py)
    2. set up     the drafter, the target's ragged cache, the rows               (below)
    3. decode     while rows remain: one step (draft, verify, accept, roll back)  (step.py)
                  then emit its tokens (stopping exactly where plain decoding does)  (emit.py)
    4. finish     the sequences, in generate()'s output types                   (below)
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, fields

import torch
from transformers import DynamicCache, LogitsProcessorList
from transformers.generation.streamers import BaseStreamer

from ..assistants.resolve import resolve
from ..cache.keyword import CACHE
from ..cache.ragged import RaggedKV
from ..drafters.base import Drafter, DraftSettings, for_rows
from ..errors import InputError
from ..speed.cpu_matmul import routed
from .draft_length import DraftLengthPolicy, policy_for_call
from .emit import Stopper, emit
from .sequences import Sequences
from .stats import SpeculationStats, SpeculativeDecoderOnlyOutput
from .step import DeviceClock, speculative_step
from .validate import decodes_rows_alone, request_for, validate
from .verification import AcceptRule


@dataclass(frozen=True)
class SpeculationOptions:
    """What a call asks of speculation beyond `generate()`'s own configuration: `speculative_generate`'s keyword
    arguments, defined here once (its signature is made from these fields, since `generate()` hands a callable only
    the arguments its signature names).

    assistant: a drafter name such as 'ngram' or 'distilled', a draft model, a `Drafter`, a folder or Hub id (see
        `hf_specdec.assistants.resolve`).
    num_draft_tokens: the most drafts per step (None: the drafter's own default).
    speculation_stats: a `SpeculationStats` to accumulate into (None: a fresh one, returned with dict outputs).
    draft_length: 'constant', 'adaptive', 'calibrated' or a policy (`draft_length.py`); None: adaptive for greedy
        decoding of one sequence, else calibrated; `num_draft_tokens` stays the cap.
    fast_cpu_verify: the target's CPU matmul path for verification forwards (`cpu_matmul.py`).
    compile_drafter: run a draft model's forward through `torch.compile` (its first call compiles; see
        `DraftModelDrafter`).
    streamer: a transformers streamer, passed as `hf_specdec_streamer=` (`generate()` keeps its own `streamer=` from
        callables).
    verification: 'exact', or 'typical' (typical acceptance, Cai et al. 2024, with `typical_threshold` /
        `typical_alpha`: sampling only, LOSSY).
    """

    assistant: object = None
    num_draft_tokens: int | None = None
    speculation_stats: SpeculationStats | None = None
    draft_length: object = None
    fast_cpu_verify: bool = True
    compile_drafter: bool = False
    streamer: BaseStreamer | None = field(default=None, metadata={"keyword": "hf_specdec_streamer"})
    verification: str = "exact"
    typical_threshold: float = 0.09
    typical_alpha: float = 0.3

    @staticmethod
    def keyword(f) -> str:
        return f.metadata.get("keyword", f.name)

    @classmethod
    def taken_from(cls, keywords: dict) -> "SpeculationOptions":
        """The options among a call's keyword arguments (removed from `keywords`, which keeps the model's)."""
        return cls(**{f.name: keywords.pop(cls.keyword(f)) for f in fields(cls) if cls.keyword(f) in keywords})

    def as_keywords(self) -> dict:
        return {self.keyword(f): getattr(self, f.name) for f in fields(self)}


@dataclass
class Run:
    """One `generate()` call's decoding state."""

    target: RaggedKV
    drafter: Drafter
    policy: DraftLengthPolicy
    rule: AcceptRule
    processors: LogitsProcessorList
    stopper: Stopper
    seqs: Sequences
    stats: SpeculationStats
    max_length: int
    pending: torch.Tensor  # [B, u] each row's tokens not yet in the target's cache (the prompt at first)
    pending_valid: torch.Tensor  # [B, u] host bools: which of them are real (the prompt's padding is not)
    streamer: BaseStreamer | None = None
    want_scores: bool = False
    want_logits: bool = False
    scores_out: list = field(default_factory=list)
    logits_out: list = field(default_factory=list)
    finished: dict = field(default_factory=dict)  # the caller's row index -> its final sequence
    clock: DeviceClock = None

    def __post_init__(self):
        self.clock = DeviceClock(self.pending.device)


@torch.no_grad()
def speculative_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    **model_kwargs,
):
    """Exact speculative decoding, used as `model.generate(..., custom_generate=speculative_generate, assistant=...)`.

    Greedy output is token-identical to plain greedy `generate()` (row by row for left-padded batches); sampled output
    has exactly the target's distribution (after every logits processor and warper `generate()` built). The keyword
    arguments after `synced_gpus` are `SpeculationOptions`' fields; the rest are the model's.
    """
    options = SpeculationOptions.taken_from(model_kwargs)
    # 1. Validate every input before any forward pass (the drafter's own checks once it is built or loaded).
    rule = validate(model, input_ids, generation_config, model_kwargs, synced_gpus, options)
    if input_ids.shape[0] > 1 and decodes_rows_alone(model):
        return decode_rows_alone(model, input_ids, logits_processor, stopping_criteria, generation_config, options,
                                 model_kwargs)
    # this call's drafter (a fork, when another call holds it) and draft-length policy (what "adaptive" learned before)
    sampling = bool(generation_config.do_sample)
    assistant = resolve(options.assistant, model, sampling)
    with assistant.claimed() as drafter, policy_for_call(
            options.draft_length, assistant.learner, model, input_ids.shape[0], sampling,
            drafter.sizes_own_drafts) as policy:
        request = request_for(model, model_kwargs, drafter, options.num_draft_tokens, rule)
        # 2. Set up the rows, the target's ragged cache and the drafter.
        run = set_up(model, input_ids, logits_processor, stopping_criteria, generation_config, request, drafter,
                     policy, model_kwargs.get("attention_mask"), options)
        # 3. Decode: a step drafts, verifies and accepts for every row; emit appends what each row keeps.
        with routed(model, run.target.fast):  # the target's CPU matmul path, for this call (cpu_matmul.py)
            decode(run)
        # 4. Finish.
        return finish(run, generation_config, request.cache, input_ids.shape[0])


def decode_rows_alone(model, input_ids, logits_processor, stopping_criteria, generation_config,
                      options: SpeculationOptions, model_kwargs: dict):
    """A batch of a target whose cache cannot hold rows that advance unevenly (`decodes_rows_alone`: sliding windows,
    convolution layers): each row decodes alone, exactly as at batch 1 (its left padding kept), with a cache of its
    own, and the rows come back padded together as `generate()` pads them (no cache is returned)."""
    batch = input_ids.shape[0]
    stats = options.speculation_stats if options.speculation_stats is not None else SpeculationStats()
    keywords = options.as_keywords()
    rows = []
    for b in range(batch):
        row_kwargs = {key: value[b : b + 1] if isinstance(value, torch.Tensor) and value.shape[:1] == (batch,) else value
                      for key, value in model_kwargs.items()}
        row_kwargs[CACHE] = DynamicCache(config=model.config)
        processors = LogitsProcessorList(for_rows(processor, [b]) for processor in logits_processor)
        keywords["speculation_stats"] = row_stats = SpeculationStats()
        out = speculative_generate(model, input_ids[b : b + 1], processors, stopping_criteria, generation_config,
                                   **keywords, **row_kwargs)
        stats.merge(row_stats, first_row=b)
        rows.append((out.sequences if generation_config.return_dict_in_generate else out)[0])
    pad = generation_config._pad_token_tensor
    sequences = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=int(pad))
    if not generation_config.return_dict_in_generate:
        return sequences
    return SpeculativeDecoderOnlyOutput(sequences=sequences, **{CACHE: None}, speculation_stats=stats)


def set_up(model, input_ids, logits_processor, stopping_criteria, generation_config, request, drafter: Drafter,
           policy: DraftLengthPolicy, attention_mask, options: SpeculationOptions) -> Run:
    if options.compile_drafter and not drafter.compiles_model:  # (before any cache is touched)
        raise InputError(f"compile_drafter=True compiles a draft model's forward, and {type(drafter).__name__} drafts "
                         "without one: drop compile_drafter.")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    policy.calibrate(model, drafter, input_ids.shape[0], request.num_draft_tokens, options.fast_cpu_verify)
    policy.start(request.num_draft_tokens)
    seqs = Sequences(input_ids, attention_mask)
    target = RaggedKV(model, request.cache, input_ids.shape[0], options.fast_cpu_verify)
    settings = DraftSettings(generation_config, logits_processor, bool(generation_config.do_sample),
                             policy.confidence_threshold, compile=options.compile_drafter, verify_cost=policy.verify_cost)
    drafter.start(target, seqs, settings)  # may still refuse the call: no forward has run yet
    if options.streamer is not None:
        options.streamer.put(input_ids.cpu())
    want = generation_config.return_dict_in_generate
    run = Run(target=target, drafter=drafter, policy=policy, rule=request.rule, processors=logits_processor,
              stopper=Stopper(stopping_criteria, generation_config.max_length), seqs=seqs,
              stats=options.speculation_stats if options.speculation_stats is not None else SpeculationStats(),
              max_length=generation_config.max_length, pending=input_ids, pending_valid=seqs.prompt_mask.clone(),
              streamer=options.streamer, want_scores=want and bool(generation_config.output_scores),
              want_logits=want and bool(generation_config.output_logits))
    if input_ids.shape[1] >= run.max_length:  # nothing to generate, as in plain decoding
        run.finished = dict(enumerate(input_ids))
        seqs.select([])
    return run


def decode(run: Run) -> None:
    """Steps until every row is finished. The first step runs as `generate()` runs the rest of the call; every later
    step in inference mode, which makes each operation's dispatch cheaper (about a tenth of a small model's forward).
    The caches' tensors are made by the first step (the prompt's forward, and a static cache's lazily made layers), so
    they stay ordinary tensors that a later plain `generate()` can update in place."""
    if run.seqs.size:
        emit(run, speculative_step(run))
    with torch.inference_mode():
        while run.seqs.size:
            emit(run, speculative_step(run))


def finish(run: Run, generation_config, cache, batch_size: int):
    run.drafter.end()
    if run.streamer is not None:
        run.streamer.end()
    pad = generation_config._pad_token_tensor
    sequences = torch.nn.utils.rnn.pad_sequence([run.finished[b] for b in range(batch_size)], batch_first=True,
                                                padding_value=int(pad) if pad is not None else 0)
    if not generation_config.return_dict_in_generate:
        return sequences
    return SpeculativeDecoderOnlyOutput(
        sequences=sequences,
        scores=tuple(s.clone() for s in run.scores_out) if run.want_scores else None,  # (clones: ordinary tensors)
        logits=tuple(x.clone() for x in run.logits_out) if run.want_logits else None,
        **{CACHE: cache},
        speculation_stats=run.stats,
    )


# generate() passes a custom loop only the keyword arguments its signature names: the options' fields are named here
speculative_generate.__signature__ = inspect.signature(speculative_generate).replace(parameters=[
    *(p for p in inspect.signature(speculative_generate).parameters.values() if p.kind != p.VAR_KEYWORD),
    *(inspect.Parameter(SpeculationOptions.keyword(f), inspect.Parameter.KEYWORD_ONLY, default=f.default)
      for f in fields(SpeculationOptions)),
    inspect.Parameter("model_kwargs", inspect.Parameter.VAR_KEYWORD)])

__all__ = ["speculative_generate", "SpeculationOptions", "Run"]
