"""A user's mistake on the command line gets one line, `hf-specdec: error: ...`, naming the file and line (or the
argument) and the fix, with exit status 2 and before any model loads; `--debug` shows the traceback; internal errors
keep theirs. The trainer's half of this is in test_distill.py."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from hf_specdec import SpecDrafterForCausalLM
from hf_specdec.cli import _target_flags, load_target_from, main
from hf_specdec.errors import InputError
from hf_specdec.kinds.draft_model.model import drafter_config_from_target
from tests.conftest import tiny_char_tokenizer, tiny_llama

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_model_loads():
    """Fails the test if the command gets as far as loading a target."""
    with mock.patch("hf_specdec.default_model.load_target", side_effect=AssertionError("a target was loaded")), \
            mock.patch("hf_specdec.default_model.load_default_target", side_effect=AssertionError("a target was loaded")):
        yield


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("hf-specdec: error: ") and "Traceback" not in err
    return lines[0]


def prompts_file(tmp_path, *lines) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_missing_prompts_file(tmp_path, capsys, no_model_loads):
    assert main(["bench", "--prompts", str(tmp_path / "missing.jsonl")]) == 2
    line = error_line(capsys)
    assert f"--prompts {tmp_path / 'missing.jsonl'}: no such file" in line and "JSON-lines file" in line


def test_broken_json_line_names_file_and_line(tmp_path, capsys, no_model_loads):
    path = prompts_file(tmp_path, '{"prompt": "fine"}', '{"prompt": oops}', '{"prompt": "fine"}')
    assert main(["bench", "--prompts", str(path)]) == 2
    line = error_line(capsys)
    assert f"{path}, line 2: not JSON" in line and "column 12" in line and "fix or delete that line" in line


def test_a_line_without_the_prompt_field(tmp_path, capsys, no_model_loads):
    path = prompts_file(tmp_path, '{"prompt": "fine"}', "", '{"text": "no prompt here"}')
    assert main(["bench", "--prompts", str(path)]) == 2
    assert f"{path}, line 3: no `prompt` text" in error_line(capsys)
    path = prompts_file(tmp_path, "[1, 2]")
    assert main(["bench", "--prompts", str(path)]) == 2
    assert f"{path}, line 1: a JSON list, not an object" in error_line(capsys)


def test_empty_prompts_file(tmp_path, capsys, no_model_loads):
    assert main(["bench", "--prompts", str(prompts_file(tmp_path))]) == 2
    assert "holds no prompts" in error_line(capsys)


@pytest.mark.parametrize("command", ["demo", "bench"])
def test_unknown_drafter_name_lists_the_known_ones_before_loading(tmp_path, capsys, no_model_loads, command):
    extra = ["--prompts", str(prompts_file(tmp_path, '{"prompt": "hi"}'))] if command == "bench" else []
    assert main([command, "--assistant", "nonsense", *extra]) == 2
    line = error_line(capsys)
    assert "Unknown drafter 'nonsense'" in line and "'ngram'" in line and "distilled" in line and "Hub id" in line
    assert main([command, "--assistant", "ngram+nonsense", *extra]) == 2
    assert "Unknown drafter 'nonsense'" in error_line(capsys)


@pytest.mark.parametrize("argv, argument", [
    (["demo", "--num-draft-tokens", "0"], "--num-draft-tokens: must be >= 1, got 0"),
    (["demo", "--max-new-tokens", "-3"], "--max-new-tokens: must be >= 1, got -3"),
    (["bench", "--prompts", "p.jsonl", "--num-prompts", "zero"], "--num-prompts: expected an integer >= 1, got 'zero'"),
    (["bench", "--prompts", "p.jsonl", "--num-draft-tokens", "3,0"], "draft lengths must be >= 1"),
    (["bench", "--prompts", "p.jsonl", "--batch-size", "0"], "--batch-size: must be >= 1"),
    (["demo", "--rounds", "0"], "--rounds: must be >= 1, got 0"),
])
def test_bad_counts_and_missing_arguments(capsys, no_model_loads, argv, argument):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    line = error_line(capsys)
    assert argument in line and "--help" in line


def test_unknown_target(tmp_path, capsys):
    path = prompts_file(tmp_path, '{"prompt": "hi"}')
    assert main(["bench", "--target", "nonsense", "--assistant", "ngram", "--prompts", str(path)]) == 2
    line = error_line(capsys)
    assert "Unknown target 'nonsense'" in line and "'default'" in line
    assert main(["bench", "--target", str(tmp_path / "no-such" / "folder"), "--assistant", "ngram", "--prompts", str(path)]) == 2
    assert "Unknown target" in error_line(capsys)


@pytest.fixture(scope="module")
def drafter_folder(tmp_path_factory):
    target = tiny_llama()
    folder = tmp_path_factory.mktemp("push") / "drafter"
    SpecDrafterForCausalLM(drafter_config_from_target(target.config, num_hidden_layers=1)).save_pretrained(folder)
    tiny_char_tokenizer().save_pretrained(folder)
    return folder


def test_push_refuses_what_is_not_a_finished_drafter_folder(tmp_path, capsys, drafter_folder):
    with mock.patch("hf_specdec.hub.push.HfApi") as api, mock.patch.dict(os.environ, {"HF_TOKEN": "hf_x"}):
        assert main(["push", str(tmp_path / "missing"), "--repo-id", "someone/x"]) == 2
        assert "no such folder" in error_line(capsys)
        assert main(["push", str(tmp_path), "--repo-id", "someone/x"]) == 2
        assert f"{tmp_path} holds no config.json" in error_line(capsys)
        run = tmp_path / "run"
        run.mkdir()
        for item in drafter_folder.iterdir():
            if item.is_file():
                (run / item.name).write_bytes(item.read_bytes())
        (run / "training_log.jsonl").write_text('{"event": "start"}\n')
        assert main(["push", str(run), "--repo-id", "someone/x"]) == 2
        assert "a training run that has not finished (no training_summary.json)" in error_line(capsys)
        assert main(["push", str(drafter_folder), "--repo-id", "not a repo id"]) == 2
        assert "--repo-id 'not a repo id' is not a Hub repo id" in error_line(capsys)
    assert not api.return_value.upload_folder.called


def test_push_without_a_token(drafter_folder, capsys, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with mock.patch("huggingface_hub.get_token", return_value=None), mock.patch("hf_specdec.hub.push.HfApi") as api:
        assert main(["push", str(drafter_folder), "--repo-id", "someone/x"]) == 2
    assert "No Hugging Face token: run `hf auth login` (or set HF_TOKEN)" in error_line(capsys)
    assert not api.return_value.create_repo.called


def test_export_refuses_what_the_format_cannot_hold_before_loading(tmp_path, capsys, no_model_loads, drafter_folder):
    out = tmp_path / "out"
    assert main(["export", str(tmp_path), "--format", "vllm-draft", "--out", str(out)]) == 2
    assert "holds no config.json" in error_line(capsys)
    assert main(["export", str(drafter_folder), "--format", "vllm-medusa", "--out", str(out)]) == 2
    assert "which vllm-medusa cannot hold: export it with --format vllm-draft" in error_line(capsys)
    assert main(["export", "distilled", "--format", "vllm-eagle", "--out", str(out)]) == 2
    assert "export it with --format vllm-draft" in error_line(capsys)
    plain = tmp_path / "plain"
    tiny_llama().save_pretrained(plain)
    capsys.readouterr()  # (save_pretrained's progress bar)
    assert main(["export", str(plain), "--format", "vllm-draft", "--out", str(out)]) == 2
    assert "already a standalone model" in error_line(capsys)
    assert main(["export", str(plain), "--format", "gguf", "--out", str(out)]) == 2
    assert "Unknown export format 'gguf'; choose one of ['medusa', 'speculators', 'vllm-draft'" in error_line(capsys)
    assert not out.exists()


def test_debug_shows_the_traceback_and_internal_errors_keep_theirs(tmp_path, capsys, monkeypatch):
    with pytest.raises(InputError, match="no such file"):
        main(["bench", "--prompts", str(tmp_path / "missing.jsonl"), "--debug"])
    monkeypatch.setenv("HF_SPECDEC_DEBUG", "1")
    with pytest.raises(InputError):
        main(["bench", "--prompts", str(tmp_path / "missing.jsonl")])
    monkeypatch.delenv("HF_SPECDEC_DEBUG")
    path = prompts_file(tmp_path, '{"prompt": "hi"}')
    with mock.patch("hf_specdec.default_model.load_target", side_effect=RuntimeError("a bug")):
        with pytest.raises(RuntimeError, match="a bug"):
            main(["bench", "--assistant", "ngram", "--prompts", str(path)])


def test_the_installed_command_exits_2_with_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "hf_specdec.cli", "bench", "--prompts", str(tmp_path / "missing.jsonl")],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"hf-specdec: error: --prompts {tmp_path / 'missing.jsonl'}: no such file; pass a JSON-lines file (one JSON "
        "object per line)."]


def test_a_device_this_machine_lacks_is_refused_before_loading(tmp_path, capsys, no_model_loads):
    path = prompts_file(tmp_path, '{"prompt": "hi"}')
    with mock.patch("torch.cuda.is_available", return_value=False):
        assert main(["bench", "--assistant", "ngram", "--prompts", str(path), "--device", "cuda:1"]) == 2
    assert "--device cuda:1: this machine has 0 CUDA device(s); pass --device cpu" in error_line(capsys)
    assert main(["bench", "--assistant", "ngram", "--prompts", str(path), "--device", "toaster"]) == 2
    assert "--device 'toaster' is not a device" in error_line(capsys)
    assert main(["bench", "--assistant", "ngram", "--prompts", str(path), "--device", "cpu", "--device-map", "auto"]) == 2
    assert "pass --device or --device-map, not both" in error_line(capsys)


@pytest.mark.parametrize("flags, dtype", [([], "float32"), (["--dtype", "bfloat16"], "bfloat16"),
                                          (["--dtype", "float16", "--device-map", "cpu"], "float16")])
def test_dtype_and_device_map_reach_the_target(tmp_path, flags, dtype):
    folder = tmp_path / "target"
    tiny_llama().save_pretrained(folder)
    tiny_char_tokenizer().save_pretrained(folder)
    parser = argparse.ArgumentParser()
    _target_flags(parser)
    target, _ = load_target_from(parser.parse_args(flags), str(folder))
    assert target.dtype == getattr(torch, dtype) and target.device.type == "cpu"
