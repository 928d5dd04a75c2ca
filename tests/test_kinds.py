"""The registry of drafter kinds: a new kind is one file plus one registration line, and then loads, saves, exports,
decodes and is tagged on the Hub with no other edit. The toy kind is that file: tests/bigram_kind.py, a bigram table."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass

import pytest
import torch

import hf_specdec
import hf_specdec.hub
from hf_specdec import AutoDrafter, SpeculationStats, as_drafter, registry, speculative_generate
from hf_specdec.formats.export import export_drafter, exporter
from hf_specdec.cli import main as cli_main
from hf_specdec.drafters import DraftModelDrafter
from hf_specdec.errors import InputError
from hf_specdec.kind_options import KindOptions, option
from hf_specdec.assistants.grammar import UnknownDrafterError, known_names
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


@dataclass
class TwinOptions(KindOptions):
    label: int | None = option(None, "what ':N' sets (recorded, to show it reaches the builder)", argument=True)


BUILT_WITH = []


def twin(target, options):
    """A kind built from its name alone: drafts with a copy of the target (so every draft is accepted)."""
    BUILT_WITH.append(options.label)
    return DraftModelDrafter(copy.deepcopy(target))


TWIN = DrafterKind("test-twin", build=twin, options=TwinOptions, description="a copy of the target, drafting")


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
    BUILT_WITH.clear()
    for name in ("test-twin", "test-twin:2", "ngram+test-twin"):
        out = target.generate(prompt, custom_generate=speculative_generate, assistant=name, num_draft_tokens=3,
                              max_new_tokens=20, do_sample=False, speculation_stats=stats, draft_length="constant")
        assert torch.equal(out, target.generate(prompt, max_new_tokens=20, do_sample=False)), name
    assert_speculated(stats, depth=3, rejected=False)
    assert BUILT_WITH == [None, 2, None]  # its options class read the name's ':N'
    with pytest.raises(UnknownDrafterError, match="'test-twin' \\(or 'test-twin:N'\\)"):
        as_drafter("test-twin:x")
    target.save_pretrained(tmp_path / "target")
    tiny_char_tokenizer().save_pretrained(tmp_path / "target")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "0", "prompt": "abcabc"}) + "\n")
    assert cli_main(["bench", "--target", str(tmp_path / "target"), "--assistant", "test-twin", "--prompts", str(prompts),
                     "--max-new-tokens", "12", "--num-draft-tokens", "3", "--json", str(tmp_path / "bench.json")]) == 0
    row = json.loads((tmp_path / "bench.json").read_text())["methods"][-1]
    assert row["identical_to_plain"] and row["mean_accepted_tokens"] > 3


def test_a_kinds_one_options_class_is_its_flags_config_drafter_keywords_and_name_argument(tmp_path):
    """Medusa's options: `--num-heads 3` makes a 3-head config (`num_heads`: the flag, the option and the config key
    share the name; the earlier spelling `--medusa-heads` still works), `--tree chain` (or the name's ':chain') makes
    a chain drafter, ':5' a 5-node tree; a fine-tune refuses a flag that would change its folder's shape."""
    from hf_specdec.kinds.medusa import MedusaConfig, MedusaHeads, MedusaOptions
    from hf_specdec.drafters.positionwise import PositionChain
    from hf_specdec.training import adapters

    medusa = next(kind for kind in drafter_kinds() if kind.name == "medusa")
    assert medusa.options is MedusaOptions
    options = adapters.parse_options(MedusaOptions, ["--num-heads", "3", "--tree", "chain"], "medusa")
    assert options.config_fields() == {"num_heads": 3, "num_layers": 1}
    assert adapters.parse_options(MedusaOptions, ["--medusa-heads", "3", "--tree", "chain"], "medusa") == options
    target = tiny_llama()
    heads = MedusaHeads(MedusaConfig.from_target(target.config, **options.config_fields()))
    assert len(heads.heads) == 3
    assert isinstance(medusa.drafter_for(heads, options).shape, PositionChain)
    assert medusa.drafter_for(heads).tree is not None  # the default: a tree
    heads.config.head_accuracy = [[0.9, 0.05], [0.8, 0.1], [0.7, 0.2]]
    heads.save_pretrained(tmp_path / "heads")
    assert isinstance(as_drafter(f"{tmp_path / 'heads'}:chain", target=target).shape, PositionChain)
    assert len(as_drafter(f"{tmp_path / 'heads'}:5", target=target).tree[1]) == 5
    with pytest.raises(InputError, match="--tree must be 'chain', 'tree' or a node count N >= 1 \\(got 'bushy'\\)"):
        adapters.parse_options(MedusaOptions, ["--tree", "bushy"], "medusa")
    with pytest.raises(InputError, match=r"a fine-tune keeps the drafter's shape, so --num-heads cannot change it "
                                         r"\(its config.json: num_heads=3\)"):
        adapters.adapter_for(str(tmp_path / "heads"), ["--medusa_heads=2"])
    assert adapters.adapter_for(str(tmp_path / "heads"), ["--medusa-decay", "0.5"])[0].options.medusa_decay == 0.5
    assert adapters.adapter_for(str(tmp_path / "heads"), ["--num-heads", "3"])[0].options.num_heads == 3  # its own


def test_drafters_and_runs_saved_before_the_options_took_their_configs_names_still_load(tmp_path):
    """The shipped drafters were saved (and their runs' arguments recorded) when `--num-heads` was `--medusa-heads` and
    `--num-hidden-layers` was `--drafter-layers`: their folders load, a fine-tune of them reads their config under
    the options' names, and a run whose run_args.json holds the earlier names resumes."""
    from hf_specdec.assistants.shipped import shipped_folder
    from hf_specdec.training import adapters
    from hf_specdec.training.arguments import Args, check_output_dir, run_args_path, run_arguments

    for name, key in (("distilled", "num_hidden_layers"), ("medusa", "num_heads")):
        folder = shipped_folder(name)
        config = json.loads((folder / "config.json").read_text())
        assert AutoDrafter.from_pretrained(str(folder)).config.to_dict()[key] == config[key]
        adapter, _ = adapters.adapter_for(str(folder), [f"--{key.replace('_', '-')}", str(config[key])])
        assert adapter.options.config_fields()[key] == config[key]
    from hf_specdec.kinds.medusa import MedusaOptions

    options = adapters.parse_options(MedusaOptions, [], "medusa")
    args = Args(output_dir=str(tmp_path), resume=True)
    saved = run_arguments(args, options)
    saved["medusa_heads"] = saved.pop("num_heads")  # as a run saved before the rename recorded it
    run_args_path(tmp_path).write_text(json.dumps(saved))
    check_output_dir(args, options)  # resumes: the same run
    saved["medusa_heads"] = 2
    run_args_path(tmp_path).write_text(json.dumps(saved))
    with pytest.raises(InputError, match="--num-heads 2 -> 4"):
        check_output_dir(args, options)
