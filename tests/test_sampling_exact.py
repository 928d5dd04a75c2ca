"""Sampled speculative decoding must have exactly the target's distribution (after all processors and warpers)."""

from __future__ import annotations

import pytest
import torch

from hf_specdec import Draft, Drafter, speculative_generate, verification
from tests.conftest import tiny_llama
from tests.distribution import captured_processors, chi_square_pvalue, exact_joint_distribution, sample_sequences

VOCAB = 12
NUM_TOKENS = 3
NUM_SAMPLES = 20_000
PROMPT = torch.tensor([[1, 5, 7, 2]])

CONFIGS = {
    "temperature_top_k": dict(temperature=0.7, top_k=5),
    "top_p_repetition_penalty": dict(top_p=0.9, repetition_penalty=1.3),
}


class FixedDistributionDrafter(Drafter):
    """Draws each draft token from one fixed distribution q (no model), and reports q: cheap, and far from p."""

    def __init__(self, q):
        self.q = q

    def propose(self, input_ids, max_tokens):
        q = self.q.expand(1, max_tokens, -1)
        tokens = torch.multinomial(q[0], 1).view(1, max_tokens) if max_tokens else input_ids[:, :0]
        return Draft(tokens, q)


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(vocab=VOCAB, seed=0)
    drafter = tiny_llama(vocab=VOCAB, seed=7)  # an unrelated model: q is far from p
    return target, drafter


def _run(target, assistant, config, k=2, seed=0):
    kwargs = dict(do_sample=True, max_new_tokens=NUM_TOKENS, **config)
    exact = exact_joint_distribution(target, PROMPT, captured_processors(target, PROMPT, **kwargs), NUM_TOKENS)
    samples = sample_sequences(
        lambda: target.generate(
            PROMPT, custom_generate=speculative_generate, assistant=assistant, num_draft_tokens=k, **kwargs
        ),
        PROMPT.shape[1],
        NUM_SAMPLES,
        seed=seed,
    )
    return chi_square_pvalue(samples, exact)


def test_draft_model_sampling_matches_target_temperature_top_k(models):
    target, drafter = models
    assert _run(target, drafter, CONFIGS["temperature_top_k"]) > 1e-3


def test_sampling_matches_target_top_p_repetition_penalty(models):
    target, _ = models
    q = torch.softmax(torch.randn(VOCAB, generator=torch.Generator().manual_seed(3)) * 2, -1)
    assert _run(target, FixedDistributionDrafter(q), CONFIGS["top_p_repetition_penalty"], k=3) > 1e-3


def test_negative_control_broken_residual_fails(models, monkeypatch):
    """The same test must reject a wrong rule: resampling from p instead of norm(max(0, p - q))."""
    target, _ = models
    monkeypatch.setattr(verification, "residual_distribution", lambda p, q: p)
    q = torch.softmax(torch.randn(VOCAB, generator=torch.Generator().manual_seed(3)) * 2, -1)
    assert _run(target, FixedDistributionDrafter(q), CONFIGS["temperature_top_k"], k=2) < 1e-6


def test_plain_generate_passes_the_same_test(models):
    """Sanity check of the test itself: the target's own sampling passes it."""
    target, _ = models
    kwargs = dict(do_sample=True, max_new_tokens=NUM_TOKENS, **CONFIGS["top_p_repetition_penalty"])
    exact = exact_joint_distribution(target, PROMPT, captured_processors(target, PROMPT, **kwargs), NUM_TOKENS)
    samples = sample_sequences(lambda: target.generate(PROMPT, **kwargs), PROMPT.shape[1], 5_000)
    assert chi_square_pvalue(samples, exact) > 1e-3


def test_adaptive_draft_length_sampling_matches_target(models):
    """Early stops decided from q before drawing keep the output distribution exact."""
    target, drafter = models
    kwargs = dict(do_sample=True, max_new_tokens=NUM_TOKENS, **CONFIGS["temperature_top_k"])
    exact = exact_joint_distribution(target, PROMPT, captured_processors(target, PROMPT, **kwargs), NUM_TOKENS)
    samples = sample_sequences(
        lambda: target.generate(PROMPT, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=3,
                                draft_length="adaptive", **kwargs),
        PROMPT.shape[1], NUM_SAMPLES, seed=11,
    )
    assert chi_square_pvalue(samples, exact) > 1e-3
