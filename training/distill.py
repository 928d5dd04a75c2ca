"""Distil a drafter to a target AS DEPLOYED (same weights, same quantization), for exact speculative decoding.

    accelerate launch training/distill.py --target default --target-quantization 8bit --max-steps 2000 \
        --output-dir runs/smollm2-drafter
    python training/distill.py ...                                   # the same, one process
    accelerate launch --cpu --num_processes 2 training/distill.py ...  # two CPU processes (gloo; accelerate itself
                                       # starts one here: see launch.py)
    python -m training.distill ...                                   # the module form works too

This file is the run, top to bottom: check the arguments and data, load the target, prepare (or read) the teacher
data, build the drafter, train, evaluate through the real decoding loop, checkpoint, publish, push. Beside it:
  arguments.py    the arguments (one dataclass, `HfArgumentParser`) and the output-folder rules (--resume, --overwrite)
  target.py       the target as deployed (fp32/bf16, bitsandbytes 8/4-bit) and its top-K
  data.py         teacher data (the target's own answers and/or the target scoring existing turns), cached on disk
  adapters.py     per drafter kind: build, feed, score (named by each kind's registration in hf_specdec.kinds)
  losses.py       fkl, rkl, tvd, jsd, the LK losses, ce on the target's top-K + "rest" buckets
  evaluate.py     acceptance through `speculative_generate` on held-out prompts
  checkpoints.py  checkpoints, the best drafter, the published folder, card and push (all written atomically)
  launch.py       `accelerate launch --cpu --num_processes N`: the N gloo processes
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import random
import shutil
import sys
import time
from datetime import timedelta
from pathlib import Path

if not __package__:  # run as a file (`accelerate launch training/distill.py`): its folder is the `training` package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "training"  # PEP 366: the relative imports below resolve as they do under `-m training.distill`

from hf_specdec.errors import InputError, debugging, one_line

from .arguments import asks_kind_help, parse_args


def run_command(call) -> None:
    """Run `call`; a mistake of the user's ends the command with one line and status 2 (HF_SPECDEC_DEBUG=1: the
    traceback)."""
    try:
        call()
    except InputError as error:
        if debugging():
            raise
        print(f"distill: error: {one_line(error)}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__" and not asks_kind_help(sys.argv[1:]):  # --help and mistakes in the common arguments
    run_command(parse_args)  # answer before torch loads (a second, not ten)

import torch  # noqa: E402
from tqdm.auto import tqdm

from hf_specdec.auto_drafter import AutoDrafter
from hf_specdec.hub.bundle import is_bundle
from hf_specdec.hub.push import RUN_COMPLETE

from .adapters import Adapter, adapter_for, print_kind_help, unwrap_drafter
from .arguments import Args, check_output_dir, run_args_path, run_arguments
from .checkpoints import (TrainState, best_folder, data_description, dataset_ids, latest_checkpoint, load_checkpoint, publish_drafter,
                          push_to_hub, save_checkpoint, save_drafter, training_command)
from .data import (TeacherData, attach_target_features, check_data, collate, epoch_batches, on_policy_records, prepare_data,
                   write_atomically)
from .evaluate import column_map, evaluate, top1_hits
from .launch import relaunch_for_cpu_processes
from .target import eos_ids, load_target, load_teacher, target_folder, target_id

logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)  # it warns on every 8-bit CPU matmul


def build_drafter(adapter: Adapter, continue_from: str | None, args: Args, target, token_counts: torch.Tensor | None,
                  eos: list[int]):
    """The drafter to train (its kind's adapter builds it), LoRA-wrapped when asked."""
    drafter = adapter.build(args, target, token_counts, eos, folder=continue_from, target_name=target_id(args),
                            target_folder=target_folder(args))
    if args.lora:
        from peft import LoraConfig, get_peft_model

        modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        drafter = get_peft_model(drafter, LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout, target_modules=modules))
    return drafter


def mergeable_copy(model):
    """A plain drafter to save: LoRA merged into a copy (the target stays shared, never copied)."""
    model = getattr(model, "module", model)
    if hasattr(model, "merge_and_unload"):
        return copy.deepcopy(model).merge_and_unload()
    return model


