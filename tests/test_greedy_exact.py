"""Greedy speculative decoding must be token-identical to plain greedy `generate()`."""

from __future__ import annotations

import math

import pytest
import torch

import hf_specdec
from hf_specdec import DraftModelDrafter, NgramDrafter, SpeculationStats, speculative_generate
from hf_specdec.generation.draft_length import (
    AdaptiveDraftLength,
    ChainAcceptance,
    ConstantDraftLength,
    StepOutcome,
    as_draft_length_policy,
)
from tests.conftest import ARCHITECTURES, VOCAB, perturbed_copy, random_prompts
from tests.speculation import ScriptedCosts, assert_adapted, assert_speculated

NEW_TOKENS = 20
PROMPTS = random_prompts(50)


class ContraryDrafter(DraftModelDrafter):
    """Proposes, at every position, a token the target would NOT choose (its argmax + 1): nothing is ever accepted."""

    def propose(self, input_ids, max_tokens, **kwargs):
        draft = super().propose(input_ids, max_tokens, **kwargs)
        draft.tokens = (draft.tokens + 1) % VOCAB
        return draft


def drafters_for(target):
    return {
        "mostly_agrees": lambda: perturbed_copy(target),
        "never_agrees": lambda: ContraryDrafter(target),
        "target_itself": lambda: target,
    }


@pytest.mark.parametrize("arch_name", sorted(ARCHITECTURES))
def test_greedy_identical_to_plain(arch_name):
    target = ARCHITECTURES[arch_name]()
    plain = [target.generate(p, max_new_tokens=NEW_TOKENS, do_sample=False) for p in PROMPTS]
    for drafter_name, make in drafters_for(target).items():
        assistant = make()
        for k in (1, 3, 8):
            stats = SpeculationStats()
            for prompt, expected in zip(PROMPTS, plain):
                before = stats.target_forwards
                out = target.generate(
                    prompt, max_new_tokens=NEW_TOKENS, do_sample=False, custom_generate=speculative_generate,
                    assistant=assistant, num_draft_tokens=k, speculation_stats=stats,
                draft_length="constant")
                assert torch.equal(out, expected), f"{arch_name}/{drafter_name}/k={k}: output differs from plain greedy"
                if drafter_name == "target_itself":  # every draft accepted: k+1 tokens per target forward
                    assert stats.target_forwards - before == math.ceil(NEW_TOKENS / (k + 1))
            if drafter_name == "never_agrees":
                assert stats.accepted_tokens == 0 and stats.drafted_tokens > 0
                assert stats.target_forwards == NEW_TOKENS * len(PROMPTS)
            if drafter_name == "target_itself":
                assert stats.accepted_tokens == stats.drafted_tokens
            if drafter_name == "mostly_agrees":
                assert_speculated(stats, depth=min(k, 3), what=f"{arch_name}/k={k}")


def test_ngram_drafter_greedy_identical(arch):
    target = ARCHITECTURES[arch]()
    stats = SpeculationStats()
    for prompt in PROMPTS[:20]:
        expected = target.generate(prompt, max_new_tokens=30, do_sample=False)
        out = target.generate(
            prompt, max_new_tokens=30, do_sample=False, custom_generate=speculative_generate,
            assistant=NgramDrafter(), num_draft_tokens=4, speculation_stats=stats,
        draft_length="constant")
        assert torch.equal(out, expected)
    assert_speculated(stats, depth=2)  # random models repeat themselves, so lookup finds something


def test_enable_route_matches_plain_and_disable_restores():
    target = ARCHITECTURES["llama"]()
    drafter = perturbed_copy(target)
    prompt = PROMPTS[0]
    expected = target.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
    hf_specdec.enable(target)
    stats = SpeculationStats()
    try:
        out = target.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, assistant=drafter, num_draft_tokens=3,
                              speculation_stats=stats, draft_length="constant")
        assert torch.equal(out, expected)
        assert_speculated(stats, depth=2)
        assert torch.equal(target.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False), expected)
    finally:
        hf_specdec.disable(target)
    with pytest.raises(ValueError):  # the plain generate() rejects the unknown kwarg again
        target.generate(prompt, max_new_tokens=3, assistant=drafter, draft_length="constant")


