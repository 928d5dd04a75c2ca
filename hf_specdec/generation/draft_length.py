"""How many tokens to draft at each step: a constant, or chosen from what the run has seen.

`num_draft_tokens` is always the cap. The adaptive policies pick, before each step, the draft length k in [0, cap]
that maximises expected tokens per second:

    E(k) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_k        (tokens a step emits; a_i = P(draft i accepted | i-1 was))
    T(k) = k * (drafting time per token) + (the rest of a step whose forward verifies k + 1 tokens)

with a_i counted from the accepted prefixes so far (a position's recent trials weigh more; apart after a fully accepted
step, as acceptance comes in runs; a drafter's stop on low confidence counts as a miss, since a_i must be what asking
for i drafts yields). k = 0 is a plain decoding step, so a drafter that does not pay costs little; now and then the
policy tries a length next to its choice when that length is nearly as good, so that close calls follow the text.
Drafters that know their confidence (draft models, feature drafters, positionwise chains, self-speculation) also stop
a step early when their top probability falls below `confidence_threshold`; that decision depends only on the
drafter's distribution before a token is drawn, and the length choice only on past steps, so sampling stays exact.

- `AdaptiveDraftLength` ("adaptive", the default for greedy decoding of one sequence) times both parts of T on the
  steps themselves and keeps what it learned for the same assistant, target and batch size across calls: it follows
  the machine, but lengths that follow measured times make a seeded sample differ from run to run.
- `CalibratedDraftLength` ("calibrated", the default for sampling and batches) prices T in advance (verification
  measured once per target, batch size and machine: `step_costs.py`; drafting from the drafter's size:
  `Drafter.draft_cost`) and counts a_i per batch row within the call: the same seed, prompt and drafter give the same
  lengths, so the same sample.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import weakref
from dataclasses import dataclass, field

from ..errors import InputError


@dataclass
class StepOutcome:
    """What a step did, as the loop reports it to the policy after each step."""

    num_drafted: int  # draft tokens verified (a chain: its length; a tree: its nodes)
    num_tried: int | list[int]  # per row, chain positions tried: its drafts, plus one when the drafter stopped on low
    #   confidence (a miss)
    num_accepted: int | list[int]  # per row, drafts accepted
    draft_seconds: float  # drafting time
    step_seconds: float  # the whole step: drafting, the verification forward, acceptance and roll-back
    tree_paths: list[list[int]] | None = None  # a tree step: each row's accepted nodes (None: a chain step)
    rows: list[int] | None = None  # the caller's index of each row above (None: 0, 1, ...)
    next_rows: list[int] | None = None  # the caller's rows the next step decodes (those that did not finish)


class DraftLengthPolicy:
    """The protocol: `start(cap)` once per call, `next_length()` before each step, `update(outcome)` after it."""

    confidence_threshold: float | None = None

    def start(self, cap: int) -> None:
        self.cap = cap

    def next_length(self) -> int:
        return self.cap

    def update(self, outcome: StepOutcome) -> None:
        pass

    def calibrate(self, model, drafter, batch_size: int, cap: int, fast_cpu_verify: bool) -> None:
        """Before `start`: the target, the call's drafter and batch size, for a policy that prices steps in advance."""

    def verify_cost(self, k: int) -> float | None:
        """Seconds a step verifying k drafts costs as measured in this run, drafting aside, or None (nothing measured:
        a constant length)."""
        return None


@dataclass
class ConstantDraftLength(DraftLengthPolicy):
    """Always draft up to the cap."""

    confidence_threshold: float | None = None


