"""Token recycling: a tree from the target's own recent top-k successors, refreshed from every verification forward;
exact for greedy and sampling, chains and trees, batches included."""

from __future__ import annotations

import pytest
import torch

from hf_specdec import SpeculationStats, as_drafter, speculative_generate
from hf_specdec.generation import verification
from hf_specdec.drafters import FallbackDrafter, NgramDrafter, RecycleDrafter
from tests.conftest import ARCHITECTURES, random_prompts, tiny_llama
from tests.distribution import captured_processors, chi_square_pvalue, exact_joint_distribution, sample_in_batches
from tests.speculation import PAD, assert_speculated, left_pad

CHAIN = [[0], [0, 0], [0, 0, 0]]  # the top-1 successor, then its top-1 successor...
SIBLINGS = [[0], [0, 0], [1], [0, 1], [1, 0], [2]]  # siblings at the root and, within the first 4 nodes, below it
pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_table_holds_the_targets_top_successors_of_what_it_read():
    target = tiny_llama(vocab=32)
    drafter = RecycleDrafter(top_k=4)
    prompt = torch.tensor([[3, 9, 17, 25]])
    # one token: a single (prefill) forward, which read the prompt's last token
    target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, max_new_tokens=1, draft_length="constant")
    assert drafter.table[25].tolist() == target(prompt).logits[0, -1].topk(4).indices.tolist()
    assert drafter.table.shape == (32, 4) and drafter.table[24].tolist() == [0, 1, 2, 3]  # unread: the initial guess
    table = drafter.table
    target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, max_new_tokens=4, draft_length="constant")
    assert drafter.table is table  # kept across calls ("recycled")
    drafter.reset()
    assert drafter.table is None


@pytest.mark.parametrize("arch_name", sorted(ARCHITECTURES))
def test_greedy_identical_to_plain_tree_and_chain(arch_name):
    target = ARCHITECTURES[arch_name](vocab=32)
    prompts = random_prompts(8, vocab=32, seed=4)
    for name, tree in (("tree", None), ("chain", CHAIN)):
        drafter = RecycleDrafter() if tree is None else RecycleDrafter(tree=tree)
        stats = SpeculationStats()
        for prompt in prompts:
            expected = target.generate(prompt, max_new_tokens=30, do_sample=False, repetition_penalty=1.1)
            for k in (3, None):
                out = target.generate(prompt, custom_generate=speculative_generate, assistant=drafter,
                                      num_draft_tokens=k, max_new_tokens=30, do_sample=False, repetition_penalty=1.1,
                                      speculation_stats=stats, draft_length="constant")
                assert torch.equal(out, expected), f"{arch_name}/{name}/k={k}"
        assert_speculated(stats, depth=2, what=name)


def test_in_batches_with_eos_and_backing_ngram():
    target = tiny_llama(vocab=32)
    prompts = random_prompts(6, vocab=32, seed=9, min_len=2, max_len=12)
    ids, mask = left_pad(prompts)
    free = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=PAD)
    kwargs = dict(attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=PAD,
                  eos_token_id=[int(free[-1, ids.shape[1] + 5])])
    expected = target.generate(ids, **kwargs)
    for assistant in (RecycleDrafter(), "ngram+recycle"):
        stats = SpeculationStats()
        out = target.generate(ids, custom_generate=speculative_generate, assistant=assistant, speculation_stats=stats,
                              **kwargs, draft_length="constant")
        assert torch.equal(out, expected), assistant
        assert_speculated(stats, depth=2, rows=1, uneven=True, what=str(assistant))
        assert sum(a > 0 for a in stats.accepted_by_row) >= 3, stats.accepted_by_row
    combined = as_drafter("ngram+recycle")
    assert isinstance(combined, FallbackDrafter) and isinstance(combined.first, NgramDrafter)
    assert isinstance(combined.second, RecycleDrafter)


SAMPLING = dict(do_sample=True, max_new_tokens=4, temperature=0.8, top_k=4)
PROMPT = torch.tensor([[1, 5, 7, 2, 5, 7]])


class AgreeingTable(RecycleDrafter):
    """A table the target agrees with at the first step after PROMPT (each token's row: the target's top successors
    after PROMPT + that token), kept as it is (no refresh), so that trees at depth 2 are accepted often."""

    def start(self, target, seqs, settings):
        super().start(target, seqs, settings)
        with torch.no_grad():
            processors = captured_processors(target.model, PROMPT, **SAMPLING)
            for token in range(self.table.shape[0]):
                ids = torch.cat([PROMPT, torch.tensor([[token]])], dim=1)
                self.table[token] = processors(ids, target.model(ids).logits[:, -1])[0].topk(self.top_k).indices
            root = processors(PROMPT, target.model(PROMPT).logits[:, -1])[0]
            self.table[PROMPT[0, -1]] = root.topk(self.top_k).indices

    def accepted(self, seqs, verified):
        pass


def recycle_pvalue(tree, stats):
    target = tiny_llama(vocab=12, seed=0)
    drafter = AgreeingTable(top_k=4, tree=tree)
    exact = exact_joint_distribution(target, PROMPT, captured_processors(target, PROMPT, **SAMPLING), 4)
    drawn = sample_in_batches(target, PROMPT, 20_000, custom_generate=speculative_generate, assistant=drafter,
                              speculation_stats=stats, **SAMPLING)
    return chi_square_pvalue(drawn, exact)


@pytest.mark.parametrize("tree", [SIBLINGS, CHAIN], ids=["tree", "chain"])
def test_sampling_keeps_the_targets_distribution(tree):
    stats = SpeculationStats()
    assert recycle_pvalue(tree, stats) > 1e-3
    assert_speculated(stats, depth=2, row_groups=1, uneven=True)


def test_sampling_negative_control(monkeypatch):
    monkeypatch.setattr(verification, "residual_distribution", lambda p, q: p)  # forget rejected siblings
    assert recycle_pvalue(SIBLINGS, SpeculationStats()) < 1e-6


def test_bad_trees_are_refused():
    with pytest.raises(ValueError, match="ranks in 0..top_k-1"):
        RecycleDrafter(top_k=2, tree=[[0], [2]])
    with pytest.raises(ValueError, match="after their parent"):
        RecycleDrafter(tree=[[0, 0], [0]])
