"""The drafter protocol: every drafting strategy is one class behind this small, batched interface.

Per `generate()` call the loop calls:

    drafter.start(target, seqs, settings)       # reset per-call state, validate; `target` is the target's RaggedKV
    loop:
        draft = drafter.propose(seqs, max_tokens)               # up to max_tokens tokens per row (+ their q)
        ... ONE target forward verifies the drafts, and the call's rule accepts a path per row ...
        drafter.accepted(seqs, verified)                        # hook: what was kept, the target's hidden states
        drafter.select_rows(rows)                               # when finished rows leave the batch
    drafter.end()                                               # hook: the call is over (its rows have finished)

`seqs` (`Sequences`) holds the rows: each row's real tokens (its prompt without padding, then what it generated), on
the device (`seqs.ids(b)`) and on the host (`seqs.tokens(b)`). `Draft.probs` is the distribution each token was drawn
from (`[B, T, V]`), or None for a deterministic drafter (greedy draft model, n-gram lookup), whose q is one-hot. A draft
is a chain unless it carries a `Tree`. A drafter may propose fewer than `max_tokens` tokens, or none: then the target
simply decodes one token.

`SequenceDrafter` is the simpler interface for a strategy that drafts one sequence at a time (your own, a
cross-tokenizer drafter, a transformers `CandidateGenerator`): the loop wraps it once (`drafters/per_row.py`) so that it
sees one batched signature.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList
from transformers.generation.candidate_generator import CandidateGenerator

from ..tree import Tree
from ..errors import InputError


def for_rows(processor, rows: list[int]):
    """`processor` as it applies to these rows of the caller's batch: one that holds a value per row (the repetition
    penalty's left-padding lengths, since transformers 5) gets a copy holding theirs, in this order."""
    per_row = getattr(processor, "prompt_ignore_length", None)
    if not isinstance(per_row, torch.Tensor):
        return processor
    copy = object.__new__(type(processor))
    copy.__dict__.update(processor.__dict__, prompt_ignore_length=per_row[torch.tensor(rows, device=per_row.device)])
    return copy


@dataclass
class Draft:
    tokens: torch.Tensor  # [B, T] proposed token ids (T may be 0)
    probs: torch.Tensor | None = None  # [B, T, V] the distribution each token was sampled from; None = one-hot
    num_valid: list[int] | None = None  # a chain whose row b proposed only its first num_valid[b] tokens; None = all
    tree: Tree | None = None  # the nodes' shape when they form a tree (one shape for every row); None = a chain
    stopped_early: bool = False  # every row stopped below max_tokens on low confidence: to the draft-length policy
    #   the next position counts as tried and missed (else its acceptance would be measured on confident drafts only)

    def __post_init__(self):
        if isinstance(self.num_valid, torch.Tensor):
            self.num_valid = self.num_valid.tolist()
        if self.num_valid is not None and all(n == self.num_tokens for n in self.num_valid):
            self.num_valid = None

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[1]

    @property
    def shape(self) -> Tree:
        return self.tree if self.tree is not None else Tree.chain(self.num_tokens)

    def valid_mask(self) -> torch.Tensor | None:
        """[B, T] host bools of the nodes each row proposed (None: all of them)."""
        if self.num_valid is None:
            return None
        return torch.arange(self.num_tokens)[None] < torch.tensor(self.num_valid)[:, None]

    def depth_by_row(self) -> list[int]:
        """Per row, how deep its draft reaches (a chain: its length)."""
        if self.num_valid is not None:
            return list(self.num_valid)
        return [self.shape.max_depth] * self.tokens.shape[0]

    @staticmethod
    def empty(batch: int, device) -> "Draft":
        return Draft(torch.zeros(batch, 0, dtype=torch.long, device=device))


