"""N-gram lookup drafter: the incremental index equals a brute-force search; decoding with it stays exact."""

from __future__ import annotations

import random

import pytest
import torch

from hf_specdec import SpeculationStats, speculative_generate
from hf_specdec.generation import verification
from hf_specdec import as_drafter
from hf_specdec.drafters import NgramDrafter
from hf_specdec.drafters import DraftSettings
from hf_specdec.drafters.ngram import NgramIndex
from hf_specdec.generation.sequences import Sequences
from tests.speculation import assert_speculated
from tests.conftest import ARCHITECTURES, random_prompts, tiny_llama
from tests.distribution import captured_processors, chi_square_pvalue, exact_joint_distribution, sample_sequences

N_RANGES = [(1, 1), (1, 3), (2, 4), (1, 6), (3, 5)]


pytestmark = pytest.mark.usefixtures("one_thread")


def brute_force(seq: list[int], min_n: int, max_n: int, max_tokens: int, strategy: str) -> tuple[list[int], int]:
    """The specification, written as plainly as possible: scan every earlier position, every time."""
    length = len(seq)

    def occurrences(query: list[int], n: int) -> list[int]:
        """Ends e (exclusive) of earlier occurrences of query[-n:] in `seq` that have a continuation seq[e]."""
        return [e for e in range(n, length) if seq[e - n : e] == query[len(query) - n :]]

    def longest(query: list[int]) -> tuple[int, list[int]]:
        for n in range(min(max_n, len(query)), min_n - 1, -1):
            ends = occurrences(query, n)
            if ends:
                return n, ends
        return 0, []

    if max_tokens <= 0:
        return [], 0
    n, ends = longest(seq)
    if not ends:
        return [], 0
    if strategy == "recent":
        ext = list(seq)
        start = max(ends)
        for i in range(max_tokens):
            ext.append(ext[start + i])  # may read tokens proposed a moment ago: a periodic copy
        return ext[length:], n
    ext, out, first_n = list(seq), [], n
    while ends and len(out) < max_tokens:
        stats = {}
        for e in ends:
            count, last = stats.get(seq[e], (0, -1))
            stats[seq[e]] = (count + 1, max(last, e))
        best = max(stats, key=lambda t: stats[t])
        out.append(best)
        ext.append(best)
        _, ends = longest(ext)
    return out, first_n


@pytest.mark.parametrize("strategy", ["recent", "frequent"])
@pytest.mark.parametrize("min_n,max_n", N_RANGES)
def test_index_matches_brute_force(strategy, min_n, max_n):
    rng = random.Random(f"{strategy}-{min_n}-{max_n}")
    checked = matched = 0
    for _ in range(300):
        vocab = rng.choice([2, 3, 5, 8])
        total = rng.randint(0, 60)
        seq = [rng.randrange(vocab) for _ in range(total)]
        index = NgramIndex(min_n, max_n, count=strategy == "frequent")
        fed = 0
        while True:  # feed in random chunks: the index must be right after every incremental update
            max_tokens = rng.randint(0, 10)
            got = index.propose(max_tokens, strategy)
            expected = brute_force(seq[:fed], min_n, max_n, max_tokens, strategy)
            assert got == expected, (seq[:fed], max_tokens, got, expected)
            checked += 1
            matched += bool(got[0])
            if fed == total:
                break
            step = rng.randint(1, 7)
            index.extend(seq[fed : fed + step])
            fed = min(total, fed + step)
    assert matched > checked // 10  # the comparison exercised real matches, not only empty proposals


def test_recent_copies_latest_and_extends_periodically():
    index = NgramIndex(1, 3)
    index.extend([7, 1, 2, 9, 1, 2, 5, 1, 2])
    assert index.propose(2) == ([5, 1], 2)  # latest earlier "1 2" was followed by 5 (the first one by 9)
    index = NgramIndex(1, 4)
    index.extend([4, 1, 2, 1, 2])
    assert index.propose(6) == ([1, 2, 1, 2, 1, 2], 2)  # "1 2" runs into the present: periodic copy
    index = NgramIndex(1, 4)
    index.extend([3, 3])
    assert index.propose(5) == ([3, 3, 3, 3, 3], 1)


