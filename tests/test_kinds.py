"""The registry of drafter kinds: a new kind is one file plus one registration line, and then loads, saves, exports,
decodes and is tagged on the Hub with no other edit. The toy kind is that file: tests/bigram_kind.py, a bigram table."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import hf_specdec
import hf_specdec.hub
from hf_specdec import AutoDrafter, SpeculationStats, as_drafter, registry, speculative_generate
from hf_specdec.export import export_drafter, exporter
from hf_specdec.cli import main as cli_main
from hf_specdec.drafters import DraftModelDrafter
from hf_specdec.names import UnknownDrafterError, known_names
from hf_specdec.registry import DrafterKind, drafter_kinds, export_formats, kind_of, register_drafter_kind
from tests.bigram_kind import BIGRAM, BigramConfig, BigramDrafter, BigramTable
from tests.conftest import random_prompts, tiny_char_tokenizer, tiny_llama
from tests.speculation import assert_speculated


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))
    register_drafter_kind(BIGRAM)
    yield BIGRAM


def fitted_bigram(target, prompts) -> BigramTable:
    """Counts of what the target's greedy continuations put after each token."""
    model = BigramTable(BigramConfig(vocab_size=target.config.vocab_size))
    with torch.no_grad():
        for prompt in prompts:
            seq = target.generate(prompt, max_new_tokens=30, do_sample=False)[0]
            model.table.index_put_((seq[:-1], seq[1:]), torch.ones(len(seq) - 1), accumulate=True)
    return model


def test_a_registered_kind_loads_saves_exports_and_decodes(registered, tmp_path):
    target = tiny_llama()
    prompts = random_prompts(8, seed=2)
    fitted_bigram(target, prompts).save_pretrained(tmp_path / "bigram")
    model = AutoDrafter.from_pretrained(tmp_path / "bigram", target=target)
    assert isinstance(model, BigramTable) and kind_of(model.config) is registered
    drafter = as_drafter(model, target=target)
    assert isinstance(drafter, BigramDrafter)
    stats = SpeculationStats()
    for prompt in prompts:
        out = target.generate(prompt, custom_generate=speculative_generate, assistant=model, num_draft_tokens=3,
                              max_new_tokens=30, do_sample=False, speculation_stats=stats, draft_length="constant")
        assert torch.equal(out, target.generate(prompt, max_new_tokens=30, do_sample=False))
    assert_speculated(stats, depth=2)
    export_drafter(tmp_path / "bigram", target, tmp_path / "exported", "test-bigram-json")
    assert len(json.loads((tmp_path / "exported" / "bigram.json").read_text())) == target.config.vocab_size
    card = hf_specdec.hub.render_model_card(tmp_path / "bigram", model.config, repo_id="someone/bigram")
    assert "test-bigram" in card.data.tags
    assert registered in drafter_kinds()


def test_every_built_in_kind_is_registered_once_with_its_exporters():
    names = [kind.name for kind in drafter_kinds()]
    assert len(names) == len(set(names)) and {"draft-model", "eagle", "medusa", "causal-lm"} <= set(names)
    for fmt, kind in export_formats().items():
        assert callable(exporter(kind.exporters[fmt])), fmt


def twin(target, number):
    """A kind built from its name alone: drafts with a copy of the target (so every draft is accepted)."""
    return DraftModelDrafter(copy.deepcopy(target))


TWIN = DrafterKind("test-twin", build=twin, number="optional", description="a copy of the target, drafting")


def test_a_kind_registered_from_outside_is_a_name_in_generate_combinations_and_the_bench(monkeypatch, tmp_path, capsys):
    """One registration line makes a name: `assistant="test-twin"` (and in "a+b"), known to the errors and to the
    command line's bench."""
    monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))
    with pytest.raises(UnknownDrafterError):
        as_drafter("test-twin")
    register_drafter_kind(TWIN)
    assert "'test-twin' (or 'test-twin:N')" in known_names()
    target = tiny_llama()
    prompt = random_prompts(1, seed=3)[0]
    stats = SpeculationStats()
    for name in ("test-twin", "test-twin:2", "ngram+test-twin"):
        out = target.generate(prompt, custom_generate=speculative_generate, assistant=name, num_draft_tokens=3,
                              max_new_tokens=20, do_sample=False, speculation_stats=stats, draft_length="constant")
        assert torch.equal(out, target.generate(prompt, max_new_tokens=20, do_sample=False)), name
    assert_speculated(stats, depth=3, rejected=False)
    target.save_pretrained(tmp_path / "target")
    tiny_char_tokenizer().save_pretrained(tmp_path / "target")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "0", "prompt": "abcabc"}) + "\n")
    assert cli_main(["bench", "--target", str(tmp_path / "target"), "--assistant", "test-twin", "--prompts", str(prompts),
                     "--max-new-tokens", "12", "--num-draft-tokens", "3", "--json", str(tmp_path / "bench.json")]) == 0
    row = json.loads((tmp_path / "bench.json").read_text())["methods"][-1]
    assert row["identical_to_plain"] and row["mean_accepted_tokens"] > 3