@dataclass
class DraftSettings:
    """What a drafter needs to know about the call it drafts for."""

    generation_config: object
    logits_processor: object  # the target's LogitsProcessorList: drafts are shaped by the same processors
    do_sample: bool
    #: drafters that know their confidence stop when their top probability falls below it (None: never). Decide from
    #: the distribution only, before drawing, so that sampling stays exact.
    confidence_threshold: float | None = None
    compile: bool = False  # run the drafter's model through `torch.compile` (drafters whose `compiles_model` is True)
    #: seconds a step verifying k drafts costs, drafting aside (its drafting is spent by the time a drafter sizes a
    #: draft), as this run measured it (None: not measured, or a constant draft length); drafters that size their
    #: drafts themselves (`sizes_own_drafts`) weigh each node's chance against it
    verify_cost: object = None


@dataclass
class Verified:
    """What the target did with a step's draft, as drafters learn it in `accepted`."""

    num_accepted: list[int]  # per row
    hidden: torch.Tensor | None = None  # [B, m, H] the captured hidden states of each row's newly committed tokens
    #   but the newest (its pending tokens, then its accepted drafts), left-aligned; None when nothing was captured
    num_hidden: list[int] | None = None  # per row, how many of `hidden`'s rows are real
    scores: torch.Tensor | None = None  # [B, T + 1, V] the target's processed scores of the step (see `read_tokens`)
    read_tokens: torch.Tensor | None = None  # [B, T + 1] the token each row of `scores` was predicted after: the
    #   row's last pending token, then each draft node (a rejected node's prediction is still the target's)
    mine: list[bool] | None = None  # per row, whether this drafter's draft was the one verified (a fallback drafter's
    #   other part may have drafted the row: its num_accepted is then 0); None: every row's

    def select(self, rows: list[int]) -> None:
        """Keep only these rows (finished rows left the batch)."""
        self.num_accepted = [self.num_accepted[b] for b in rows]
        index = torch.tensor(rows, device=self.scores.device if self.scores is not None else "cpu")
        if self.hidden is not None:
            self.hidden = self.hidden[index.to(self.hidden.device)]
            self.num_hidden = [self.num_hidden[b] for b in rows]
        if self.scores is not None:
            self.scores, self.read_tokens = self.scores[index], self.read_tokens[index]


class Drafting:
    """An autoregressive drafter's step-by-step state, shared by the model drafters.

    Each `step(scores)` applies the target's logits processors on each row's prefix (its sequence plus the drafts so
    far), stops the rows whose top probability is below the confidence threshold (decided from q before drawing, so
    sampling stays exact; the first draft is always proposed), then takes the argmax or a draw from q. Which rows go on
    is read on the host only when a threshold is set (one look per drafted token).
    """

    def __init__(self, settings: DraftSettings, seqs, device):
        rows = [seqs.full(b) for b in range(seqs.size)]
        self.settings, self.rows = settings, rows  # rows: the sequences as the target's processors see them
        # each row's processors: one that holds a value per row of the caller's batch holds this row's
        self.processors = [LogitsProcessorList(for_rows(p, [seqs.index[b]]) for p in settings.logits_processor)
                           for b in range(len(rows))] if settings.logits_processor else None
        self.stops = settings.confidence_threshold is not None
        self.drafting = torch.ones(len(rows), dtype=torch.bool, device=device)
        self.still = torch.ones(len(rows), dtype=torch.bool)  # host copy of `drafting`
        self.counts = torch.zeros(len(rows), dtype=torch.long)
        self.tokens: list[torch.Tensor] = []
        self.probs: list[torch.Tensor] = []
        self.stopped_early = False
        self.device = device

    def step(self, scores: torch.Tensor) -> bool:
        """Choose each row's next draft from its `scores` [B, V]; False when every row has stopped."""
        settings = self.settings
        if self.processors:
            scores = torch.cat([
                self.processors[b](torch.cat([row, *[t[b : b + 1] for t in self.tokens]])[None], scores[b : b + 1])
                for b, row in enumerate(self.rows)
            ])
        may_stop = self.stops and bool(self.tokens)
        q = scores.softmax(dim=-1) if settings.do_sample or may_stop else None
        if may_stop:
            self.drafting = self.drafting & (q.max(dim=-1).values >= settings.confidence_threshold)
            self.still = self.drafting.cpu()
            if not self.still.any():
                self.stopped_early = True
                return False
        self.tokens.append(torch.multinomial(q, 1).squeeze(1) if settings.do_sample else scores.argmax(dim=-1))
        if settings.do_sample:
            self.probs.append(q)
        if self.stops:  # (without a threshold every row drafts every token: the counts are the draft's length)
            self.counts += self.still.long()
        return True

    @property
    def token(self) -> torch.Tensor:
        return self.tokens[-1]

    def draft(self) -> Draft:
        if not self.tokens:
            return Draft.empty(len(self.rows), self.device)
        probs = torch.stack(self.probs, dim=1) if self.probs else None
        return Draft(torch.stack(self.tokens, dim=1), probs, self.counts.numpy().tolist() if self.stops else None,
                     stopped_early=self.stopped_early)