def test_repetition_penalty_and_min_new_tokens_greedy():
    """Logits processors are applied at every draft position on the exact prefix: a repetition penalty and n-gram
    blocking that change the argmax, and min_new_tokens holding back an EOS that plain decoding would emit early."""
    target = ARCHITECTURES["llama"]()
    drafter = perturbed_copy(target)
    stats, held_back = SpeculationStats(), 0
    for prompt in PROMPTS[:10]:
        free = target.generate(prompt, max_new_tokens=25, do_sample=False, repetition_penalty=1.5,
                               no_repeat_ngram_size=3)[0, prompt.shape[1] :]
        eos = int(free[2])  # plain decoding would stop at token 3; min_new_tokens=12 forbids EOS before token 12
        kwargs = dict(max_new_tokens=25, do_sample=False, repetition_penalty=1.5, no_repeat_ngram_size=3,
                      eos_token_id=eos, min_new_tokens=12)
        expected = target.generate(prompt, **kwargs)
        held_back += expected.shape[1] - prompt.shape[1] >= 12
        out = target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=4,
                              speculation_stats=stats, **kwargs, draft_length="constant")
        assert torch.equal(out, expected)
    assert held_back == 10  # min_new_tokens really changed the output
    assert_speculated(stats, depth=3)


def test_fast_cpu_verify_off_is_also_exact():
    target = ARCHITECTURES["qwen2"]()
    drafter = perturbed_copy(target)
    stats = SpeculationStats()
    for prompt in PROMPTS[:10]:
        expected = target.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
        out = target.generate(
            prompt, max_new_tokens=NEW_TOKENS, do_sample=False, custom_generate=speculative_generate,
            assistant=drafter, num_draft_tokens=3, fast_cpu_verify=False, speculation_stats=stats,
        draft_length="constant")
        assert torch.equal(out, expected)
    assert_speculated(stats, depth=3)


def test_compiled_draft_model_is_exact():
    """`compile_drafter=True` runs the draft model through torch.compile (its numerics may differ from eager's, which
    only changes what is accepted): plain greedy's output, one row and a left-padded batch whose rows hold holes."""
    from torch._dynamo.utils import counters

    from tests.speculation import PAD, left_pad

    target = ARCHITECTURES["llama"]()
    drafter = perturbed_copy(target)
    stats = SpeculationStats()
    graphs = counters["stats"]["unique_graphs"]
    for prompt in PROMPTS[:6]:
        expected = target.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
        out = target.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, custom_generate=speculative_generate,
                              assistant=drafter, num_draft_tokens=3, compile_drafter=True, speculation_stats=stats,
                              draft_length="constant")
        assert torch.equal(out, expected)
    ids, mask = left_pad(PROMPTS[6:9])
    kwargs = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=PAD)
    out = target.generate(ids, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=3,
                          compile_drafter=True, speculation_stats=stats, draft_length="constant", **kwargs)
    assert torch.equal(out, target.generate(ids, **kwargs))
    assert counters["stats"]["unique_graphs"] > graphs  # the compiled forward really ran
    assert_speculated(stats, depth=3)


@pytest.mark.parametrize("arch_name", ["llama", "gpt2"])
def test_adaptive_draft_length_is_exact(arch_name):
    """Lengths chosen step by step (scripted costs, so drafting pays and the choices are deterministic) and the
    drafter's confidence stops leave the output plain greedy's."""
    target = ARCHITECTURES[arch_name]()
    assistant = perturbed_copy(target, scale=0.05)
    stats, policy = SpeculationStats(), ScriptedCosts()
    for prompt in PROMPTS[:25]:
        expected = target.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
        out = target.generate(
            prompt, max_new_tokens=NEW_TOKENS, do_sample=False, custom_generate=speculative_generate,
            assistant=assistant, num_draft_tokens=6, draft_length=policy, speculation_stats=stats,
        )
        assert torch.equal(out, expected)
    assert_speculated(stats, depth=2)
    assert_adapted(policy)


