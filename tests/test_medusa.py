"""Medusa heads: a new head is the identity, heads round-trip, and decoding with them (chain) is exact."""

from __future__ import annotations

import pytest
import torch

from hf_specdec import AutoDrafter, MedusaConfig, MedusaHeads, SpeculationStats, speculative_generate
from hf_specdec.drafters import MedusaDrafter, as_drafter
from hf_specdec.modeling_drafter import TargetNotBoundError
from tests.conftest import random_prompts, tiny_llama, tiny_qwen2
from tests.distribution import captured_processors, chi_square_pvalue, exact_joint_distribution, sample_sequences
from tests.test_batch import PAD, left_pad


def noisy_heads(target, num_heads=3, seed=0, scale=0.3):
    heads = MedusaHeads(MedusaConfig.from_target(target.config, num_heads=num_heads, num_layers=1))
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in heads.heads.parameters():
            p.normal_(0, scale)
    return heads


def test_new_heads_start_as_the_targets_lm_head_and_blocks_are_not_shared():
    target = tiny_llama()
    heads = MedusaHeads(MedusaConfig.from_target(target.config, num_heads=3, num_layers=2)).bind_target(target)
    hidden = torch.randn(2, 5, target.config.hidden_size)
    logits = heads(hidden)
    assert logits.shape == (2, 5, 3, target.config.vocab_size)
    for i in range(3):
        torch.testing.assert_close(logits[..., i, :], target.lm_head(hidden))
    blocks = [block for head in heads.heads for block in head]
    assert len({id(b.linear.weight) for b in blocks}) == 6  # six independent blocks, none repeated
    assert "lm_head.weight" not in heads.state_dict()  # the target's head is borrowed, never saved


def test_unbound_and_mismatched_heads_are_refused():
    target = tiny_llama()
    heads = MedusaHeads(MedusaConfig.from_target(target.config))
    with pytest.raises(TargetNotBoundError):
        heads(torch.randn(1, target.config.hidden_size))
    with pytest.raises(ValueError, match="trained for a target"):
        heads.bind_target(tiny_llama(vocab=50))


@pytest.mark.parametrize("make_target", [tiny_llama, tiny_qwen2], ids=["llama", "qwen2"])
def test_medusa_chain_greedy_identical(make_target, one_thread):
    target = make_target(vocab=16, seed=0)
    heads = noisy_heads(target)
    assert isinstance(as_drafter(heads), MedusaDrafter)
    stats = SpeculationStats()
    for prompt in random_prompts(10, vocab=16, seed=6):
        expected = target.generate(prompt, max_new_tokens=24, do_sample=False)
        for k in (1, 3):
            out = target.generate(prompt, custom_generate=speculative_generate, assistant=heads, num_draft_tokens=k,
                                  max_new_tokens=24, do_sample=False, speculation_stats=stats)
            assert torch.equal(out, expected)
    assert 0 < stats.accepted_tokens < stats.drafted_tokens


def test_medusa_batched_greedy_identical_with_eos(one_thread):
    target = tiny_llama(vocab=16, seed=0)
    heads = noisy_heads(target)
    prompts = random_prompts(8, vocab=16, seed=9, min_len=2, max_len=12)
    for batch_size in (2, 5):
        ids, mask = left_pad(prompts[:batch_size])
        free = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=PAD)
        kwargs = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=PAD,
                      eos_token_id=[int(free[0, ids.shape[1] + 4])])
        expected = target.generate(ids, **kwargs)
        out = target.generate(ids, custom_generate=speculative_generate, assistant=heads, num_draft_tokens=3, **kwargs)
        assert torch.equal(out, expected), f"batch={batch_size}"


def test_medusa_sampling_matches_target(one_thread):
    target = tiny_llama(vocab=12, seed=0)
    heads = noisy_heads(target, num_heads=2)
    prompt = torch.tensor([[1, 5, 7, 2]])
    kwargs = dict(do_sample=True, max_new_tokens=3, temperature=0.8, top_k=6)
    exact = exact_joint_distribution(target, prompt, captured_processors(target, prompt, **kwargs), 3)
    samples = sample_sequences(
        lambda: target.generate(prompt, custom_generate=speculative_generate, assistant=heads, num_draft_tokens=2, **kwargs),
        prompt.shape[1], 6000, seed=0,
    )
    assert chi_square_pvalue(samples, exact) > 1e-3


