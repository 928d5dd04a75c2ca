"""The prepared GPU training command (benchmarks/gpu/train_shipped.py) and its payload (benchmarks/gpu/payload.py), at
tiny sizes on the CPU: it must not rot while no GPU is lent."""

from __future__ import annotations

import json
import lzma
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

import hf_specdec
from benchmarks.gpu import payload
from hf_specdec.default_model import load_target
from hf_specdec.errors import InputError
from tests.conftest import perturbed_copy, tiny_llama

ROOT = Path(__file__).resolve().parents[1]


def test_parts_fit_beside_the_tree_and_rebuild_the_file(tmp_path):
    """The compressed file cut into parts that each fit one command beside the tree (the first with the common
    folder); the parts rebuild the original byte for byte; a missing or altered part is refused with what to do."""
    original = tmp_path / "model.gguf"
    original.write_bytes(os.urandom(150_000) + b"abc" * 50_000)
    dest = tmp_path / ".gpu"
    (dest / payload.COMMON).mkdir(parents=True)
    (dest / payload.COMMON / "prompts.jsonl.xz").write_bytes(os.urandom(10_000))
    packed = dest / "gguf.xz"
    packed.write_bytes(lzma.compress(original.read_bytes()))
    manifest = {"gguf": {"name": original.name, "bytes": original.stat().st_size, "sha256": payload.sha256(original)}}
    limit, tree = 200_000, 40_000
    payload.split(packed, dest, manifest, tree, limit=limit + payload.MARGIN)
    written = json.loads((dest / payload.COMMON / payload.MANIFEST).read_text())
    assert len(written["parts"]) == 2 and sum(p["bytes"] for p in written["parts"]) == packed.stat().st_size
    assert all(c["bytes"] <= limit for c in written["commands"])
    assert written["commands"][0]["carry"] == [".gpu/common", ".gpu/part-0"] and written["commands"][1]["carry"] == [".gpu/part-1"]

    rebuilt = payload.unpack(dest, tmp_path / "there")
    assert rebuilt.read_bytes() == original.read_bytes()

    (dest / "part-1").unlink()
    with pytest.raises(InputError, match="from the first command"):
        payload.unpack(dest, tmp_path / "again")
    payload.split(packed, dest, manifest, tree, limit=limit + payload.MARGIN)
    data = bytearray((dest / "part-0").read_bytes())
    data[100] ^= 1
    (dest / "part-0").write_bytes(bytes(data))
    with pytest.raises(InputError, match="SHA-256"):
        payload.unpack(dest, tmp_path / "again")


def test_a_tree_too_large_to_carry_anything_is_refused():
    with pytest.raises(InputError, match="no room"):
        payload.part_sizes(10, first_extra=5, tree=payload.LIMIT)


def test_the_weights_digest_tells_equal_weights_from_others():
    target = tiny_llama()
    assert payload.weights_digest(target) == payload.weights_digest(tiny_llama())
    assert payload.weights_digest(target) != payload.weights_digest(perturbed_copy(target, scale=1e-6))


