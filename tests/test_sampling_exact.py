"""Sampled speculative decoding must have exactly the target's distribution (after all processors and warpers).

Each test compares sampled continuations with the exact joint distribution, enumerated (chi-square), and asserts that
the path it names ran: drafts proposed, accepted and rejected at every draft position it claims. The negative controls
show that the same test fails on a wrong rule.
"""

from __future__ import annotations

import pytest
import torch

from hf_specdec import Draft, SequenceDrafter, SpeculationStats, speculative_generate
from hf_specdec.generation import verification
from tests.conftest import DEVICE, tiny_llama
from tests.distribution import (
    captured_processors,
    chi_square_pvalue,
    exact_joint_distribution,
    sample_in_batches,
)
from tests.speculation import ScriptedCosts, assert_adapted, assert_speculated, lie_about_second_q

VOCAB = 12
NUM_TOKENS = 4
NUM_SAMPLES = 20_000
PROMPT = torch.tensor([[1, 5, 7, 2]], device=DEVICE)

CONFIGS = {
    "temperature_top_k": dict(temperature=0.7, top_k=5),
    "top_p_repetition_penalty": dict(top_p=0.9, repetition_penalty=1.3),
}


class FixedDistributionDrafter(SequenceDrafter):
    """Draws each draft token from one fixed distribution q (no model), and reports q: cheap, and far from p."""

    def __init__(self, q):
        self.q = q

    def propose(self, input_ids, max_tokens):
        q = self.q.expand(1, max_tokens, -1)
        tokens = torch.multinomial(q[0], 1).view(1, max_tokens) if max_tokens else input_ids[:, :0]
        return Draft(tokens, q)


def far_q(seed=3):
    return torch.softmax(torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 2, -1).to(DEVICE)


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(vocab=VOCAB, seed=0).to(DEVICE)
    drafter = tiny_llama(vocab=VOCAB, seed=7).to(DEVICE)  # an unrelated model: q is far from p
    return target, drafter


def _pvalue(target, assistant, config, k=3, num_tokens=NUM_TOKENS, stats=None, samples=NUM_SAMPLES, seed=0, **extra):
    kwargs = dict(do_sample=True, max_new_tokens=num_tokens, **config)
    exact = exact_joint_distribution(target, PROMPT, captured_processors(target, PROMPT, **kwargs), num_tokens)
    spec = dict(custom_generate=speculative_generate, assistant=assistant, num_draft_tokens=k,
                speculation_stats=stats if stats is not None else SpeculationStats(), **extra, **kwargs)
    return chi_square_pvalue(sample_in_batches(target, PROMPT, samples, seed=seed, **spec), exact)


def test_draft_model_sampling_matches_target_temperature_top_k(models):
    target, drafter = models
    stats = SpeculationStats()
    assert _pvalue(target, drafter, CONFIGS["temperature_top_k"], stats=stats) > 1e-3
    assert_speculated(stats, depth=3, rows=2, uneven=True)


def test_sampling_matches_target_top_p_repetition_penalty(models):
    target, _ = models
    stats = SpeculationStats()
    assert _pvalue(target, FixedDistributionDrafter(far_q()), CONFIGS["top_p_repetition_penalty"], num_tokens=3,
                   stats=stats) > 1e-3
    assert_speculated(stats, depth=2, rows=2)


def test_negative_control_broken_residual_fails(models, monkeypatch):
    """The same test must reject a wrong rule: resampling from p instead of norm(max(0, p - q))."""
    target, _ = models
    monkeypatch.setattr(verification, "residual_distribution", lambda p, q: p)
    assert _pvalue(target, FixedDistributionDrafter(far_q()), CONFIGS["temperature_top_k"]) < 1e-6


def test_negative_control_wrong_q_at_the_second_draft_fails(models):
    """The test sees an error that only touches second drafts: it really verifies them."""
    target, _ = models
    q2 = far_q(seed=5)

    class TwoDistributions(SequenceDrafter):  # first draft from q, second from q2
        def propose(self, input_ids, max_tokens):
            q = torch.stack([far_q(), q2])[:max_tokens][None]
            return Draft(torch.multinomial(q[0], 1).view(1, -1), q)

    assert _pvalue(target, TwoDistributions(), CONFIGS["temperature_top_k"], k=2) > 1e-3
    assert _pvalue(target, lie_about_second_q(TwoDistributions()), CONFIGS["temperature_top_k"], k=2) < 1e-6


def test_plain_generate_passes_the_same_test(models):
    """Sanity check of the test itself: the target's own sampling passes it."""
    target, _ = models
    kwargs = dict(do_sample=True, max_new_tokens=NUM_TOKENS, **CONFIGS["top_p_repetition_penalty"])
    exact = exact_joint_distribution(target, PROMPT, captured_processors(target, PROMPT, **kwargs), NUM_TOKENS)
    samples = sample_in_batches(target, PROMPT, NUM_SAMPLES, **kwargs)
    assert chi_square_pvalue(samples, exact) > 1e-3


def test_adaptive_draft_length_sampling_matches_target(models):
    """Lengths chosen by the adaptive policy (scripted costs, so drafting pays) and its early stops, decided from q
    before drawing, keep the output distribution exact."""
    target, drafter = models
    stats, policy = SpeculationStats(), ScriptedCosts()
    assert _pvalue(target, drafter, CONFIGS["temperature_top_k"], stats=stats, draft_length=policy, seed=11) > 1e-3
    assert_speculated(stats, depth=3)
    assert_adapted(policy)
