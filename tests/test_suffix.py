"""Suffix decoding: the suffix array's ranges, exactness (greedy and sampling, trees and chains, batches), the index
kept with the target across calls and threads (the second call drafts from the first one's output), its bounds, and
saving and loading it."""

from __future__ import annotations

import copy
import pickle
import threading

import numpy as np
import pytest
import torch

import hf_specdec
from hf_specdec import SpeculationStats, speculative_generate
from hf_specdec.generation import verification
from hf_specdec.drafters import FallbackDrafter, MedusaDrafter, NgramDrafter, SuffixDrafter, SuffixIndex
from hf_specdec.drafters.fallback import _Measured
from hf_specdec.generation import draft_length
from hf_specdec.drafters.base import DraftSettings, Verified
from hf_specdec.drafters.suffix import SuffixArray, _Acceptance, _Node, index_of
from hf_specdec.generation.sequences import Sequences
from tests.conftest import ARCHITECTURES, random_prompts, tiny_char_tokenizer, tiny_llama
from tests.distribution import captured_processors, chi_square_pvalue, exact_joint_distribution, sample_in_batches
from tests.speculation import PAD, assert_speculated, fitted_heads, left_pad

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_suffix_array_finds_every_occurrence_and_nothing_across_documents():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 4, 400).astype(np.int32)
    tokens[[60, 61, 250]] = -1  # document separators
    array = SuffixArray(tokens, depth=8)
    for _ in range(300):
        m, start = int(rng.integers(1, 7)), int(rng.integers(0, 390))
        pattern = tokens[start : start + m]
        if (pattern < 0).any():
            continue
        lo, hi = array.range_of(pattern)
        brute = [i for i in range(len(tokens)) if np.array_equal(tokens[i : i + m], pattern)]
        assert sorted(array.order[lo:hi].tolist()) == brute
        for token, count, a, b in array.children(lo, hi, m):  # continuations: sub-ranges, counted
            assert token >= 0 and count == b - a == sum(tokens[i + m] == token for i in brute if i + m < len(tokens))


@pytest.mark.parametrize("arch_name", sorted(ARCHITECTURES))
def test_greedy_identical_and_the_second_call_drafts_from_the_first_calls_output(arch_name):
    target = ARCHITECTURES[arch_name](vocab=48)
    prompts = random_prompts(4, vocab=48, seed=3)
    kwargs = dict(max_new_tokens=30, do_sample=False, repetition_penalty=1.2)
    expected = [target.generate(p, **kwargs) for p in prompts]
    drafter = SuffixDrafter()
    first, second = SpeculationStats(), SpeculationStats()
    for prompt, plain in zip(prompts, expected):
        out = target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, speculation_stats=first,
                              draft_length="constant", **kwargs)
        assert torch.equal(out, plain)
    assert drafter.index.num_documents == 4 and drafter.index.num_tokens == sum(e.shape[1] for e in expected)
    for prompt, plain in zip(prompts, expected):  # the same requests again: the index holds their answers
        out = target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, speculation_stats=second,
                              draft_length="constant", **kwargs)
        assert torch.equal(out, plain)
    # (the second round may accept every draft: the answers repeat exactly; the first round's rejections ran)
    assert_speculated(second, depth=4, rejected=False, what=arch_name)
    assert first.accepted_tokens < first.drafted_tokens, first.as_dict()
    assert second.mean_accepted_tokens > 4 * first.mean_accepted_tokens > 4, (first.as_dict(), second.as_dict())
    drafter.index.clear()  # without the index, the second round drafts only what the current sequence repeats
    cleared = SpeculationStats()
    for prompt, plain in zip(prompts, expected):
        out = target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, speculation_stats=cleared,
                              draft_length="constant", **kwargs)
        assert torch.equal(out, plain)
    assert cleared.mean_accepted_tokens < second.mean_accepted_tokens / 2