def check_device(module, target, what: str = "drafter") -> None:
    device = next(module.parameters()).device if any(True for _ in module.parameters()) else target.device
    if device != target.device:
        raise InputError(f"The {what} is on {device} but the target is on {target.device}; move it first: "
                         f"`drafter.to({str(target.device)!r})`.")


class Drafter:
    """Base class of every batched drafter. Subclasses implement `propose`; the rest has sensible defaults."""

    #: draft length used when the caller does not pass `num_draft_tokens`
    default_num_draft_tokens: int = 5
    #: whether `compile_drafter=True` can compile its model's forward (a draft model's: see `DraftModelDrafter`)
    compiles_model: bool = False
    #: whether it sizes each draft itself from per-node chances and `settings.verify_cost` (the adaptive policy then
    #: hands it the cap, not a length of its own) ...
    sizes_own_drafts: bool = False
    #: ... and then, inside a fallback drafter, the tokens per second its other part is expected to give this step:
    #: such a drafter drafts nothing (and leaves the step to it) unless it expects more (None: draft what pays)
    rival_rate: float | None = None

    def fork(self) -> "Drafter":
        """The drafter a concurrent call decodes with while this one is busy: it shares what this drafter knows (its
        model, tables, index, what it learned) and gets per-call state of its own, which `start` sets (a shallow copy;
        the drafters it combines are forked too). Override when per-call state outlives `start`."""
        clone = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, Drafter):
                setattr(clone, name, value.fork())
        return clone

    @classmethod
    def for_target(cls, target, options=None) -> "Drafter":
        """The drafter an assistant name builds (`assistants/grammar.py`: "ngram", "self:L", ...), with its kind's
        `options` (what the name's ':arg' set) as keywords."""
        return cls(**options.drafter_keywords()) if options is not None else cls()

    def start(self, target, seqs, settings: DraftSettings) -> None:
        """Called once per `generate()` call, before any target forward. Validate and reset per-call state here.
        `target` is the target's `RaggedKV` (its model is `target.model`)."""
        self.settings = settings

    def propose(self, seqs, max_tokens: int) -> Draft:
        raise NotImplementedError

    def own_verification(self, target, pending: torch.Tensor, pending_valid: torch.Tensor, draft: Draft):
        """This step's verification logits if this drafter computes them its own way (it ran part of the target as it
        drafted: self-speculation), else None: the step runs its one target forward (`verify` in
        `generation/verification.py`, which says what the arguments and the logits are)."""
        return None

    def accepted(self, seqs, verified: Verified) -> None:
        """`seqs` now ends with each row's accepted drafts plus the target's token."""

    def select_rows(self, rows: list[int]) -> None:
        """Keep only these rows (finished rows have left the batch)."""

    def end(self) -> None:
        """The call is over: its last rows have finished (what a drafter learns across calls is kept here)."""

    def vocab_size(self) -> int | None:
        """Size of the token space the drafter proposes in, or None when it proposes the target's own ids."""
        return None

    def draft_cost(self, target_model) -> float:
        """What drafting one more position costs, as a share of the target's forward of one token per row: the
        "calibrated" draft-length policy prices drafts with it instead of timing them, so that its lengths depend on
        nothing that varies from run to run. 0 here: a lookup on the host costs next to nothing (a drafter that runs
        a model says so, with `share_of_target`)."""
        return 0.0


