"""training/distill.py on a tiny random target (tokenizer, chat template and data made offline: distill_world.py)."""

from __future__ import annotations

import json
import math
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from accelerate.state import AcceleratorState
from huggingface_hub.utils import filter_repo_objects
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

import hf_specdec
from hf_specdec import registry
from hf_specdec.cache.hidden import decoder_layers, entering_layers
from hf_specdec.kinds.eagle3.model import Eagle3Config, Eagle3DraftModel
from hf_specdec.kinds.draft_model.model import SpecDrafterForCausalLM, drafter_config_from_target
import hf_specdec.drafters
import hf_specdec.hub

REPO = Path(__file__).resolve().parents[1]


from hf_specdec.errors import InputError  # noqa: E402
from hf_specdec.cli import main as cli_main  # noqa: E402
from hf_specdec.hub.push import RUN_COMPLETE  # noqa: E402
from hf_specdec.training import adapters, arguments, checkpoints, evaluate, losses, prepare, sources, states  # noqa: E402
from training import distill  # noqa: E402
from hf_specdec.kinds.eagle import training as eagle_training  # noqa: E402
from hf_specdec.kinds.eagle3 import training as eagle3_training  # noqa: E402
from hf_specdec.kinds.medusa import training as medusa_training  # noqa: E402
from hf_specdec.training import data as teacher_data  # noqa: E402
from hf_specdec.training import target as deployed  # noqa: E402
from tests.bigram_kind import BIGRAM, BigramTable  # noqa: E402
from tests.conftest import tiny_llama  # noqa: E402
from tests.distill_world import build_tiny_world, run_or_show_stacks, subprocess_env  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: a second thread only adds contention
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_tiny_world(tmp_path_factory.mktemp("tiny"))


def decode_like_plain(target, drafter, num_draft_tokens: int, prompts: int = 3, max_new_tokens: int = 16):
    """Greedy speculative decoding with `drafter` equals plain greedy on a few random prompts; returns the stats."""
    stats = hf_specdec.SpeculationStats()
    for seed in range(prompts):
        prompt = torch.randint(6, 96, (1, 4 + seed), generator=torch.Generator().manual_seed(seed))
        plain = target.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False)
        spec = target.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False, assistant=drafter,
                               custom_generate=hf_specdec.speculative_generate, num_draft_tokens=num_draft_tokens,
                               speculation_stats=stats, draft_length="constant")
        assert torch.equal(plain, spec)
    return stats


def cli(world, out: Path, **overrides) -> list[str]:
    options = {
        "target": world["target"], "data": world["data"], "exclude_ids": world["dev"], "num_generate": 24,
        "num_score": 32, "heldout_prompts": 6, "max_new_tokens": 16, "top_k": 8, "gen_batch_size": 8,
        "data_cache_dir": world["root"] / "cache", "draft_vocab_size": 48, "batch_size": 8,
        "eval_max_new_tokens": 12, "warmup_steps": 2, "threads": 1, "log_every": 1, "max_steps": 6,
        "eval_every": 3, "save_every": 3, "output_dir": out,
    }
    if overrides.get("drafter", "new") in ("new", "draft-model", "eagle"):
        options["num_hidden_layers"] = 1  # (a token-only or EAGLE drafter's own option)
    options.update(overrides)
    args = []
    for key, value in options.items():
        if value is True:
            args.append(f"--{key.replace('_', '-')}")
        elif value is not False:
            args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def run_in_process(argv):
    threads = torch.get_num_threads()
    AcceleratorState._reset_state(reset_partial_state=True)  # each run sets its own (mixed precision, processes)
    try:
        return distill.main(argv)
    finally:
        torch.set_num_threads(threads)


def assert_evaluated_speculatively(evaluation: dict) -> None:
    """The run's evaluation decoded through the real speculative loop: drafts proposed, some accepted, fewer target
    forwards than tokens (its mean_accepted_tokens is then above plain decoding's 1.0)."""
    assert evaluation["drafted_tokens"] > 0 and evaluation["accepted_tokens"] > 0, evaluation
    assert evaluation["target_forwards"] < evaluation["emitted_tokens"], evaluation
    assert evaluation["mean_accepted_tokens"] > 1.0


def read_log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory):
    """One short in-process run (on-policy batches included) that pushes to a mocked Hub at the end."""
    out = tmp_path_factory.mktemp("run") / "tiny-drafter"
    with mock.patch.object(checkpoints, "HfApi") as api:
        summary = run_in_process(cli(world, out, on_policy_ratio=0.5, push_to_hub=True, hub_model_id="someone/tiny-drafter"))
    return {"out": out, "summary": summary, "api": api}


# --- data ------------------------------------------------------------------------------------------------------------
def test_dev_prompts_are_excluded_and_heldout_is_disjoint(world, trained):
    args = arguments.parse_args(cli(world, trained["out"]))[0]
    examples, skipped = sources.load_examples(args)
    assert len(examples) == 79 and "c0_0" not in {e["id"] for e in examples}
    assert skipped == {"dev prompt (excluded)": 1}
    assert world["excluded_prompt"] not in {e["messages"][-1]["content"] for e in examples}
    folder = Path(trained["summary"]["data"]["cache_folder"])
    train = teacher_data.TeacherData.load(folder / "train.safetensors")
    held = teacher_data.TeacherData.load(folder / "heldout.safetensors")
    train_prompts = {tuple(train.record(i)["tokens"][: train.record(i)["start"]].tolist()) for i in range(len(train))}
    held_prompts = {tuple(held.record(i)["tokens"][: held.record(i)["start"]].tolist()) for i in range(len(held))}
    assert len(held_prompts) == 6 and not held_prompts & train_prompts
    assert set(train.t["source"].tolist()) == {teacher_data.Source.SELF_GENERATED, teacher_data.Source.SCORED}
    assert train.t["ids"].shape[1] == 8 and len(train) == 24 + 32


def test_teacher_data_is_the_targets_own(world, trained):
    folder = Path(trained["summary"]["data"]["cache_folder"])
    train = teacher_data.TeacherData.load(folder / "train.safetensors")
    target = AutoModelForCausalLM.from_pretrained(world["target"]).eval()
    for i in (0, len(train) - 1):  # one self-generated, one scored sequence
        r = train.record(i)
        with torch.no_grad():
            logprobs = target(r["tokens"][None].long()).logits[0, r["start"] - 1 : -1].log_softmax(-1)
        top = logprobs.topk(8)
        assert torch.equal(top.indices, r["ids"].long())
        torch.testing.assert_close(top.values, r["lps"].float(), atol=2e-2, rtol=1e-3)
        if r["source"] == teacher_data.Source.SELF_GENERATED:  # greedy: each new token is the target's argmax
            assert torch.equal(r["tokens"][r["start"] :].long(), r["ids"][:, 0].long())


def test_prepared_data_is_reused(world, trained):
    with mock.patch.object(prepare, "self_generate", side_effect=AssertionError("regenerated")):
        summary = run_in_process(cli(world, trained["out"].parent / "again", max_steps=1, eval_every=0, save_every=0))
    assert summary["final_step"] == 1


# --- losses ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fkl", "rkl", "tvd", "jsd", "lk-alpha", "lk-hybrid"])
def test_divergence_is_zero_when_the_drafter_equals_the_target(kind):
    logits = torch.randn(5, 30) * 3
    lps = logits.log_softmax(-1)
    top = lps.topk(6)
    loss = losses.distill_loss(logits, top.indices, top.values, None, kind)
    assert abs(float(loss)) < 1e-5
    assert float(losses.distill_loss(torch.randn(5, 30), top.indices, top.values, None, kind)) > 1e-3


@pytest.mark.parametrize("kind", list(losses.LOSSES))
def test_every_loss_decreases_on_a_fixed_batch(world, trained, kind):
    args = arguments.parse_args(cli(world, trained["out"]))[0]
    target, tokenizer = deployed.load_target(args, torch.device("cpu"))
    folder = Path(trained["summary"]["data"]["cache_folder"])
    train = teacher_data.TeacherData.load(folder / "train.safetensors")
    torch.manual_seed(0)
    adapter, folder = adapters.adapter_for(args.drafter)
    drafter = distill.build_drafter(adapter, folder, args, target, train.target_token_counts(96), [2])
    batch = teacher_data.collate([train.record(i) for i in range(0, 48, 3)], tokenizer.pad_token_id)
    cols = evaluate.column_map(drafter, 96, torch.device("cpu"))
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
    history = []
    for _ in range(25):
        loss = losses.distill_loss(adapter.logits(drafter, batch)[0], batch["tgt_ids"], batch["tgt_lps"], cols, kind)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        history.append(loss.item())
    assert history[-1] < 0.8 * history[0], history