@dataclass
class ChainAcceptance:
    """a_i by chain position, from the accepted prefixes of chain steps (drafts of a draft model, n-gram lookup...)."""

    decay: float = 0.95
    prior: float = 0.5  # a_1 before any trial
    # decayed counts by draft position, kept apart for steps that follow a fully accepted step (True) and the rest:
    # acceptance comes in runs (a copied span, a formulaic answer), which one average would smear out
    # (None: after a plain step, which says nothing about what comes next: both states' pooled counts apply)
    accepted: dict = field(default_factory=lambda: {True: [], False: [], None: []})
    drafted: dict = field(default_factory=lambda: {True: [], False: [], None: []})
    in_run: bool | None = None

    def record(self, outcome: StepOutcome) -> None:
        self.record_prefixes(outcome.num_tried, outcome.num_accepted)

    def record_prefixes(self, num_tried: int | list[int], num_accepted: int | list[int]) -> None:
        """The positions a step tried (its drafts, plus one when the drafter stopped on low confidence, which counts
        as a miss: a_i must be what choosing a length i yields, not the acceptance of confident drafts alone) and how
        many of them the target accepted; per row in a batch (each row is a trial: tokens per second count them all)."""
        rows = [(d, a) for d, a in zip(*(x if isinstance(x, list) else [x] for x in (num_tried, num_accepted))) if d]
        if not rows:
            self.in_run = None
            return
        drafted, accepted = self.drafted[self.in_run], self.accepted[self.in_run]
        while len(drafted) < max(d for d, _ in rows):
            drafted.append(0.0)
            accepted.append(0.0)
        # Only the positions this step tried age: a position tried rarely keeps what its trials showed, instead of
        # fading into the prior and looking as good as position 1 (which would draw the policy to it).
        for tried, ok in rows:
            for i in range(min(tried, ok + 1)):  # positions past the first rejection were not tried
                drafted[i] = self.decay * drafted[i] + 1
                accepted[i] = self.decay * accepted[i] + int(i < ok)
        self.in_run = all(a == d for d, a in rows)

    def expected(self, cap: int, prior: list[float] | None = None) -> list[float]:
        """E(k) for k = 0..cap in the current state (after a fully accepted step, a rejection, or a plain step, which
        uses the pooled counts alone). a_i is the state's own count pulled (two pseudo-steps) towards both states'
        pooled estimate, which in turn falls back (one pseudo-step) on the previous position's, or on `prior[i]` (a
        batch's pooled a_i, for one of its rows): positions rarely tried borrow from their neighbours, not from an
        optimistic guess."""
        expected, reach, pooled = [1.0], 1.0, self.prior
        for i in range(cap):
            if prior is not None:
                pooled = prior[i]
            own_d, own_a, all_d, all_a = 0.0, 0.0, 0.0, 0.0
            for state in (True, False, None):
                d, a = self.drafted[state], self.accepted[state]
                if i < len(d):
                    all_d, all_a = all_d + d[i], all_a + a[i]
                    if state is self.in_run and state is not None:
                        own_d, own_a = d[i], a[i]
            pooled = (all_a + pooled) / (all_d + 1)
            reach *= (own_a + 2 * pooled) / (own_d + 2)
            expected.append(expected[-1] + reach)
        return expected

    def rates(self, cap: int) -> list[float]:
        """a_i for i = 1..cap (see `expected`)."""
        expected = self.expected(cap)
        return [(expected[i + 1] - expected[i]) / max(expected[i] - expected[i - 1], 1e-9) if i else expected[1] - 1
                for i in range(cap)]


@dataclass
class RowAcceptance:
    """a_i per row of a batch, each row's counts pulled towards the batch's pooled ones, and E(k) the mean of the
    rows furthest behind among those the next step decodes: one row may copy code while another writes prose, and a
    batch ends with its slowest row, so a row that is ahead (its drafts were accepted, or it finishes early) gains the
    call nothing more from drafts, while a drafted width costs every row (on a CPU a step costs nearly the same at
    any number of rows). Pooled over the rows, one copying row kept a whole batch drafting for its own sake."""

    decay: float = 0.95
    prior: float = 0.5  # a_1 before any trial
    pooled: ChainAcceptance = None
    rows: dict = field(default_factory=dict)  # the caller's row index -> its ChainAcceptance
    emitted: dict = field(default_factory=dict)  # the caller's row index -> tokens this call's steps gave it
    current: list[int] | None = None  # the rows the next step decodes (None: before the first step)

    def __post_init__(self):
        self.pooled = self.pooled or ChainAcceptance(self.decay, self.prior)

    def record(self, outcome: StepOutcome) -> None:
        tried, accepted = ([x] if isinstance(x, int) else x for x in (outcome.num_tried, outcome.num_accepted))
        self.pooled.record_prefixes(tried, accepted)
        for row, d, a in zip(outcome.rows or range(len(tried)), tried, accepted):
            self.rows.setdefault(row, ChainAcceptance(self.decay, self.prior)).record_prefixes(d, a)
            self.emitted[row] = self.emitted.get(row, 0) + a + 1
        self.current = outcome.next_rows

    def expected(self, cap: int) -> list[float]:
        if not self.current or len(self.rows) <= 1:
            return self.pooled.expected(cap)  # (one row: its own counts are the pooled ones)
        prior = self.pooled.rates(cap)
        behind = min(self.emitted.get(b, 0) for b in self.current)
        rows = [self.rows.get(b) for b in self.current if self.emitted.get(b, 0) == behind]
        each = [row.expected(cap, prior) if row else self.pooled.expected(cap) for row in rows]
        return [sum(e[k] for e in each) / len(each) for k in range(cap + 1)]


