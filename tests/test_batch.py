"""Batched speculative decoding: left-padded batches, rows accepting their own prefix, equal to plain generate()."""

from __future__ import annotations

import pytest
import torch

from hf_specdec import SpeculationStats, speculative_generate
from tests.conftest import ARCHITECTURES, perturbed_copy, random_prompts, tiny_llama
from tests.distribution import captured_processors, chi_square_pvalue, exact_joint_distribution

PAD = 0


def left_pad(prompts):
    width = max(p.shape[1] for p in prompts)
    ids = torch.full((len(prompts), width), PAD)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - p.shape[1] :] = p[0]
        mask[b, width - p.shape[1] :] = 1
    return ids, mask


@pytest.mark.parametrize("arch_name", ["llama", "gpt2", "qwen2"])
def test_batched_greedy_equals_plain_batched(arch_name):
    target = ARCHITECTURES[arch_name]()
    drafter = perturbed_copy(target, scale=0.2)
    prompts = random_prompts(40, seed=99, min_len=2, max_len=14)
    stats = SpeculationStats()
    for batch_size in (2, 5, 8):
        for start in range(0, 2 * batch_size, batch_size):
            ids, mask = left_pad(prompts[start : start + batch_size])
            # EOS ids that some rows really produce, so rows finish at different steps
            free = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False)[:, ids.shape[1] :]
            eos = [int(free[0, 5]), int(free[-1, 12])]
            kwargs = dict(attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=eos, pad_token_id=PAD)
            expected = target.generate(ids, **kwargs)
            for k in (1, 4):
                out = target.generate(ids, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=k,
                                      speculation_stats=stats, **kwargs)
                assert torch.equal(out, expected), f"{arch_name} batch={batch_size} k={k}"
    assert 0 < stats.accepted_tokens < stats.drafted_tokens


def test_batch_of_one_equals_unbatched_path():
    target = tiny_llama()
    drafter = perturbed_copy(target)
    for prompt in random_prompts(8, seed=4):
        single = target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=3,
                                 max_new_tokens=20, do_sample=False)
        ids, mask = left_pad([prompt])
        batched = target.generate(ids, attention_mask=mask, custom_generate=speculative_generate, assistant=drafter,
                                  num_draft_tokens=3, max_new_tokens=20, do_sample=False, pad_token_id=PAD)
        assert torch.equal(single, batched)


def test_adaptive_draft_length_in_batches():
    target = tiny_llama(seed=2)
    drafter = perturbed_copy(target, scale=0.3)
    ids, mask = left_pad(random_prompts(4, seed=8))
    kwargs = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=PAD)
    out = target.generate(ids, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=5,
                          draft_length="adaptive", **kwargs)
    assert torch.equal(out, target.generate(ids, **kwargs))


def assert_batched_sampling_matches_target(target, assistant, prompts, runs, num_tokens=2):
    """Each row of a left-padded batch, sampled `runs` times, against its exact joint distribution (chi-square)."""
    ids, mask = left_pad(prompts)
    kwargs = dict(do_sample=True, max_new_tokens=num_tokens, temperature=0.8, top_k=6, pad_token_id=PAD)
    torch.manual_seed(0)
    samples = [[] for _ in prompts]
    for _ in range(runs):
        out = target.generate(ids, attention_mask=mask, custom_generate=speculative_generate, assistant=assistant,
                              num_draft_tokens=2, **kwargs)
        for b in range(len(prompts)):
            samples[b].append(tuple(out[b, ids.shape[1] :].tolist()))
    for b, prompt in enumerate(prompts):
        exact = exact_joint_distribution(target, prompt, captured_processors(target, prompt, **kwargs), num_tokens)
        assert chi_square_pvalue(samples[b], exact) > 1e-3, f"row {b}"


def test_batched_sampling_matches_target_per_row():
    target = tiny_llama(vocab=12, seed=0)
    prompts = [torch.tensor([[1, 5, 7, 2]]), torch.tensor([[3, 9]])]
    assert_batched_sampling_matches_target(target, tiny_llama(vocab=12, seed=7), prompts, runs=4000)


def test_batch_refusals_are_clear():
    target = tiny_llama()
    ids, mask = left_pad(random_prompts(2, seed=1))
    with pytest.raises(ValueError, match="DynamicCache"):
        target.generate(ids, attention_mask=mask, custom_generate=speculative_generate, assistant=perturbed_copy(target),
                        cache_implementation="static", max_new_tokens=5, pad_token_id=PAD)
    out = target.generate(ids, attention_mask=mask, custom_generate=speculative_generate,
                          assistant=perturbed_copy(target), max_new_tokens=5, pad_token_id=PAD)
    assert out.shape == (2, ids.shape[1] + 5) or out.shape[0] == 2


