"""Distil a drafter to a target AS DEPLOYED (same weights, same quantization), for exact speculative decoding.

    accelerate launch training/distill.py --target default --target-quantization 8bit --max-steps 2000 \
        --output-dir runs/smollm2-drafter
    python training/distill.py ...                                   # the same, one process
    accelerate launch --cpu --num_processes 2 training/distill.py ...  # two CPU processes (gloo; accelerate itself
                                       # starts one here: see launch.py)
    python -m training.distill ...                                   # the module form works too

This file is the run, top to bottom: check the arguments and data, load the target, prepare (or read) the teacher
data, build the drafter, train, evaluate through the real decoding loop, checkpoint, publish, push. What it uses is
the package's library half, `hf_specdec/training/` (the built-in kinds' training code imports it too, so it ships
in the wheel):
  arguments.py    the arguments (one dataclass, `HfArgumentParser`) and the output-folder rules (--resume, --overwrite)
  target.py       the target as deployed (fp32/bf16, bitsandbytes 8/4-bit) and its top-K
  sources.py      the conversations (ShareGPT, JSON lines, datasets), with the dev prompts kept out
  prepare.py      teacher data (the target's own answers and/or the target scoring existing turns), cached on disk
                  (--prepare-only makes it and stops)
  data.py         the teacher data's files and the training batches
  adapters.py     the interface of a kind's training (build, feed, score) and its own options; the built-in kinds'
                  adapters in hf_specdec/kinds/<kind>/training.py (named by each kind's registration)
  on_policy.py    batches the drafter continues and the target scores (--on-policy-ratio)
  losses.py       fkl, rkl, tvd, jsd, the LK losses, ce on the target's top-K + "rest" buckets
  evaluate.py     acceptance through `speculative_generate` on held-out prompts
  checkpoints.py  checkpoints, the best drafter, the published folder, card and push (all written atomically)
  launch.py       `accelerate launch --cpu --num_processes N`: the N gloo processes
"""

from __future__ import annotations

import copy
import logging
import math
import os
import random
import sys
import time
from datetime import timedelta
from pathlib import Path

from hf_specdec.errors import InputError, debugging, one_line
from hf_specdec.training.arguments import asks_kind_help, parse_args


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
from tqdm.auto import tqdm  # noqa: E402

from hf_specdec.assistants.auto_drafter import AutoDrafter  # noqa: E402

from hf_specdec.training.adapters import Adapter, adapter_for, print_kind_help, unwrap_drafter  # noqa: E402
from hf_specdec.training.arguments import Args, autocast_precision, check_output_dir, run_arguments  # noqa: E402
from hf_specdec.training.checkpoints import (  # noqa: E402
    RunLog, TrainState, best_folder, data_description, dataset_ids, publish_drafter, push_to_hub, resume,
    save_checkpoint, save_drafter, start_output_dir, training_command)
from hf_specdec.training.data import collate, epoch_batches  # noqa: E402
from hf_specdec.training.evaluate import column_map, draft_vocab_coverage, evaluate, top1_hits  # noqa: E402
from hf_specdec.training.launch import relaunch_for_cpu_processes  # noqa: E402
from hf_specdec.training.on_policy import on_policy_records  # noqa: E402
from hf_specdec.training.prepare import load_teacher_data  # noqa: E402
from hf_specdec.training.sources import check_data  # noqa: E402
from hf_specdec.training.states import target_states  # noqa: E402
from hf_specdec.training.target import eos_ids, load_target, load_teacher, target_folder, target_id  # noqa: E402

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


class WarmupCosine:
    """The learning-rate factor: linear warm-up, then cosine down to `min_lr_ratio` at `max_steps`."""

    def __init__(self, args: Args):
        self.warmup, self.steps, self.floor = args.warmup_steps, args.max_steps, args.min_lr_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.steps - self.warmup))
        return self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * progress))


def training_info(args: Args, train, world: int, step: int, coverage, command: str) -> dict:
    """How the drafter was trained, as its config and card record it."""
    return {"data": data_description(args), "datasets": dataset_ids(args), "teacher_data": args.teacher_data,
            "train_sequences": len(train), "train_target_tokens": int(train.t["tgt_off"][-1]), "top_k": args.top_k,
            "loss": args.loss, "on_policy_ratio": args.on_policy_ratio, "steps": step, "batch_size": args.batch_size * world,
            "learning_rate": args.learning_rate, "lora": args.lora, "seed": args.seed,
            "heldout_draft_vocab_coverage": coverage, "command": command}


