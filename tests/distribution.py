"""Exact reference distributions and a chi-square test, shared by the sampling tests of every drafter."""

from __future__ import annotations

from collections import Counter

import torch
from scipy.stats import chisquare


def captured_processors(model, prompt, **generate_kwargs):
    """The exact LogitsProcessorList (warpers included) that `generate()` builds for these arguments."""
    box = {}

    def capture(model, input_ids, logits_processor, stopping_criteria, generation_config, **kwargs):
        box["processors"] = logits_processor
        return input_ids

    model.generate(prompt, custom_generate=capture, **generate_kwargs)
    return box["processors"]


@torch.no_grad()
def exact_joint_distribution(model, prompt, processors, num_tokens):
    """P(t1..tn | prompt) under the target's sampling, by enumerating every prefix with non-zero probability."""
    dist = {(): 1.0}
    for _ in range(num_tokens):
        nxt = {}
        for prefix, prob in dist.items():
            ids = torch.cat([prompt, torch.tensor([prefix], dtype=torch.long, device=prompt.device).view(1, -1)], dim=1)
            logits = model(input_ids=ids).logits[:, -1].float()
            p = torch.softmax(processors(ids, logits.clone()), dim=-1)[0]
            for token in torch.nonzero(p > 0).flatten().tolist():
                nxt[prefix + (token,)] = prob * float(p[token])
        dist = nxt
    return dist


def chi_square_pvalue(samples: list[tuple], exact: dict[tuple, float], min_expected: float = 5.0) -> float:
    """Goodness of fit of observed sequences to the exact distribution (small cells pooled). A sequence the target
    could never produce gives p = 0."""
    counts = Counter(samples)
    if any(seq not in exact for seq in counts):
        return 0.0
    n = len(samples)
    observed, expected, pooled_obs, pooled_exp = [], [], 0.0, 0.0
    for seq, prob in exact.items():
        if prob * n >= min_expected:
            observed.append(counts.get(seq, 0))
            expected.append(prob * n)
        else:
            pooled_obs += counts.get(seq, 0)
            pooled_exp += prob * n
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    scale = sum(observed) / sum(expected)
    return float(chisquare(observed, [e * scale for e in expected]).pvalue)


def sample_sequences(generate_fn, prompt_len, num_samples, seed=0):
    torch.manual_seed(seed)
    return [tuple(generate_fn()[0, prompt_len:].tolist()) for _ in range(num_samples)]


def sample_in_batches(model, prompt, num_samples, batch_size=500, seed=0, pad_token_id=0, **generate_kwargs):
    """`num_samples` independent continuations of `prompt`, drawn as rows of batches of the repeated prompt (each row
    samples on its own, so this is the batched path; much faster than one call per sample). Speculative calls draft
    at a constant length unless told otherwise: the calibrated default would rightly never draft with a drafter as
    large as a tiny target, and these tests are about the acceptance rule."""
    if "custom_generate" in generate_kwargs:
        generate_kwargs.setdefault("draft_length", "constant")
    torch.manual_seed(seed)
    samples = []
    while len(samples) < num_samples:
        rows = min(batch_size, num_samples - len(samples))
        ids = prompt.expand(rows, -1)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=pad_token_id, **generate_kwargs)
        samples += [tuple(row) for row in out[:, prompt.shape[1]:].tolist()]
    return samples


__all__ = ["captured_processors", "exact_joint_distribution", "chi_square_pvalue", "sample_sequences",
           "sample_in_batches"]


#: four sampled tokens of a tiny target: enough for its second drafts to be verified
SHORT_SAMPLE = dict(do_sample=True, max_new_tokens=4, temperature=0.8, top_k=6)


def speculative_sample_pvalue(target, prompt, drafter, num_draft_tokens=2, stats=None, samples: int = 20_000) -> float:
    """The chi-square p-value of `samples` speculative draws of SHORT_SAMPLE against the target's exact joint
    distribution of those four tokens."""
    from hf_specdec import speculative_generate

    exact = exact_joint_distribution(target, prompt, captured_processors(target, prompt, **SHORT_SAMPLE), 4)
    drawn = sample_in_batches(target, prompt, samples, custom_generate=speculative_generate, assistant=drafter,
                              num_draft_tokens=num_draft_tokens, speculation_stats=stats, **SHORT_SAMPLE)
    return chi_square_pvalue(drawn, exact)