def test_adaptive_calls_are_identical_and_the_drafter_sizes_its_own_trees():
    """At batch 1 the default draft length is adaptive: the policy hands the suffix drafter the cap once it has
    measured step costs, and the drafter keeps the nodes whose chances pay for a wider forward."""
    target = tiny_llama(vocab=48)
    prompts = random_prompts(3, vocab=48, seed=5)
    kwargs = dict(max_new_tokens=30, do_sample=False, repetition_penalty=1.2)
    drafter, stats, sized = SuffixDrafter(), SpeculationStats(), []
    original = drafter._sized
    drafter._sized = lambda nodes: sized.append(drafter.settings.verify_cost(0) is not None) or original(nodes)
    for _ in range(2):  # the second round drafts from the first round's answers
        for prompt in prompts:
            out = target.generate(prompt, custom_generate=speculative_generate, assistant=drafter,
                                  speculation_stats=stats, **kwargs)
            assert torch.equal(out, target.generate(prompt, **kwargs))
    (policy,) = draft_length._LEARNED[drafter][target].values()
    assert isinstance(policy, draft_length.AdaptiveDraftLength) and policy.drafter_sizes
    assert sum(sized) > len(sized) / 2  # most steps were sized against measured costs
    assert_speculated(stats, depth=3)


def test_a_tree_is_sized_by_its_nodes_chances_against_the_verify_cost():
    chain = [_Node(t, t - 1, 0.9 ** (t + 1), 1.0, ("sequence", 2)) for t in range(10)]  # chances 0.9, 0.81, ...
    drafter = SuffixDrafter()
    drafter.settings = DraftSettings(None, None, False, verify_cost=lambda k: 1.0)  # as cheap wide as narrow (a GPU)
    assert drafter._sized(chain) == chain
    drafter.settings = DraftSettings(None, None, False, verify_cost=lambda k: None)  # nothing measured yet
    assert drafter._sized(chain) == chain
    # each draft costs half a step: 1 + 0.9 + 0.81 + 0.729 tokens for 2.5 steps is the best rate (3 nodes)
    drafter.settings = DraftSettings(None, None, False, verify_cost=lambda k: 1.0 + 0.5 * k)
    assert drafter._sized(chain) == chain[:3]
    # behind a fallback: (1 + 2.44) / 2.5 = 1.38 tokens per second for 3 nodes beats a rival's 1.3, not its 1.4
    drafter.rival_rate = 1.3
    assert drafter._sized(chain) == chain[:3]
    drafter.rival_rate = 1.4
    assert drafter._sized(chain) == []
    # now and then a tree that would be cut goes out whole, so that the wide forward's cost gets measured
    drafter.rival_rate, drafter.explore_every, drafter.cut_trees = None, 3, 0
    assert [len(drafter._sized(chain)) for _ in range(6)] == [3, 3, 10, 3, 3, 10]


def test_behind_a_model_drafter_weak_matches_leave_the_step_to_it():
    """`suffix+medusa:chain`: the suffix drafter drafts where it expects more tokens per second than the heads gave on
    their own steps, and declines its weaker trees; greedy output identical, and both parts drafted."""
    target = tiny_llama(vocab=48)
    prompts = random_prompts(4, vocab=48, seed=7)
    kwargs = dict(max_new_tokens=30, do_sample=False, repetition_penalty=1.2)
    heads = fitted_heads(target, prompts, num_heads=3, **kwargs)  # right often: a rival worth leaving steps to
    suffix = SuffixDrafter()
    hybrid = FallbackDrafter(suffix, MedusaDrafter(heads, tree="chain"))
    assert hybrid.sizes_own_drafts
    sized, original = [], suffix._sized
    suffix._sized = lambda nodes: sized.append((len(nodes), suffix.rival_rate, len(kept := original(nodes)))) or kept
    stats = SpeculationStats()
    for _ in range(2):  # the second round's suffix drafts come from the first round's answers
        for prompt in prompts:
            out = target.generate(prompt, custom_generate=speculative_generate, assistant=hybrid,
                                  speculation_stats=stats, **kwargs)
            assert torch.equal(out, target.generate(prompt, **kwargs))
    assert hybrid.second_measured.gain > 1  # the heads drafted, and were right some of the time
    assert any(kept for _, _, kept in sized)  # the suffix drafter drafted ...
    assert any(grown and rival is not None and not kept for grown, rival, kept in sized)  # ... and left steps to them
    assert_speculated(stats, depth=3)