def test_lk_losses_are_minus_log_acceptance_and_its_kl_tv_blend():
    """alpha = sum min(p, q) = 1 - TV on the K+1 buckets; lk-hybrid weighs KL by exp(-3 alpha) and TV by the rest."""
    torch.manual_seed(0)
    target, drafter = torch.randn(4, 30) * 2, torch.randn(4, 30) * 2
    top = target.log_softmax(-1).topk(6)
    tv = torch.stack([losses.distill_loss(drafter[i : i + 1], top.indices[i : i + 1], top.values[i : i + 1], None, "tvd")
                      for i in range(4)])
    kl = torch.stack([losses.distill_loss(drafter[i : i + 1], top.indices[i : i + 1], top.values[i : i + 1], None, "fkl")
                      for i in range(4)])
    alpha = 1 - tv
    lk = losses.distill_loss(drafter, top.indices, top.values, None, "lk-alpha")
    torch.testing.assert_close(lk, -alpha.log().mean())
    weight = torch.exp(-3 * alpha)
    hybrid = losses.distill_loss(drafter, top.indices, top.values, None, "lk-hybrid")
    torch.testing.assert_close(hybrid, (weight * kl + (1 - weight) * tv).mean())


# --- quantized targets -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("quantization", ["8bit", "4bit"])
def test_quantized_targets_train_on_cpu(world, tmp_path, quantization):
    pytest.importorskip("bitsandbytes")
    out = tmp_path / quantization
    summary = run_in_process(cli(world, out, target_quantization=quantization, max_steps=2, eval_every=2, save_every=0,
                                 heldout_prompts=4, on_policy_ratio=0.5))
    assert summary["final_step"] == 2
    assert_evaluated_speculatively(summary["best"])
    config = json.loads((out / "config.json").read_text())
    assert config["target_quantization"] == quantization
    target, _ = deployed.load_target(arguments.parse_args(cli(world, out, target_quantization=quantization))[0], torch.device("cpu"))
    assert "bitsandbytes" in type(target.model.layers[0].mlp.up_proj).__module__


