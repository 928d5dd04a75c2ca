"""The calibrated draft-length policy (the default for sampling and batches): exact, and its lengths depend on the run's
own outcomes only, so that a seed reproduces its sample however long each step happened to take."""

from __future__ import annotations

import random

import pytest
import torch

from hf_specdec import Draft, SequenceDrafter, SpeculationStats, speculative_generate
from hf_specdec.generation import step_costs
from hf_specdec.generation.draft_length import ChainAcceptance, RowAcceptance, StepOutcome
from hf_specdec.drafters import DraftModelDrafter, NgramDrafter
from hf_specdec.generation import step
from tests.conftest import perturbed_copy, tiny_llama
from tests.distribution import captured_processors, chi_square_pvalue, exact_joint_distribution, sample_in_batches
from tests.speculation import ScriptedCalibration, assert_adapted, assert_speculated, lie_about_second_q
from tests.test_sampling_exact import CONFIGS, NUM_TOKENS, PROMPT, far_q


@pytest.fixture(autouse=True)
def own_cache_folder(tmp_path, monkeypatch):
    """Each test calibrates into a folder of its own (and forgets what the process measured)."""
    monkeypatch.setenv("HF_SPECDEC_CACHE", str(tmp_path))
    step_costs.forget()
    yield
    step_costs.forget()


@pytest.fixture(scope="module")
def pair():
    """A target and a drafter far enough from it that drafts are often rejected."""
    target = tiny_llama(vocab=12, seed=0)
    return target, perturbed_copy(target, scale=0.3)


@pytest.fixture(scope="module")
def close_pair():
    target = tiny_llama(vocab=12, seed=0)
    return target, perturbed_copy(target)


class FreeDraftModel(DraftModelDrafter):
    """A draft model that declares its drafts free (a tiny target's drafter is as large as the target itself, so the
    calibrated policy would rightly never draft with it)."""

    def draft_cost(self, target_model):
        return 0.0


def sampled(target, drafter, seed, **extra):
    torch.manual_seed(seed)
    stats = SpeculationStats()
    out = target.generate(PROMPT, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=4,
                          do_sample=True, max_new_tokens=40, speculation_stats=stats, **CONFIGS["temperature_top_k"],
                          **extra)
    return out, stats


def noisy_clock(monkeypatch, seed):
    """Every step's measured times made up at random: what a loaded machine does to timings, exaggerated."""
    rng = random.Random(seed)
    monkeypatch.setattr(step.DeviceClock, "seconds", lambda self, start, end: rng.uniform(0.001, 0.2))


def test_a_seed_reproduces_its_sample_with_the_default_settings(close_pair, monkeypatch):
    """Sampling with no draft_length: the same seed gives the same sample, even when every step's timing differs,
    and the lengths the policy chose did vary (a constant length would pass trivially)."""
    target, drafter = close_pair
    drafter = FreeDraftModel(drafter)
    outs = []
    for noise in (1, 2):
        noisy_clock(monkeypatch, noise)
        out, stats = sampled(target, drafter, seed=5)
        outs.append(out)
        assert_speculated(stats)
        varied = len(set(stats.drafted_by_position)) > 1 or stats.drafted_by_position[0] < stats.target_forwards
        assert varied, f"every step drafted the cap: {stats.drafted_by_position}, {stats.target_forwards} steps"
    assert torch.equal(outs[0], outs[1])


def test_negative_control_the_timed_policy_does_not_reproduce_under_the_same_noise(close_pair, monkeypatch):
    """The same two noisy runs with the timed policy give different samples: the test above can see a policy that
    decides from timings."""
    target, drafter = close_pair
    drafter = FreeDraftModel(drafter)
    outs = []
    for noise in (1, 2):
        noisy_clock(monkeypatch, noise)
        outs.append(sampled(target, drafter, seed=5, draft_length="adaptive")[0])
    assert not torch.equal(outs[0], outs[1])


def test_calibrated_sampling_matches_target(close_pair):
    """Lengths chosen by the calibrated policy, and its confidence stops, keep the distribution exact."""
    target, drafter = close_pair
    stats, policy = SpeculationStats(), ScriptedCalibration(per_token=0.002)
    kwargs = dict(do_sample=True, max_new_tokens=NUM_TOKENS, **CONFIGS["temperature_top_k"])
    exact = exact_joint_distribution(target, PROMPT, captured_processors(target, PROMPT, **kwargs), NUM_TOKENS)
    spec = dict(custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=3, draft_length=policy,
                speculation_stats=stats, **kwargs)
    assert chi_square_pvalue(sample_in_batches(target, PROMPT, 20_000, seed=13, **spec), exact) > 1e-3
    assert_speculated(stats, depth=2)
    assert_adapted(policy)