# --- every drafter kind in batches ------------------------------------------------------------------------------------
def _ragged_batch_check(target, assistant, vocab, prompts, k_values=(2, 5), steps=20, seed_eos=True):
    stats = SpeculationStats()
    for batch_size in (3, 6):
        ids, mask = left_pad(prompts[:batch_size])
        free = target.generate(ids, attention_mask=mask, max_new_tokens=steps, do_sample=False, pad_token_id=PAD)
        eos = [int(free[0, ids.shape[1] + 6])] if seed_eos else None
        kwargs = dict(attention_mask=mask, max_new_tokens=steps, do_sample=False, eos_token_id=eos, pad_token_id=PAD)
        expected = target.generate(ids, **kwargs)
        for k in k_values:
            out = target.generate(ids, custom_generate=speculative_generate, assistant=assistant, num_draft_tokens=k,
                                  speculation_stats=stats, **kwargs)
            assert torch.equal(out, expected), f"batch={batch_size} k={k}"
    return stats


def test_ngram_in_batches(one_thread):
    target = tiny_llama(vocab=8, seed=0)  # a small vocabulary repeats itself: the n-gram index finds matches
    prompts = random_prompts(6, vocab=8, seed=3, min_len=4, max_len=14)
    stats = _ragged_batch_check(target, "ngram", 8, prompts)
    assert stats.accepted_tokens > 0


def test_self_speculation_in_batches(one_thread):
    from hf_specdec.drafters import SelfSpeculativeDrafter

    target = tiny_llama(layers=3, seed=0)
    stats = _ragged_batch_check(target, SelfSpeculativeDrafter(num_layers=2), 96, random_prompts(6, seed=4, min_len=2))
    assert stats.drafted_tokens > 0
    all_layers = _ragged_batch_check(target, SelfSpeculativeDrafter(num_layers=3), 96, random_prompts(6, seed=4),
                                     seed_eos=False)
    assert all_layers.accepted_tokens == all_layers.drafted_tokens  # the target drafting for itself


def test_cross_tokenizer_drafter_in_batches_row_by_row(one_thread):
    from hf_specdec.drafters import CrossTokenizerDrafter
    from tests.test_cross_tokenizer import bpe_tokenizer, char_tokenizer, sentences

    target_tok, draft_tok = bpe_tokenizer(), char_tokenizer()
    target = tiny_llama(vocab=len(target_tok))
    drafter = CrossTokenizerDrafter(tiny_llama(vocab=len(draft_tok), seed=3), draft_tok, target_tok)
    prompts = [torch.tensor([target_tok(s, add_special_tokens=False)["input_ids"]]) for s in sentences(6, seed=5)]
    stats = _ragged_batch_check(target, drafter, len(target_tok), prompts, k_values=(3,))
    assert stats.drafted_tokens > 0


def test_fallback_drafter_batches_and_picks_per_row(one_thread):
    """n-gram where it matches, a draft model elsewhere: exact in ragged batches with EOS, and both drafters served."""
    from hf_specdec.drafters import FallbackDrafter, NgramDrafter, as_drafter

    target = tiny_llama(vocab=8, seed=0)
    combined = FallbackDrafter(NgramDrafter(), as_drafter(perturbed_copy(target, scale=0.2)))
    prompts = random_prompts(6, vocab=8, seed=3, min_len=2, max_len=14)
    stats = _ragged_batch_check(target, combined, 8, prompts)
    assert stats.accepted_tokens > 0
    single = _ragged_batch_check(target, FallbackDrafter(NgramDrafter(), as_drafter(perturbed_copy(target, scale=0.2))),
                                 8, prompts[:3], k_values=(3,))
    assert single.drafted_tokens > 0


def test_fallback_drafter_sampling_mixes_one_hot_and_model_q():
    from hf_specdec.drafters import FallbackDrafter, NgramDrafter, as_drafter

    target = tiny_llama(vocab=12, seed=0)
    combined = FallbackDrafter(NgramDrafter(), as_drafter(tiny_llama(vocab=12, seed=7)))
    prompts = [torch.tensor([[1, 5, 1, 5, 1]]), torch.tensor([[3, 9]])]  # row 0 repeats itself, row 1 does not
    assert_batched_sampling_matches_target(target, combined, prompts, runs=3000)