# --- the saved folder --------------------------------------------------------------------------------------------------
def test_saved_folder_round_trips_and_decodes_exactly(world, trained):
    out = trained["out"]
    drafter = AutoModelForCausalLM.from_pretrained(out)
    assert isinstance(drafter, SpecDrafterForCausalLM) and not drafter.is_bound
    config = drafter.config
    assert config.target_name_or_path == str(world["target"]) and config.target_quantization == "none"
    assert config.num_draft_tokens_eval == 5
    assert_evaluated_speculatively(config.measured)
    assert config.training["loss"] == "fkl" and "accelerate launch training/distill.py" in config.training["command"]
    assert (out / "tokenizer.json").exists()
    card = (out / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: hf-specdec" in card and "speculative-decoding" in card
    assert "# someone/tiny-drafter: a speculative-decoding drafter" in card and ".tmp" not in card  # its Hub id
    assert "%.3f" % config.measured["mean_accepted_tokens"] in card and config.training["command"] in card
    target = AutoModelForCausalLM.from_pretrained(world["target"]).eval()
    assert decode_like_plain(target, drafter, 5, prompts=4, max_new_tokens=20).accepted_tokens > 0


def test_log_and_best_checkpoint(trained):
    log = read_log(trained["out"])
    events = [r["event"] for r in log]
    assert events[0] == "start" and events.count("eval") == 2 and "done" in events
    evals = [r for r in log if r["event"] == "eval"]
    assert {"mean_accepted_tokens", "acceptance_rate", "acceptance_by_position", "heldout_top1"} <= set(evals[0])
    assert any(r.get("on_policy") for r in log if r["event"] == "train")
    best = max(evals, key=lambda r: r["mean_accepted_tokens"])
    assert trained["summary"]["best"]["mean_accepted_tokens"] == best["mean_accepted_tokens"]
    assert sorted(p.name for p in (trained["out"] / "checkpoints").iterdir()) == ["best", "step-0000003", "step-0000006"]


def test_push_to_hub_uploads_exactly_the_drafter_folder(trained):
    api = trained["api"].return_value
    api.create_repo.assert_called_once_with(repo_id="someone/tiny-drafter", repo_type="model", private=False, exist_ok=True)
    (call,) = api.upload_folder.call_args_list
    assert call.kwargs["folder_path"] == str(trained["out"]) and call.kwargs["repo_id"] == "someone/tiny-drafter"
    expected = ["README.md", "chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
                "tokenizer.json", "tokenizer_config.json", "training_log.jsonl", "training_summary.json"]
    # the custom_generate/ folder too: `custom_generate="<repo>"` runs it from the Hub (see hf_specdec/hub.py)
    expected = sorted(expected + [f"custom_generate/{n}" for n in [*hf_specdec.hub.bundle_sources(), "requirements.txt"]])
    assert call.kwargs["allow_patterns"] == expected
    assert "token" not in call.kwargs and "token" not in api.create_repo.call_args.kwargs
    every_file = [str(p.relative_to(trained["out"])) for p in trained["out"].rglob("*") if p.is_file()]
    assert sorted(filter_repo_objects(every_file, allow_patterns=call.kwargs["allow_patterns"])) == expected
    assert (trained["out"] / "model.safetensors").stat().st_size < 200_000


def test_lora_on_an_existing_drafter_saves_a_merged_drafter(world, trained, tmp_path):
    out = tmp_path / "lora"
    run_in_process(cli(world, out, drafter=trained["out"], lora=True, lora_r=4, max_steps=2, eval_every=0, save_every=0))
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert isinstance(merged, SpecDrafterForCausalLM)
    original = AutoModelForCausalLM.from_pretrained(trained["out"])
    assert set(merged.state_dict()) == set(original.state_dict())


# --- resume and multi-process (subprocesses) -----------------------------------------------------------------------------
def test_resume_after_sigkill_ends_like_an_uninterrupted_run(world, tmp_path):
    common = dict(max_steps=40, save_every=10, eval_every=20, on_policy_ratio=0.3, log_every=5)
    run = lambda out, *extra: [sys.executable, "-m", "training.distill", *cli(world, out, **common), *extra]  # noqa: E731
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    subprocess.run(run(straight), check=True, env=subprocess_env(), cwd=REPO, capture_output=True)
    proc = subprocess.Popen(run(killed), env=subprocess_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (killed / "checkpoints" / "step-0000010").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "training_summary.json").exists(), "the run finished before it could be killed"
    subprocess.run(run(killed, "--resume"), check=True, env=subprocess_env(), cwd=REPO, capture_output=True)
    a = json.loads((straight / "training_summary.json").read_text())
    b = json.loads((killed / "training_summary.json").read_text())
    assert b["resumed_from"] and b["final_step"] == a["final_step"] == 40
    assert b["final_loss"] == pytest.approx(a["final_loss"], rel=1e-4)
    assert b["best"]["mean_accepted_tokens"] == pytest.approx(a["best"]["mean_accepted_tokens"])


def test_the_literal_accelerate_launch_command_trains_evaluates_and_writes_a_loadable_drafter(world, tmp_path):
    """`accelerate launch training/distill.py ...`, typed as in the README (a file path, from the checkout)."""
    out = tmp_path / "runs" / "literal"
    result = subprocess.run(["accelerate", "launch", "training/distill.py", *cli(world, out, max_steps=3, eval_every=3,
                                                                                save_every=0)],
                            env=subprocess_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    drafter = hf_specdec.AutoDrafter.from_pretrained(out)
    assert isinstance(drafter, SpecDrafterForCausalLM) and (out / RUN_COMPLETE).is_file()
    assert_evaluated_speculatively(drafter.config.measured)
    assert drafter.config.training["command"].startswith("accelerate launch training/distill.py --target ")
    card = (out / "README.md").read_text()
    assert f"# {out}: a speculative-decoding drafter" in card and f'from_pretrained("{out}"' in card
    assert ".final.tmp" not in card  # not the staging folder it was written in
    target = AutoModelForCausalLM.from_pretrained(world["target"]).eval()
    decode_like_plain(target, drafter, 3, prompts=2, max_new_tokens=12)


@pytest.mark.parametrize("command", [["python", "training/distill.py"], ["accelerate", "launch", "training/distill.py"],
                                     ["python", "-m", "training.distill"]])
def test_help_works_in_every_form(command, tmp_path):
    """From the checkout and from elsewhere (the file form finds its own package)."""
    for cwd in (REPO, tmp_path):
        argv = [a if a != "training/distill.py" or cwd == REPO else str(REPO / a) for a in command]
        if cwd != REPO and "-m" in argv:
            continue  # the module form needs the checkout (or an install that puts it on the path)
        result = subprocess.run([sys.executable if a == "python" else a for a in argv] + ["--help"], cwd=cwd,
                                env=subprocess_env(), capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and "--max-steps" in result.stdout and "--target" in result.stdout, result.stderr


def test_two_cpu_processes_with_accelerate_launch(world, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "two"
    command = ["accelerate", "launch", "--cpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
               "--dynamo_backend", "no", "--main_process_port", str(port), "training/distill.py",
               *cli(world, out, batch_size=4, max_steps=4, eval_every=2, save_every=2, on_policy_ratio=0.5,
                    data_cache_dir=tmp_path / "cache")]
    result = run_or_show_stacks(command, timeout=300, env=subprocess_env(), cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    start = read_log(out)[0]
    assert start["event"] == "start" and start["processes"] == 2
    assert sorted(p.name for p in (out / "checkpoints" / "step-0000004").glob("rng-*")) == [
        "rng-0.json", "rng-0.safetensors", "rng-1.json", "rng-1.safetensors"]
    meta = json.loads(next((tmp_path / "cache").glob("*/meta.json")).read_text())
    assert meta["processes"] == 2 and meta["train_records"] == 24 + 32
    assert isinstance(AutoModelForCausalLM.from_pretrained(out), SpecDrafterForCausalLM)


# --- eagle: a drafter that reads the target's hidden states -------------------------------------------------------------
def test_eagle_drafter_trains_saves_and_decodes_exactly(world, tmp_path):
    """(The tiny target is random, so no drafter generalises to held-out prompts beyond chance: the held-out eval
    only has to draft; acceptance is asserted on the answers it trained on, which it has learnt.)"""
    out = tmp_path / "eagle"
    summary = run_in_process(cli(world, out, drafter="eagle", max_steps=150, eval_every=150, save_every=0,
                                 learning_rate=3e-3))
    log = [r for r in read_log(out) if r["event"] == "train"]
    assert log[-1]["loss"] < log[0]["loss"] and summary["best"]["drafted_tokens"] > 0
    cache = Path(json.loads((out / "training_summary.json").read_text())["data"]["cache_folder"])
    assert (cache / "features-train-final.npy").exists() and (cache / "features-heldout-final.npy").exists()
    drafter = AutoModelForCausalLM.from_pretrained(out)
    assert isinstance(drafter, SpecDrafterForCausalLM) and drafter.config.target_feature_input
    assert isinstance(hf_specdec.as_drafter(drafter), hf_specdec.drafters.EagleDrafter)
    target = AutoModelForCausalLM.from_pretrained(world["target"]).eval()
    decode_like_plain(target, drafter, 4)
    train = teacher_data.TeacherData.load(cache / "train.safetensors")
    stats = hf_specdec.SpeculationStats()
    for i in range(8):
        record = train.record(i, features=False)
        prompt = record["tokens"][None, : record["start"]].long()
        plain = target.generate(prompt, max_new_tokens=12, do_sample=False)
        spec = target.generate(prompt, max_new_tokens=12, do_sample=False, assistant=drafter, num_draft_tokens=4,
                               custom_generate=hf_specdec.speculative_generate, speculation_stats=stats,
                               draft_length="constant")
        assert torch.equal(plain, spec)
    assert stats.accepted_tokens > 5, stats


def test_eagle_passes_feed_back_their_own_hidden_states(world):
    """Pass r of the unrolled training sees the drafter's own pass r-1 output as features, shifted by one position."""
    drafter = SpecDrafterForCausalLM(drafter_config_from_target(
        LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2), num_hidden_layers=1, target_feature_input=True))
    target = AutoModelForCausalLM.from_pretrained(world["target"]).eval()
    drafter.bind_target(target)
    ids = torch.randint(6, 96, (2, 7))
    positions = torch.zeros(2, 7, dtype=torch.bool)
    positions[:, 2:6] = True
    batch = {"input_ids": ids, "positions": positions, "features": torch.randn(2, 7, 64)}
    seen = []
    original = drafter.forward
    with mock.patch.object(drafter, "forward", side_effect=lambda **kw: seen.append(kw["target_features"]) or original(**kw)):
        logits, _ = eagle_training.eagle_passes(drafter, batch, unroll_steps=1)
    assert len(logits) == 2 and logits[0].shape[0] == int(positions.sum())
    torch.testing.assert_close(seen[0][:, 1:], batch["features"][:, :-1])
    assert not seen[0][:, 0].any()
    own = original(input_ids=ids, target_features=seen[0], use_cache=False).hidden_states[0]
    torch.testing.assert_close(seen[1][:, 1:], own[:, :-1])


# --- eagle3: the fused states entering three target layers, trained with training-time test ---------------------------
def test_eagle3_drafter_trains_saves_exports_and_decodes_exactly(world, tmp_path):
    out = tmp_path / "eagle3"
    summary = run_in_process(cli(world, out, drafter="eagle3", target_layer_ids="1,2,2", ttt_steps=2, max_steps=30,
                                 eval_every=30, save_every=0, learning_rate=1e-2, draft_vocab_size=64,
                                 max_train_tokens=700))
    data = summary["data"]  # a seeded subset of the prepared set
    assert 0 < data["train_target_tokens"] <= 700 < data["subset_of"]["target_tokens"]
    log = [r for r in read_log(out) if r["event"] == "train"]
    assert log[-1]["loss"] < log[0]["loss"]
    assert_evaluated_speculatively(summary["best"])
    cache = Path(json.loads((out / "training_summary.json").read_text())["data"]["cache_folder"])
    assert (cache / "features-train-layers-1-2-2.npy").exists() and (cache / "features-heldout-layers-1-2-2.npy").exists()
    target = AutoModelForCausalLM.from_pretrained(world["target"]).eval()
    drafter = hf_specdec.AutoDrafter.from_pretrained(out, target=target)
    assert isinstance(drafter, hf_specdec.Eagle3DraftModel) and drafter.config.target_layer_ids == [1, 2, 2]
    assert drafter.config.draft_vocab_size == 64 and drafter.config.measured["mean_accepted_tokens"] > 0
    decode_like_plain(target, drafter, 4)
    assert cli_main(["export", str(out), "--format", "vllm-eagle3", "--target", str(world["target"]),
                     "--out", str(tmp_path / "vllm")]) == 0


def test_a_published_speculators_drafter_fine_tunes_and_keeps_its_layout(world, tmp_path):
    """--drafter FOLDER in speculators' EAGLE-3 layout (its flags: a norm before fc, the normed output fed back, a
    sliding window, embeddings of its own): the fine-tune trains it on the target's answers (not its copy of the
    target's embeddings, which speculators freezes too) and writes speculators' layout again, which loads as it did and
    decodes exactly."""
    from hf_specdec.kinds.eagle3.formats import SPECULATORS

    target = AutoModelForCausalLM.from_pretrained(world["target"]).eval()
    config = hf_specdec.Eagle3Config.from_target(target.config, draft_vocab_size=0, target_layer_ids=[0, 1, 2],
                                                 fc_input_norm="joint", feed_back_normed=True, attention_windows=[16],
                                                 own_embeddings=True)
    published = hf_specdec.Eagle3DraftModel(config)
    with torch.no_grad():
        published.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
    published.set_draft_vocab(torch.arange(96), target)  # (its LM head starts as the target's)
    SPECULATORS.write(published.bind_target(target), target, tmp_path / "published", torch.float32)
    out = tmp_path / "tuned"
    summary = run_in_process(cli(world, out, drafter=tmp_path / "published", ttt_steps=2, max_steps=40, eval_every=40,
                                 save_every=20, learning_rate=1e-2))
    assert_evaluated_speculatively(summary["best"])
    saved = json.loads((out / "config.json").read_text())
    assert saved["speculators_model_type"] == "eagle3" and saved["norm_before_fc"] and saved["norm_output"]
    assert saved["transformer_layer_config"]["sliding_window"] == 16 and not (out / "custom_generate").exists()
    drafter = hf_specdec.AutoDrafter.from_pretrained(out, target=target)
    assert drafter.config.published["format"] == "speculators-eagle3" and drafter.config.own_embeddings
    assert not torch.equal(drafter.fc.weight, published.fc.weight)  # it trained
    assert torch.equal(drafter.embed_tokens.weight, published.embed_tokens.weight)  # not its copy of the embeddings
    decode_like_plain(target, drafter, 4)


def test_a_one_pass_schedule_trains_one_pass_first_then_all_and_resumes_on_schedule(world, tmp_path):
    """--ttt-one-pass-steps N: the first N optimisation steps run one training-time-test pass, the later ones all
    --ttt-steps; a run resumed past N goes on with all of them."""
    passes = []
    real = eagle3_training.training_time_test_passes
    spy = lambda model, batch, steps, decay: (passes.append(steps) if torch.is_grad_enabled() else None) or \
        real(model, batch, steps, decay)  # noqa: E731
    common = dict(drafter="eagle3", target_layer_ids="1,2,2", ttt_steps=3, ttt_one_pass_steps=2, eval_every=3,
                  save_every=3, draft_vocab_size=64, data_cache_dir=tmp_path / "cache")
    with mock.patch.object(eagle3_training, "training_time_test_passes", spy):
        run_in_process(cli(world, tmp_path / "run", max_steps=3, **common))
        assert passes == [1, 1, 3]
        summary = run_in_process(cli(world, tmp_path / "run", max_steps=5, **common) + ["--resume"])
    assert passes == [1, 1, 3, 3, 3] and summary["final_step"] == 5


# --- block: one forward proposes block_size tokens --------------------------------------------------------------------
def test_block_drafter_trains_saves_and_decodes_exactly(world, tmp_path):
    out = tmp_path / "block"
    summary = run_in_process(cli(world, out, drafter="block", target_layer_ids="1,2,2", block_size=3, block_anchors=8,
                                 max_steps=30, eval_every=30, save_every=0, learning_rate=1e-2, draft_vocab_size=64))
    log = [r for r in read_log(out) if r["event"] == "train"]
    assert log[-1]["loss"] < log[0]["loss"]
    assert_evaluated_speculatively(summary["best"])
    target = AutoModelForCausalLM.from_pretrained(world["target"]).eval()
    drafter = hf_specdec.AutoDrafter.from_pretrained(out, target=target)
    assert isinstance(drafter, hf_specdec.BlockDrafterModel) and drafter.config.block_size == 3
    accuracy = drafter.config.position_accuracy  # measured on held-out data: position i's rank-r hit rate
    assert len(accuracy) == 3 and all(len(row) == 16 and 0 <= min(row) and sum(row) <= 1 + 1e-6 for row in accuracy)
    decode_like_plain(target, drafter, 3)
    decode_like_plain(target, hf_specdec.drafters.BlockDrafter(drafter, tree=6), None)


def test_a_dflash_drafter_trains_in_transformers_layout_and_fine_tunes(world, tmp_path):
    """A DFlash drafter the trainer makes loads in plain transformers without remote code and decodes there with
    speculation_type="dflash" exactly as plain greedy; the trainer then fine-tunes it from its folder."""
    from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantModel

    out = tmp_path / "dflash"
    summary = run_in_process(cli(world, out, drafter="dflash", block_size=4, block_anchors=8, max_steps=30,
                                 eval_every=30, save_every=0, learning_rate=1e-2))
    log = [r for r in read_log(out) if r["event"] == "train"]
    assert log[-1]["loss"] < log[0]["loss"]
    assert_evaluated_speculatively(summary["best"])
    target = AutoModelForCausalLM.from_pretrained(world["target"]).eval()
    drafter = MuseGlimmerAssistantModel.from_pretrained(out).eval()  # transformers' own class, from the folder
    assert json.loads((out / "config.json").read_text())["model_type"] == "muse_glimmer_assistant"
    forwards = [0]
    for seed in range(3):
        prompt = torch.randint(6, 96, (1, 4 + seed), generator=torch.Generator().manual_seed(seed))
        plain = target.generate(prompt, max_new_tokens=16, do_sample=False)
        hook = target.register_forward_hook(lambda *args: forwards.__setitem__(0, forwards[0] + 1))
        theirs = target.generate(prompt, max_new_tokens=16, do_sample=False, assistant_model=drafter,
                                 speculation_type="dflash")
        hook.remove()
        assert torch.equal(theirs, plain)
    assert forwards[0] < 3 * 16, "plain transformers accepted none of its drafts"
    decode_like_plain(target, drafter, 3)
    tuned = tmp_path / "tuned"
    run_in_process(cli(world, tuned, drafter=str(out), max_steps=4, eval_every=4, save_every=0))
    first = [r for r in read_log(tuned) if r["event"] == "train"][0]
    assert first["loss"] < log[0]["loss"], "the fine-tuning did not start from the folder's drafter"
    assert hf_specdec.AutoDrafter.from_pretrained(tuned, target=target).config.block_size == 4


def test_a_gemma4_assistant_fine_tunes_on_its_targets_answers_and_stays_in_transformers_layout(world, tmp_path):
    pytest.importorskip("transformers.models.gemma4_assistant")
    from transformers import AutoTokenizer
    from transformers.models.gemma4_assistant import Gemma4AssistantForCausalLM

    from tests.transformers_drafters import tiny_gemma4_with_assistant

    target, assistant = tiny_gemma4_with_assistant(vocab=96, noise=0.3)
    target.save_pretrained(tmp_path / "gemma4")
    AutoTokenizer.from_pretrained(world["target"]).save_pretrained(tmp_path / "gemma4")
    assistant.save_pretrained(tmp_path / "assistant")
    out = tmp_path / "tuned"
    summary = run_in_process(cli(world, out, target=tmp_path / "gemma4", drafter=tmp_path / "assistant", max_steps=20,
                                 eval_every=20, save_every=0, learning_rate=3e-3, draft_vocab_size=0,
                                 data_cache_dir=tmp_path / "cache"))
    log = [r for r in read_log(out) if r["event"] == "train"]
    assert log[-1]["loss"] < log[0]["loss"]
    assert_evaluated_speculatively(summary["best"])
    tuned = Gemma4AssistantForCausalLM.from_pretrained(out).eval()  # transformers' own class, from the folder
    assert not torch.equal(tuned.pre_projection.weight, assistant.pre_projection.weight)
    for seed in range(3):
        prompt = torch.randint(6, 96, (1, 4 + seed), generator=torch.Generator().manual_seed(seed))
        plain = target.generate(prompt, max_new_tokens=16, do_sample=False)
        assert torch.equal(target.generate(prompt, max_new_tokens=16, do_sample=False, assistant_model=tuned), plain)
    decode_like_plain(target, tuned, 3)
    with pytest.raises(InputError, match="existing Gemma 4 assistant"):
        run_in_process(cli(world, tmp_path / "new", target=tmp_path / "gemma4", drafter="gemma4-assistant"))


def test_a_larger_set_reuses_the_parts_a_smaller_one_made(world, tmp_path):
    """--num-score 20 after --num-score 12 (parts of 8) scores only what is new: part 0 is reused, the smaller run's
    short last part is made again, and the result equals a fresh 20-text preparation."""
    common = dict(prepare_only=True, teacher_data="score", num_generate=0, prepare_part_size=8, heldout_prompts=2)
    run_in_process(cli(world, tmp_path / "a", data_cache_dir=tmp_path / "grown", num_score=12, **common))
    scored, original = [], prepare.score_sequences
    with mock.patch.object(prepare, "score_sequences", side_effect=lambda t, seqs, *a, **k: scored.append(len(seqs)) or original(t, seqs, *a, **k)):
        grown = run_in_process(cli(world, tmp_path / "b", data_cache_dir=tmp_path / "grown", num_score=20, **common))
    assert scored == [8, 4]  # part 1 (4 texts before, 8 now) and part 2; part 0 came from the smaller run
    fresh = run_in_process(cli(world, tmp_path / "c", data_cache_dir=tmp_path / "fresh", num_score=20, **common))
    a = teacher_data.TeacherData.load(Path(grown["data"]["cache_folder"]) / "train.safetensors")
    b = teacher_data.TeacherData.load(Path(fresh["data"]["cache_folder"]) / "train.safetensors")
    assert len(a) == 20 and all(torch.equal(a.t[k], b.t[k]) for k in a.t)


def test_scoring_records_a_feature_drafters_states_in_the_same_forward(world, tmp_path):
    """Preparing for --drafter eagle3, the parts scored now get their states from the scoring forward itself; a part an
    earlier token-only preparation made gets one pass of its own; and the merged file equals a separate pass over the
    whole set, row for row."""
    common = dict(prepare_only=True, teacher_data="score", num_generate=0, prepare_part_size=8, heldout_prompts=2,
                  data_cache_dir=tmp_path / "cache")
    run_in_process(cli(world, tmp_path / "a", num_score=8, **common))  # part 0, without states
    passes, separate_pass = [], states.attach_target_features
    with mock.patch.object(states, "attach_target_features",
                           side_effect=lambda t, data, *a, **k: passes.append(len(data)) or separate_pass(t, data, *a, **k)):
        summary = run_in_process(cli(world, tmp_path / "b", num_score=20, drafter="eagle3", target_layer_ids="1,2,2", **common))
    assert passes == [8]  # part 0 only: parts 1 and 2 (12 texts) were scored with their states
    folder = Path(summary["data"]["cache_folder"])
    fused = np.load(folder / "features-train-layers-1-2-2.npy")
    data = teacher_data.TeacherData.load(folder / "train.safetensors")
    target = AutoModelForCausalLM.from_pretrained(world["target"]).eval()
    separate_pass(target, data, tmp_path / "separate.npy", entering_layers(target, [1, 2, 2]), False)
    assert fused.shape == data.features.shape == (int(data.t["tok_off"][-1]), 3 * 64) and np.abs(fused).min(1).all()
    np.testing.assert_allclose(fused, np.asarray(data.features), atol=2e-3, rtol=2e-3)


def test_target_features_are_memory_mapped_and_a_killed_pass_continues(tmp_path):
    """The feature pass writes a memory-mapped .npy as it goes; killed mid-way, a rerun continues from its last saved
    batch and ends with the file an uninterrupted pass writes."""
    target = tiny_llama(vocab=40, layers=3)
    g = torch.Generator().manual_seed(0)
    records = [teacher_data.make_record(torch.randint(0, 40, (n,), generator=g).tolist(), 2, torch.zeros(n - 2, 4, dtype=torch.int32),
                                        torch.zeros(n - 2, 4, dtype=torch.float16), 1) for n in (5, 9, 7, 12, 6, 8)]
    modules = [decoder_layers(target)[0], decoder_layers(target)[2]]

    def make(folder, fail_after=None):
        data = teacher_data.TeacherData.from_records(records, {})
        calls, forward = [0], target.forward

        def flaky(*args, **kwargs):
            calls[0] += 1
            if fail_after is not None and calls[0] > fail_after:
                raise KeyboardInterrupt  # the kill
            return forward(*args, **kwargs)

        with mock.patch.object(target, "forward", side_effect=flaky):
            prepare.attach_target_features(target, data, folder / "f.npy", modules, False, tokens_per_batch=12,
                                                flush_every=1)
        return data, calls[0]

    (tmp_path / "a").mkdir()
    clean, clean_calls = make(tmp_path / "a")
    assert isinstance(clean.features, np.memmap) and clean.features.shape == (47, 2 * 48)
    (tmp_path / "b").mkdir()
    with pytest.raises(KeyboardInterrupt):
        make(tmp_path / "b", fail_after=2)
    assert (tmp_path / "b" / "f.npy.partial").exists() and not (tmp_path / "b" / "f.npy").exists()
    resumed, resumed_calls = make(tmp_path / "b")
    assert resumed_calls == clean_calls - 2  # the two saved batches are not computed again
    assert np.array_equal(np.asarray(resumed.features), np.asarray(clean.features))
    last = []
    hook = modules[1].register_forward_hook(lambda m, a, o: last.append(o))
    states = target(records[1]["tokens"][None].long(), output_hidden_states=True).hidden_states
    hook.remove()
    expected = torch.cat([states[1], last[0]], dim=-1)[0].half()  # after layer 0 (entering 1), and after layer 2
    torch.testing.assert_close(clean.record(1)["features"], expected, atol=2e-3, rtol=2e-3)


def test_data_curve_subsets_are_nested_and_keep_their_features():
    g = torch.Generator().manual_seed(0)
    records = [teacher_data.make_record(torch.randint(0, 40, (n,), generator=g).tolist(), 2, torch.zeros(n - 2, 4, dtype=torch.int32),
                                        torch.zeros(n - 2, 4, dtype=torch.float16), 1) for n in range(4, 24)]
    data = teacher_data.TeacherData.from_records(records, {})
    data.features = np.arange(int(data.t["tok_off"][-1]) * 2, dtype=np.float16).reshape(-1, 2) % 1000
    small, large = data.subset(60, seed=3), data.subset(150, seed=3)
    assert 0 < int(small.t["tgt_off"][-1]) <= 60 < int(large.t["tgt_off"][-1]) <= 150
    tokens = lambda d: [tuple(d.record(i)["tokens"].tolist()) for i in range(len(d))]  # noqa: E731
    assert tokens(small) == tokens(large)[: len(small)]
    originals = {tuple(r["tokens"].tolist()): i for i, r in enumerate(records)}
    for i in range(len(large)):
        rec = large.record(i)
        j = originals[tuple(rec["tokens"].tolist())]
        assert torch.equal(rec["features"], data.record(j)["features"])


def test_training_time_test_passes_see_what_drafting_ahead_sees():
    """Pass r's logits at position j equal the drafter's, decoding as the loop does: its cache fed (t_i, fused target
    state at i - 1) up to position j - r, then r steps that each feed the next token with its own previous output."""
    target = tiny_llama(vocab=40, layers=4)
    torch.manual_seed(0)
    drafter = Eagle3DraftModel(Eagle3Config.from_target(target.config, draft_vocab_size=0, initializer_range=0.3)).eval()
    drafter.bind_target(target)
    ids = torch.randint(0, 40, (2, 9))
    positions = torch.zeros(2, 9, dtype=torch.bool)
    positions[:, 3:] = True
    batch = {"input_ids": ids, "positions": positions, "features": torch.randn(2, 9, 3 * 48)}
    with torch.no_grad():
        passes, weights = eagle3_training.training_time_test_passes(drafter, batch, steps=3, decay=0.5)
        assert weights == [1.0, 0.5, 0.25]
        fused = drafter.fuse(batch["features"])
        for r, logits in enumerate(passes):
            logits = logits.view(2, 6, -1)  # the teacher positions 3..8 of each row
            for b in range(2):
                for j in range(3, 9):
                    start = j - r  # the last position fed the target's state
                    cache = DynamicCache(config=drafter.config)
                    shifted = torch.cat([torch.zeros(1, 48), fused[b, : start]])[None]
                    out = drafter(input_ids=ids[b : b + 1, : start + 1], target_features=shifted, cache=cache, use_cache=True)
                    for step in range(1, r + 1):
                        own = out.hidden_states[0][:, -1:]
                        out = drafter(input_ids=ids[b : b + 1, start + step : start + step + 1], target_features=own,
                                      cache=cache, use_cache=True)
                    expected = out.logits[0, -1]
                    torch.testing.assert_close(logits[b, j - 3], expected, atol=1e-4, rtol=1e-4)


# --- Medusa heads ---------------------------------------------------------------------------------------------------------
def test_medusa_pairs_align_heads_with_future_teacher_rows():
    positions = torch.tensor([[False, True, True, True, True, False], [False, False, True, True, False, False]])
    source, teacher = medusa_training.medusa_pairs(positions, 1)  # head 1 at j reads f_j and learns the teacher at j + 2
    assert source.nonzero().tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1]]
    # teacher rows (row-major over `positions`): row 0 -> 0..3 at j = 1..4, row 1 -> 4, 5 at j = 2, 3
    assert teacher.tolist() == [1, 2, 3, 4, 5]


def test_medusa_heads_train_save_and_decode_exactly(world, tmp_path):
    out = tmp_path / "medusa"
    summary = run_in_process(cli(world, out, drafter="medusa", num_heads=2, max_steps=8, eval_every=8, save_every=0,
                                 learning_rate=3e-3))
    log = [r for r in read_log(out) if r["event"] == "train"]
    assert log[-1]["loss"] < log[0]["loss"]
    assert_evaluated_speculatively(summary["best"])
    heads = hf_specdec.AutoDrafter.from_pretrained(out)
    assert isinstance(heads, hf_specdec.MedusaHeads) and heads.config.num_heads == 2
    assert (out / "README.md").exists()
    target = AutoModelForCausalLM.from_pretrained(world["target"]).eval()
    decode_like_plain(target, heads, 2)


# --- a registered kind trains with no edit to the trainer ----------------------------------------------------------------
def test_a_registered_kind_trains_evaluates_and_saves_with_no_edit_to_the_trainer(world, tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))
    registry.register_drafter_kind(BIGRAM)
    out = tmp_path / "bigram"
    summary = run_in_process(cli(world, out, drafter="test-bigram", max_steps=30, eval_every=30, save_every=0,
                                 learning_rate=0.3, bigram_scale=2.0))  # an option of the kind's own
    assert json.loads((out / "run_args.json").read_text())["bigram_scale"] == 2.0
    log = [r for r in read_log(out) if r["event"] == "train"]
    assert log[-1]["loss"] < 0.7 * log[0]["loss"]
    assert_evaluated_speculatively(summary["best"])
    drafter = hf_specdec.AutoDrafter.from_pretrained(out)
    assert isinstance(drafter, BigramTable) and drafter.table.abs().sum() > 0
    with pytest.raises(ValueError, match="neither a kind of drafter to train .*test-bigram"):
        adapters.adapter_for("no-such-kind")
    with pytest.raises(InputError, match=r"unrecognized arguments: --ttt-steps 2 \(the options of a test-bigram drafter: --bigram-scale"):
        distill.main(cli(world, tmp_path / "other", drafter="test-bigram", ttt_steps=2))
    assert not (tmp_path / "other").exists()


# --- bad input and data safety ---------------------------------------------------------------------------------------
def run_cli(*argv, timeout=300):
    return subprocess.run([sys.executable, "-m", "training.distill", *map(str, argv)], env=subprocess_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert lines[0].startswith("distill: error: ")
    return lines[0]


def test_bad_data_files_are_one_line_before_any_target_loads(tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "fine"}\n{"prompt": oops}\n')
    no_target = tmp_path / "no-such-target"  # loading it would fail: the data error must come first
    line = one_error_line(run_cli("--data", broken, "--target", no_target, "--output-dir", tmp_path / "out"))
    assert f"{broken}, line 2: not JSON" in line and "column 12" in line
    line = one_error_line(run_cli("--data", tmp_path / "missing.jsonl", "--target", no_target, "--output-dir", tmp_path / "out"))
    assert f"--data {tmp_path / 'missing.jsonl'}: no such file" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, message", [
    (["--max-steps", "0"], "--max-steps must be >= 1 (got 0)"),
    (["--batch-size", "-2", "--top-k", "0"], "--top-k must be >= 1 (got 0); --batch-size must be >= 1 (got -2)"),
    (["--on-policy-ratio", "1.5"], "--on-policy-ratio must lie in [0, 1]"),
    (["--resume", "--overwrite"], "pass one"),
    (["--drafter", "eagle3", "--target-layer-ids", "2,15"], "--target-layer-ids must be three target layers, e.g. 2,15,27"),
    (["--drafter", "eagle3", "--target-layer-ids", "9,1,1"], "--target-layer-ids 9,1,1: an EAGLE-3 drafter reads three target layers, each in 1..2"),
    (["--drafter", "nonsense"], "--drafter 'nonsense' is neither a kind of drafter to train (new, draft-model, eagle, eagle3, medusa"),
    (["--drafter", "medusa", "--tree", "12"], "--tree 12: an N-node tree is built from the accuracy a drafter's training measured"),
    (["--drafter", "block", "--tree", "bushy"], "--tree must be 'chain', 'tree' or a node count N >= 1 (got 'bushy')"),
])
def test_bad_arguments_are_input_errors(world, tmp_path, argv, message):
    kind = {"drafter": argv[argv.index("--drafter") + 1]} if "--drafter" in argv else {}
    with pytest.raises(InputError) as error:
        distill.main(cli(world, tmp_path / "out", **kind) + argv)
    assert message in str(error.value)
    assert not (tmp_path / "out").exists()