def test_negative_control_calibrated_with_a_wrong_q_fails(pair):
    """The same test rejects a rule that is wrong at second drafts only, under this policy too."""
    target, _ = pair

    class TwoDistributions(SequenceDrafter):  # first draft from q, second from q2
        def propose(self, input_ids, max_tokens):
            q = torch.stack([far_q(), far_q(seed=5)])[:max_tokens][None]
            return Draft(torch.multinomial(q[0], 1).view(1, -1), q)

    kwargs = dict(do_sample=True, max_new_tokens=NUM_TOKENS, **CONFIGS["temperature_top_k"])
    exact = exact_joint_distribution(target, PROMPT, captured_processors(target, PROMPT, **kwargs), NUM_TOKENS)
    spec = dict(custom_generate=speculative_generate, num_draft_tokens=2, **kwargs,
                draft_length=ScriptedCalibration(per_token=0.0))  # (drafting always pays: k = 2)
    honest = sample_in_batches(target, PROMPT, 20_000, seed=13, assistant=TwoDistributions(), **spec)
    assert chi_square_pvalue(honest, exact) > 1e-3
    lying = sample_in_batches(target, PROMPT, 20_000, seed=13, assistant=lie_about_second_q(TwoDistributions()), **spec)
    assert chi_square_pvalue(lying, exact) < 1e-6


def test_each_row_counts_its_own_acceptance_and_the_rows_furthest_behind_decide():
    """A row that copies (every draft accepted) beside one whose drafts all fail: a batch ends with its slowest row, so
    once the copying row is ahead the batch expects what the other row does (pooled over the rows, the copies kept a
    whole batch drafting, every row paying the width); rows level with each other count alike."""
    rows, pooled = RowAcceptance(), ChainAcceptance()
    for _ in range(20):
        outcome = StepOutcome(5, [5, 5], [5, 0], 0.0, 0.0, rows=[0, 1], next_rows=[0, 1])
        rows.record(outcome)
        pooled.record(outcome)
    behind = rows.expected(5)[5]
    assert behind < 1.3 < 3 < pooled.expected(5)[5]  # row 1 is behind: its 1 token a step
    for _ in range(20):  # row 1 catches up (it copies now), row 0 stalls: level again after 20 steps
        rows.record(StepOutcome(5, [5, 5], [0, 5], 0.0, 0.0, rows=[0, 1], next_rows=[0, 1]))
    assert rows.emitted[0] == rows.emitted[1]
    level = rows.expected(5)[5]
    alone = RowAcceptance(rows=rows.rows, emitted=rows.emitted, pooled=rows.pooled, current=[0])
    assert level == pytest.approx((alone.expected(5)[5] + RowAcceptance(
        rows=rows.rows, emitted=rows.emitted, pooled=rows.pooled, current=[1]).expected(5)[5]) / 2)
    finished = StepOutcome(5, [5, 5], [5, 0], 0.0, 0.0, rows=[0, 1], next_rows=[1])  # row 0's last step
    rows.record(finished)
    assert rows.current == [1] and rows.expected(5)[5] != level


def test_a_batch_whose_drafts_only_move_one_row_ahead_stops_drafting():
    """LossWatch counts a batch's progress as its slowest row's: drafts that one row accepts while the other's fail
    make that row finish early, not the call; counted as emitted tokens (7 a drafting step against 2 a plain one)
    they looked like a win."""
    from hf_specdec.generation.draft_length import LossWatch

    watch = LossWatch()
    watch.record(StepOutcome(0, [0, 0], [0, 0], 0.0, 9.0, rows=[0, 1]))  # the first step: not counted
    lengths = []
    for _ in range(40):
        k = watch.length(5)
        lengths.append(k)
        watch.record(StepOutcome(k, [k, k], [k, 0], 0.0, 0.07 if k else 0.05, rows=[0, 1]))
    assert watch.stopped and lengths[20:] == [0] * 20
    level = LossWatch()
    level.record(StepOutcome(0, [0, 0], [0, 0], 0.0, 9.0, rows=[0, 1]))
    for _ in range(40):  # both rows accept: the batch moves 6 tokens a drafting step
        k = level.length(5)
        level.record(StepOutcome(k, [k, k], [k, k], 0.0, 0.07 if k else 0.05, rows=[0, 1]))
    assert not level.stopped


