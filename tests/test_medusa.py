"""Medusa heads: a new head is the identity, heads round-trip, and decoding with them (chain) is exact."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from transformers import DynamicCache

import hf_specdec.generation.verification as rules
from hf_specdec import AutoDrafter, MedusaConfig, MedusaHeads, SpeculationStats, speculative_generate
from hf_specdec import as_drafter
from hf_specdec.cache.ragged import RaggedKV
from hf_specdec.drafters import MedusaDrafter
from hf_specdec.drafters.positionwise import best_tree, tree_parents
from hf_specdec.kinds.draft_model.model import TargetNotBoundError
from hf_specdec.tree import Tree
from hf_specdec.generation.verification import Accepted, residual_distribution
from tests.conftest import random_prompts, tiny_llama, tiny_qwen2
from tests.distribution import captured_processors, chi_square_pvalue, exact_joint_distribution, sample_in_batches
from tests.speculation import (
    PAD,
    ScriptedCosts,
    assert_adapted,
    assert_speculated,
    fitted_heads,
    left_pad,
    lie_about_second_q,
)

PROMPTS16 = random_prompts(10, vocab=16, seed=6)
SAMPLING_PROMPT = torch.tensor([[1, 5, 7, 2]])
# 6 tokens: after the first (plain: no hidden states yet), a step may still verify 4 nodes, so depth-2 siblings
SAMPLING = dict(do_sample=True, max_new_tokens=6, temperature=0.8, top_k=3)


def sampling_pvalue(target, drafter, stats, samples=20_000, num_draft_tokens=2, **extra):
    """Chi-square of batched samples against the exact distribution of SAMPLING on SAMPLING_PROMPT (a tree drafter:
    `num_draft_tokens=None`, its whole tree)."""
    prompt = SAMPLING_PROMPT
    exact = exact_joint_distribution(target, prompt, captured_processors(target, prompt, **SAMPLING), 6)
    drawn = sample_in_batches(target, prompt, samples, custom_generate=speculative_generate, assistant=drafter,
                              num_draft_tokens=num_draft_tokens, speculation_stats=stats, **SAMPLING, **extra)
    return chi_square_pvalue(drawn, exact)


@pytest.fixture(scope="module")
def sampling_target():
    target = tiny_llama(vocab=12, seed=0)
    torch.manual_seed(0)  # heads fitted to the target's own samples after the test's prompt: they agree often
    return target, fitted_heads(target, [SAMPLING_PROMPT] * 300, num_heads=2, **SAMPLING)


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
    heads = fitted_heads(target, PROMPTS16)
    assert isinstance(as_drafter(heads), MedusaDrafter)
    chain = MedusaDrafter(heads, tree="chain")
    stats = SpeculationStats()
    for prompt in PROMPTS16:
        expected = target.generate(prompt, max_new_tokens=24, do_sample=False)
        for k in (1, 3):
            out = target.generate(prompt, custom_generate=speculative_generate, assistant=chain, num_draft_tokens=k,
                                  max_new_tokens=24, do_sample=False, speculation_stats=stats, draft_length="constant")
            assert torch.equal(out, expected)
    assert_speculated(stats, depth=3)


def test_medusa_chain_batched_greedy_identical_with_eos(one_thread):
    target = tiny_llama(vocab=16, seed=0)
    prompts = random_prompts(8, vocab=16, seed=9, min_len=2, max_len=12)
    chain = MedusaDrafter(fitted_heads(target, prompts), tree="chain")
    stats = SpeculationStats()
    for batch_size in (2, 5):
        ids, mask = left_pad(prompts[:batch_size])
        free = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=PAD)
        kwargs = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=PAD,
                      eos_token_id=[int(free[0, ids.shape[1] + 4])])
        expected = target.generate(ids, **kwargs)
        out = target.generate(ids, custom_generate=speculative_generate, assistant=chain, num_draft_tokens=3,
                              speculation_stats=stats, **kwargs, draft_length="constant")
        assert torch.equal(out, expected), f"batch={batch_size}"
    assert_speculated(stats, depth=2, rows=2, uneven=True)


def test_medusa_chain_sampling_with_the_heads_q_matches_target(sampling_target, one_thread):
    """The chain drafts one draw from each head's processed distribution and reports it as q."""
    target, heads = sampling_target
    stats = SpeculationStats()
    assert sampling_pvalue(target, MedusaDrafter(heads, tree="chain"), stats) > 1e-3
    assert_speculated(stats, depth=2, row_groups=1, uneven=True)