def test_an_unknown_flag_is_one_line(tmp_path):
    line = one_error_line(run_cli("--max-stepz", "3", "--output-dir", tmp_path / "out"))
    assert "unrecognized arguments: --max-stepz 3" in line and "--help" in line


def test_unusable_rows_are_counted_per_reason_and_reported(world, tmp_path, capsys):
    rows = [json.loads(line) for line in world["data"].read_text().splitlines()]
    rows += [{"id": "x1", "messages": [{"role": "user", "content": "   "}]}, {"id": "x2", "text": "no prompt"},
             {"id": "x3", "messages": [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}][1:]},
             {"id": "x4", "messages": "not a list"}, {"id": "x5", "prompt": " ".join(["w5"] * 300)}]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    summary = run_in_process(cli(world, out, data=data, max_steps=1, eval_every=0, save_every=0,
                                 data_cache_dir=tmp_path / "cache", num_generate=100, num_score=0))
    skipped = summary["data"]["skipped"]
    assert skipped == {"dev prompt (excluded)": 1, "empty or non-text prompt": 1, "no messages, conversations or prompt": 1,
                       "not ending in a user turn": 1, "malformed turns (not a list of objects)": 1,
                       "prompt over --max-prompt-tokens 256": 1}
    assert "rows skipped: 1 dev prompt (excluded), 1 empty or non-text prompt" in capsys.readouterr().out
    assert json.loads((out / "training_summary.json").read_text())["data"]["skipped"] == skipped
    assert read_log(out)[0]["rows_skipped"] == skipped


