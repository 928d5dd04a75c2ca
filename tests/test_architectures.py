"""Exact or refused up front, across the architectures transformers ships: a representative type per family, run
through the same cells as `benchmarks/architectures.py` (every drafter kind that applies, both ways in, the CPU matmul
path on and off) against plain greedy `generate()`."""

from __future__ import annotations

import pytest

from benchmarks.architectures import run_type
from hf_specdec.cache.keyword import CACHE

#: one type per family of attention, cache and layout the sweep meets: dense RoPE (llama), ALiBi (bloom), learned
#: positions (gpt2), parallel blocks (gpt_neox, falcon), multi-query (gpt_bigcode), sliding windows mixed with
#: full attention (gemma2, gemma3 through its multimodal class), MoE (qwen3_moe), latent attention
#: (deepseek_v3), convolution layers that can roll back (lfm2), complex RoPE on a non-contiguous projection (llama4_text)
IDENTICAL = ["llama", "bloom", "gpt2", "gpt_neox", "falcon", "gpt_bigcode", "gemma2", "gemma3", "qwen3_moe",
             "deepseek_v3", "lfm2", "llama4_text", "mpt"]
#: refused before any forward, with the reason: recurrent state, no cache in the forward ... (where transformers
#: versions differ, either reason: from 5.25 RWKV's forward takes no cache and is no longer marked stateful, and
#: DeepSeek V4 attends through an indexer instead of a recurrent state)
REFUSED = {"mamba": "recurrent state", "rwkv": ("recurrent state", "takes no cache"), "xlnet": "takes no cache",
           "openai-gpt": "takes no cache", "cpmant": "position bias", "moshi": "other tokens",
           "deepseek_v4": ("recurrent state", "indexer"), "minimax": "cannot be rolled back",
           "prophetnet": "one new token", "xlm": "structure of its own"}


#: refused on transformers < 5.24 (models took `past_key_values`): sliding-window and chunked layers did not roll back
NEEDS_5_24 = {"gemma2", "gemma3", "llama4_text"}
OLD_SLIDING = "attends over a sliding window"


@pytest.mark.parametrize("model_type", IDENTICAL)
def test_identical_to_plain_greedy(model_type):
    row = run_type(model_type, fast_variants=(True,))
    if CACHE == "past_key_values" and model_type in NEEDS_5_24:
        ours = {name: cell for name, cell in row["cells"].items() if not name.startswith("transformers")}
        assert all(c["status"] == "refused" and OLD_SLIDING in c["reason"] for c in ours.values()), ours
        return
    bad = {name: cell for name, cell in row.get("cells", {}).items()
           if cell["status"] not in ("ok", "refused") and not name.startswith("transformers")}
    assert row.get("status", "").startswith("identical") and not bad, (row.get("reason"), bad)
    # the drafters that apply to every architecture drafted and stayed identical (not refused)
    assert all(row["cells"][f"{drafter}/{route}/fast"]["status"] == "ok"
               for drafter in ("copy", "noisy", "ngram") for route in ("enable", "custom_generate")), row["cells"]


@pytest.mark.parametrize("model_type, reason", sorted(REFUSED.items()), ids=sorted(REFUSED))
def test_refused_before_any_forward_with_the_reason(model_type, reason):
    row = run_type(model_type, fast_variants=(True,))
    ours = {name: cell for name, cell in row["cells"].items() if not name.startswith("transformers")}
    reasons = (reason,) if isinstance(reason, str) else reason
    if CACHE == "past_key_values":  # (before 5.24 a sliding window is refused first, as Moshi's is)
        reasons += (OLD_SLIDING,)
    assert all(cell["status"] == "refused" and any(r in cell["reason"] for r in reasons) for cell in ours.values()), ours
