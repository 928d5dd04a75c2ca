"""The registry of drafter kinds: a new kind is one file plus one registration line, and then loads, saves, exports,
decodes and is tagged on the Hub with no other edit. The toy kind here is that file: a bigram table."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

import hf_specdec
from hf_specdec import AutoDrafter, SpeculationStats, as_drafter, speculative_generate
from hf_specdec.drafters import Draft, Drafter
from hf_specdec.kinds import DrafterKind, drafter_kinds, kind_of, register_drafter_kind
from tests.conftest import random_prompts, tiny_llama
from training.adapters import Adapter
from tests.speculation import assert_speculated


# --- the kind's file ---------------------------------------------------------------------------------------------------
class BigramConfig(PretrainedConfig):
    model_type = "hf_specdec_test_bigram"

    def __init__(self, vocab_size: int = 96, **kwargs):
        self.vocab_size = vocab_size
        super().__init__(**kwargs)


class BigramTable(PreTrainedModel):
    """next-token scores for each token: the simplest drafter model there is."""

    config_class = BigramConfig

    def __init__(self, config):
        super().__init__(config)
        self.table = nn.Parameter(torch.zeros(config.vocab_size, config.vocab_size))
        self.post_init()

    def _init_weights(self, module):
        pass


class BigramDrafter(Drafter):
    def __init__(self, model: BigramTable):
        self.model = model

    def vocab_size(self):
        return self.model.config.vocab_size

    def propose(self, seqs, max_tokens):
        last = torch.stack([seqs.ids(b)[-1] for b in range(seqs.size)])
        tokens = []
        for _ in range(max_tokens):
            last = self.model.table[last].argmax(dim=-1)
            tokens.append(last)
        return Draft(torch.stack(tokens, dim=1))


def export_bigram_json(model, target, out, dtype):
    out.mkdir(parents=True, exist_ok=True)
    (out / "bigram.json").write_text(json.dumps(model.table.argmax(dim=-1).tolist()))


@dataclass
class BigramOptions:
    bigram_scale: float = field(default=1.0, metadata={"help": "the table's entries are logits times this"})


class BigramTraining(Adapter):
    """How `python -m training.distill --drafter test-bigram` builds and scores it (the default loss: the target's
    top-K distribution at every teacher position, from the token there), with an option of its own."""

    Options = BigramOptions

    def new(self, args, target, target_name, target_folder, draft_vocab):
        return BigramTable(BigramConfig(vocab_size=target.config.vocab_size))

    def logits(self, model, batch):
        return self.options.bigram_scale * model.table[batch["input_ids"][batch["positions"]]], batch["tgt_ids"]


BIGRAM = DrafterKind("test-bigram", BigramConfig, BigramTable, BigramDrafter, exporters={"test-bigram-json": export_bigram_json},
                     training="tests.test_kinds:BigramTraining", description="a bigram table")
# --- end of the kind's file (its registration line is in the fixture, so that it leaves the registry afterwards) ----


@pytest.fixture
def registered(monkeypatch):
    from hf_specdec import kinds

    monkeypatch.setattr(kinds, "_KINDS", dict(kinds._KINDS))
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
    from hf_specdec.export import export_drafter

    export_drafter(tmp_path / "bigram", target, tmp_path / "exported", "test-bigram-json")
    assert len(json.loads((tmp_path / "exported" / "bigram.json").read_text())) == target.config.vocab_size
    card = hf_specdec.hub.render_model_card(tmp_path / "bigram", model.config, repo_id="someone/bigram")
    assert "test-bigram" in card.data.tags
    assert registered in drafter_kinds()


def test_every_built_in_kind_is_registered_once_with_its_exporters():
    names = [kind.name for kind in drafter_kinds()]
    assert len(names) == len(set(names)) and {"draft-model", "eagle", "medusa", "causal-lm"} <= set(names)
    from hf_specdec.export import exporter
    from hf_specdec.kinds import export_formats

    for fmt, kind in export_formats().items():
        assert callable(exporter(kind.exporters[fmt])), fmt