def test_verification_costs_are_measured_once_and_kept_on_disk(monkeypatch):
    target = tiny_llama()
    first = step_costs.verify_seconds(target, 2, 6)
    assert sorted(first) == [1, 2, 3, 4, 5, 6] and all(s > 0 for s in first.values())
    step_costs.forget()  # a new process: read back, not measured again
    monkeypatch.setattr(step_costs, "_measure", lambda *a: pytest.fail("measured again"))
    assert step_costs.verify_seconds(target, 2, 6) == first
    assert step_costs.costs_file().exists()
    assert sorted(step_costs.verify_seconds(target, 2, 4)) == [1, 2, 3, 4]
    wide = [n for n in step_costs._grid(40)]
    assert wide[:9] == list(range(1, 10)) and wide[-1] == 40 and len(wide) < 20


def test_drafts_are_priced_by_the_drafter_size(pair):
    target, drafter = pair
    assert NgramDrafter().draft_cost(target) == 0.0
    assert DraftModelDrafter(drafter).draft_cost(target) == pytest.approx(1.0)  # as large as the target
    small = tiny_llama(vocab=12, layers=1, seed=3)
    assert 0.3 < DraftModelDrafter(small).draft_cost(target) < 0.8


def test_the_default_targets_default_is_the_shipped_choice_and_any_other_targets_is_ngram_lookup():
    """"default" for the embedded SmolLM2 is what its shipped drafters' default.json names (greedy: n-gram lookup
    backed by a shipped drafter; sampled: n-gram lookup), every part of it a kind or a shipped drafter."""
    from hf_specdec.assistants.grammar import default_name, parse
    from hf_specdec.assistants.shipped import shipped_default, shipped_drafter_names

    greedy = parse("default", None)
    assert greedy.text == shipped_default(False) and len(greedy.parts) == 2
    assert greedy.parts[0].kind.name == "ngram" and greedy.parts[1].source in shipped_drafter_names()
    assert shipped_default(True) == "ngram" and default_name(tiny_llama()) == "ngram"


def test_sampled_calls_draft_with_ngram_lookup_alone_by_default():
    """Under sampling "default" is n-gram lookup (the heads' drawn drafts did not pay: BENCHMARKS.md); greedy keeps the
    measured default; other names and drafter objects pass through."""
    from hf_specdec.assistants.resolve import resolve
    from hf_specdec.assistants.grammar import default_name, parse

    assert parse("default", None, sampling=True).text == "ngram"
    assert parse("default+suffix", None, sampling=True).text == "ngram+suffix"
    assert parse("default", None, sampling=False).text == default_name(None)
    drafter = NgramDrafter()
    assert resolve(drafter, None, sampling=True).drafter is drafter


def test_a_greedy_call_whose_drafting_loses_notices_and_stops():
    """LossWatch: the call's drafting steps against its plain steps (one forced every few drafting steps while it has
    too few to compare), seconds per emitted token; drafting that costs more per token stops for the rest of the call,
    drafting that pays goes on."""
    from hf_specdec.generation.draft_length import LossWatch

    def run(draft_seconds: float, accepted: int) -> tuple[list[int], bool]:
        watch, lengths = LossWatch(), []
        watch.record(StepOutcome(0, [0], [0], 0.0, 9.0))  # the first step (it reads the prompt): not counted
        for _ in range(40):
            k = watch.length(3)
            lengths.append(k)
            seconds = 0.05 + (0.01 + draft_seconds if k else 0.0)  # a wider forward costs a little more
            watch.record(StepOutcome(k, [k], [min(accepted, k)], draft_seconds if k else 0.0, seconds))
        return lengths, watch.stopped

    losing, stopped = run(draft_seconds=0.06, accepted=0)  # 0.12 s for 1 token against 0.05 s
    assert stopped and losing[20:] == [0] * 20 and losing[:20].count(3) == 16  # 16 drafting steps and 4 probes
    paying, stopped = run(draft_seconds=0.01, accepted=2)  # 0.07 s for 3 tokens
    assert not stopped and paying[-10:] == [3] * 10 and 4 <= paying.count(0) <= 5  # (the probes only)


def test_only_greedy_calls_watch_their_times(close_pair):
    """Sampled calls keep lengths that depend on their outcomes alone (a seed reproduces its sample); greedy ones
    (batches) may stop drafting on their times."""
    from hf_specdec.generation.draft_length import policy_for_call

    target, _ = close_pair
    with policy_for_call(None, object(), target, 4, sampling=True) as sampled:
        sampled.start(3)
        assert sampled.watch is None
    with policy_for_call(None, object(), target, 4, sampling=False) as greedy:
        greedy.start(3)
        assert greedy.watch is not None
