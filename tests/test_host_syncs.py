"""Host syncs per speculative step: every drafter kind, batch 1 and 8, at most two per step.

On a GPU every read of a device value back to the host (`item`, `tolist`, `bool(t)`, `nonzero`, `.cpu()`) stalls the
queue, so a step that makes many is slow however small its kernels. `count_host_syncs` counts those calls here on the
CPU, where they are the same calls. What a step costs is the slope: syncs of a long run minus a short one, over the
target forwards between them, so that once-per-call setup (the prompt, the drafter's start) is left out.
"""

from __future__ import annotations

import pytest
import torch

from hf_specdec import SpeculationStats, speculative_generate
from hf_specdec.speed.diagnostics import count_host_syncs
from hf_specdec.drafters import DraftModelDrafter, EagleDrafter, MedusaDrafter, NgramDrafter, RecycleDrafter
from hf_specdec.kinds.draft_model.self_speculative import SelfSpeculativeDrafter
from tests.conftest import random_prompts, tiny_llama
from tests.speculation import PAD, agreeing_eagle, fitted_heads, left_pad, quiet_last_layer

MAX_SYNCS_PER_STEP = 2.0


def drafters():
    target = quiet_last_layer(tiny_llama(vocab=16, seed=0))
    heads = fitted_heads(target, random_prompts(6, vocab=16, seed=9, min_len=2, max_len=12))
    return target, {
        "draft model": lambda: DraftModelDrafter(target),
        "n-gram": lambda: NgramDrafter(),
        "eagle": lambda: EagleDrafter(agreeing_eagle(target)),
        "medusa chain": lambda: MedusaDrafter(heads, tree="chain"),
        "medusa tree": lambda: MedusaDrafter(heads, tree=[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]),
        "self-speculation": lambda: SelfSpeculativeDrafter(1),
        "token recycling": lambda: RecycleDrafter(),
    }


TARGET, DRAFTERS = drafters()


def syncs_and_forwards(make_drafter, ids, mask, new_tokens):
    stats = SpeculationStats()
    drafter = make_drafter()
    with count_host_syncs() as syncs:
        TARGET.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, pad_token_id=PAD,
                        custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=4,
                        speculation_stats=stats, draft_length="constant")
    return syncs.total, stats


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_at_most_two_host_syncs_per_step(name, batch, one_thread):
    prompts = [torch.tensor([[3, 5, 7, 3, 5, 7, 3, 5]]) if b % 2 == 0 else p
               for b, p in enumerate(random_prompts(batch, vocab=16, seed=4, min_len=4, max_len=10))]
    ids, mask = left_pad(prompts)
    short_syncs, short = syncs_and_forwards(DRAFTERS[name], ids, mask, 8)
    long_syncs, long = syncs_and_forwards(DRAFTERS[name], ids, mask, 48)
    steps = long.target_forwards - short.target_forwards
    assert long.drafted_tokens > 0 and long.accepted_tokens > 0, f"{name}: the path under test never speculated"
    assert steps > 5
    per_step = (long_syncs - short_syncs) / steps
    assert per_step <= MAX_SYNCS_PER_STEP, f"{name}, batch {batch}: {per_step:.2f} host syncs per step"