def test_a_fallbacks_second_part_is_measured_in_tokens_per_second():
    measured = _Measured(decay=0.5)
    assert measured.rate(lambda k: 1.0) is None  # nothing measured yet
    measured.steps(3, 4)
    measured.drafting(0.5)
    assert measured.rate(None) is None and measured.rate(lambda k: None) is None
    assert measured.rate(lambda k: 1.0 + 0.25 * k) == pytest.approx(3 / (2.0 + 0.5))
    measured.steps(1, 2)  # decayed means: 2 tokens per step, 3 drafted
    assert measured.rate(lambda k: 1.0 + 0.25 * k) == pytest.approx(2 / (1.75 + 0.5))


def test_node_chances_learn_from_what_was_accepted():
    acceptance, key = _Acceptance(), ("corpus", 1)
    prior = acceptance.rate(key)
    for _ in range(100):  # a one-token corpus match's only continuation, always rejected
        acceptance.record([_Node(5, -1, prior, 1.0, key), _Node(6, 0, prior * prior, 1.0, key)], set())
    assert acceptance.rate(key) < 0.1 and acceptance.rate(("sequence", 4)) == prior
    assert acceptance.counts[key][0] < 100  # only the first node was a trial (its child's parent was rejected)
    for _ in range(300):
        acceptance.record([_Node(5, -1, 0.1, 1.0, key), _Node(6, 0, 0.01, 1.0, key)], {0, 1})
    assert acceptance.rate(key) > 0.9


def test_a_draft_another_drafter_replaced_teaches_nothing():
    """In `ngram+suffix` a row n-gram lookup drafted reports 0 accepted to the suffix drafter: not a miss of its own."""
    drafter, seqs = SuffixDrafter(), Sequences(torch.tensor([[3, 4, 5]]), torch.ones(1, 3))
    key = ("sequence", 1)
    for mine, learns in ((False, False), (None, True), (True, True)):
        drafter.drafted, drafter.drafted_after = [[_Node(7, -1, 0.7, 1.0, key)]], [3]
        before = {k: list(v) for k, v in drafter.acceptance.counts.items()}
        drafter.accepted(seqs, Verified([0], mine=None if mine is None else [mine]))
        assert (drafter.acceptance.counts != before) == learns
    # inside a fallback inside another, a row the outer one drafted with its first part is not the suffix drafter's
    inner = FallbackDrafter(NgramDrafter(), drafter)
    outer = FallbackDrafter(NgramDrafter(), inner)
    outer.used_first, inner.used_first = [True], [False]  # the outer's n-gram lookup drafted the row
    drafter.drafted, drafter.drafted_after = [[_Node(7, -1, 0.7, 1.0, key)]], [3]
    before = {k: list(v) for k, v in drafter.acceptance.counts.items()}
    outer.accepted(seqs, Verified([0]))
    assert drafter.acceptance.counts == before