def test_adaptive_policy_weighs_acceptance_against_step_cost():
    def run(accept_prob, draft_cost, verify_cost, steps=200, cap=6):
        """Simulated steps: each draft accepted with accept_prob; costs in seconds."""
        gen = torch.Generator().manual_seed(0)
        policy = AdaptiveDraftLength(confidence_threshold=None)
        policy.start(cap)
        chosen = []
        for _ in range(steps):
            k = policy.next_length()
            assert 0 <= k <= cap
            chosen.append(k)
            accepted = 0
            while accepted < k and torch.rand((), generator=gen) < accept_prob:
                accepted += 1
            policy.update(StepOutcome(k, k, accepted, k * draft_cost, k * draft_cost + verify_cost(k + 1)))
        return max(set(chosen[50:]), key=chosen[50:].count)  # the length it settles on

    flat = lambda n: 0.1  # noqa: E731  (verification as cheap for 7 tokens as for 1: a GPU)
    assert run(0.9, 0.001, flat) == 6  # good cheap drafts: draft to the cap
    assert run(0.05, 0.05, lambda n: 0.1 * n) == 0  # bad, costly drafts: plain steps
    assert run(0.7, 0.0, lambda n: 0.1 + 0.05 * (n - 1)) in (1, 2, 3)  # a cost that grows with width: in between
    with pytest.raises(ValueError, match="draft_length must be"):
        as_draft_length_policy("sometimes")


def test_adaptive_policy_does_not_stay_plain_after_a_plain_step():
    """A plain step (k = 0) says nothing about the next token: the next choice uses the pooled acceptance, not the
    pessimistic 'after a rejection' counts (which would keep choosing k = 0 forever)."""
    policy = AdaptiveDraftLength(confidence_threshold=None)
    policy.start(2)
    policy.record_costs(2, 0.0, 1.0)  # first step: prompt, not timed
    policy.verify_seconds = {1: 1.0, 2: 1.15, 3: 1.3}
    policy.draft_seconds_per_token = 0.01
    for _ in range(30):  # runs: after an accepted draft the next is accepted (0.9), after a rejection rarely (0.1)
        policy.chain.in_run = True
        policy.chain.record_prefixes(1, 1)
        policy.chain.in_run = True
        policy.chain.record_prefixes(1, 0)
    for _ in range(30):
        policy.chain.in_run = False
        policy.chain.record_prefixes(1, 0)
    policy.chain.in_run = False
    assert policy.next_length() == 0  # after a rejection drafting does not pay here
    policy.chain.record_prefixes(0, 0)  # a plain step
    assert policy.chain.in_run is None and policy.next_length() >= 1  # on average it does


def test_adaptive_policy_prices_a_plain_step_as_measured():
    """On some CPUs (an AMD EPYC of this project's) a one-token forward costs more than a two-token one (a
    matrix-vector product streams the weights at half the speed); priced at the two-token time, a plain step looked
    cheaper than one draft that pays, and the policy stayed plain."""
    policy = AdaptiveDraftLength(confidence_threshold=None)
    policy.start(5)
    policy.record_costs(5, 0.0, 1.0)  # first step: prompt, not timed
    policy.verify_seconds = {1: 0.060, 2: 0.030, 6: 0.063}
    policy.draft_seconds_per_token = 0.008
    for i in range(60):  # one draft in ten accepted
        policy.chain.record_prefixes(1, int(i % 10 == 0))
    policy.chain.in_run = None
    assert policy.step_seconds(0) == pytest.approx(0.060)
    assert policy.next_length() == 1  # 1.12 tokens in 38 ms beat 1 in 60 ms