def evaluate_and_keep_best(accelerator, adapter, model, target, tokenizer, heldout, args: Args, state: TrainState,
                           log: RunLog, info: dict) -> dict:
    """Acceptance through the real decoding loop; a drafter better than the best so far replaces it on disk (with its
    measurements, how it was trained, and what its kind measures on held-out data)."""
    started = time.perf_counter()
    metrics = evaluate(accelerator, adapter, model, target, tokenizer, heldout, args)
    log.write({"event": "eval", "step": state.step, **metrics, "eval_seconds": time.perf_counter() - started})
    if state.best is None or metrics["mean_accepted_tokens"] > state.best["mean_accepted_tokens"]:
        state.best, state.best_step = metrics, state.step
        if accelerator.is_main_process:
            plain = mergeable_copy(model)
            plain.config.measured, plain.config.training = {**metrics, "step": state.step}, info
            was_training = plain.training
            held = collate([heldout.record(i) for i in range(len(heldout))], tokenizer.pad_token_id)
            for key, value in adapter.measure(plain.eval(), held).items():
                setattr(plain.config, key, value)
            plain.train(was_training)
            save_drafter(plain, Path(args.output_dir) / "checkpoints" / "best")
    accelerator.wait_for_everyone()
    return metrics


COMPILE_BACKEND = "inductor"  # what --compile hands accelerate (tests use "eager": same wrappers, no code generation)


