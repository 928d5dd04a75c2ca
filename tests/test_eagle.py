"""EAGLE-style drafters (SpecDrafter reading the target's hidden states): exact outputs, and the features they get
are the target's real hidden states whatever the batch layout."""

from __future__ import annotations

import pytest
import torch

from hf_specdec import SpeculationStats, speculative_generate
from hf_specdec import as_drafter
from hf_specdec.drafters import EagleDrafter
from hf_specdec.kinds.draft_model.model import SpecDrafterForCausalLM, drafter_config_from_target
from hf_specdec.cache.hidden import final_norm
from tests.conftest import random_prompts, tiny_llama, tiny_qwen2
from tests.distribution import speculative_sample_pvalue
from tests.speculation import (
    check_batches_with_an_early_eos,
    check_greedy_prompt_by_prompt,
    PAD,
    RecordingEagle,
    agreeing_eagle,
    assert_speculated,
    left_pad,
    lie_about_second_q,
    quiet_last_layer,
)


def eagle_for(target, seed=3, draft_vocab_size=0):
    torch.manual_seed(seed)
    config = drafter_config_from_target(target.config, num_hidden_layers=1, target_feature_input=True,
                                        draft_vocab_size=draft_vocab_size)
    drafter = SpecDrafterForCausalLM(config).eval()
    with torch.no_grad():  # a loud fuse, so the drafts depend on the features (and wrong ones would show)
        drafter.model.fuse.weight.normal_(0, 0.5)
    if draft_vocab_size:
        drafter.set_draft_vocab(torch.arange(draft_vocab_size) * 3 % config.vocab_size)
    return drafter


@pytest.mark.parametrize("make_target", [tiny_llama, tiny_qwen2], ids=["llama", "qwen2"])
def test_eagle_greedy_identical(make_target, one_thread):
    target = quiet_last_layer(make_target(vocab=16, seed=0))
    drafter = agreeing_eagle(target)
    assert isinstance(as_drafter(drafter), EagleDrafter)
    check_greedy_prompt_by_prompt(target, drafter, random_prompts(12, vocab=16, seed=5), k=4, depth=4, adaptive_depth=2)


def test_eagle_batched_greedy_identical_with_eos(one_thread):
    target = quiet_last_layer(tiny_llama(vocab=16, seed=0))
    drafter = agreeing_eagle(target, draft_vocab_size=12)
    drafter.set_draft_vocab(torch.arange(12) + 4)  # ids 0..3 are never proposed
    prompts = random_prompts(12, vocab=16, seed=9, min_len=2, max_len=12)
    stats = SpeculationStats()
    check_batches_with_an_early_eos(target, drafter, prompts, (2, 5), stats)
    assert_speculated(stats, depth=3, rows=6, uneven=True)


def test_eagle_receives_the_targets_real_hidden_states(one_thread):
    """The features handed over from verification forwards (with holes, padding, finished rows leaving and rolled-back
    drafts) equal a plain forward's final hidden states of the same tokens."""
    target = tiny_llama(vocab=16, seed=0)
    eagle = RecordingEagle(eagle_for(target))
    ids, mask = left_pad(random_prompts(4, vocab=16, seed=2, min_len=3, max_len=9))
    out = target.generate(ids, attention_mask=mask, custom_generate=speculative_generate, assistant=eagle,
                          num_draft_tokens=3, max_new_tokens=16, do_sample=False, pad_token_id=PAD, draft_length="constant")
    for b, features in zip(eagle.row_ids, eagle.features):
        eagle.final[b] = features
    assert sorted(eagle.final) == [0, 1, 2, 3]
    for b in range(4):
        real = torch.cat([out[b, : ids.shape[1]][mask[b].bool()], out[b, ids.shape[1] :]])
        captured = []
        hook = final_norm(target).register_forward_hook(lambda m, a, o: captured.append(o))
        target(real[None])
        hook.remove()
        got = eagle.final[b]
        assert len(got) >= int(mask[b].sum())
        torch.testing.assert_close(got, captured[0][0, : len(got)], atol=1e-4, rtol=1e-4)


def eagle_sampling_pvalue(drafter_transform=lambda d: d, stats=None):
    target = quiet_last_layer(tiny_llama(vocab=12, seed=0))
    drafter = drafter_transform(EagleDrafter(agreeing_eagle(target)))
    prompt = torch.tensor([[1, 5, 7, 2]])
    return speculative_sample_pvalue(target, prompt, drafter, 2, stats)


def test_eagle_sampling_matches_target(one_thread):
    stats = SpeculationStats()
    assert eagle_sampling_pvalue(stats=stats) > 1e-3
    assert_speculated(stats, depth=2, row_groups=1, uneven=True)


def test_eagle_sampling_negative_control_second_draft(one_thread):
    """The test sees a wrong q at EAGLE's second draft only: it really verifies second drafts."""
    assert eagle_sampling_pvalue(lie_about_second_q, SpeculationStats()) < 1e-6


def test_eagle_round_trip_and_clear_errors(tmp_path, one_thread):
    target = quiet_last_layer(tiny_llama(vocab=16, seed=0))
    drafter = agreeing_eagle(target, draft_vocab_size=14)
    drafter.set_draft_vocab(torch.arange(14) + 2)
    drafter.save_pretrained(tmp_path)
    loaded = SpecDrafterForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert loaded.config.target_feature_input
    stats = SpeculationStats()
    for prompt in random_prompts(3, vocab=16, seed=1):
        a = target.generate(prompt, custom_generate=speculative_generate, assistant=loaded, max_new_tokens=12,
                            do_sample=False, speculation_stats=stats, draft_length="constant")
        assert torch.equal(a, target.generate(prompt, max_new_tokens=12, do_sample=False))
    assert_speculated(stats)
    with pytest.raises(ValueError, match="target_features"):
        loaded.bind_target(target)(input_ids=prompt)
    with pytest.raises(TypeError, match="target_feature_input"):
        EagleDrafter(target)