def lr_lambda(args: Args):
    def f(step: int) -> float:
        if step < args.warmup_steps:
            return (step + 1) / args.warmup_steps
        progress = min(1.0, (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps))
        return args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return f


def main(argv=None) -> dict:
    from accelerate import Accelerator, InitProcessGroupKwargs
    from accelerate.utils import set_seed
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # keep the logs to our own bars and JSON lines

    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    if asks_kind_help(argv):
        return print_kind_help(argv)
    args, rest = parse_args(argv)
    adapter, continue_from = adapter_for(args.drafter, rest)  # every mistake in the arguments and data before any work
    if args.lora and continue_from is None:
        raise InputError("--lora adapts an existing drafter: pass --drafter PATH.")
    check_output_dir(args, adapter.options)
    check_data(args)
    adapter.check(args, continue_from)
    if args.tf32 and torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    accelerator = Accelerator(cpu=not torch.cuda.is_available(),  # CPU-only: gloo between processes
                              mixed_precision="bf16" if args.dtype == "bfloat16" else "no",
                              kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(hours=12))])
    is_main, world = accelerator.is_main_process, accelerator.num_processes
    threads = args.threads or max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    output_dir = Path(args.output_dir)
    log_path = output_dir / "training_log.jsonl"

    def log(record: dict) -> None:
        if is_main:
            line = json.dumps({"time": round(time.time(), 1), **record})
            tqdm.write(line)
            with log_path.open("a") as f:
                f.write(line + "\n")

    if is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        if args.overwrite:  # nothing of the run it replaces stays
            for name in ("checkpoints", "custom_generate"):
                if (output_dir / name).is_dir() and (name != "custom_generate" or is_bundle(output_dir / name)):
                    shutil.rmtree(output_dir / name)
            for name in ("training_log.jsonl", "model.safetensors", "config.json", "generation_config.json"):
                (output_dir / name).unlink(missing_ok=True)
        (output_dir / RUN_COMPLETE).unlink(missing_ok=True)  # written last: its absence marks a run in progress
        best, old = output_dir / "checkpoints" / "best", output_dir / "checkpoints" / "best.old"
        if not best.exists() and old.exists():  # killed mid-swap: the previous best drafter comes back
            old.rename(best)
        write_atomically(run_args_path(output_dir), json.dumps(run_arguments(args, adapter.options), indent=2))
    set_seed(args.seed)
    with accelerator.main_process_first():
        target, tokenizer = load_target(args, accelerator.device)
        teacher = load_teacher(args, target, accelerator.device)
    features = adapter.feature_modules(teacher, continue_from) if adapter.reads_target_features else None
    train, heldout = prepare_data(args, accelerator, teacher, tokenizer, features)
    if args.extra_data:
        extra = [TeacherData.load(Path(f) / "train.safetensors") for f in args.extra_data.split(",") if f]
        for part, folder in zip(extra, [f for f in args.extra_data.split(",") if f]):
            part.meta = {**json.loads((Path(folder) / "meta.json").read_text()), "cache_folder": folder}
    if adapter.reads_target_features:  # the target's hidden states, cached beside each teacher-data folder
        with accelerator.main_process_first():
            for part in [train, heldout] + (extra if args.extra_data else []):
                name = "heldout" if part is heldout else "train"
                attach_target_features(teacher, part, Path(part.meta["cache_folder"]) / f"features-{name}-{features[1]}.npy",
                                       features[0], accelerator.is_main_process)
    del teacher
    if args.extra_data:
        meta = train.meta
        train = TeacherData.concat([train] + extra)
        train.meta = {**meta, "extra_data": args.extra_data}
    if args.prepare_only:
        accelerator.wait_for_everyone()
        return {"data": train.meta}
    if args.max_train_tokens:
        full = train
        train = full.subset(args.max_train_tokens, args.seed)
        train.meta = {**full.meta, "train_records": len(train), "train_target_tokens": int(train.t["tgt_off"][-1]),
                      "subset_of": {"records": len(full), "target_tokens": int(full.t["tgt_off"][-1])}}
    if adapter.reads_target_features and args.on_policy_ratio > 0:
        raise InputError(f"--on-policy-ratio is not supported with --drafter {args.drafter} (its data needs the target's "
                         "hidden states); pass --on-policy-ratio 0.")
    if len(train) < args.batch_size * world:
        raise InputError(f"Only {len(train)} training sequences for a global batch of {args.batch_size * world}; lower "
                         "--batch-size or make more data (--num-generate, --num-score).")

    vocab = target.config.get_text_config().vocab_size
    drafter = build_drafter(adapter, continue_from, args, target, train.target_token_counts(vocab), eos_ids(target, tokenizer))
    trainable = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=args.learning_rate, betas=(0.9, 0.98), weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(args))
    state = TrainState()
    model, optimizer = accelerator.prepare(drafter, optimizer)
    cols = column_map(model, vocab, accelerator.device)
    inner = unwrap_drafter(model)
    draft_vocab = getattr(inner, "draft_vocab", None)
    coverage = None
    if draft_vocab is not None:
        in_vocab = torch.isin(heldout.t["ids"][:, 0].long(), draft_vocab.cpu())
        coverage = float(in_vocab.float().mean()) if len(in_vocab) else None

    resumed_from = None
    if args.resume:
        found = latest_checkpoint(output_dir)
        if found is None:
            log({"event": "resume", "note": "no checkpoint found; starting from scratch"})
        else:
            load_checkpoint(accelerator, model, optimizer, state, found)
            scheduler.load_state_dict(state.scheduler)
            resumed_from = str(found)
            saved_best = best_folder(output_dir)  # an eval after the checkpoint may have saved a better drafter
            measured = json.loads((saved_best / "config.json").read_text()).get("measured") if saved_best else None
            if measured and (state.best is None or measured["mean_accepted_tokens"] > state.best["mean_accepted_tokens"]):
                state.best, state.best_step = {k: v for k, v in measured.items() if k != "step"}, measured["step"]
            log({"event": "resume", "checkpoint": resumed_from, "step": state.step, "best_step": state.best_step})
    accelerator.wait_for_everyone()

    n_params = sum(p.numel() for p in inner.parameters())
    log({"event": "start", "args": run_arguments(args, adapter.options), "processes": world, "threads": threads, "train_sequences": len(train),
         "train_target_tokens": int(train.t["tgt_off"][-1]), "heldout_sequences": len(heldout),
         "drafter_parameters": n_params, "trainable_parameters": sum(p.numel() for p in trainable),
         "draft_vocab_size": None if draft_vocab is None else len(draft_vocab), "heldout_draft_vocab_coverage": coverage,
         "data_throughput": train.meta.get("throughput"), "data_cache": train.meta.get("cache_folder"),
         "rows_skipped": train.meta.get("skipped")})

    def training_info(step: int) -> dict:
        return {"data": data_description(args), "datasets": dataset_ids(args), "teacher_data": args.teacher_data, "train_sequences": len(train),
                "train_target_tokens": int(train.t["tgt_off"][-1]), "top_k": args.top_k, "loss": args.loss,
                "on_policy_ratio": args.on_policy_ratio, "steps": step, "batch_size": args.batch_size * world,
                "learning_rate": args.learning_rate, "lora": args.lora, "seed": args.seed,
                "heldout_draft_vocab_coverage": coverage, "command": training_command(accelerator, sys.argv[1:] if argv is None else list(argv))}

    def run_eval() -> dict:
        metrics = evaluate(accelerator, adapter, model, target, tokenizer, heldout, args)
        log({"event": "eval", "step": state.step, **metrics})
        if state.best is None or metrics["mean_accepted_tokens"] > state.best["mean_accepted_tokens"]:
            state.best, state.best_step = metrics, state.step
            plain = mergeable_copy(model) if is_main else None
            if is_main:
                plain.config.measured = {**metrics, "step": state.step}
                plain.config.training = training_info(state.step)
                was_training = plain.training
                held = collate([heldout.record(i) for i in range(len(heldout))], tokenizer.pad_token_id)
                for key, value in adapter.measure(plain.eval(), held).items():
                    setattr(plain.config, key, value)
                plain.train(was_training)
                save_drafter(plain, output_dir / "checkpoints" / "best")
        accelerator.wait_for_everyone()
        return metrics

    global_batch = args.batch_size * world
    lengths = train.lengths()
    batches, batches_epoch = None, -1
    model.train()
    bar = tqdm(total=args.max_steps, initial=state.step, desc="distill", disable=not is_main, unit="step")
    t0, tokens_done, steps_run, last_metrics = time.perf_counter(), 0, 0, None
    while state.step < args.max_steps:
        if batches_epoch != state.epoch:
            batches, batches_epoch = epoch_batches(lengths, state.epoch, global_batch, args.seed), state.epoch
        indices = batches[state.batch_in_epoch][accelerator.process_index :: world]
        records = [train.record(i) for i in indices]
        on_policy = random.Random(args.seed * 7919 + state.step).random() < args.on_policy_ratio
        if on_policy:
            records = on_policy_records(model, target, records, args, tokenizer)
        batch = {k: v.to(accelerator.device) for k, v in collate(records, tokenizer.pad_token_id).items()}
        loss, logits, teacher = adapter.loss(model, batch, cols, args)
        accelerator.backward(loss)
        grad_norm = accelerator.clip_grad_norm_(trainable, args.max_grad_norm) if args.max_grad_norm > 0 else None
        optimizer.step()
        scheduler.step()
        state.scheduler = scheduler.state_dict()
        optimizer.zero_grad(set_to_none=True)
        hits, n = top1_hits(logits.detach(), teacher, model)
        sums = torch.tensor([loss.item(), hits, n], dtype=torch.float64, device=accelerator.device)
        loss_sum, hits_sum, teacher_tokens = accelerator.reduce(sums, "sum").tolist()  # one collective for the three
        state.step += 1
        steps_run += 1
        state.batch_in_epoch += 1
        if state.batch_in_epoch == len(batches):
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
        state.last_loss = loss_sum / world
        tokens_done += int(teacher_tokens)
        bar.update(1)
        bar.set_postfix(loss=f"{state.last_loss:.4f}")
        if state.step % args.log_every == 0 or state.step == args.max_steps:
            elapsed = time.perf_counter() - t0
            log({"event": "train", "step": state.step, "epoch": state.epoch, "loss": state.last_loss,
                 "top1": hits_sum / max(teacher_tokens, 1), "lr": scheduler.get_last_lr()[0], "on_policy": on_policy,
                 "grad_norm": None if grad_norm is None else float(grad_norm),
                 "target_tokens_per_second": tokens_done / elapsed, "seconds_per_step": elapsed / max(1, steps_run)})
        if args.eval_every > 0 and state.step % args.eval_every == 0:
            last_metrics = run_eval()
        out_of_time = args.time_budget > 0 and time.perf_counter() - t0 > 3600 * args.time_budget
        out_of_time = bool(accelerator.reduce(torch.tensor(float(out_of_time), device=accelerator.device), "sum") > 0)
        if (args.save_every > 0 and state.step % args.save_every == 0) or (out_of_time and state.step < args.max_steps):
            save_checkpoint(accelerator, model, optimizer, state, output_dir, args.keep_checkpoints)
        if out_of_time and state.step < args.max_steps:
            log({"event": "time budget", "step": state.step, "hours": args.time_budget, "note": "resume with --resume"})
            break
    bar.close()

    if last_metrics is None or args.eval_every <= 0 or state.step % args.eval_every:
        last_metrics = run_eval()  # the final weights are always evaluated
    summary = {"final_step": state.step, "stopped_by_time_budget": state.step < args.max_steps, "final_loss": state.last_loss, "best_step": state.best_step, "best": state.best,
               "resumed_from": resumed_from, "data": {k: train.meta.get(k) for k in ("throughput", "train_records",
                                                                                    "train_target_tokens", "subset_of", "cache_folder", "skipped")}}
    if is_main:
        final = AutoDrafter.from_pretrained(best_folder(output_dir), dtype=torch.float32)
        final.config.training = training_info(state.step)
        final.config.training["best_step"] = state.best_step
        publish_drafter(final, tokenizer, output_dir, args, summary)
        log({"event": "done", **{k: v for k, v in summary.items() if k != "data"}})
        if args.push_to_hub:
            repo_id = args.hub_model_id or output_dir.name
            log({"event": "push", "repo_id": repo_id, "url": push_to_hub(output_dir, repo_id, args.hub_private)})
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return summary


if __name__ == "__main__":
    relaunch_for_cpu_processes()
    run_command(main)