def test_no_usable_rows_is_an_error_that_says_why(world, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"id": "a", "text": "x"}\n{"id": "c0_0", "prompt": "%s"}\n' % world["excluded_prompt"])
    with pytest.raises(InputError, match=r"no usable rows \(skipped: 1 dev prompt \(excluded\), 1 no messages"):
        run_in_process(cli(world, tmp_path / "out", data=data, data_cache_dir=tmp_path / "cache"))


def test_resume_refuses_other_arguments_and_a_new_run_refuses_a_used_folder(world, tmp_path):
    out = tmp_path / "run"
    run_in_process(cli(world, out, max_steps=3, eval_every=3, save_every=3))
    # a run saved before an argument existed: the argument counts as its default
    saved = json.loads((out / "run_args.json").read_text())
    del saved["mixed_precision"]
    (out / "run_args.json").write_text(json.dumps(saved))
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    with pytest.raises(InputError, match=r"--resume: .* holds a run with other arguments \(--loss 'fkl' -> 'tvd'; "
                                         r"--mixed-precision 'auto' -> 'bf16'; --seed 0 -> 1\)"):
        run_in_process(cli(world, out, max_steps=6, eval_every=3, save_every=3, loss="tvd", seed=1,
                           mixed_precision="bf16") + ["--resume"])
    with pytest.raises(InputError, match="holds another run or drafter; continue it with --resume, replace it with --overwrite"):
        run_in_process(cli(world, out, max_steps=3))
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before  # nothing written or lost
    summary = run_in_process(cli(world, out, max_steps=6, eval_every=3, save_every=3) + ["--resume"])  # may go longer
    assert summary["resumed_from"].endswith("step-0000003") and summary["final_step"] == 6
    summary = run_in_process(cli(world, out, max_steps=2, eval_every=2, save_every=0, loss="tvd") + ["--overwrite"])
    assert summary["final_step"] == 2 and not (out / "checkpoints" / "step-0000003").exists()