def test_frequent_prefers_most_frequent_follower_then_most_recent():
    index = NgramIndex(1, 2, count=True)
    index.extend([1, 2, 1, 2, 1, 3, 1])
    assert index.propose(1, "frequent") == ([2], 1)  # 1 -> 2 twice, 1 -> 3 once
    assert index.propose(1, "recent") == ([3], 1)
    index = NgramIndex(1, 1, count=True)
    index.extend([1, 2, 1, 3, 1])
    assert index.propose(1, "frequent") == ([3], 1)  # a tie: the most recent follower wins


def lookup(drafter, ids: list[int], k: int, seqs=None):
    """The drafter's proposal for one sequence, as the loop asks for it (a new call when `seqs` is None; else `ids`
    must extend the sequence `seqs` holds, which then grows)."""
    if seqs is None:
        seqs = Sequences(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
        drafter.start(None, seqs, DraftSettings(None, None, False))
    else:
        new = ids[seqs.lengths()[0] :]
        seqs.append(0, torch.tensor(new), new)
    draft = drafter.propose(seqs, k)
    return draft, seqs


def test_no_match_drafts_nothing():
    drafter = NgramDrafter(min_ngram=2, max_ngram=4)
    draft, _ = lookup(drafter, [5, 6, 7, 8, 5, 9], 5)  # "5 9" never occurred before
    assert draft.num_tokens == 0 and draft.probs is None
    assert lookup(drafter, [5, 6, 7, 8, 5, 9, 7, 8], 3)[0].tokens.tolist() == [[5, 9, 7]]


def test_drafter_index_is_incremental_and_new_per_call():
    drafter = NgramDrafter(1, 3)
    draft, seqs = lookup(drafter, [1, 2, 3, 4, 1, 2], 3)
    assert draft.tokens.tolist() == [[3, 4, 1]]
    index = drafter.index
    draft, _ = lookup(drafter, [1, 2, 3, 4, 1, 2, 3, 9, 1, 2, 3], 2, seqs)
    assert draft.tokens.tolist() == [[9, 1]]
    assert drafter.index is index and len(index) == 11  # extended in place
    assert lookup(drafter, [8, 6, 8], 2)[0].tokens.tolist() == [[6, 8]]  # another call: a new index
    assert drafter.index is not index


def test_max_tokens_by_match_caps_weak_matches():
    drafter = NgramDrafter(1, 4, max_tokens_by_match=(2, 3))
    assert lookup(drafter, [1, 2, 3, 4, 5, 6, 9, 1], 6)[0].tokens.tolist() == [[2, 3]]  # 1-gram: 2
    assert lookup(drafter, [1, 2, 3, 4, 5, 6, 9, 1, 2], 6)[0].tokens.tolist() == [[3, 4, 5]]  # 2-gram: 3
    assert lookup(drafter, [1, 2, 3, 4, 5, 6, 9, 1, 2, 3], 6)[0].tokens.tolist() == [[4, 5, 6, 9, 1, 2]]
    drafter = NgramDrafter(1, 4, max_tokens_by_match=(0,))  # 1-gram matches draft nothing: like min_ngram=2
    assert lookup(drafter, [1, 2, 3, 4, 5, 6, 9, 1], 6)[0].num_tokens == 0
    assert lookup(NgramDrafter(1, 4, max_tokens_by_match=()), [1, 2, 3, 1], 6)[0].tokens.tolist() == [[2, 3, 1, 2, 3, 1]]


def test_bad_arguments():
    with pytest.raises(ValueError, match="min_n"):
        NgramDrafter(min_ngram=3, max_ngram=2)
    with pytest.raises(ValueError, match="strategy"):
        NgramDrafter(strategy="oldest")
    with pytest.raises(ValueError, match="max_tokens_by_match"):
        NgramDrafter(max_tokens_by_match=(3, -1))
    assert isinstance(as_drafter("ngram"), NgramDrafter)


SETTINGS = {
    "default": dict(),
    "frequent": dict(strategy="frequent", max_ngram=3),
    "uncapped": dict(min_ngram=2, max_ngram=6, max_tokens_by_match=()),
}


@pytest.mark.parametrize("arch_name", sorted(ARCHITECTURES))
def test_greedy_identical_to_plain(arch_name):
    target = ARCHITECTURES[arch_name]()
    prompts = random_prompts(12, seed=7)
    plain = [target.generate(p, max_new_tokens=30, do_sample=False) for p in prompts]
    for name, kwargs in SETTINGS.items():
        stats = SpeculationStats()
        for k in (2, 6):
            for prompt, expected in zip(prompts, plain):
                out = target.generate(
                    prompt, max_new_tokens=30, do_sample=False, custom_generate=speculative_generate,
                    assistant=NgramDrafter(**kwargs), num_draft_tokens=k, speculation_stats=stats,
                draft_length="constant")
                assert torch.equal(out, expected), f"{arch_name}/{name}/k={k}: output differs from plain greedy"
        # tiny random models repeat themselves: lookup finds something (2-gram matches, when uncapped, are rarer)
        assert_speculated(stats, depth=1 if name == "uncapped" else 2, what=name)


def test_greedy_with_repetition_penalty_and_one_drafter_reused():
    target = tiny_llama(vocab=16)  # a small vocabulary repeats itself even under the penalty
    drafter = NgramDrafter(strategy="frequent")  # one object across calls: start() resets its index
    stats = SpeculationStats()
    for prompt in random_prompts(6, vocab=16, seed=11):
        kwargs = dict(max_new_tokens=25, do_sample=False, repetition_penalty=1.3)
        expected = target.generate(prompt, **kwargs)
        out = target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=4,
                              speculation_stats=stats, **kwargs, draft_length="constant")
        assert torch.equal(out, expected)
    assert_speculated(stats, depth=2)