def test_medusa_chain_sampling_negative_control(sampling_target, one_thread):
    """The test sees a wrong q at the second head only."""
    target, heads = sampling_target
    assert sampling_pvalue(target, lie_about_second_q(MedusaDrafter(heads, tree="chain")), SpeculationStats()) < 1e-6


def test_medusa_round_trip(tmp_path, one_thread):
    target = tiny_llama(vocab=16, seed=0)
    heads = noisy_heads(target)
    with torch.no_grad():  # blocks of the noisy heads, fitted LM heads of their own: heads that agree often
        fitted = fitted_heads(target, PROMPTS16)
        heads = MedusaHeads(MedusaConfig.from_target(target.config, num_heads=3, num_layers=1, share_lm_head=False))
        heads.load_state_dict({**noisy_heads(target, scale=0.01).state_dict(), **fitted.state_dict()}, strict=False)
    heads.config.save_dtype = None  # exact weights on disk, so the reloaded heads decode identically
    heads.save_pretrained(tmp_path)
    loaded = AutoDrafter.from_pretrained(tmp_path, target=target)
    assert isinstance(loaded, MedusaHeads) and loaded.config.num_heads == 3
    for (name, a), b in zip(heads.state_dict().items(), loaded.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
    stats = [SpeculationStats(), SpeculationStats()]
    for prompt in PROMPTS16[:3]:
        runs = [target.generate(prompt, custom_generate=speculative_generate, assistant=h, max_new_tokens=16,
                                do_sample=False, speculation_stats=s, draft_length="constant") for h, s in zip((heads, loaded), stats)]
        assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], target.generate(prompt, max_new_tokens=16,
                                                                                     do_sample=False))
    assert stats[0].accepted_by_position == stats[1].accepted_by_position
    assert_speculated(stats[1], depth=2)