@dataclass
class TreeAcceptance:
    """How often each node of a tree step (the tree's node order, likeliest first) is on the accepted path: a tree
    drafter's budget is its number of nodes."""

    decay: float = 0.95
    verified: list = field(default_factory=list)  # decayed counts per node of being verified ...
    accepted: list = field(default_factory=list)  # ... and accepted

    def record(self, outcome: StepOutcome) -> None:
        size = outcome.num_drafted
        grow = size - len(self.verified)
        self.verified += [0.0] * grow
        self.accepted += [0.0] * grow
        for path in outcome.tree_paths:
            on_path = set(path)
            for i in range(size):
                self.verified[i] = self.decay * self.verified[i] + 1
                self.accepted[i] = self.decay * self.accepted[i] + (i in on_path)

    def expected(self, cap: int) -> list[float]:
        """E(n) for n = 0..cap nodes: 1 + the chance of each of the first n nodes to be on the accepted path (a node
        seldom verified borrows from half its parent-in-order's estimate, an optimistic guess a wider tree will test)."""
        expected, previous = [1.0], 0.5
        for i in range(cap):
            seen, hits = (self.verified[i], self.accepted[i]) if i < len(self.verified) else (0.0, 0.0)
            p = (hits + previous) / (seen + 1)
            expected.append(expected[-1] + p)
            previous = 0.5 * p
        return expected


