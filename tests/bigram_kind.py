"""A toy drafter kind, a bigram table: the one file a new kind needs (tests/test_kinds.py loads, saves, exports and
decodes it; tests/test_distill.py trains it). Importing it registers nothing: the registration line,
`register_drafter_kind(BIGRAM)`, is in the tests, so that the kind leaves the registry afterwards."""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from hf_specdec.drafters import Draft, Drafter
from hf_specdec.kind_options import KindOptions, option
from hf_specdec.registry import DrafterKind
from hf_specdec.training.adapters import Adapter


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
class BigramOptions(KindOptions):
    bigram_scale: float = option(1.0, "the table's entries are logits times this")


class BigramTraining(Adapter):
    """How `python -m training.distill --drafter test-bigram` builds and scores it (the default loss: the target's
    top-K distribution at every teacher position, from the token there), with an option of its own."""

    def new(self, args, target, target_name, target_folder, draft_vocab):
        return BigramTable(BigramConfig(vocab_size=target.config.vocab_size))

    def logits(self, model, batch):
        return self.options.bigram_scale * model.table[batch["input_ids"][batch["positions"]]], batch["tgt_ids"]


BIGRAM = DrafterKind("test-bigram", BigramConfig, BigramTable, BigramDrafter, exporters={"test-bigram-json": export_bigram_json},
                     options=BigramOptions, training="tests.bigram_kind:BigramTraining", description="a bigram table")