def test_a_kill_mid_write_leaves_a_loadable_run(world, tmp_path):
    """What a kill during a checkpoint, a best-drafter swap or data preparation leaves behind is never read."""
    out = tmp_path / "run"
    cache = tmp_path / "cache"
    run_in_process(cli(world, out, max_steps=3, eval_every=3, save_every=3, data_cache_dir=cache))
    checkpoint = out / "checkpoints" / "step-0000003"
    assert (checkpoint / "train_state.json").is_file()
    assert sorted(p.suffix for p in checkpoint.iterdir()) == [".json", ".json", ".pt", ".safetensors", ".safetensors"]
    torch.load(checkpoint / "optimizer.pt", weights_only=True)  # no pickled objects anywhere in what --resume reads
    # killed mid-checkpoint at step 6 (a half-written step-N.tmp) and mid-swap of best/ (only best.old left)
    (out / "checkpoints" / "step-0000006.tmp").mkdir()
    (out / "checkpoints" / "step-0000006.tmp" / "model.safetensors").write_bytes(b"half")
    (out / "checkpoints" / "best").rename(out / "checkpoints" / "best.old")
    (out / RUN_COMPLETE).unlink()
    assert checkpoints.latest_checkpoint(out) == checkpoint
    assert checkpoints.best_folder(out) == out / "checkpoints" / "best.old"
    summary = run_in_process(cli(world, out, max_steps=6, eval_every=3, save_every=3, data_cache_dir=cache) + ["--resume"])
    assert summary["resumed_from"] == str(checkpoint) and summary["final_step"] == 6
    assert (out / "checkpoints" / "best" / "config.json").is_file() and (out / RUN_COMPLETE).is_file()
    # killed mid-preparation: a half shard under its temporary name, no meta.json: the data is made again
    args = arguments.parse_args(cli(world, out, data_cache_dir=tmp_path / "cache2"))[0]
    folder = tmp_path / "cache2" / prepare.data_cache_key(args)
    folder.mkdir(parents=True)
    (folder / "shard-0.pt.tmp").write_bytes(b"half")
    summary = run_in_process(cli(world, tmp_path / "prep", data_cache_dir=tmp_path / "cache2", prepare_only=True))
    assert (folder / "meta.json").is_file() and summary["data"]["train_records"] > 0
    assert not list(folder.glob("shard-*"))