@dataclass
class AdaptiveDraftLength(DraftLengthPolicy):
    """The draft length with the most expected tokens per second, from measured acceptance and step costs."""

    confidence_threshold: float | None = 0.3
    #: weight kept by a position's past trials at each new one (recent acceptance matters more: prose vs code...)
    decay: float = 0.95
    #: every this many steps, try a length next to the best one instead, so that its estimates stay current...
    explore_every: int = 32
    #: ... if its estimated tokens per second are within this fraction of the best length's; and, from a plain step,
    #: no more often than an exploration's estimated loss (a drafted width costs a batch 1.3-1.6 plain steps on a CPU)
    #: spread over the steps since the last one stays under this share of the time
    explore_margin: float = 0.05
    explore_budget: float = 0.005
    #: a plain step (k = 0) is chosen only when estimated this much faster than the best drafting length
    plain_margin: float = 0.1
    # what a step verifying n tokens costs now: `level` (how fast the machine runs at present: it moves with every step)
    # times `shape[n]` (the width's cost relative to that level: it moves only when that width is measured), so that a
    # width not tried for a while is still priced at today's speed
    verify_seconds: dict[int, float] = field(default_factory=dict)  # tokens in the verification forward -> seconds
    verify_samples: dict[int, int] = field(default_factory=dict)  # how many steps measured each width
    shape: dict[int, float] = field(default_factory=dict)
    level: float | None = None
    draft_seconds_per_token: float | None = None
    previous_drafted: int | None = None  # the last step's drafts (0: a plain step)
    steps: int = 0
    explored_at: int = 0  # the step of the last exploration
    explorations: int = 0
    #: the drafter sizes each draft itself, from its own per-node chances against `verify_cost` (`sizes_own_drafts`):
    #: once the costs are measured the policy hands it the cap
    drafter_sizes: bool = False

    def __post_init__(self):
        self.chain, self.tree = ChainAcceptance(self.decay), TreeAcceptance(self.decay)
        self.acceptance = self.chain  # the estimator of the kind of step last taken (a fallback drafter mixes them)

    def start(self, cap: int) -> None:
        self.cap = cap
        self.first_step = True  # its forward also reads the prompt: not timed

    def next_length(self) -> int:
        self.steps += 1
        if not self.verify_seconds:
            return self.cap  # nothing measured yet: learn acceptance first
        if 1 not in self.verify_seconds:
            return 0  # the cost of a plain step, to compare every length with
        if self.drafter_sizes:  # (it weighs each node's own chance against `verify_cost`: an average would cut the
            return self.cap     #  long confident drafts short, and pad the doubtful ones)
        expected = self.acceptance.expected(self.cap)
        rate = [expected[k] / self.step_seconds(k) for k in range(self.cap + 1)]
        best = max(range(1, self.cap + 1), key=rate.__getitem__)
        # A plain step only when clearly better: it is not as cheap as it looks, since a drafter with a cache of its
        # own feeds the skipped tokens at its next step, and that cost is booked as drafting.
        if rate[0] > (1 + self.plain_margin) * rate[best]:
            best = 0
        if self.steps - self.explored_at >= self.explore_every:
            # now and then a neighbour that is estimated nearly as good, so that close calls get re-measured; a
            # clearly worse length is not tried again (what it costs would be lost for nothing); from plain steps,
            # one draft all the same, since plain steps measure no acceptance and would never be left otherwise, but
            # only as often as `explore_budget` allows what that draft is estimated to lose
            if best:
                neighbour = best + (-1 if self.explorations % 2 else 1)
                self.explored_at, self.explorations = self.steps, self.explorations + 1
                if 0 <= neighbour <= self.cap and rate[neighbour] >= (1 - self.explore_margin) * rate[best]:
                    best = neighbour
            elif self.steps - self.explored_at >= (1 - rate[1] / rate[0]) / self.explore_budget:
                best, self.explored_at, self.explorations = 1, self.steps, self.explorations + 1
        return best

    def update(self, outcome: StepOutcome) -> None:
        self.acceptance = self.chain if outcome.tree_paths is None else self.tree
        self.acceptance.record(outcome)
        tried = outcome.num_tried
        self.record_costs(outcome.num_drafted, outcome.draft_seconds, outcome.step_seconds - outcome.draft_seconds,
                          num_tried=max(tried, default=0) if isinstance(tried, list) else tried)

    def record_costs(self, num_drafted: int, draft_seconds: float, verify_seconds: float, num_tried: int | None = None) -> None:
        """A step's drafting time, and the rest (verification forward, acceptance, cache roll-back and bookkeeping).
        `num_tried` counts a confidence stop's extra drafter pass (see `ChainAcceptance.record_prefixes`)."""
        first, self.first_step = self.first_step, False
        if not first:  # the first step's forward also reads the prompt: its verification time says nothing
            n = num_drafted + 1
            seen = self.verify_samples.get(n, 0)
            self.verify_samples[n] = seen + 1
            if self.level is None:
                self.level = verify_seconds
            if seen <= 1:
                # the first forward of a width may carry one-time costs (the CPU path timing its matmuls, the
                # allocator growing): the second sample replaces it
                self.shape[n] = verify_seconds / self.level
            else:
                # noise on a shared machine only ever adds time: a sample far above the estimate moves it little
                slower = verify_seconds / (self.shape[n] * self.level)
                self.level *= 1 + (0.2 if slower < 1.5 else 0.05) * (slower - 1)
                self.shape[n] += (0.1 if slower < 1.5 else 0.02) * (verify_seconds / self.level - self.shape[n])
            self.verify_seconds = {m: shape * self.level for m, shape in self.shape.items()}
        tried = num_drafted if num_tried is None else num_tried
        # A drafter with a cache of its own first feeds what it has not seen (the prompt at a call's first step, the
        # tokens of the plain steps before): such a step's drafting time is not what a draft token costs (booked so,
        # every exploration after 32 plain steps made drafting look dearer, and the policy stayed plain)
        caught_up = first or self.previous_drafted == 0
        self.previous_drafted = num_drafted
        if tried and not caught_up:
            per_token = draft_seconds / tried
            old = self.draft_seconds_per_token
            self.draft_seconds_per_token = per_token if old is None else 0.7 * old + 0.3 * per_token

    def verify_cost(self, k: int) -> float | None:
        return self.verify_part(k) if 1 in self.verify_seconds else None

    def step_seconds(self, k: int) -> float:
        """Drafting plus the rest of a step with k drafts."""
        return k * (self.draft_seconds_per_token or 0.0) + self.verify_part(k)

    def verify_part(self, k: int) -> float:
        """A step with k drafts but its drafting: times in between measured lengths are interpolated, beyond the
        longest one extrapolated along the last measured slope (never downwards); and, for drafting widths, never above
        a wider forward's measured time (a narrower forward does no more work: a higher figure is noise that would
        otherwise keep that length from ever being tried again)."""
        n, known = k + 1, sorted(self.verify_seconds)
        below = [m for m in known if m <= n]
        above = [m for m in known if m >= n]
        if below and above:
            lo, hi = below[-1], above[0]
            w = 0.0 if hi == lo else (n - lo) / (hi - lo)
            verify = (1 - w) * self.verify_seconds[lo] + w * self.verify_seconds[hi]
        elif above:
            verify = self.verify_seconds[above[0]]
        else:
            verify = self.verify_seconds[below[-1]]
            if len(below) >= 2:
                lo, hi = below[-2], below[-1]
                slope = max(0.0, (self.verify_seconds[hi] - self.verify_seconds[lo]) / (hi - lo))
                verify += slope * (n - hi)
        wider = [self.verify_seconds[m] for m in known if m > n]
        if wider and n > 1:  # (a plain step is priced as measured: on some CPUs a one-token forward really costs more
            verify = min(verify, min(wider))  # than a two-token one, and pricing it lower kept the policy plain)
        return verify