def run_tiny(work: Path, out: Path, minutes: float, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "benchmarks/gpu/train_shipped.py", "--tiny", "--device", "cpu",
                           "--minutes", str(minutes), "--work", str(work), "--out", str(out), "--tokens", "250", *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("shipped")
    result = run_tiny(work, work / "out", 2.5)  # (room for both kinds on a loaded CI machine)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"work": work, "summary": json.loads((work / "out" / "summary.json").read_text())}


def test_the_command_makes_answers_trains_each_kind_and_measures_the_dev_prompts(tiny_run):
    stages = tiny_run["summary"]["stages"]
    answers = stages["answers"]
    assert answers["target_tokens"] >= 250 and len(answers["curve"]) >= 2  # grown part by part to --tokens
    for kind in ("new", "eagle3"):
        trained = stages["training"]["kinds"][kind]
        assert trained["steps"] > 3 and trained["eval_curve"] and trained["loss_curve"], trained
        assert trained["train_target_tokens"] == answers["target_tokens"]
    rows = {row["name"]: row for row in stages["dev_prompts"]["result"]["methods"]}
    assert any("new-n" in name for name in rows) and any("eagle3-n" in name for name in rows)
    assert all(row["identical_to_plain"] for row in rows.values())


def test_what_comes_back_fits_and_the_drafters_decode_exactly(tiny_run, tmp_path):
    out = tiny_run["work"] / "out"
    files = list(out.iterdir())
    assert len(files) <= 8 and all(f.stat().st_size <= 16 * 2**20 for f in files) and sum(f.stat().st_size for f in files) <= 64 * 2**20
    assert set(tiny_run["summary"]["stages"]["delivered"]["files"]) >= {"drafter-new.tar", "drafter-eagle3.tar", "answers.npz.xz"}
    target = load_target(str(tiny_run["work"] / "tiny-world" / "target"))[0]
    for kind in ("new", "eagle3"):
        with tarfile.open(out / f"drafter-{kind}.tar") as t:
            t.extractall(tmp_path, filter="data")
        drafter = hf_specdec.AutoDrafter.from_pretrained(tmp_path / f"drafter-{kind}", target=target)
        stats = hf_specdec.SpeculationStats()
        for seed in range(3):
            prompt = torch.randint(6, 96, (1, 5 + seed), generator=torch.Generator().manual_seed(seed))
            plain = target.generate(prompt, max_new_tokens=12, do_sample=False)
            spec = target.generate(prompt, max_new_tokens=12, do_sample=False, custom_generate=hf_specdec.speculative_generate,
                                   assistant=drafter, num_draft_tokens=3, speculation_stats=stats, draft_length="constant")
            assert torch.equal(plain, spec)
        assert stats.drafted_tokens > 0


def test_a_second_sitting_keeps_the_answers_and_continues_the_training(tiny_run):
    """The CPU run's sittings: a rerun with the goal reached makes no answers again and resumes each run from its
    last checkpoint."""
    work = tiny_run["work"]
    before = {k: v["steps"] for k, v in tiny_run["summary"]["stages"]["training"]["kinds"].items()}
    answers_log = (work / "logs" / "answers.log").read_text()
    result = run_tiny(work, work / "out2", 1.0, "--kinds", "new")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((work / "out2" / "summary.json").read_text())
    assert summary["stages"]["answers"]["curve"] == tiny_run["summary"]["stages"]["answers"]["curve"]
    assert (work / "logs" / "answers.log").read_text() == answers_log  # the trainer was not even asked
    assert summary["stages"]["training"]["kinds"]["new"]["steps"] > before["new"]
    log = (work / "runs" / f"new-n{summary['stages']['answers']['num_generate']}" / "training_log.jsonl").read_text()
    assert '"event": "resume", "checkpoint"' in log


def test_each_kinds_options_continue_a_larger_sets_run_from_the_previous_best(tmp_path):
    """A larger answer set starts from the previous run's best drafter (`--drafter FOLDER` with the kind's options):
    the trainer takes the kind's shape flags there when they match the folder (it refuses only a change of shape)."""
    from benchmarks.gpu.train_shipped import KIND_OPTIONS
    from hf_specdec.kinds.block import BlockDrafterConfig, BlockDrafterModel
    from hf_specdec.kinds.draft_model import SpecDrafterForCausalLM, drafter_config_from_target
    from hf_specdec.kinds.eagle3 import Eagle3Config, Eagle3DraftModel
    from hf_specdec.training import adapters
    from hf_specdec.training.arguments import parse_args

    target = tiny_llama()
    made = {"new": SpecDrafterForCausalLM(drafter_config_from_target(target.config, num_hidden_layers=2)),
            "eagle3": Eagle3DraftModel(Eagle3Config.from_target(target.config, draft_vocab_size=0)),
            "block": BlockDrafterModel(BlockDrafterConfig.from_target(target.config, draft_vocab_size=0))}
    for kind, options in KIND_OPTIONS.items():
        made[kind].save_pretrained(tmp_path / kind)
        args, rest = parse_args(["--drafter", str(tmp_path / kind), *options])  # (as distill.py parses them)
        adapter, folder = adapters.adapter_for(args.drafter, rest)
        assert folder == str(tmp_path / kind) and adapter.kind.name == ("draft-model" if kind == "new" else kind)
