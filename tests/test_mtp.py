"""The target's own multi-token-prediction layers (transformers' `use_mtp=True`) as hf_specdec's drafter: exact
against plain generate() by name and by object, in batches and sampled, drafting what transformers' path drafts."""

from __future__ import annotations

import pytest
import torch

MtpModel = getattr(pytest.importorskip("transformers.modeling_layers"), "MtpModel", None)
if MtpModel is None:
    pytest.skip("this transformers release does not ship MTP layers", allow_module_level=True)

from hf_specdec import SpeculationStats, as_drafter, speculative_generate
from hf_specdec.errors import InputError
from hf_specdec.kinds.mtp import MtpDrafter
from tests.conftest import random_prompts, tiny_llama
from tests.distribution import speculative_sample_pvalue
from tests.speculation import (
    assert_speculated,
    check_batches_with_an_early_eos,
    check_greedy_prompt_by_prompt,
    check_greedy_through_enable,
    forwards_beside_transformers,
    lie_about_second_q,
)
from tests.transformers_drafters import tiny_deepseek_with_mtp


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    return tiny_deepseek_with_mtp(tmp_path_factory.mktemp("deepseek-mtp"))


def test_mtp_by_name_and_by_object_is_plain_greedy(deepseek, one_thread):
    mtp = MtpModel.from_pretrained(deepseek).eval()
    assert isinstance(as_drafter(mtp), MtpDrafter) and isinstance(as_drafter("mtp", deepseek), MtpDrafter)
    prompts = random_prompts(6, vocab=32, seed=5)
    check_greedy_prompt_by_prompt(deepseek, mtp, prompts, k=3, depth=2)
    check_greedy_through_enable(deepseek, "mtp", prompts)


def test_mtp_drafts_what_transformers_use_mtp_drafts(deepseek, one_thread):
    """At one draft a step (what one MTP layer drafts in transformers), the same tokens in as many target forwards:
    the layer reads the same (token, state) pairs."""
    counts = forwards_beside_transformers(deepseek, random_prompts(6, vocab=32, seed=5), {"use_mtp": True},
                                          {"assistant": "mtp", "num_draft_tokens": 1, "draft_length": "constant"})
    assert counts["hf_specdec"] == counts["transformers"] < 6 * 24, counts


def test_mtp_batches_with_an_early_eos(deepseek, one_thread):
    stats = SpeculationStats()
    prompts = random_prompts(6, vocab=32, seed=7, min_len=2, max_len=12)
    check_batches_with_an_early_eos(deepseek, MtpDrafter.for_target(deepseek), prompts, (1, 3), stats)
    assert_speculated(stats, depth=2, rows=6, uneven=True)


def mtp_sampling_pvalue(tmp_path, transform=lambda drafter: drafter, stats=None):
    target = tiny_deepseek_with_mtp(tmp_path, vocab=12)
    return speculative_sample_pvalue(target, torch.tensor([[1, 5, 7, 2]]), transform(MtpDrafter.for_target(target)),
                                     2, stats)


def test_mtp_sampling_matches_target(tmp_path, one_thread):
    stats = SpeculationStats()
    assert mtp_sampling_pvalue(tmp_path, stats=stats) > 1e-3
    assert_speculated(stats, depth=2, row_groups=1)


def test_mtp_sampling_negative_control_second_draft(tmp_path, one_thread):
    assert mtp_sampling_pvalue(tmp_path, lie_about_second_q, SpeculationStats()) < 1e-6


def test_mtp_on_a_target_without_mtp_layers_is_refused_naming_the_fix(one_thread):
    target = tiny_llama()
    with pytest.raises(InputError, match="num_mtp_layers"):
        target.generate(torch.tensor([[1, 2, 3]]), custom_generate=speculative_generate, assistant="mtp",
                        max_new_tokens=4)
