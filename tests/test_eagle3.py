"""EAGLE-3-style drafters: exact outputs on Llama, Qwen2 and GPT-2 targets, greedy and sampled, batched; the states
they get are the target's real hidden states entering the layers they read; they save, load and refuse clearly."""

from __future__ import annotations

import pytest
import torch

from hf_specdec import AutoDrafter, Eagle3Config, Eagle3DraftModel, SpeculationStats, as_drafter, speculative_generate
from hf_specdec.cache.hidden import decoder_layers
from hf_specdec.drafters import Eagle3Drafter
from hf_specdec.kinds.eagle3.model import default_layer_ids
from tests.conftest import random_prompts, tiny_gpt2, tiny_llama, tiny_qwen2
from tests.distribution import SHORT_SAMPLE, speculative_sample_pvalue
from tests.speculation import (
    check_batches_with_an_early_eos,
    check_greedy_identical,
    check_greedy_prompt_by_prompt,
    PAD,
    RecordingEagle,
    assert_speculated,
    fitted_eagle3,
    left_pad,
    lie_about_second_q,
)

ARCHS = {"llama": tiny_llama, "qwen2": tiny_qwen2, "gpt2": tiny_gpt2}


def test_default_layers_are_low_middle_and_high():
    assert default_layer_ids(30) == [2, 15, 27]  # SmolLM2-135M
    assert default_layer_ids(32) == [2, 16, 29]  # what vLLM and SGLang read by default
    assert default_layer_ids(4) == [2, 2, 1]
    config = Eagle3Config.from_target(tiny_llama(layers=4).config, draft_vocab_size=10)
    assert config.target_layer_ids == [2, 2, 1] and config.draft_vocab_size == 10


@pytest.mark.parametrize("arch", ARCHS)
def test_eagle3_greedy_identical(arch, one_thread):
    target = ARCHS[arch](vocab=16, seed=0, layers=4)
    prompts = random_prompts(6, vocab=16, seed=5)
    drafter = fitted_eagle3(target, prompts, layer_ids=[1, 2, 4])
    assert isinstance(as_drafter(drafter), Eagle3Drafter)
    check_greedy_prompt_by_prompt(target, drafter, prompts, k=4, depth=3)


def test_eagle3_batched_greedy_identical_with_eos_and_a_reduced_vocabulary(one_thread):
    target = tiny_llama(vocab=16, seed=0, layers=4)
    prompts = random_prompts(12, vocab=16, seed=9, min_len=2, max_len=12)
    drafter = fitted_eagle3(target, prompts, draft_vocab=torch.arange(12) + 4)  # ids 0..3 are never proposed
    assert drafter.draft_vocab.tolist() == list(range(4, 16))
    stats = SpeculationStats()
    check_batches_with_an_early_eos(target, drafter, prompts, (2, 5), stats)
    assert_speculated(stats, depth=2, rows=5, uneven=True)  # (the last row stops after 5 tokens)


class RecordingEagle3(RecordingEagle, Eagle3Drafter):
    """The EAGLE recorder (each row's features kept when it leaves the batch) on an EAGLE-3 drafter."""


def test_eagle3_receives_the_states_entering_its_layers(one_thread):
    """What the verification forwards hand over (holes, padding, rows leaving, rolled-back drafts) equals a plain
    forward's hidden states entering layers 1, 3 and 4 (the last layer's output, before the final norm)."""
    target = tiny_llama(vocab=16, seed=0, layers=4)
    prompts = random_prompts(4, vocab=16, seed=2, min_len=3, max_len=9)
    eagle = RecordingEagle3(fitted_eagle3(target, prompts, layer_ids=[1, 3, 4]))
    ids, mask = left_pad(prompts)
    stats = SpeculationStats()
    out = target.generate(ids, attention_mask=mask, custom_generate=speculative_generate, assistant=eagle,
                          num_draft_tokens=3, max_new_tokens=16, do_sample=False, pad_token_id=PAD, speculation_stats=stats, draft_length="constant")
    assert_speculated(stats)
    for b, features in zip(eagle.row_ids, eagle.features):
        eagle.final[b] = features
    assert sorted(eagle.final) == [0, 1, 2, 3]
    for b in range(4):
        real = torch.cat([out[b, : ids.shape[1]][mask[b].bool()], out[b, ids.shape[1] :]])
        states = target(real[None], output_hidden_states=True).hidden_states  # [embeddings, after layer 1, ...]
        expected = torch.cat([states[1], states[3], decoder_layer_output(target, real, 3)], dim=-1)[0]
        got = eagle.final[b]
        assert len(got) >= int(mask[b].sum())
        torch.testing.assert_close(got, expected[: len(got)], atol=1e-4, rtol=1e-4)


def decoder_layer_output(target, ids, index):
    captured = []
    hook = decoder_layers(target)[index].register_forward_hook(lambda m, a, o: captured.append(o))
    target(ids[None])
    hook.remove()
    return captured[0]


def eagle3_sampling_pvalue(drafter_transform=lambda d: d, stats=None):
    target = tiny_llama(vocab=12, seed=0, layers=4)
    prompt = torch.tensor([[1, 5, 7, 2]])
    torch.manual_seed(0)
    drafter = drafter_transform(Eagle3Drafter(fitted_eagle3(target, [prompt] * 24, sharpness=2.0, **SHORT_SAMPLE)))
    return speculative_sample_pvalue(target, prompt, drafter, 2, stats)


def test_eagle3_sampling_matches_target(one_thread):
    stats = SpeculationStats()
    assert eagle3_sampling_pvalue(stats=stats) > 1e-3
    assert_speculated(stats, depth=2, row_groups=1, uneven=True)


def test_eagle3_sampling_negative_control_second_draft(one_thread):
    """The test sees a wrong q at the second draft only: it really verifies second drafts."""
    assert eagle3_sampling_pvalue(lie_about_second_q, SpeculationStats()) < 1e-6


def test_eagle3_round_trip_and_clear_errors(tmp_path, one_thread):
    target = tiny_llama(vocab=16, seed=0, layers=4)
    prompts = random_prompts(3, vocab=16, seed=1)
    drafter = fitted_eagle3(target, prompts, layer_ids=[1, 3, 4], draft_vocab=torch.arange(14) + 2)
    drafter.save_pretrained(tmp_path)
    assert (tmp_path / "custom_generate" / "generate.py").is_file()
    loaded = AutoDrafter.from_pretrained(tmp_path, target=target)
    assert isinstance(loaded, Eagle3DraftModel) and loaded.is_bound
    assert "embed_tokens.weight" not in loaded.state_dict()  # the target's, borrowed
    assert torch.equal(loaded.draft_vocab, drafter.draft_vocab)
    check_greedy_identical(target, loaded, prompts)
    with pytest.raises(ValueError, match="16-token vocabulary and hidden size 48.*has 20 and 48"):
        Eagle3DraftModel.from_pretrained(tmp_path).bind_target(tiny_llama(vocab=20, layers=4))
    with pytest.raises(ValueError, match="reads target layers .* only 2"):
        Eagle3DraftModel.from_pretrained(tmp_path).bind_target(tiny_llama(vocab=16, layers=2))
    with pytest.raises(ValueError, match="target layers in 0..N"):
        Eagle3Config(target_layer_ids=[-1, 1, 2])
    with pytest.raises(TypeError, match="Eagle3DraftModel"):
        Eagle3Drafter(target)