def test_medusa_round_trip(tmp_path, one_thread):
    target = tiny_llama(vocab=16, seed=0)
    heads = noisy_heads(target)
    heads.config.save_dtype = None  # exact weights on disk, so the reloaded heads decode identically
    heads.save_pretrained(tmp_path)
    loaded = AutoDrafter.from_pretrained(tmp_path, target=target)
    assert isinstance(loaded, MedusaHeads) and loaded.config.num_heads == 3
    for (name, a), b in zip(heads.state_dict().items(), loaded.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
    prompt = random_prompts(1, vocab=16, seed=2)[0]
    runs = [target.generate(prompt, custom_generate=speculative_generate, assistant=h, max_new_tokens=16, do_sample=False,
                            speculation_stats=s) for h, s in ((heads, SpeculationStats()), (loaded, SpeculationStats()))]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], target.generate(prompt, max_new_tokens=16, do_sample=False))


# --- trees: one forward with a tree attention mask ---------------------------------------------------------------------
def test_tree_forward_matches_plain_forwards_of_each_path(one_thread):
    """Every node's logits equal a plain forward of prefix + the node's path (mask and positions are right), for a
    left-padded batch, and the cache then holds exactly the kept path."""
    from transformers import DynamicCache

    from hf_specdec.ragged_cache import RaggedKV
    from hf_specdec.verification import tree_ancestor_mask

    target = tiny_llama(vocab=16, seed=0)
    parents = torch.tensor([-1, -1, 0, 0, 1, 2])
    ids, mask = left_pad(random_prompts(2, vocab=16, seed=3, min_len=3, max_len=7))
    tree = torch.randint(2, 16, (2, 6), generator=torch.Generator().manual_seed(0))
    kv = RaggedKV(target, DynamicCache(config=target.config), mask[:, :0])
    logits = kv.forward_tree(ids, mask.bool(), tree, parents)
    paths = tree_ancestor_mask(parents)
    for b in range(2):
        prompt = ids[b][mask[b].bool()]
        torch.testing.assert_close(logits[b, 0], target(prompt[None]).logits[0, -1], atol=1e-4, rtol=1e-4)
        for i in range(6):
            seq = torch.cat([prompt, tree[b][paths[i]]])
            torch.testing.assert_close(logits[b, i + 1], target(seq[None]).logits[0, -1], atol=1e-4, rtol=1e-4)
    kv.keep_tree(6, torch.tensor([[1, 0, 1, 0, 0, 1], [0, 1, 0, 0, 1, 0]], dtype=torch.bool))
    nxt = torch.tensor([[3], [4]])
    after = kv.forward(nxt, torch.ones(2, 1, dtype=torch.bool), 1)
    for b, path in enumerate([[0, 2, 5], [1, 4]]):
        seq = torch.cat([ids[b][mask[b].bool()], tree[b][path], nxt[b]])
        torch.testing.assert_close(after[b, -1], target(seq[None]).logits[0, -1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("make_target", [tiny_llama, tiny_qwen2], ids=["llama", "qwen2"])
def test_medusa_tree_greedy_identical(make_target, one_thread):
    target = make_target(vocab=16, seed=0)
    heads = noisy_heads(target, num_heads=4)
    trees = {"default": "default", "wide": [[0], [1], [2], [3], [0, 0], [1, 0], [0, 1]], "deep": [[0], [0, 0], [0, 0, 0]],
             "calibrated": 12}
    heads.config.head_accuracy = [[0.4, 0.2, 0.1, 0.05], [0.3, 0.1, 0.05, 0.01], [0.2, 0.1, 0.05, 0.01], [0.2, 0.1, 0.0, 0.0]]
    for name, tree in trees.items():
        drafter = MedusaDrafter(heads, tree=tree)
        stats = SpeculationStats()
        for prompt in random_prompts(6, vocab=16, seed=6):
            expected = target.generate(prompt, max_new_tokens=20, do_sample=False, repetition_penalty=1.2)
            for k in (2, 4):
                out = target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=k,
                                      max_new_tokens=20, do_sample=False, repetition_penalty=1.2, speculation_stats=stats)
                assert torch.equal(out, expected), name
        assert stats.accepted_tokens > 0, name


def test_medusa_tree_in_batches_with_eos(one_thread):
    target = tiny_llama(vocab=16, seed=0)
    drafter = MedusaDrafter(noisy_heads(target, num_heads=4))
    prompts = random_prompts(6, vocab=16, seed=9, min_len=2, max_len=12)
    ids, mask = left_pad(prompts)
    free = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=PAD)
    kwargs = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=PAD,
                  eos_token_id=[int(free[0, ids.shape[1] + 4])])
    out = target.generate(ids, custom_generate=speculative_generate, assistant=drafter, **kwargs)
    assert torch.equal(out, target.generate(ids, **kwargs))


