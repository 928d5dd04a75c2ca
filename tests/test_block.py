"""Block drafters: one forward proposes several tokens. Training's layout gives what decoding sees; outputs are exact
on Llama, Qwen2 and GPT-2 targets, greedy and sampled, chains and trees, batched; they save, load and refuse clearly."""

from __future__ import annotations

import pytest
import torch

from hf_specdec import AutoDrafter, BlockDrafterConfig, BlockDrafterModel, SpeculationStats, as_drafter, speculative_generate
from hf_specdec.drafters import BlockDrafter
from tests.conftest import random_prompts, tiny_gpt2, tiny_llama, tiny_qwen2
from tests.distribution import SHORT_SAMPLE, speculative_sample_pvalue
from tests.speculation import (
    check_batches_with_an_early_eos,
    check_greedy_identical,
    check_greedy_prompt_by_prompt,
    PAD,
    assert_speculated,
    fitted_block,
    left_pad,
    lie_about_second_q,
)

ARCHS = {"llama": tiny_llama, "qwen2": tiny_qwen2, "gpt2": tiny_gpt2}


def test_training_layout_sees_what_decoding_sees(one_thread):
    """`forward_blocks` (every anchor's block in one forward, a 4-D mask) gives, at each anchor and its masks, the
    logits of a separate causal forward of the context up to the anchor followed by the block's masks."""
    target = tiny_llama(vocab=16, seed=0, layers=4)
    config = BlockDrafterConfig.from_target(target.config, draft_vocab_size=0, target_layer_ids=[1, 2, 4], block_size=3,
                                            initializer_range=0.3)
    model = BlockDrafterModel(config).eval().bind_target(target)
    torch.manual_seed(0)
    length, ids, features = 9, torch.randint(0, 16, (2, 9)), torch.randn(2, 9, config.hidden_size)
    anchors = torch.tensor([[2, 5, 8], [0, 3, 3]])
    out, predicts = model.forward_blocks(ids, features, anchors)
    assert predicts[0].tolist() == list(range(9)) + [2, 3, 5, 6, 8, 9]
    for b in range(2):
        for m, a in enumerate(anchors[b].tolist()):
            alone = model(input_ids=torch.cat([ids[b : b + 1, : a + 1], torch.zeros(1, 2, dtype=torch.long)], 1),
                          target_features=torch.cat([features[b : b + 1, : a + 1], torch.zeros(1, 2, config.hidden_size)], 1),
                          is_mask=torch.arange(a + 3)[None] > a, use_cache=False).logits[0]
            torch.testing.assert_close(out.logits[b, a], alone[a], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(out.logits[b, length + 2 * m : length + 2 * m + 2], alone[a + 1 :], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_block_greedy_identical(arch, one_thread):
    target = ARCHS[arch](vocab=16, seed=0, layers=4)
    prompts = random_prompts(6, vocab=16, seed=5)
    drafter = fitted_block(target, prompts, block_size=3, layer_ids=[1, 2, 4])
    assert isinstance(as_drafter(drafter), BlockDrafter)
    check_greedy_prompt_by_prompt(target, drafter, prompts, k=3, depth=3)


def test_block_batched_greedy_identical_with_eos_and_a_reduced_vocabulary(one_thread):
    target = tiny_llama(vocab=16, seed=0, layers=4)
    prompts = random_prompts(12, vocab=16, seed=9, min_len=2, max_len=12)
    drafter = fitted_block(target, prompts, block_size=2, draft_vocab=torch.arange(12) + 4)  # ids 0..3 never proposed
    stats = SpeculationStats()
    check_batches_with_an_early_eos(target, drafter, prompts, (2, 3), stats)
    assert_speculated(stats, depth=2, rows=5, uneven=True)  # (the last row stops after 5 tokens)


def test_block_tree_greedy_identical_batched(one_thread):
    """A tree of each position's top candidates, built from measured accuracy, verified in one forward."""
    target = tiny_llama(vocab=16, seed=0, layers=4)
    prompts = random_prompts(8, vocab=16, seed=3, min_len=2, max_len=10)
    model = fitted_block(target, prompts, block_size=3)
    model.config.position_accuracy = [[0.9, 0.05, 0.02], [0.8, 0.1, 0.05], [0.7, 0.1, 0.05]]
    drafter = BlockDrafter(model, tree=6)
    assert drafter.tree[0].max_depth == 3 and drafter.default_num_draft_tokens == 6
    stats = SpeculationStats()
    for batch_size in (1, 4):
        ids, mask = left_pad(prompts[:batch_size])
        kwargs = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=PAD)
        expected = target.generate(ids, **kwargs)
        out = target.generate(ids, custom_generate=speculative_generate, assistant=drafter, speculation_stats=stats,
                              draft_length="constant", **kwargs)
        assert torch.equal(out, expected), batch_size
    assert_speculated(stats, depth=2, rows=4)


def block_sampling_pvalue(drafter_transform=lambda d: d, stats=None, tree="chain"):
    target = tiny_llama(vocab=12, seed=0, layers=4)
    prompt = torch.tensor([[1, 5, 7, 2]])
    torch.manual_seed(0)
    model = fitted_block(target, [prompt] * 24, block_size=2, sharpness=2.0, **SHORT_SAMPLE)
    drafter = drafter_transform(BlockDrafter(model, tree=tree))
    return speculative_sample_pvalue(target, prompt, drafter, None if tree != "chain" else 2, stats)


def test_block_sampling_matches_target(one_thread):
    stats = SpeculationStats()
    assert block_sampling_pvalue(stats=stats) > 1e-3
    assert_speculated(stats, depth=2, row_groups=1, uneven=True)


def test_block_tree_sampling_matches_target(one_thread):
    stats = SpeculationStats()
    assert block_sampling_pvalue(stats=stats, tree=[[0], [0, 0], [1]]) > 1e-3  # (depth 2 within the first two nodes)
    assert_speculated(stats, depth=2, row_groups=1)


def test_block_sampling_negative_control_second_draft(one_thread):
    """The test sees a wrong q at the second draft only: it really verifies second drafts."""
    assert block_sampling_pvalue(lie_about_second_q, SpeculationStats()) < 1e-6


def test_block_round_trip_and_clear_errors(tmp_path, one_thread):
    target = tiny_llama(vocab=16, seed=0, layers=4)
    prompts = random_prompts(3, vocab=16, seed=1)
    drafter = fitted_block(target, prompts, block_size=4, layer_ids=[1, 3, 4], draft_vocab=torch.arange(14) + 2)
    drafter.save_pretrained(tmp_path)
    assert (tmp_path / "custom_generate" / "generate.py").is_file()
    loaded = AutoDrafter.from_pretrained(tmp_path, target=target)
    assert isinstance(loaded, BlockDrafterModel) and loaded.is_bound and loaded.config.block_size == 4
    assert "embed_tokens.weight" not in loaded.state_dict()  # the target's, borrowed
    assert torch.equal(loaded.mask_embedding, drafter.mask_embedding.half().float())  # (saved in fp16)
    check_greedy_identical(target, loaded, prompts)
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        BlockDrafterConfig(block_size=0)
    with pytest.raises(TypeError, match="BlockDrafterModel"):
        BlockDrafter(target)
    with pytest.raises(ValueError, match="measured accuracy"):
        BlockDrafter(loaded, tree=5)
    with pytest.raises(ValueError, match="deeper than the 4 positions"):
        BlockDrafter(loaded, tree=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]])
