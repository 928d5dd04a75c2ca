"""Gemma 4 assistants (transformers' `gemma4_assistant`, which read their Gemma 4 target's stored K/V) through
hf_specdec's loop: exact against plain generate() by object and by folder, in batches, sampled; drafting what
transformers' own `assistant_model=` path drafts."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers.models.gemma4_assistant", reason="this transformers release does not ship the drafter")

from hf_specdec import SpeculationStats, as_drafter, speculative_generate
from hf_specdec.errors import InputError
from hf_specdec.kinds.gemma4_assistant import Gemma4AssistantDrafter
from tests.conftest import random_prompts, tiny_llama
from tests.distribution import speculative_sample_pvalue
from tests.speculation import assert_speculated, check_batches_with_an_early_eos, check_greedy_prompt_by_prompt
from tests.speculation import check_greedy_through_enable, forwards_beside_transformers
from tests.transformers_drafters import tiny_gemma4_with_assistant

PROMPTS = random_prompts(6, vocab=16, seed=5)


@pytest.fixture(scope="module")
def gemma4():
    return tiny_gemma4_with_assistant()


def test_a_gemma4_assistant_by_object_and_by_folder_is_plain_greedy(gemma4, tmp_path, one_thread):
    target, assistant = gemma4
    assistant.save_pretrained(tmp_path)
    assert isinstance(as_drafter(assistant), Gemma4AssistantDrafter)
    assert isinstance(as_drafter(str(tmp_path), target), Gemma4AssistantDrafter)
    check_greedy_prompt_by_prompt(target, assistant, PROMPTS, k=4, depth=3)
    check_greedy_through_enable(target, str(tmp_path), PROMPTS[:3])


def test_a_gemma4_assistant_drafts_what_transformers_assistant_model_path_drafts(gemma4, one_thread):
    """At the assistant's own length, the same tokens in at most as many target forwards as `assistant_model=`."""
    target, assistant = gemma4
    counts = forwards_beside_transformers(target, PROMPTS, {"assistant_model": assistant},
                                          {"assistant": assistant, "draft_length": "constant"})
    assert counts["hf_specdec"] <= counts["transformers"] < len(PROMPTS) * 24, counts


def test_a_gemma4_assistant_in_batches_with_an_early_eos_and_past_the_sliding_window(gemma4, one_thread):
    target, assistant = gemma4
    stats = SpeculationStats()
    check_batches_with_an_early_eos(target, assistant, random_prompts(6, vocab=16, seed=11, min_len=2, max_len=12), (1, 4), stats)
    assert_speculated(stats, depth=3, rows=6)
    target, assistant = tiny_gemma4_with_assistant(sliding_window=6)  # the sliding layer's stored K/V: its last 5 tokens
    stats = SpeculationStats()
    for prompt in PROMPTS:
        out = target.generate(prompt, custom_generate=speculative_generate, assistant=assistant, max_new_tokens=40,
                              do_sample=False, draft_length="constant", speculation_stats=stats)
        assert torch.equal(out, target.generate(prompt, max_new_tokens=40, do_sample=False))
    assert_speculated(stats, depth=3)


def test_a_gemma4_assistant_sampling_matches_target(one_thread):
    """3,000 draws, not 20,000: a sliding-window target decodes a batch row by row (8 ms a draw here). At this size the
    harness's negative control (`lie_about_second_q`) gives p ~ 0.005, too weak to assert; the controls of the same
    harness and rule run at full size with the MTP and DFlash drafters (tests/test_mtp.py, tests/test_dflash.py)."""
    target, assistant = tiny_gemma4_with_assistant(vocab=12)
    stats = SpeculationStats()
    assert speculative_sample_pvalue(target, torch.tensor([[1, 5, 7, 2]]), Gemma4AssistantDrafter(assistant), 2, stats,
                                     samples=3000) > 1e-3
    assert_speculated(stats, depth=2, row_groups=1)


def test_a_gemma4_assistant_with_another_target_is_refused_naming_the_fix(gemma4, one_thread):
    with pytest.raises(InputError, match="Gemma 4 model it was made for"):
        tiny_llama(vocab=16).generate(PROMPTS[0], custom_generate=speculative_generate, assistant=gemma4[1],
                                      max_new_tokens=4)
