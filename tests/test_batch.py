"""Batched speculative decoding: left-padded batches, rows accepting their own prefix, equal to plain generate()."""

from __future__ import annotations

import pytest
import torch

from hf_specdec import SpeculationStats, as_drafter, speculative_generate
from hf_specdec.drafters import DraftModelDrafter, FallbackDrafter, NgramDrafter, SelfSpeculativeDrafter
from tests.conftest import (
    ARCHITECTURES,
    bpe_tokenizer,
    char_tokenizer,
    perturbed_copy,
    random_prompts,
    sentences,
    tiny_llama,
)
from tests.distribution import captured_processors, chi_square_pvalue, exact_joint_distribution
from tests.speculation import PAD, ScriptedCalibration, ScriptedCosts, TargetOracleDrafter, assert_adapted, assert_speculated, left_pad


@pytest.mark.parametrize("arch_name", ["llama", "gpt2", "qwen2"])
def test_batched_greedy_equals_plain_batched(arch_name):
    target = ARCHITECTURES[arch_name]()
    drafter = perturbed_copy(target)
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
                                      speculation_stats=stats, **kwargs, draft_length="constant")
                assert torch.equal(out, expected), f"{arch_name} batch={batch_size} k={k}"
    assert_speculated(stats, depth=3, rows=8, uneven=True)


def test_batch_of_one_with_padding_equals_plain():
    """A batch of one row with left padding (the batched path: a padded prompt, a 2-D mask) gives plain generate()'s
    output for the same padded input, and the unpadded call gives plain's for the unpadded prompt."""
    target = tiny_llama()
    drafter = perturbed_copy(target)
    stats = SpeculationStats()
    for prompt in random_prompts(8, seed=4):
        ids = torch.cat([torch.full((1, 3), PAD), prompt], dim=1)
        mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(prompt)], dim=1)
        kwargs = dict(max_new_tokens=20, do_sample=False, pad_token_id=PAD)
        spec = dict(custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=3, speculation_stats=stats,
                    draft_length="constant")
        padded = target.generate(ids, attention_mask=mask, **spec, **kwargs)
        assert torch.equal(padded, target.generate(ids, attention_mask=mask, **kwargs))
        assert torch.equal(target.generate(prompt, **spec, **kwargs), target.generate(prompt, **kwargs))
    assert_speculated(stats, depth=3)


@pytest.mark.parametrize("policy", [ScriptedCosts, ScriptedCalibration])
def test_adaptive_draft_lengths_in_batches(policy):
    """Both adaptive policies in left-padded batches whose rows draft different lengths in one step (each row stops
    at its own low-confidence position): each row equals plain generate()."""
    target = tiny_llama(seed=2)
    stats, policy, ragged = SpeculationStats(), policy(), []

    class Recording(DraftModelDrafter):
        def propose(self, seqs, max_tokens):
            draft = super().propose(seqs, max_tokens)
            ragged.append(draft.num_valid is not None and len(set(draft.num_valid)) > 1)
            return draft

    drafter = Recording(perturbed_copy(target))
    for seed in (8, 9, 10):
        ids, mask = left_pad(random_prompts(4, seed=seed))
        kwargs = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=PAD)
        out = target.generate(ids, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=5,
                              draft_length=policy, speculation_stats=stats, **kwargs)
        assert torch.equal(out, target.generate(ids, **kwargs))
    assert any(ragged), "no step had rows drafting different lengths"
    assert_speculated(stats, depth=2, rows=4, uneven=True)
    assert_adapted(policy)