def test_a_drafting_step_that_catches_up_does_not_price_drafting():
    """A drafter with a cache of its own feeds what it skipped (the prompt at a call's first step, the tokens of plain
    steps) at its next draft: that step's drafting time is not a draft token's cost. Booked so, each exploration after
    32 plain steps made drafting look dearer, and the policy stayed plain for good."""
    policy = AdaptiveDraftLength(confidence_threshold=None)
    policy.start(3)
    policy.record_costs(3, 0.5, 1.0)  # the first step: the drafter read the prompt too
    assert policy.draft_seconds_per_token is None
    policy.record_costs(2, 0.010, 0.05)  # 5 ms a draft token
    policy.record_costs(0, 0.0, 0.05)  # a plain step
    policy.record_costs(1, 0.040, 0.04)  # the next draft also feeds the plain step's token
    assert policy.draft_seconds_per_token == pytest.approx(0.005)
    policy.record_costs(1, 0.007, 0.04)
    assert policy.draft_seconds_per_token == pytest.approx(0.7 * 0.005 + 0.3 * 0.007)


def test_exploring_from_plain_steps_spends_at_most_its_budget():
    """From plain steps the policy still tries a draft now and then (plain steps measure no acceptance), but only as
    often as that draft's estimated loss allows: every 32 steps where a drafted width costs little more than one token
    (one row), about every 70 where it costs 1.6 plain steps (a batch on a CPU), which had drafted for nothing every
    32."""
    def explorations(two_token_cost):
        policy = AdaptiveDraftLength(confidence_threshold=None)
        policy.start(1)
        policy.verify_seconds = {1: 0.04, 2: 0.04 * two_token_cost}
        policy.draft_seconds_per_token = 0.0
        policy.acceptance.record_prefixes([1] * 20, [0] * 20)  # drafts that missed: a_1 near 0, the policy stays plain
        return [step for step in range(1, 201) if policy.next_length()]

    assert explorations(1.15) == [32, 64, 96, 128, 160, 192]
    slow = explorations(1.6)
    assert len(slow) == 2 and all(b - a >= 0.35 / 0.005 for a, b in zip([0] + slow, slow)), slow


def test_confidence_stop_counts_as_a_miss_for_the_length_policy():
    """A drafter that stops on low confidence tells the loop so, and the policy is told one more position was tried
    (and missed); the output is still plain greedy's."""
    class Recording(ConstantDraftLength):
        def update(self, outcome):
            tried.append(max(outcome.num_tried))  # (per row; one row here)

    target = ARCHITECTURES["llama"]()
    drafter = DraftModelDrafter(perturbed_copy(target))
    for threshold, expected_tried in ((1.01, 2), (None, 3)):  # 1.01: every draft after the first is unsure
        tried, stats = [], SpeculationStats()
        for prompt in PROMPTS[:5]:
            out = target.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, custom_generate=speculative_generate,
                                  assistant=drafter, num_draft_tokens=3, speculation_stats=stats,
                                  draft_length=Recording(confidence_threshold=threshold))
            assert torch.equal(out, target.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False))
        assert_speculated(stats, depth=1 if threshold else 3)
        # every step tries the expected positions, but the last steps of each call (capped by max_length)
        assert max(tried) == expected_tried and tried.count(expected_tried) >= len(tried) - 5 * 3


def test_adaptive_policy_remembers_positions_it_rarely_tries():
    """Position 2 missed whenever tried; then many steps try position 1 only. Its estimate must not fade back to the
    prior (which made the policy jump to a longer draft on no evidence)."""
    chain = ChainAcceptance()
    for _ in range(20):
        chain.record_prefixes(2, 1)  # first accepted, second missed
    for i in range(300):
        chain.record_prefixes(1, i % 2)  # only position 1 tried, accepted half the time
    for state in (True, False):
        chain.in_run = state
        e = chain.expected(2)
        assert e[2] - e[1] < 0.1 * (e[1] - e[0])  # reaching 2 AND accepting it stays unlikely
