"""Sliding-window targets (Mistral-, Qwen2- and Gemma-2-style layer mixes): every cache the project creates is rolled
back correctly once the sequence is past the window, greedy and sampling, through both ways in; what cannot work
(trees) is refused before any work; batches decode row by row."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

import hf_specdec
from hf_specdec import SpeculationStats, speculative_generate
from hf_specdec.cache.keyword import CACHE
from hf_specdec.drafters import CrossTokenizerDrafter, MedusaDrafter, SelfSpeculativeDrafter
from tests.conftest import bpe_tokenizer, char_tokenizer, perturbed_copy, random_prompts
from tests.distribution import captured_processors, chi_square_pvalue, exact_joint_distribution, sample_sequences
from tests.speculation import assert_speculated, fitted_heads

WINDOW = 8
COMMON = dict(vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=None, pad_token_id=0,
              initializer_range=0.3, sliding_window=WINDOW)


def mistral(seed=0, **overrides):  # every layer slides
    torch.manual_seed(seed)
    return MistralForCausalLM(MistralConfig(**{**COMMON, **overrides})).eval()


def qwen2(seed=0, **overrides):  # layer 0 full, layer 1 sliding
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(**{**COMMON, **overrides}, use_sliding_window=True, max_window_layers=1)).eval()


def gemma2(seed=0, **overrides):  # alternating sliding and full layers (a smaller init: Gemma-2 scales its embeddings)
    torch.manual_seed(seed)
    return Gemma2ForCausalLM(Gemma2Config(**{**COMMON, "initializer_range": 0.05, **overrides}, head_dim=12)).eval()


TARGETS = {"mistral": mistral, "qwen2": qwen2, "gemma2": gemma2}
PROMPTS = random_prompts(4, seed=3, min_len=4, max_len=10)
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(CACHE == "past_key_values", reason="transformers < 5.24 refuses sliding-window "
                                 "targets (tests/test_bad_input.py checks the refusal)")]


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_greedy_past_the_window_with_a_draft_model_of_the_same_family(name):
    """The crash this guards against: a draft model's own sliding-window cache, cropped once past its window."""
    target = TARGETS[name]()
    drafter = perturbed_copy(target, scale=0.3 if name == "gemma2" else 0.05)  # Gemma-2's soft-capped logits agree more
    stats = SpeculationStats()
    kwargs = dict(max_new_tokens=40, do_sample=False, repetition_penalty=1.3)  # 5x the window; varied text
    for prompt in PROMPTS:
        expected = target.generate(prompt, **kwargs)
        for k in (2, 5):
            out = target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=k,
                                  speculation_stats=stats, **kwargs, draft_length="constant")
            assert torch.equal(out, expected), f"{name} k={k}"
    assert_speculated(stats, depth=3)  # rejections happened: both caches were rolled back past the window


def test_every_kind_of_cache_past_the_window_through_enable():
    """Self-speculation (a cache of its own on sliding targets), a cross-tokenizer drafter whose draft model slides,
    Medusa chains (the target's cache alone) and n-gram lookup, through `enable()`."""
    target = mistral()
    target_tok, draft_tok = char_tokenizer(), bpe_tokenizer()
    word_target = mistral(vocab_size=len(target_tok))
    drafters = {
        "self": (target, SelfSpeculativeDrafter(1)),
        "medusa chain": (target, MedusaDrafter(fitted_heads(target, PROMPTS), tree="chain")),
        "ngram": (target, "ngram"),
        "cross-tokenizer": (word_target, CrossTokenizerDrafter(mistral(seed=4, vocab_size=len(draft_tok)), draft_tok,
                                                               target_tok, lookbehind_chars=8)),
    }
    for name, (model, drafter) in drafters.items():
        prompts = PROMPTS if model is target else [torch.tensor([target_tok("ab cd ab", add_special_tokens=False)["input_ids"]])]
        hf_specdec.enable(model)
        stats = SpeculationStats()
        try:
            for prompt in prompts:
                expected = model.generate(prompt, max_new_tokens=32, do_sample=False)
                out = model.generate(prompt, max_new_tokens=32, do_sample=False, assistant=drafter, num_draft_tokens=3,
                                     speculation_stats=stats, draft_length="constant")
                assert torch.equal(out, expected), name
        finally:
            hf_specdec.disable(model)
        assert stats.drafted_tokens > 0, name
        if name != "cross-tokenizer":  # a random draft model through text rarely agrees; the others must
            assert_speculated(stats, what=name)