# --- sampling: the drafter is deterministic (q one-hot), so the rule is exact; the chi-square test checks it ---
SAMPLE_VOCAB = 12
SAMPLE_TOKENS = 3
SAMPLE_PROMPT = torch.tensor([[1, 5, 7, 2, 5, 7, 2, 5]])  # "5 7 2" repeats: the drafter proposes from the start
NUM_SAMPLES = 4_000


def _sampled_pvalue(target, drafter, config, stats):
    kwargs = dict(do_sample=True, max_new_tokens=SAMPLE_TOKENS, **config)
    processors = captured_processors(target, SAMPLE_PROMPT, **kwargs)
    exact = exact_joint_distribution(target, SAMPLE_PROMPT, processors, SAMPLE_TOKENS)
    samples = sample_sequences(
        lambda: target.generate(
            SAMPLE_PROMPT, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=3,
            speculation_stats=stats, **kwargs,
        draft_length="constant"),
        SAMPLE_PROMPT.shape[1],
        NUM_SAMPLES,
    )
    return chi_square_pvalue(samples, exact)


@pytest.fixture(scope="module")
def sampling_target():
    return tiny_llama(vocab=SAMPLE_VOCAB, seed=0)


def test_sampling_matches_target(sampling_target):
    stats = SpeculationStats()
    pvalue = _sampled_pvalue(sampling_target, NgramDrafter(1, 3), dict(temperature=1.5, top_k=8), stats)
    assert pvalue > 1e-3
    assert_speculated(stats, depth=2)  # both branches of the rule were exercised, at two draft positions


def test_sampling_negative_control_fails(sampling_target, monkeypatch):
    """The same test, with a broken rule (resample from p after a rejection), must fail at this sample size."""
    monkeypatch.setattr(verification, "residual_distribution", lambda p, q: p)
    pvalue = _sampled_pvalue(sampling_target, NgramDrafter(1, 3), dict(temperature=1.5, top_k=8), SpeculationStats())
    assert pvalue < 1e-4
