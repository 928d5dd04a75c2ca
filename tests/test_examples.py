"""Every example script runs (at small settings where it trains) and shows that it speculated."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from unittest import mock

import pytest

from tests.distill_world import build_tiny_world, subprocess_env

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str, monkeypatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", [name, *args])
    runpy.run_path(str(EXAMPLES / name), run_name="__main__")


def per_forward(out: str) -> float:
    return float(out.split("tokens per target forward")[1].split(":")[1].split()[0])


@pytest.mark.slow
def test_quickstart(capsys, monkeypatch):
    run_example("quickstart.py", monkeypatch)
    assert per_forward(capsys.readouterr().out) > 1.0  # it speculated (and the script asserts exactness)


@pytest.mark.slow
def test_batch_of_prompts(capsys, monkeypatch):
    run_example("batch_of_prompts.py", monkeypatch, "--max-new-tokens", "24", "--draft-length", "constant")
    assert per_forward(capsys.readouterr().out) > 1.0


@pytest.mark.slow
def test_medusa_tree(capsys, monkeypatch):
    run_example("medusa_tree.py", monkeypatch, "--max-new-tokens", "24", "--nodes", "7")
    out = capsys.readouterr().out
    assert float(out.split("7-node tree: ")[1].split()[0]) > 1.0


@pytest.mark.slow
def test_custom_generate_folder(capsys, monkeypatch):
    run_example("custom_generate_folder.py", monkeypatch, "--max-new-tokens", "24")
    assert per_forward(capsys.readouterr().out) > 1.0


def test_distill_and_push(tmp_path, capsys, monkeypatch):
    world = build_tiny_world(tmp_path)
    monkeypatch.setattr("os.environ", subprocess_env())
    tiny = ["--data", world["data"], "--exclude-ids", world["dev"], "--num-generate", 8, "--num-score", 8,
            "--heldout-prompts", 2, "--max-new-tokens", 8, "--top-k", 4, "--num-hidden-layers", 1, "--draft-vocab-size",
            48, "--batch-size", 4, "--eval-max-new-tokens", 8, "--max-steps", 4, "--eval-every", 4, "--save-every", 0,
            "--threads", 1, "--data-cache-dir", tmp_path / "cache"]
    with mock.patch("hf_specdec.hub.push.HfApi") as api:
        run_example("distill_and_push.py", monkeypatch, "--target", str(world["target"]), "--output-dir",
                    str(tmp_path / "drafter"), "--repo-id", "someone/tiny-drafter", *map(str, tiny))
    assert "tokens per target forward in its evaluation" in capsys.readouterr().out
    upload = api.return_value.upload_folder.call_args.kwargs
    assert upload["repo_id"] == "someone/tiny-drafter" and "model.safetensors" in upload["allow_patterns"]