def test_medusa_tree_sampling_matches_target(one_thread):
    target = tiny_llama(vocab=12, seed=0)
    drafter = MedusaDrafter(noisy_heads(target, num_heads=2), tree=[[0], [1], [2], [0, 0], [1, 0]])
    prompt = torch.tensor([[1, 5, 7, 2]])
    kwargs = dict(do_sample=True, max_new_tokens=3, temperature=0.8, top_k=6)
    exact = exact_joint_distribution(target, prompt, captured_processors(target, prompt, **kwargs), 3)
    samples = sample_sequences(
        lambda: target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=2, **kwargs),
        prompt.shape[1], 6000, seed=0,
    )
    assert chi_square_pvalue(samples, exact) > 1e-3


def test_best_tree_takes_the_most_likely_nodes():
    import itertools

    from hf_specdec.drafters.medusa import best_tree, tree_parents

    gen = torch.Generator().manual_seed(0)
    accuracy = (torch.rand(3, 4, generator=gen) * 0.5).sort(dim=1, descending=True).values.tolist()
    value = lambda path: torch.tensor([accuracy[d][r] for d, r in enumerate(path)]).prod().item()  # noqa: E731
    every = [p for d in (1, 2, 3) for p in itertools.product(range(4), repeat=d)]
    for n in (1, 5, 20, 40):
        tree = best_tree(accuracy, n)
        assert len(tree) == n and len(set(tree)) == n
        tree_parents(tree)  # every parent is in the tree
        # brute force: no node outside the tree is more likely than the least likely node in it
        outside = max(value(p) for p in every if p not in tree)
        assert min(value(p) for p in tree) >= outside - 1e-9


def test_bad_trees_are_refused():
    target = tiny_llama()
    heads = noisy_heads(target, num_heads=2)
    with pytest.raises(ValueError, match="measured accuracy"):
        MedusaDrafter(heads, tree=8)  # no config.head_accuracy
    with pytest.raises(ValueError, match="lack their parent"):
        MedusaDrafter(heads, tree=[[0], [1, 0]])
    with pytest.raises(ValueError, match="deeper than"):
        MedusaDrafter(heads, tree=[[0], [0, 0], [0, 0, 0]])


def test_typical_acceptance_is_opt_in_lossy_and_checked(one_thread):
    import warnings

    target = tiny_llama(vocab=12, seed=0)
    heads = noisy_heads(target, num_heads=2)
    prompt = torch.tensor([[1, 5, 7, 2]])
    base = dict(custom_generate=speculative_generate, max_new_tokens=3)
    with pytest.raises(ValueError, match="sampling rule"):
        target.generate(prompt, assistant=MedusaDrafter(heads), do_sample=False, verification="typical", **base)
    with pytest.raises(ValueError, match="'exact'"):
        target.generate(prompt, assistant=MedusaDrafter(heads), do_sample=True, verification="lossless", **base)
    with pytest.warns(UserWarning, match="lossy"):
        target.generate(prompt, assistant=MedusaDrafter(heads), do_sample=True, verification="typical", **base)
    # With a bar no token clears (threshold 1), every draft is rejected and each token is drawn from the target after
    # the accepted prefix: the output is then exactly the target's distribution, through both the chain and tree paths.
    kwargs = dict(do_sample=True, max_new_tokens=3, temperature=0.8, top_k=6)
    exact = exact_joint_distribution(target, prompt, captured_processors(target, prompt, **kwargs), 3)
    for tree in ("chain", [[0], [1], [0, 0]]):
        drafter = MedusaDrafter(heads, tree=tree)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            samples = sample_sequences(
                lambda: target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, verification="typical",
                                        typical_threshold=1.0, typical_alpha=100.0, **kwargs),
                prompt.shape[1], 3000, seed=1,
            )
        assert chi_square_pvalue(samples, exact) > 1e-3, tree


def test_medusa_chain_adaptive_length_is_exact(one_thread):
    target = tiny_llama(vocab=16, seed=0)
    drafter = MedusaDrafter(noisy_heads(target, num_heads=4), tree="chain")
    stats = SpeculationStats()
    for prompt in random_prompts(6, vocab=16, seed=3):
        expected = target.generate(prompt, max_new_tokens=20, do_sample=False)
        out = target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=4,
                              draft_length="adaptive", max_new_tokens=20, do_sample=False, speculation_stats=stats)
        assert torch.equal(out, expected)
    assert stats.drafted_tokens > 0