def test_a_time_budget_stops_cleanly_and_resume_ends_like_an_uninterrupted_run(world, tmp_path):
    straight = run_in_process(cli(world, tmp_path / "straight", max_steps=8, eval_every=4, save_every=0))
    out = tmp_path / "budget"
    with mock.patch.object(distill.time, "perf_counter", side_effect=lambda c=iter(range(0, 10**9, 400)): float(next(c))):
        stopped = run_in_process(cli(world, out, max_steps=8, eval_every=4, save_every=0, time_budget=0.5))
    assert stopped["stopped_by_time_budget"] and 0 < stopped["final_step"] < 8
    assert checkpoints.latest_checkpoint(out).name == f"step-{stopped['final_step']:07d}"
    assert any(r["event"] == "time budget" for r in read_log(out))
    resumed = run_in_process(cli(world, out, max_steps=8, eval_every=4, save_every=0) + ["--resume"])
    assert resumed["final_step"] == 8 and not resumed["stopped_by_time_budget"]
    assert resumed["final_loss"] == pytest.approx(straight["final_loss"], rel=1e-4)


@pytest.mark.parametrize("drafter", ["new", "eagle"])
def test_bf16_runs_the_target_in_bf16_and_the_drafter_in_mixed_precision(world, tmp_path, drafter):
    out = tmp_path / "bf16"
    summary = run_in_process(cli(world, out, dtype="bfloat16", drafter=drafter, max_steps=2, eval_every=2, save_every=0,
                                 data_cache_dir=tmp_path / "cache"))
    assert summary["final_step"] == 2 and summary["best"]["target_forwards"] > 0
    assert "bfloat16" in json.loads((out / "run_args.json").read_text())["dtype"]
    fp32 = arguments.parse_args(cli(world, out, data_cache_dir=tmp_path / "cache"))[0]
    assert prepare.data_cache_key(fp32) != Path(summary["data"]["cache_folder"]).name  # its own teacher data
    target, _ = deployed.load_target(arguments.parse_args(cli(world, out, dtype="bfloat16"))[0], torch.device("cpu"))
    assert target.dtype == torch.bfloat16


def test_mixed_precision_bf16_autocasts_the_drafters_loss_while_the_target_stays_fp32(world, tmp_path):
    """--mixed-precision bf16 with an fp32 target (the CPU's fast decoding dtype): every training step computes the
    drafter's loss under bf16 autocast, evaluation runs against the fp32 target."""
    casts, judged = [], []
    real_autocast = torch.autocast
    spy = lambda *a, **k: casts.append(k.get("dtype")) or real_autocast(*a, **k)  # noqa: E731
    with mock.patch.object(torch, "autocast", spy), \
            mock.patch.object(distill, "evaluate", lambda acc, adapter, model, target, *a: judged.append(target.dtype)
                              or evaluate.evaluate(acc, adapter, model, target, *a)):
        summary = run_in_process(cli(world, tmp_path / "run", mixed_precision="bf16", drafter="block", max_steps=2,
                                     target_layer_ids="1,2,2", block_size=3, block_anchors=8, eval_every=2, save_every=0,
                                     data_cache_dir=tmp_path / "cache"))
    assert casts.count(torch.bfloat16) >= 2  # one per training step at least
    assert judged == [torch.float32] and summary["final_step"] == 2 and summary["best"]["target_forwards"] > 0
    assert math.isfinite(summary["final_loss"])


def test_compile_trains_checkpoints_resumes_and_evaluates_the_compiled_drafter(world, tmp_path):
    """--compile wraps the drafter in torch.compile (here its "eager" backend: the same wrapper, no code generation):
    evaluation decodes with the drafter inside, checkpoints hold its own weight names, and a run resumes."""
    out = tmp_path / "run"
    compiled = []
    real_compile = torch.compile
    spy = lambda model, *a, **k: compiled.append(type(model).__name__) or real_compile(model, *a, **k)  # noqa: E731
    with mock.patch.object(distill, "COMPILE_BACKEND", "eager"), mock.patch.object(torch, "compile", spy):
        run_in_process(cli(world, out, compile=True, max_steps=2, eval_every=2, save_every=2,
                           data_cache_dir=tmp_path / "cache"))
        summary = run_in_process(cli(world, out, compile=True, max_steps=4, eval_every=2, save_every=2,
                                     data_cache_dir=tmp_path / "cache") + ["--resume"])
    assert compiled == ["SpecDrafterForCausalLM"] * 2
    assert summary["resumed_from"].endswith("step-0000002") and summary["final_step"] == 4
    assert_evaluated_speculatively(summary["best"])
    from safetensors.torch import load_file

    names = load_file(str(out / "checkpoints" / "step-0000004" / "model.safetensors"))
    assert names and not any("_orig_mod" in name for name in names)


def test_a_bf16_teacher_makes_the_data_while_the_drafter_is_judged_against_the_fp32_target(world, tmp_path):
    """--teacher-dtype bfloat16 (twice the CPU scoring rate) scores, self-generates and records states with a bf16 copy
    loaded from the files; the target the drafter is evaluated against stays fp32."""
    teacher, judged = [], []
    spy = lambda real, seen: lambda model, *a, **k: seen.append(model.dtype) or real(model, *a, **k)  # noqa: E731
    with mock.patch.object(prepare, "score_sequences", spy(prepare.score_sequences, teacher)), \
            mock.patch.object(prepare, "self_generate", spy(prepare.self_generate, teacher)), \
            mock.patch.object(distill, "evaluate", lambda acc, adapter, model, target, *a: judged.append(target.dtype)
                              or evaluate.evaluate(acc, adapter, model, target, *a)):
        summary = run_in_process(cli(world, tmp_path / "run", teacher_dtype="bfloat16", drafter="eagle3", max_steps=2,
                                     eval_every=2, save_every=0, data_cache_dir=tmp_path / "cache"))
    assert len(teacher) >= 3 and set(teacher) == {torch.bfloat16}  # generation, scoring, held-out states: all bf16
    assert judged and set(judged) == {torch.float32} and summary["best"]["target_forwards"] > 0
    folder = Path(summary["data"]["cache_folder"])
    assert json.loads((folder / "meta.json").read_text())["teacher_dtype"] == "bfloat16"
    key = lambda **dtypes: prepare.data_cache_key(arguments.parse_args(cli(world, tmp_path, **dtypes))[0])  # noqa: E731
    assert folder.name == key(teacher_dtype="bfloat16") == key(dtype="bfloat16")  # same teacher numerics, same data
    assert key() == key(teacher_dtype="float32") != folder.name  # and the fp32 data keeps its own folder (and name)