# --- trees: one forward with a tree attention mask ---------------------------------------------------------------------
def test_tree_forward_matches_plain_forwards_of_each_path(one_thread):
    """Every node's logits equal a plain forward of prefix + the node's path (mask and positions are right), for a
    left-padded batch, and the cache then holds exactly the kept path."""
    target = tiny_llama(vocab=16, seed=0)
    tree = Tree([-1, -1, 0, 0, 1, 2])
    ids, mask = left_pad(random_prompts(2, vocab=16, seed=3, min_len=3, max_len=7))
    tokens = torch.randint(2, 16, (2, 6), generator=torch.Generator().manual_seed(0))
    kv = RaggedKV(target, DynamicCache(config=target.config), 2)
    logits = kv.forward_tree(ids, mask.bool(), tokens, tree)
    for b in range(2):
        prompt = ids[b][mask[b].bool()]
        torch.testing.assert_close(logits[b, 0], target(prompt[None]).logits[0, -1], atol=1e-4, rtol=1e-4)
        for i in range(6):
            seq = torch.cat([prompt, tokens[b][tree.path_to(i)]])
            torch.testing.assert_close(logits[b, i + 1], target(seq[None]).logits[0, -1], atol=1e-4, rtol=1e-4)
    paths = [[0, 2, 5], [1, 4]]
    kv.keep(ids.shape[1] + 6, [[j for j in range(ids.shape[1]) if mask[b, j]] + [ids.shape[1] + n for n in path]
                               for b, path in enumerate(paths)])
    nxt = torch.tensor([[3], [4]])
    after = kv.forward(nxt, 1)
    for b, path in enumerate(paths):
        seq = torch.cat([ids[b][mask[b].bool()], tokens[b][path], nxt[b]])
        torch.testing.assert_close(after[b, -1], target(seq[None]).logits[0, -1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("make_target", [tiny_llama, tiny_qwen2], ids=["llama", "qwen2"])
def test_medusa_tree_greedy_identical(make_target, one_thread):
    target = make_target(vocab=16, seed=0)
    heads = fitted_heads(target, PROMPTS16, num_heads=4)
    trees = {"default": "default", "wide": [[0], [1], [2], [3], [0, 0], [1, 0], [0, 1]], "deep": [[0], [0, 0], [0, 0, 0]],
             "calibrated": 12}
    heads.config.head_accuracy = [[0.4, 0.2, 0.1, 0.05], [0.3, 0.1, 0.05, 0.01], [0.2, 0.1, 0.05, 0.01], [0.2, 0.1, 0.0, 0.0]]
    for name, tree in trees.items():
        drafter = MedusaDrafter(heads, tree=tree)
        stats = SpeculationStats()
        for prompt in PROMPTS16[:6]:
            expected = target.generate(prompt, max_new_tokens=20, do_sample=False, repetition_penalty=1.2)
            for k in (4, None):  # the first 4 nodes, the whole tree
                out = target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=k,
                                      max_new_tokens=20, do_sample=False, repetition_penalty=1.2, speculation_stats=stats, draft_length="constant")
                assert torch.equal(out, expected), name
        assert_speculated(stats, depth=2, what=name)


def test_medusa_tree_in_batches_with_eos(one_thread):
    target = tiny_llama(vocab=16, seed=0)
    prompts = random_prompts(6, vocab=16, seed=9, min_len=2, max_len=12)
    drafter = MedusaDrafter(fitted_heads(target, prompts, num_heads=4))
    ids, mask = left_pad(prompts)
    free = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=PAD)
    kwargs = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=PAD,
                  eos_token_id=[int(free[0, ids.shape[1] + 4])])
    stats = SpeculationStats()
    out = target.generate(ids, custom_generate=speculative_generate, assistant=drafter, speculation_stats=stats, **kwargs, draft_length="constant")
    assert torch.equal(out, target.generate(ids, **kwargs))
    assert_speculated(stats, depth=2, rows=2, uneven=True)


SIBLING_TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [2]]  # siblings at depth 1 and, within the first 4 nodes, depth 2


def test_medusa_tree_sampling_matches_target(sampling_target, one_thread):
    """Recursive rejection over siblings, at depth 1 and depth 2."""
    target, heads = sampling_target
    stats = SpeculationStats()
    assert sampling_pvalue(target, MedusaDrafter(heads, tree=SIBLING_TREE), stats, num_draft_tokens=None) > 1e-3
    assert_speculated(stats, depth=2, row_groups=1, uneven=True)


def wrong_below_the_root(tokens, tree, probs, q=None, valid=None, generator=None):
    """`verification.rejection_sample` with a rule that is easy to get wrong: after a rejected sibling BELOW the root,
    the next sibling is tried against the same p instead of the residual norm(max(0, p' - onehot))."""
    batch = tokens.shape[0]
    rows = torch.arange(batch)
    children = tree.tensors(tokens.device)["children"]
    node = torch.full((batch,), -1)
    p, alive = probs[:, 0].clone(), torch.ones(batch, dtype=torch.bool)
    path = torch.full((batch, tree.max_depth), -1)
    for depth in range(tree.max_depth):
        moved = torch.zeros_like(alive)
        for rank in range(children.shape[1]):
            child = children[node + 1, rank]
            trying = alive & ~moved & (child >= 0)
            x = tokens[rows, child.clamp_min(0)]
            accept = trying & (torch.rand(batch) < p.gather(1, x[:, None]).squeeze(1))
            if depth == 0:  # the root's siblings get the right residual; deeper ones do not
                residual = residual_distribution(p, torch.nn.functional.one_hot(x, p.shape[-1]).float())
                p = torch.where((trying & ~accept)[:, None], residual, p)
            p = torch.where(accept[:, None], probs[rows, child.clamp_min(0) + 1], p)
            node = torch.where(accept, child, node)
            path[:, depth] = torch.where(accept, child, path[:, depth])
            moved |= accept
        alive &= moved
    return Accepted(path, (path >= 0).sum(1), torch.multinomial(p, 1).squeeze(1), node)