@dataclass
class CalibratedDraftLength(AdaptiveDraftLength):
    """The same choice as `AdaptiveDraftLength`, made from nothing that varies from run to run: acceptance by position
    and by row as this call counts it (it starts afresh at every call), verification costs measured once per target,
    batch size and machine before the call (`step_costs.py`), and drafting priced from the drafter's size
    (`Drafter.draft_cost`). The same seed, prompt and drafter give the same lengths, so the same sample, on this
    machine; per row in batches, where a drafted width costs every row a slot."""

    confidence_threshold: float | None = 0.3
    #: drafting only when estimated 5% faster than a plain step: its prices are estimates made in advance, and where
    #: they are close (a batch, a sampled chat) a wrong call must not cost more than no drafting
    plain_margin: float = -0.05
    #: a_1 before the call's first trial: what n-gram lookup and the shipped heads measure on the dev prompts, sampled
    #: or batched (each call starts afresh, so an optimistic guess would cost every call its first steps)
    prior: float = 0.3
    #: greedy calls only (their output does not depend on the lengths): the call's own step times are watched, and
    #: once its drafting steps have cost more per token than its plain steps, it drafts no more (`LossWatch`)
    watch_losses: bool = False

    def __post_init__(self):
        super().__post_init__()
        self.chain = self.acceptance = RowAcceptance(self.decay, self.prior)
        self.watch = LossWatch() if self.watch_losses else None

    def calibrate(self, model, drafter, batch_size: int, cap: int, fast_cpu_verify: bool) -> None:
        from .step_costs import verify_seconds

        self.verify_seconds = self.shape = verify_seconds(model, batch_size, cap + 1, fast_cpu_verify)
        self.level = 1.0
        self.draft_seconds_per_token = drafter.draft_cost(model) * self.verify_seconds[1]

    def start(self, cap: int) -> None:
        super().start(cap)
        self.chain = self.acceptance = RowAcceptance(self.decay, self.prior)  # every call afresh: its rows are its own
        self.tree, self.steps, self.explored_at = TreeAcceptance(self.decay), 0, 0
        self.watch = LossWatch() if self.watch_losses else None

    def next_length(self) -> int:
        length = super().next_length()
        return length if self.watch is None else self.watch.length(length)

    def update(self, outcome: StepOutcome) -> None:
        self.acceptance = self.chain if outcome.tree_paths is None else self.tree
        self.acceptance.record(outcome)  # (costs stay as calibrated)
        if self.watch is not None:
            self.watch.record(outcome)