def test_a_killed_preparation_continues_from_its_last_complete_part(world, tmp_path):
    """Teacher data is made in parts saved as they are done: after a kill, the next run makes only the missing parts
    and ends with exactly the data an uninterrupted preparation makes."""
    common = dict(prepare_only=True, num_generate=24, num_score=0, prepare_part_size=8)
    whole = run_in_process(cli(world, tmp_path / "a", data_cache_dir=tmp_path / "whole", **common))
    made, original = [], prepare.self_generate

    def killed_after_two_parts(target, tokenizer, prompts, *rest):
        if len(made) == 2 and len(prompts) == 8:
            raise KeyboardInterrupt  # the kill
        made.append(len(prompts))
        return original(target, tokenizer, prompts, *rest)

    with mock.patch.object(prepare, "self_generate", side_effect=killed_after_two_parts):
        with pytest.raises(KeyboardInterrupt):
            run_in_process(cli(world, tmp_path / "b", data_cache_dir=tmp_path / "parts", **common))
    folder = next((tmp_path / "parts" / "parts").iterdir())
    assert sorted(p.name for p in folder.glob("gen-*")) == ["gen-0-part-00000-of-8.pt", "gen-0-part-00001-of-8.pt"]
    assert not list((tmp_path / "parts").glob("*/meta.json"))
    made.clear()
    with mock.patch.object(prepare, "self_generate", side_effect=lambda *a: made.append(len(a[2])) or original(*a)):
        resumed = run_in_process(cli(world, tmp_path / "c", data_cache_dir=tmp_path / "parts", **common))
    assert made == [8, 6]  # the third part of the 24 prompts, then the held-out prompts: nothing made twice
    assert len(list(folder.glob("gen-*-part-*"))) == 3  # merged; the parts stay, for a larger set
    a = teacher_data.TeacherData.load(Path(whole["data"]["cache_folder"]) / "train.safetensors")
    b = teacher_data.TeacherData.load(Path(resumed["data"]["cache_folder"]) / "train.safetensors")
    assert a.t.keys() == b.t.keys() and all(torch.equal(a.t[k], b.t[k]) for k in a.t)


# --- what the GPU run needs (benchmarks/gpu/train_shipped.py) ---------------------------------------------------------
def test_self_generation_records_the_top_k_greedy_decoding_saw_without_holding_every_steps_logits(world):
    """The recorder's top-K per answer token equals the top-K of the logits `output_logits` returns, and the answers
    are greedy generate()'s."""
    args, _ = arguments.parse_args(cli(world, Path("unused"), top_k=5, max_new_tokens=10, gen_batch_size=3))
    target, tokenizer = deployed.load_target(args, torch.device("cpu"))
    prompts = [tokenizer(f"<|user|> w{i} w{i + 3} w7 <|end|> <|assistant|>")["input_ids"][: 3 + i] for i in range(4)]
    records, _ = prepare.self_generate(target, tokenizer, prompts, args, teacher_data.Source.SELF_GENERATED, False)
    for prompt, record in zip(prompts, records):
        out = target.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, output_logits=True,
                              return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id)
        answer = record["tokens"][len(prompt):]
        assert torch.equal(answer.long(), out.sequences[0, len(prompt): len(prompt) + len(answer)])
        for step, logits in enumerate(out.logits[: len(answer)]):
            ids, lps = deployed.topk_logprobs(logits, 5)
            assert torch.equal(record["ids"][step], ids[0])
            assert torch.allclose(record["lps"][step].float(), lps[0].float(), atol=1e-3)


def test_a_larger_set_of_answers_reuses_the_parts_and_held_out_answers_a_smaller_one_made(world, tmp_path):
    """--num-generate 24 after 8 (generation only, parts of 8): only the new prompts are answered, the held-out prompts
    once, and the set equals a fresh 24-prompt preparation."""
    common = dict(prepare_only=True, teacher_data="generate", num_score=0, prepare_part_size=8, heldout_prompts=3)
    run_in_process(cli(world, tmp_path / "a", data_cache_dir=tmp_path / "grown", num_generate=8, **common))
    answered, original = [], prepare.self_generate
    with mock.patch.object(prepare, "self_generate", side_effect=lambda t, tok, prompts, *a: answered.append(len(prompts)) or original(t, tok, prompts, *a)):
        grown = run_in_process(cli(world, tmp_path / "b", data_cache_dir=tmp_path / "grown", num_generate=24, **common))
    assert answered == [8, 8]  # parts 1 and 2; part 0 and the held-out part came from the smaller set
    fresh = run_in_process(cli(world, tmp_path / "c", data_cache_dir=tmp_path / "fresh", num_generate=24, **common))
    for name in ("train", "heldout"):
        a = teacher_data.TeacherData.load(Path(grown["data"]["cache_folder"]) / f"{name}.safetensors")
        b = teacher_data.TeacherData.load(Path(fresh["data"]["cache_folder"]) / f"{name}.safetensors")
        assert all(torch.equal(a.t[k], b.t[k]) for k in a.t)


def test_online_features_are_the_stored_states_computed_per_batch(world, tmp_path):
    """--online-features: no states file for the training set, each batch's states computed by the target (equal to the
    stored ones up to their fp16 rounding), and an EAGLE-3 drafter trained on them decodes exactly."""
    common = dict(drafter="eagle3", target_layer_ids="1,2,2", max_steps=4, eval_every=4, save_every=0, teacher_data="score",
                  num_generate=0, num_score=24, data_cache_dir=tmp_path / "cache")
    computed, original = [], distill.target_states
    with mock.patch.object(distill, "target_states", side_effect=lambda *a: computed.append(1) or original(*a)):
        summary = run_in_process(cli(world, tmp_path / "online", online_features=True, **common))
    folder = Path(summary["data"]["cache_folder"])
    assert len(computed) == 4 and not list(folder.glob("features-train-*")) and list(folder.glob("features-heldout-*"))
    assert_evaluated_speculatively(summary["best"])
    data = teacher_data.TeacherData.load(folder / "train.safetensors")
    target = AutoModelForCausalLM.from_pretrained(world["target"]).eval()
    modules = entering_layers(target, [1, 2, 2])
    states.attach_target_features(target, data, tmp_path / "stored.npy", modules, False)
    batch = teacher_data.collate([data.record(i) for i in range(4)], 0)
    online = states.target_states(target, batch["input_ids"], modules)
    np.testing.assert_allclose(online[batch["input_ids"] != 0].numpy(), batch["features"][batch["input_ids"] != 0].numpy(),
                               atol=2e-3, rtol=2e-3)
    drafter = hf_specdec.AutoDrafter.from_pretrained(tmp_path / "online", target=target)
    decode_like_plain(target, drafter, 3)


def test_a_resumed_run_with_more_steps_follows_the_new_horizon(world, tmp_path):
    """--max-steps is a resumable change: after a short first call, a resume with a longer horizon continues the cosine
    over the new horizon (the GPU run's calibration then its real run), not the saved one's floor."""
    out = tmp_path / "run"
    run_in_process(cli(world, out, max_steps=4, warmup_steps=2, eval_every=0, save_every=4, min_lr_ratio=0.1))
    run_in_process(cli(world, out, max_steps=40, warmup_steps=2, eval_every=0, save_every=0, min_lr_ratio=0.1) + ["--resume"])
    lr = {r["step"]: r["lr"] for r in read_log(out) if r["event"] == "train"}
    schedule = distill.WarmupCosine(arguments.parse_args(cli(world, out, max_steps=40, warmup_steps=2, min_lr_ratio=0.1))[0])
    assert lr[5] == pytest.approx(1e-3 * schedule(5)) and lr[5] > 0.9e-3  # early in the new cosine, not at its floor