def assert_batched_sampling_matches_target(target, assistant, prompts, samples, num_tokens=3, stats=None):
    """Each prompt of a left-padded batch (the prompts repeated to fill it), sampled `samples` times, against its
    exact joint distribution (chi-square)."""
    repeats = 250
    ids, mask = left_pad([p for p in prompts for _ in range(repeats)])
    kwargs = dict(do_sample=True, max_new_tokens=num_tokens, temperature=0.8, top_k=6, pad_token_id=PAD)
    torch.manual_seed(0)
    drawn = [[] for _ in prompts]
    for _ in range(samples // repeats):
        out = target.generate(ids, attention_mask=mask, custom_generate=speculative_generate, assistant=assistant,
                              num_draft_tokens=2, speculation_stats=stats, **kwargs, draft_length="constant")
        for row, seq in enumerate(out[:, ids.shape[1] :].tolist()):
            drawn[row // repeats].append(tuple(seq))
    for b, prompt in enumerate(prompts):
        exact = exact_joint_distribution(target, prompt, captured_processors(target, prompt, **kwargs), num_tokens)
        assert chi_square_pvalue(drawn[b], exact) > 1e-3, f"row {b}"


def test_batched_sampling_matches_target_per_row():
    target = tiny_llama(vocab=12, seed=0)
    prompts = [torch.tensor([[1, 5, 7, 2]]), torch.tensor([[3, 9]])]
    stats = SpeculationStats()
    assert_batched_sampling_matches_target(target, tiny_llama(vocab=12, seed=7), prompts, samples=5000, stats=stats)
    assert_speculated(stats, depth=2, row_groups=2, uneven=True)


def test_batch_refusals_are_clear():
    target = tiny_llama()
    ids, mask = left_pad(random_prompts(2, seed=1))
    with pytest.raises(ValueError, match="DynamicCache"):
        target.generate(ids, attention_mask=mask, custom_generate=speculative_generate, assistant=perturbed_copy(target),
                        cache_implementation="static", max_new_tokens=5, pad_token_id=PAD, draft_length="constant")
    # the model works normally after the refusal
    stats = SpeculationStats()
    out = target.generate(ids, attention_mask=mask, custom_generate=speculative_generate, speculation_stats=stats,
                          assistant=perturbed_copy(target), max_new_tokens=12, pad_token_id=PAD, draft_length="constant")
    assert torch.equal(out, target.generate(ids, attention_mask=mask, max_new_tokens=12, pad_token_id=PAD))
    assert_speculated(stats, rows=2)


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
                                  speculation_stats=stats, **kwargs, draft_length="constant")
            assert torch.equal(out, expected), f"batch={batch_size} k={k}"
    return stats


def test_ngram_in_batches(one_thread):
    target = tiny_llama(vocab=8, seed=0)  # a small vocabulary repeats itself: the n-gram index finds matches
    prompts = random_prompts(6, vocab=8, seed=3, min_len=4, max_len=14)
    stats = _ragged_batch_check(target, NgramDrafter(), 8, prompts)
    assert_speculated(stats, depth=2, rows=2, uneven=True)


def test_self_speculation_in_batches(one_thread):
    target = tiny_llama(layers=3, seed=0)
    stats = _ragged_batch_check(target, SelfSpeculativeDrafter(num_layers=2), 96, random_prompts(6, seed=4, min_len=2))
    assert_speculated(stats, depth=2, rows=6, uneven=True)
    all_layers = _ragged_batch_check(target, SelfSpeculativeDrafter(num_layers=3), 96, random_prompts(6, seed=4),
                                     seed_eos=False)
    assert_speculated(all_layers, depth=5, rejected=False, rows=6)
    assert all_layers.accepted_tokens == all_layers.drafted_tokens  # the target drafting for itself


def test_cross_tokenizer_drafter_in_batches_row_by_row(one_thread):
    target_tok, draft_tok = char_tokenizer(), bpe_tokenizer()
    target = tiny_llama(vocab=len(target_tok))
    # the target's own continuation seen through text and the other tokenizer: drafts that are often right
    drafter = TargetOracleDrafter(target, tiny_llama(vocab=len(draft_tok), seed=3), draft_tok, target_tok)
    prompts = [torch.tensor([target_tok(s, add_special_tokens=False)["input_ids"]]) for s in sentences(6, seed=5)]
    stats = _ragged_batch_check(target, drafter, len(target_tok), prompts, k_values=(3,), seed_eos=False)
    assert_speculated(stats, depth=3, rows=6, uneven=True)


def test_fallback_drafter_batches_and_picks_per_row(one_thread):
    """n-gram where it matches, a draft model elsewhere: exact in ragged batches with EOS, and both drafters served."""
    served = {"ngram": 0, "model": 0}

    class CountedNgram(NgramDrafter):
        def propose(self, *args, **kwargs):
            draft = super().propose(*args, **kwargs)
            served["ngram"] += draft.num_tokens > 0
            return draft

    class CountedModel(DraftModelDrafter):
        def propose(self, *args, **kwargs):
            draft = super().propose(*args, **kwargs)
            served["model"] += draft.num_tokens > 0
            return draft

    target = tiny_llama(vocab=8, seed=0)
    combined = FallbackDrafter(CountedNgram(), CountedModel(perturbed_copy(target)))
    prompts = random_prompts(6, vocab=8, seed=3, min_len=2, max_len=14)
    stats = _ragged_batch_check(target, combined, 8, prompts)
    assert_speculated(stats, depth=2, rows=2, uneven=True)
    assert served["ngram"] > 0 and served["model"] > 0, served


def test_fallback_drafter_sampling_mixes_one_hot_and_model_q():
    target = tiny_llama(vocab=12, seed=0)
    combined = FallbackDrafter(NgramDrafter(), as_drafter(tiny_llama(vocab=12, seed=7)))
    prompts = [torch.tensor([[1, 5, 1, 5, 1]]), torch.tensor([[3, 9]])]  # row 0 repeats itself, row 1 does not
    stats = SpeculationStats()
    assert_batched_sampling_matches_target(target, combined, prompts, samples=5000, stats=stats)
    assert_speculated(stats, depth=2, row_groups=2, uneven=True)


def test_a_candidate_generator_keeps_one_rows_state_per_row():
    """A transformers CandidateGenerator in a batch: each row drafts with a generator of its own (one sequence's state:
    an assistant's cache, a draft length), which shares the generator's modules, and the batch decodes as plain."""
    from transformers.generation.candidate_generator import CandidateGenerator

    target = tiny_llama()
    seen = {}  # generator -> the prompts whose continuations it was asked for

    class OneSequenceGenerator(CandidateGenerator):
        def __init__(self, model):
            self.model = model  # shared by the rows' copies (its weights are not copied)

        def get_candidates(self, input_ids):
            seen.setdefault(id(self), set()).add(tuple(input_ids[0, :3].tolist()))
            assert self.model is target
            nxt = self.model(input_ids).logits[:, -1:].argmax(-1)
            return torch.cat([input_ids, nxt], 1), None

        def update_candidate_strategy(self, input_ids, scores, num_matches):
            pass

    prompts = random_prompts(3, seed=11)
    ids, mask = left_pad(prompts)
    out = target.generate(ids, attention_mask=mask, pad_token_id=PAD, max_new_tokens=6, do_sample=False,
                          custom_generate=speculative_generate, assistant=OneSequenceGenerator(target))
    plain = target.generate(ids, attention_mask=mask, pad_token_id=PAD, max_new_tokens=6, do_sample=False)
    assert torch.equal(out, plain)
    assert len(seen) == 3 and all(len(starts) == 1 for starts in seen.values()), seen


@pytest.mark.parametrize("assistant", ["draft model", "layers:1"])
def test_a_draft_model_applies_each_rows_own_processors_in_a_batch(assistant):
    """A draft model shapes its drafts with the target's processors row by row; a processor holding a value per row
    of the caller's batch (the repetition penalty's prompt lengths) must be given that row's (a batch crashed with
    'Incompatible `prompt_ignore_length` batch size', found by the soak of issue 44)."""
    target = tiny_llama()
    drafter = perturbed_copy(target) if assistant == "draft model" else assistant
    ids, mask = left_pad(random_prompts(3, seed=31, min_len=3, max_len=12))
    kwargs = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, repetition_penalty=1.3, pad_token_id=PAD)
    stats = SpeculationStats()
    out = target.generate(ids, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=3,
                          speculation_stats=stats, draft_length="constant", **kwargs)
    assert torch.equal(out, target.generate(ids, **kwargs))
    assert stats.drafted_tokens > 0


def test_a_convolution_target_decodes_a_batch_row_by_row_and_scores_need_batch_1():
    """LFM2's convolution layers read each row's newest cache slots, where a batched step leaves holes: its batches
    decode one row at a time (refused before issue 44), equal to plain batched generate(). Scores at batch > 1 are
    refused with the reason, before any forward."""
    from benchmarks.architectures import build

    target = build("lfm2")
    ids, mask = left_pad(random_prompts(3, vocab=100, seed=17, min_len=3, max_len=12))
    kwargs = dict(attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=PAD)
    stats = SpeculationStats()
    out = target.generate(ids, custom_generate=speculative_generate, assistant=perturbed_copy(target),
                          num_draft_tokens=3, speculation_stats=stats, draft_length="constant", **kwargs)
    assert torch.equal(out, target.generate(ids, **kwargs))
    assert_speculated(stats, rows=2)
    with pytest.raises(ValueError, match="need batch 1 .* scores finished rows on padding"):
        target.generate(ids, custom_generate=speculative_generate, assistant="ngram", return_dict_in_generate=True,
                        output_scores=True, **kwargs)