@dataclass
class LossWatch:
    """The call's own evidence that drafting loses: its drafting steps' seconds per token of progress (in a batch, how
    far its slowest row moved) against its plain steps' (a plain step every `probe_every` drafting steps, if the
    policy takes none, so that both are measured on the call's own rows and machine load). The calibrated prices
    miss what a drafter costs beyond its size (n-gram lookup in Python, a row's holes) and what the loop's acceptance
    and roll-back cost a batch; once drafting has cost more per token than plain steps over `min_steps` of each, the
    call drafts no more. Lengths then depend on times, so only greedy calls watch (their output is the same at any
    length)."""

    min_steps: int = 4
    probe_every: int = 4
    margin: float = 1.0  # drafting loses when its seconds per token exceed the plain steps' times this
    seconds: dict = field(default_factory=lambda: {"plain": 0.0, "drafting": 0.0})
    tokens: dict = field(default_factory=lambda: {"plain": 0, "drafting": 0})
    steps: dict = field(default_factory=lambda: {"plain": 0, "drafting": 0})
    emitted: dict = field(default_factory=dict)  # the caller's row index -> tokens this call's steps gave it
    stopped: bool = False
    first: bool = True

    def length(self, chosen: int) -> int:
        if self.stopped:
            return 0
        if chosen and self.steps["plain"] < self.min_steps and self.steps["drafting"] >= self.probe_every * (
                self.steps["plain"] + 1):
            return 0  # a plain step to compare with
        return chosen

    def record(self, outcome: StepOutcome) -> None:
        accepted = outcome.num_accepted if isinstance(outcome.num_accepted, list) else [outcome.num_accepted]
        rows = outcome.rows or range(len(accepted))
        behind = min(self.emitted.get(row, 0) for row in rows)
        for row, a in zip(rows, accepted):
            self.emitted[row] = self.emitted.get(row, 0) + a + 1
        if self.first:  # its forward also read the prompt
            self.first = False
            return
        kind = "drafting" if outcome.num_drafted else "plain"
        self.seconds[kind] += outcome.step_seconds
        # the batch's progress is its slowest row's: tokens that put a row further ahead do not end the call sooner
        self.tokens[kind] += min(self.emitted[row] for row in rows) - behind
        self.steps[kind] += 1
        if min(self.steps.values()) >= self.min_steps and not self.stopped:
            per_token = {k: self.seconds[k] / max(self.tokens[k], 1) for k in self.seconds}
            self.stopped = per_token["drafting"] > self.margin * per_token["plain"]


#: what "adaptive" learned, per drafter (a name's, kept with its target, or the caller's object), target and batch
#: size, so that later calls start from it; weak on the drafter and on the target, so that a new model never takes
#: over a collected one's entry (as a key of id(model) let it, once the id was reused)
_LEARNED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
_IN_USE: set[int] = set()  # ids of the kept policies a call is deciding with right now


@contextlib.contextmanager
def policy_for_call(value, learner, model, batch_size: int, sampling: bool = False, drafter_sizes: bool = False):
    """The policy a `generate()` call uses. `None` (the default) is "adaptive" for greedy decoding of one sequence, the
    fastest measured there (BENCHMARKS.md), and "calibrated" for sampling (so that a fixed seed reproduces its sample)
    and for batches (where a drafted width costs every row: the policy drafts nothing when that does not pay); each
    "calibrated" call starts afresh.
    "adaptive" starts from what `learner`'s previous calls on this target and batch size learned: the kept policy
    itself, or, while another call (thread) decides with it, a copy of it; whichever call ends last leaves its policy
    as the one kept, under a lock. `drafter_sizes`: the drafter sizes its drafts itself (`Drafter.sizes_own_drafts`)."""
    if value is None:
        value = "adaptive" if batch_size == 1 and not sampling else "calibrated"
    if value != "adaptive":
        policy = as_draft_length_policy(value)
        if value == "calibrated" and not sampling:  # (greedy output is the same at any length: times may decide)
            policy.watch_losses = True
        yield policy
        return
    try:
        with _LOCK:
            learned = _LEARNED.setdefault(learner, weakref.WeakKeyDictionary()).setdefault(model, {})
    except TypeError:  # not weak-referenceable: nothing is kept
        yield AdaptiveDraftLength(drafter_sizes=drafter_sizes)
        return
    with _LOCK:
        kept = learned.setdefault(batch_size, AdaptiveDraftLength(drafter_sizes=drafter_sizes))
        policy = copy.deepcopy(kept) if id(kept) in _IN_USE else kept
        _IN_USE.add(id(policy))
    try:
        yield policy
    finally:
        with _LOCK:
            _IN_USE.discard(id(policy))
            learned[batch_size] = policy


def as_draft_length_policy(value):
    if value in (None, "constant"):
        return ConstantDraftLength()
    if value == "adaptive":
        return AdaptiveDraftLength()
    if value == "calibrated":
        return CalibratedDraftLength()
    if isinstance(value, DraftLengthPolicy):
        return value
    raise InputError(
        f"draft_length must be 'constant', 'adaptive', 'calibrated' or a DraftLengthPolicy (start / next_length / update), got "
        f"{value!r}."
    )