def test_medusa_tree_sampling_negative_control_at_depth_two(sampling_target, one_thread, monkeypatch):
    """The test sees an error that only touches siblings at depth 2: it really verifies them."""
    target, heads = sampling_target
    monkeypatch.setattr(rules, "rejection_sample", wrong_below_the_root)
    assert sampling_pvalue(target, MedusaDrafter(heads, tree=SIBLING_TREE), SpeculationStats(), num_draft_tokens=None) < 1e-6


def test_best_tree_takes_the_most_likely_nodes():
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


def test_typical_acceptance_is_opt_in_lossy_and_checked(sampling_target, one_thread):
    target, heads = sampling_target
    prompt = SAMPLING_PROMPT
    base = dict(custom_generate=speculative_generate, max_new_tokens=3)
    with pytest.raises(ValueError, match="sampling rule"):
        target.generate(prompt, assistant=MedusaDrafter(heads), do_sample=False, verification="typical", **base, draft_length="constant")
    with pytest.raises(ValueError, match="'exact'"):
        target.generate(prompt, assistant=MedusaDrafter(heads), do_sample=True, verification="lossless", **base, draft_length="constant")
    with pytest.warns(UserWarning, match="lossy"):
        target.generate(prompt, assistant=MedusaDrafter(heads), do_sample=True, verification="typical", **base, draft_length="constant")
    # With a bar no token clears (threshold 1), every draft is rejected and each token is drawn from the target after
    # the accepted prefix: the output is then exactly the target's distribution, through both the chain and tree paths.
    for tree in ("chain", SIBLING_TREE):
        stats = SpeculationStats()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            p = sampling_pvalue(target, MedusaDrafter(heads, tree=tree), stats, samples=5000, verification="typical",
                                typical_threshold=1.0, typical_alpha=100.0, num_draft_tokens=2 if tree == "chain" else None)
        assert p > 1e-3, tree
        assert stats.drafted_by_position[:2] > [0, 0] and stats.accepted_tokens == 0, stats.as_dict()


@pytest.mark.parametrize("tree", ["chain", SIBLING_TREE], ids=["chain", "tree"])
def test_typical_acceptance_accepts_and_is_lossy(sampling_target, tree, one_thread):
    """With a bar of 0 every draft the target gives any probability passes: most drafts are accepted, every token
    stays in the target's support, and the output is measurably NOT the target's distribution (the lossy rule ran)."""
    target, heads = sampling_target
    stats = SpeculationStats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        p = sampling_pvalue(target, MedusaDrafter(heads, tree=tree), stats, samples=5000, verification="typical",
                            typical_threshold=0.0, typical_alpha=0.0, num_draft_tokens=2 if tree == "chain" else None)
    assert p < 1e-6
    assert_speculated(stats, depth=2)


def test_medusa_chain_adaptive_length_is_exact(one_thread):
    target = tiny_llama(vocab=16, seed=0)
    drafter = MedusaDrafter(fitted_heads(target, PROMPTS16, num_heads=4), tree="chain")
    stats, policy = SpeculationStats(), ScriptedCosts()
    for prompt in PROMPTS16:
        expected = target.generate(prompt, max_new_tokens=20, do_sample=False)
        out = target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=4,
                              draft_length=policy, max_new_tokens=20, do_sample=False, speculation_stats=stats)
        assert torch.equal(out, expected)
    assert_speculated(stats, depth=2)
    assert_adapted(policy)