def test_a_name_keeps_one_index_per_target_on_both_routes_and_across_threads():
    target = tiny_llama(vocab=48)
    prompts = random_prompts(6, vocab=48, seed=5)
    kwargs = dict(max_new_tokens=20, do_sample=False, repetition_penalty=1.2)
    expected = {i: target.generate(p, **kwargs) for i, p in enumerate(prompts)}
    hf_specdec.enable(target)
    try:
        outputs = {}

        def decode(i):
            route = {} if i % 2 else {"custom_generate": speculative_generate}
            call = target.generate if i % 2 else (lambda *a, **k: type(target).generate(target, *a, **k))
            outputs[i] = call(prompts[i], assistant="suffix", **route, **kwargs)

        threads = [threading.Thread(target=decode, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        hf_specdec.disable(target)
    assert all(torch.equal(outputs[i], expected[i]) for i in expected)
    index = index_of(target)
    assert index is hf_specdec.get_assistant(target, "suffix").index and index.num_documents == len(prompts)


def test_in_batches_rows_draft_chains_and_finished_rows_join_the_index():
    target = tiny_llama(vocab=48)
    prompts = random_prompts(5, vocab=48, seed=11, min_len=3, max_len=10)
    ids, mask = left_pad(prompts)
    kwargs = dict(attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=PAD, repetition_penalty=1.2)
    drafter = SuffixDrafter()
    target.generate(ids, custom_generate=speculative_generate, assistant=drafter, draft_length="constant", **kwargs)
    assert drafter.index.num_documents == 5
    # answers under another penalty: the index's drafts are partly right, so rows accept and reject unevenly
    kwargs["repetition_penalty"] = 1.3
    expected = target.generate(ids, **kwargs)
    stats = SpeculationStats()
    for assistant in (drafter, FallbackDrafter(drafter, NgramDrafter())):
        out = target.generate(ids, custom_generate=speculative_generate, assistant=assistant, speculation_stats=stats,
                              draft_length="constant", **kwargs)
        assert torch.equal(out, expected)
    assert_speculated(stats, depth=3, rows=5, uneven=True)


SAMPLING = dict(do_sample=True, max_new_tokens=4, temperature=0.8, top_k=4)  # the first token comes from the prompt's forward
PROMPT = torch.tensor([[1, 5, 7, 2, 3, 9]])  # no token repeats: the corpus, not the prompt itself, drafts


def warmed_drafter(target, samples: int = 300) -> SuffixDrafter:
    """An index holding the target's own sampled continuations of PROMPT: trees with siblings it often accepts."""
    drafter = SuffixDrafter(min_probability=0.02)
    drawn = sample_in_batches(target, PROMPT, samples, seed=99, **SAMPLING)
    drafter.index.add(*(PROMPT[0].tolist() + list(continuation) for continuation in drawn))
    return drafter


def suffix_pvalue(batched: bool, stats) -> float:
    target = tiny_llama(vocab=12, seed=0)
    drafter = warmed_drafter(target)
    index_before = drafter.index.num_documents
    drafter.index.add = lambda *documents: None  # the index stays as warmed (what samples add would change drafts)
    exact = exact_joint_distribution(target, PROMPT, captured_processors(target, PROMPT, **SAMPLING), 4)
    kwargs = dict(custom_generate=speculative_generate, assistant=drafter, speculation_stats=stats, **SAMPLING)
    if batched:  # rows draft chains
        drawn = sample_in_batches(target, PROMPT, 20_000, **kwargs)
    else:  # one row: trees
        torch.manual_seed(0)
        drawn = [tuple(target.generate(PROMPT, **kwargs)[0, PROMPT.shape[1]:].tolist()) for _ in range(2500)]
    assert drafter.index.num_documents == index_before
    return chi_square_pvalue(drawn, exact)


@pytest.mark.parametrize("batched", [False, True], ids=["tree", "chains"])
def test_sampling_keeps_the_targets_distribution(batched):
    stats = SpeculationStats()
    assert suffix_pvalue(batched, stats) > 1e-3
    assert_speculated(stats, depth=2)


def test_sampling_behind_a_model_drafter_with_adaptive_sizing_keeps_the_targets_distribution():
    """`suffix+medusa:chain` under `draft_length="adaptive"`: which part drafts, and how many nodes, depends on rates
    measured at earlier steps, never on this step's draws, so the samples keep the target's distribution."""
    target = tiny_llama(vocab=12, seed=0)
    suffix = warmed_drafter(target)
    suffix.index.add = lambda *documents: None
    torch.manual_seed(1)
    heads = fitted_heads(target, [PROMPT] * 100, num_heads=2, **SAMPLING)
    hybrid = FallbackDrafter(suffix, MedusaDrafter(heads, tree="chain"))
    rivals, original = [], suffix._sized
    suffix._sized = lambda nodes: rivals.append(suffix.rival_rate) or original(nodes)
    exact = exact_joint_distribution(target, PROMPT, captured_processors(target, PROMPT, **SAMPLING), 4)
    stats = SpeculationStats()
    torch.manual_seed(0)
    drawn = [tuple(target.generate(PROMPT, custom_generate=speculative_generate, assistant=hybrid,
                                   draft_length="adaptive", speculation_stats=stats, **SAMPLING)[0, PROMPT.shape[1]:].tolist())
             for _ in range(2500)]
    assert chi_square_pvalue(drawn, exact) > 1e-3
    assert hybrid.second_measured.gain is not None and any(r is not None for r in rivals)  # both parts, and the rival
    assert_speculated(stats, depth=2)


def test_sampling_negative_control(monkeypatch):
    monkeypatch.setattr(verification, "residual_distribution", lambda p, q: p)  # forget rejected siblings
    assert suffix_pvalue(False, SpeculationStats()) < 1e-6


def test_a_fixed_seed_reproduces_a_sample_from_the_same_drafter_state_only():
    """The suffix drafter learns from every call (its index and its node chances), so a seeded sample is reproduced by
    a fresh drafter, not by the same drafter a call later: the drafts differ, and so do the draws that verify them
    (each sample keeps the target's distribution either way). Why it is opt-in, not part of `"default"`."""
    target, prompt = tiny_llama(vocab=48), random_prompts(1, vocab=48, seed=3)[0]

    def sample(drafter):
        torch.manual_seed(0)
        return target.generate(prompt, max_new_tokens=40, do_sample=True, custom_generate=speculative_generate,
                               assistant=drafter)[0].tolist()

    kept = SuffixDrafter()
    first = sample(kept)
    assert sample(SuffixDrafter()) == first  # the same state: the same sample
    assert sample(kept) != first  # one call later the index holds the first sample
    ngram = NgramDrafter()  # a drafter with no state across calls reproduces it every time
    assert sample(ngram) == sample(ngram)


def test_the_index_is_bounded_and_saves_and_loads(tmp_path):
    index = SuffixIndex(max_tokens=100, merge_tokens=10)
    for i in range(30):
        index.add(list(range(i, i + 10)))
    assert index.num_tokens <= 100 + 10 and index.num_documents < 30  # the oldest went first
    kept = [d.tolist() for d in index._large_docs + index._recent_docs]
    assert kept[-1] == list(range(29, 39))
    index.save(tmp_path / "index.npz")
    loaded = SuffixIndex(max_tokens=100, merge_tokens=10)
    loaded.load(tmp_path / "index.npz")
    assert [d.tolist() for d in loaded._large_docs + loaded._recent_docs] == kept
    assert index.nbytes() == 8 * sum(len(a) for a in index.arrays)  # 8 bytes per token: tokens and suffix array


def test_a_drafter_copies_and_pickles_with_an_index_of_its_own():
    """`hf-specdec bench` deep-copies each drafter it measures: the copy's index holds the same documents, and adding
    to one leaves the other as it was."""
    drafter = SuffixDrafter()
    drafter.index.add([1, 2, 3, 4], [5, 6, 7])
    for twin in (copy.deepcopy(drafter), pickle.loads(pickle.dumps(drafter))):
        assert twin.index.num_documents == 2 and twin.index.arrays[0].range_of([2, 3]) == drafter.index.arrays[0].range_of([2, 3])
        twin.index.add([8, 9])
        assert twin.index.num_documents == 3 and drafter.index.num_documents == 2


def test_warm_from_a_jsonl_of_earlier_answers(tmp_path):
    tokenizer = tiny_char_tokenizer()
    (tmp_path / "answers.jsonl").write_text('{"text": "abcabc"}\n{"text": "xyz"}\n{"other": 1}\n')
    index = SuffixIndex()
    assert index.add_jsonl(tmp_path / "answers.jsonl", tokenizer) == 2
    assert index.num_documents == 2 and index.num_tokens == 9


def test_every_index_is_sorted_on_one_builder_thread(monkeypatch):
    """Additions from many threads sort on one thread: the sorts' large temporary arrays then stay in one allocator
    arena (sorted on each serving thread, resident memory grew with the number of threads: benchmarks/soak.py)."""
    from hf_specdec.drafters import suffix

    built_on = []
    original = suffix.SuffixArray.__init__
    monkeypatch.setattr(suffix.SuffixArray, "__init__",
                        lambda self, *a: built_on.append(threading.get_ident()) or original(self, *a))
    indexes = [SuffixIndex(), SuffixIndex()]
    callers = [threading.Thread(target=indexes[i % 2].add, args=([i, 1, 2, 3],)) for i in range(6)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert len(built_on) >= 6 and len(set(built_on)) == 1
    assert built_on[0] not in {t.ident for t in callers} | {threading.get_ident()}
    assert indexes[0].num_documents == indexes[1].num_documents == 3


def test_a_forked_child_builds_its_index_on_a_builder_thread_of_its_own():
    """After a fork (a server's worker processes) the parent's builder thread is gone: the child makes its own instead
    of waiting forever on the parent's."""
    import multiprocessing

    SuffixIndex().add([1, 2, 3, 4])  # the parent's builder thread exists now
    child = multiprocessing.get_context("fork").Process(target=SuffixIndex().add, args=([5, 6, 7, 8],))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0