def train_step(accelerator, adapter, model, batch: dict, cols, args: Args, optimizer, scheduler, trainable) -> dict:
    """One optimisation step; the loss and the drafter's teacher-forced top-1 hits summed over processes."""
    with accelerator.autocast():  # (the adapters call submodules too, which the prepared model's forward would miss)
        loss, logits, teacher = adapter.loss(model, batch, cols, args)
    accelerator.backward(loss)
    grad_norm = accelerator.clip_grad_norm_(trainable, args.max_grad_norm) if args.max_grad_norm > 0 else None
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    hits, n = top1_hits(logits.detach(), teacher, model)
    sums = torch.tensor([loss.item(), hits, n], dtype=torch.float64, device=accelerator.device)
    loss_sum, hits_sum, tokens = accelerator.reduce(sums, "sum").tolist()  # one collective for the three
    return {"loss": loss_sum / accelerator.num_processes, "top1": hits_sum / max(tokens, 1), "tokens": int(tokens),
            "grad_norm": None if grad_norm is None else float(grad_norm)}


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
    if adapter.reads_target_features and args.on_policy_ratio > 0:
        raise InputError(f"--on-policy-ratio is not supported with --drafter {args.drafter} (its data needs the target's "
                         "hidden states); pass --on-policy-ratio 0.")
    check_output_dir(args, adapter.options)
    check_data(args)
    adapter.check(args, continue_from)
    if args.tf32 and torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    accelerator = Accelerator(cpu=not torch.cuda.is_available(),  # CPU-only: gloo between processes
                              mixed_precision=autocast_precision(args),
                              dynamo_backend=COMPILE_BACKEND if args.compile else None,
                              kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(hours=12))])
    world = accelerator.num_processes
    threads = args.threads or max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    output_dir, log = Path(args.output_dir), RunLog(Path(args.output_dir), accelerator.is_main_process)
    if accelerator.is_main_process:
        start_output_dir(output_dir, args.overwrite, run_arguments(args, adapter.options))
    set_seed(args.seed)
    with accelerator.main_process_first():
        target, tokenizer = load_target(args, accelerator.device)
        teacher = load_teacher(args, target, accelerator.device)
    train, heldout = load_teacher_data(args, accelerator, adapter, teacher, tokenizer, continue_from)
    del teacher
    if args.prepare_only:
        accelerator.wait_for_everyone()
        return {"data": train.meta}
    if len(train) < args.batch_size * world:
        raise InputError(f"Only {len(train)} training sequences for a global batch of {args.batch_size * world}; lower "
                         "--batch-size or make more data (--num-generate, --num-score).")

    vocab = target.config.get_text_config().vocab_size
    drafter = build_drafter(adapter, continue_from, args, target, train.target_token_counts(vocab), eos_ids(target, tokenizer))
    trainable = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=args.learning_rate, betas=(0.9, 0.98), weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(args))
    state = TrainState()
    model, optimizer = accelerator.prepare(drafter, optimizer)
    cols, coverage = column_map(model, vocab, accelerator.device), draft_vocab_coverage(model, heldout)
    resumed_from = resume(accelerator, model, optimizer, scheduler, state, output_dir, log) if args.resume else None
    accelerator.wait_for_everyone()
    log.write({"event": "start", "args": run_arguments(args, adapter.options), "processes": world, "threads": threads,
               "train_sequences": len(train), "train_target_tokens": int(train.t["tgt_off"][-1]),
               "heldout_sequences": len(heldout), "drafter_parameters": sum(p.numel() for p in unwrap_drafter(model).parameters()),
               "trainable_parameters": sum(p.numel() for p in trainable), "heldout_draft_vocab_coverage": coverage,
               "data_throughput": train.meta.get("throughput"), "data_cache": train.meta.get("cache_folder"),
               "rows_skipped": train.meta.get("skipped")})
    command = training_command(accelerator, argv)
    evaluation = (accelerator, adapter, model, target, tokenizer, heldout, args, state, log)

    online = adapter.feature_modules(target, continue_from)[0] if args.online_features and adapter.reads_target_features else None
    lengths, batches, batches_epoch = train.lengths(), None, -1
    model.train()
    bar = tqdm(total=args.max_steps, initial=state.step, desc="distill", disable=not accelerator.is_main_process, unit="step")
    t0, tokens_done, steps_run, last_metrics = time.perf_counter(), 0, 0, None
    while state.step < args.max_steps:
        if batches_epoch != state.epoch:
            batches, batches_epoch = epoch_batches(lengths, state.epoch, args.batch_size * world, args.seed), state.epoch
        records = [train.record(i) for i in batches[state.batch_in_epoch][accelerator.process_index :: world]]
        on_policy = random.Random(args.seed * 7919 + state.step).random() < args.on_policy_ratio
        if on_policy:
            records = on_policy_records(model, target, records, args, tokenizer)
        batch = {k: v.to(accelerator.device) for k, v in collate(records, tokenizer.pad_token_id).items()}
        if online is not None:
            batch["features"] = target_states(target, batch["input_ids"], online)
        adapter.step = state.step
        step = train_step(accelerator, adapter, model, batch, cols, args, optimizer, scheduler, trainable)
        state.advance(step["loss"], len(batches), scheduler.state_dict())
        steps_run, tokens_done = steps_run + 1, tokens_done + step["tokens"]
        bar.update(1)
        bar.set_postfix(loss=f"{state.last_loss:.4f}")
        if state.step % args.log_every == 0 or state.step == args.max_steps:
            elapsed = time.perf_counter() - t0
            log.write({"event": "train", "step": state.step, "epoch": state.epoch, "loss": state.last_loss, "top1": step["top1"],
                       "lr": scheduler.get_last_lr()[0], "on_policy": on_policy, "grad_norm": step["grad_norm"],
                       "target_tokens_per_second": tokens_done / elapsed, "seconds_per_step": elapsed / steps_run,
                       "steps_run": steps_run})
        if args.eval_every > 0 and state.step % args.eval_every == 0:
            last_metrics = evaluate_and_keep_best(*evaluation, training_info(args, train, world, state.step, coverage, command))
        out_of_time = args.time_budget > 0 and time.perf_counter() - t0 > 3600 * args.time_budget
        out_of_time = bool(accelerator.reduce(torch.tensor(float(out_of_time), device=accelerator.device), "sum") > 0)
        if (args.save_every > 0 and state.step % args.save_every == 0) or (out_of_time and state.step < args.max_steps):
            save_checkpoint(accelerator, model, optimizer, state, output_dir, args.keep_checkpoints)
        if out_of_time and state.step < args.max_steps:
            log.write({"event": "time budget", "step": state.step, "hours": args.time_budget, "note": "resume with --resume"})
            break
    bar.close()

    if last_metrics is None or args.eval_every <= 0 or state.step % args.eval_every:
        last_metrics = evaluate_and_keep_best(*evaluation, training_info(args, train, world, state.step, coverage, command))
    summary = {"final_step": state.step, "stopped_by_time_budget": state.step < args.max_steps, "final_loss": state.last_loss,
               "best_step": state.best_step, "best": state.best, "resumed_from": resumed_from,
               "data": {k: train.meta.get(k) for k in ("throughput", "train_records", "train_target_tokens", "subset_of",
                                                       "cache_folder", "skipped")}}
    if accelerator.is_main_process:
        final = AutoDrafter.from_pretrained(best_folder(output_dir), dtype=torch.float32)
        final.config.training = {**training_info(args, train, world, state.step, coverage, command), "best_step": state.best_step}
        publish_drafter(final, tokenizer, output_dir, args, summary)
        log.write({"event": "done", **{k: v for k, v in summary.items() if k != "data"}})
        if args.push_to_hub:
            repo_id = args.hub_model_id or output_dir.name
            log.write({"event": "push", "repo_id": repo_id, "url": push_to_hub(output_dir, repo_id, args.hub_private)})
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return summary


if __name__ == "__main__":
    relaunch_for_cpu_processes()
    run_command(main)
