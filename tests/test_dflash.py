"""DFlash block drafters (transformers' `muse_glimmer_assistant`, `speculation_type="dflash"`) through hf_specdec's
loop: exact against plain generate() by object and by folder, in batches (past the drafter's sliding window), as
trees, sampled; drafting what transformers' own path drafts."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers.models.muse_glimmer_assistant", reason="this transformers release does not ship the drafter")
from transformers import LlamaConfig, LlamaForCausalLM

from hf_specdec import AutoDrafter, SpeculationStats, as_drafter, speculative_generate
from hf_specdec.errors import InputError
from hf_specdec.kinds.dflash import DFlashDrafter
from tests.conftest import random_prompts, tiny_llama
from tests.distribution import SHORT_SAMPLE, speculative_sample_pvalue
from tests.speculation import (
    PAD,
    assert_speculated,
    check_batches_with_an_early_eos,
    check_greedy_prompt_by_prompt,
    check_greedy_through_enable,
    forwards_beside_transformers,
    left_pad,
    lie_about_second_q,
    quiet_last_layer,
)
from tests.transformers_drafters import trained_dflash

PROMPTS = random_prompts(6, vocab=16, seed=5)


@pytest.fixture(scope="module")
def target():
    return quiet_last_layer(tiny_llama(vocab=16, seed=0))


@pytest.fixture(scope="module")
def dflash(target):
    return trained_dflash(target, PROMPTS)


def test_dflash_by_object_and_by_folder_is_plain_greedy(target, dflash, tmp_path, one_thread):
    dflash.save_pretrained(tmp_path)
    assert isinstance(as_drafter(str(tmp_path), target), DFlashDrafter)
    assert isinstance(AutoDrafter.from_pretrained(tmp_path, target=target), type(dflash))
    check_greedy_prompt_by_prompt(target, dflash, PROMPTS, k=3, depth=3, adaptive_depth=2)
    check_greedy_through_enable(target, str(tmp_path), PROMPTS[:3])


def test_dflash_drafts_what_transformers_dflash_path_drafts(target, dflash, one_thread):
    """At its block's length, the same tokens in as many target forwards as `speculation_type="dflash"`."""
    counts = forwards_beside_transformers(target, PROMPTS, {"assistant_model": dflash, "speculation_type": "dflash"},
                                          {"assistant": dflash, "num_draft_tokens": 3, "draft_length": "constant"})
    assert counts["hf_specdec"] == counts["transformers"] < len(PROMPTS) * 24, counts


def test_dflash_batches_with_an_early_eos_and_past_its_sliding_window(target, dflash, one_thread):
    stats = SpeculationStats()
    check_batches_with_an_early_eos(target, dflash, PROMPTS, (1, 3), stats)
    assert_speculated(stats, depth=3, rows=6, uneven=True)
    narrow = trained_dflash(target, PROMPTS)
    narrow.config.sliding_window = 6  # every layer slides; a row's context outgrows the window within a few steps
    for layer in narrow.layers:
        layer.self_attn.sliding_window = 6
    ids, mask = left_pad(PROMPTS)
    stats = SpeculationStats()
    out = target.generate(ids, attention_mask=mask, custom_generate=speculative_generate, assistant=narrow,
                          num_draft_tokens=3, draft_length="constant", max_new_tokens=40, do_sample=False,
                          pad_token_id=PAD, speculation_stats=stats)
    assert torch.equal(out, target.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False, pad_token_id=PAD))
    assert_speculated(stats, depth=3, rows=6, uneven=True)


def test_dflash_trees_are_plain_greedy(target, dflash, one_thread):
    stats = SpeculationStats()
    drafter = DFlashDrafter(dflash, tree="default")
    for prompt in PROMPTS:
        out = target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, max_new_tokens=24,
                              do_sample=False, draft_length="constant", speculation_stats=stats)
        assert torch.equal(out, target.generate(prompt, max_new_tokens=24, do_sample=False))
    assert_speculated(stats, depth=2)


def dflash_sampling_pvalue(transform=lambda drafter: drafter, stats=None):
    target = quiet_last_layer(tiny_llama(vocab=12, seed=0))
    prompt = torch.tensor([[1, 5, 7, 2]])
    torch.manual_seed(0)
    drafter = transform(DFlashDrafter(trained_dflash(target, [prompt] * 24, layers=2, **{**SHORT_SAMPLE, "max_new_tokens": 8})))
    return speculative_sample_pvalue(target, prompt, drafter, 2, stats)


def test_dflash_sampling_matches_target(one_thread):
    stats = SpeculationStats()
    assert dflash_sampling_pvalue(stats=stats) > 1e-3
    assert_speculated(stats, depth=2, row_groups=1)


def test_dflash_sampling_negative_control_second_draft(one_thread):
    assert dflash_sampling_pvalue(lie_about_second_q, SpeculationStats()) < 1e-6


def test_a_dflash_drafter_for_another_target_is_refused_before_any_work(dflash, one_thread):
    wider = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(InputError, match="hidden size"):
        wider.generate(PROMPTS[0], custom_generate=speculative_generate, assistant=dflash, max_new_tokens=4)
    shallow = tiny_llama(vocab=16, seed=0, layers=1)
    with pytest.raises(InputError, match="layers"):
        shallow.generate(PROMPTS[0], custom_generate=speculative_generate, assistant=dflash, max_new_tokens=4)


def test_dflash_reads_a_normed_embeddings_lookup_without_touching_the_module():
    """DFlash feeds the embeddings before a target's embedding norm, as transformers does, but without swapping the
    norm out of the shared module (a concurrent call on another thread would see it gone)."""
    normed = pytest.importorskip("transformers.models.inkling.modeling_inkling").InklingNormedEmbedding(10, 8, 0, 1e-6)
    from hf_specdec.kinds.dflash.drafter import embedded

    ids = torch.tensor([[1, 2, 3]])
    norm = normed.embed_norm
    assert torch.equal(embedded(normed, ids), torch.nn.functional.embedding(ids, normed.weight, padding_idx=0))
    assert normed.embed_norm is norm and not torch.equal(normed(ids), embedded(normed, ids))