def test_sampling_past_the_window_keeps_the_targets_distribution():
    """The prompt alone is longer than the window, so every step verifies and rolls back past it."""
    target = mistral(vocab_size=12)
    drafter = perturbed_copy(target, scale=0.3)
    prompt = torch.tensor([[1, 5, 7, 2, 9, 3, 4, 8, 6, 2, 11, 5]])  # 12 tokens > WINDOW
    kwargs = dict(do_sample=True, max_new_tokens=3, temperature=0.8, top_k=5)
    exact = exact_joint_distribution(target, prompt, captured_processors(target, prompt, **kwargs), 3)
    stats = SpeculationStats()
    samples = sample_sequences(
        lambda: target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=2,
                                speculation_stats=stats, **kwargs, draft_length="constant"), prompt.shape[1], 3000)
    assert chi_square_pvalue(samples, exact) > 1e-3
    assert_speculated(stats, depth=2)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_batches_decode_row_by_row_exactly_past_the_window(name):
    """A left-padded batch of a sliding-window target (refused before issue 44) decodes each row alone, with its
    padding: the output is plain batched generate()'s, rows finishing at different steps, by name and by object."""
    from tests.speculation import PAD, left_pad

    target = TARGETS[name]()
    drafter = perturbed_copy(target, scale=0.3 if name == "gemma2" else 0.05)
    ids, mask = left_pad(random_prompts(3, vocab=96, seed=8, min_len=3, max_len=11))
    free = target.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=PAD)
    eos = int(free[1, ids.shape[1] + 20])  # a token row 1 produces: it finishes early
    kwargs = dict(attention_mask=mask, max_new_tokens=30, do_sample=False, eos_token_id=eos, pad_token_id=PAD)
    expected = target.generate(ids, **kwargs)
    spec = dict(custom_generate=speculative_generate, num_draft_tokens=3, draft_length="constant", **kwargs)
    stats = SpeculationStats()
    out = target.generate(ids, assistant=drafter, speculation_stats=stats, return_dict_in_generate=True, **spec)
    assert torch.equal(out.sequences, expected)
    assert_speculated(stats, depth=2, rows=2)  # (rows 0 and 1: their stats come back under their own index)
    assert torch.equal(target.generate(ids, assistant="ngram", **spec), expected)


def test_what_sliding_windows_cannot_do_is_refused_before_any_work():
    target = mistral()
    heads = fitted_heads(target, PROMPTS)
    with pytest.raises(ValueError, match="tree='chain'"):
        target.generate(PROMPTS[0], custom_generate=speculative_generate, assistant=MedusaDrafter(heads),
                        max_new_tokens=4, draft_length="constant")
    # every drafter that verifies trees, alone or inside a composite (the fuzz of issue 44 crashed on ngram+recycle)
    for assistant in ("recycle", "ngram+recycle"):
        with pytest.raises(ValueError, match=r"sliding window\): draft a chain"):
            target.generate(PROMPTS[0], custom_generate=speculative_generate, assistant=assistant, num_draft_tokens=6,
                            max_new_tokens=4, draft_length="constant")
    # the model still works, and speculates, afterwards
    stats = SpeculationStats()
    out = target.generate(PROMPTS[0], custom_generate=speculative_generate, assistant=perturbed_copy(target),
                          max_new_tokens=20, do_sample=False, speculation_stats=stats, draft_length="constant")
    assert torch.equal(out, target.generate(PROMPTS[0], max_new_tokens=20, do_sample=False))
    assert_speculated(stats)