def share_of_target(target_model, *modules) -> float:
    """The share of a one-token target forward that running `modules` costs, from their sizes: the larger of their
    share of the target's weights (what bounds a small batch's matrix products) and of its linear layers (what bounds
    a small model's forward, one kernel each)."""
    def size(mods):
        params = {id(p): p.numel() for m in mods for p in m.parameters()}
        linears = {id(x) for m in mods for x in m.modules() if isinstance(x, torch.nn.Linear)}
        return sum(params.values()), len(linears)

    params, linears = size(modules)
    all_params, all_linears = size([target_model])
    return max(params / max(all_params, 1), linears / max(all_linears, 1))


def borrowed_head(model, target_model) -> list:
    """The target's LM head, when `model` borrows it (it is then none of the model's own parameters)."""
    from ..models.borrowed import BorrowsFromTarget

    own = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    borrowing = isinstance(model, BorrowsFromTarget) and (own is None or not any(True for _ in own.parameters()))
    return [target_model.get_output_embeddings()] if borrowing else []


class SequenceDrafter:
    """A drafter of one sequence at a time: implement `propose(input_ids [1, L], max_tokens) -> Draft`.

    `input_ids` holds the row's real tokens (prompt without padding, then what it generated). In a batch each row
    gets its own shallow copy (`drafters/per_row.py`), and the target still verifies the batch in one forward.
    """

    default_num_draft_tokens: int = 5

    def start(self, target, input_ids: torch.Tensor, settings: DraftSettings) -> None:
        """Once per row and `generate()` call; `target` is the target model."""
        self.settings = settings

    def propose(self, input_ids: torch.Tensor, max_tokens: int) -> Draft:
        raise NotImplementedError

    def draft_cost(self, target_model) -> float:
        """As `Drafter.draft_cost` (a sequence drafter with a model says so)."""
        return 0.0

    def accepted(self, input_ids: torch.Tensor, num_accepted: int) -> None:
        """`input_ids` now ends with the accepted drafts plus the target's token."""

    def vocab_size(self) -> int | None:
        return None


class CandidateGeneratorDrafter(SequenceDrafter):
    """Adapter: any `transformers` `CandidateGenerator` used as a drafter.

    Its candidate logits (already processed, as transformers defines them) give q by softmax; without logits, the
    candidates are treated as deterministic proposals.
    """

    def __init__(self, candidate_generator: CandidateGenerator):
        self.candidate_generator = candidate_generator

    def __copy__(self):
        """A row's copy (`PerRowDrafter`): a candidate generator keeps one sequence's state (an assistant's cache, its
        draft length), so each row gets its own, sharing the modules and tensors the generator holds."""
        shared = {id(v): v for v in vars(self.candidate_generator).values()
                  if isinstance(v, (torch.nn.Module, torch.Tensor))}
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.candidate_generator = copy.deepcopy(self.candidate_generator, shared)
        return clone

    def draft_cost(self, target_model):
        assistant = getattr(self.candidate_generator, "assistant_model", None)
        return share_of_target(target_model, assistant) if isinstance(assistant, torch.nn.Module) else 0.0

    def propose(self, input_ids, max_tokens):
        candidate_ids, candidate_logits = self.candidate_generator.get_candidates(input_ids)
        tokens = candidate_ids[:, input_ids.shape[1] :][:, :max_tokens]
        probs = None
        if candidate_logits is not None:
            probs = candidate_logits[:, : tokens.shape[1]].float().softmax(dim=-1)
        return Draft(tokens, probs)

    def accepted(self, input_ids, num_accepted):
        self.candidate_generator.update_candidate_strategy(input_ids, None, num_accepted)
