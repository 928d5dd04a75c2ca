"""Evaluation through the REAL decoding loop (`speculative_generate`, greedy, k drafts, held-out prompts), and the
teacher-forced top-1 agreement beside it."""

from __future__ import annotations

import torch
from accelerate.utils import gather_object

import hf_specdec

from .adapters import Adapter, unwrap_drafter
from .arguments import Args
from .data import TeacherData, collate
from .target import greedy_generation_config


def column_map(model, vocab_size: int, device) -> torch.Tensor | None:
    """token id -> column of the drafter's logits (-1: outside the draft vocabulary); None when columns are ids."""
    draft_vocab = getattr(unwrap_drafter(model), "draft_vocab", None)
    if draft_vocab is None:
        return None
    cols = torch.full((vocab_size,), -1, dtype=torch.long, device=device)
    cols[draft_vocab] = torch.arange(len(draft_vocab), device=device)
    return cols


def draft_vocab_coverage(model, heldout: TeacherData) -> float | None:
    """How often the target's held-out top-1 token lies in the drafter's reduced vocabulary (None: it has none)."""
    draft_vocab = getattr(unwrap_drafter(model), "draft_vocab", None)
    if draft_vocab is None or not len(heldout):
        return None
    return float(torch.isin(heldout.t["ids"][:, 0].long(), draft_vocab.cpu()).float().mean())


def top1_hits(logits: torch.Tensor, tgt_ids: torch.Tensor, model) -> tuple[int, int]:
    """(drafter argmax == target argmax, tokens)."""
    pred = logits.argmax(-1)
    draft_vocab = getattr(unwrap_drafter(model), "draft_vocab", None)
    if draft_vocab is not None:
        pred = draft_vocab[pred]
    return int((pred == tgt_ids[:, 0]).sum()), len(pred)


@torch.no_grad()
def evaluate(accelerator, adapter: Adapter, model, target, tokenizer, heldout: TeacherData, args: Args) -> dict:
    """Held-out top-1 agreement (teacher-forced) and speculative decoding (greedy, k drafts) against the target."""
    inner = unwrap_drafter(model)
    was_training = inner.training
    inner.eval()
    rank, world = accelerator.process_index, accelerator.num_processes
    k = args.num_draft_tokens
    mine = list(range(len(heldout)))[rank::world]
    hits = total = 0
    for b in range(0, len(mine), args.batch_size):
        batch = collate([heldout.record(i) for i in mine[b : b + args.batch_size]], tokenizer.pad_token_id)
        batch = {key: v.to(accelerator.device) for key, v in batch.items()}
        h, n = top1_hits(*adapter.logits(inner, batch), inner)
        hits, total = hits + h, total + n
    stats = hf_specdec.SpeculationStats()
    config = greedy_generation_config(target, args.eval_max_new_tokens, tokenizer.pad_token_id)
    n_prompts = min(len(heldout), args.eval_prompts or len(heldout))
    for i in list(range(n_prompts))[rank::world]:
        r = heldout.record(i)
        prompt = r["tokens"][None, : r["start"]].long().to(accelerator.device)
        target.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), generation_config=config,
                        custom_generate=hf_specdec.speculative_generate, num_draft_tokens=k,
                        assistant=adapter.kind.drafter_for(inner, adapter.options),  # as its options say (`--tree`)
                        draft_length="constant",  # acceptance at every one of the k positions
                        speculation_stats=stats)
    inner.train(was_training)
    everyone = hf_specdec.SpeculationStats()
    for part in (gather_object([stats]) if world > 1 else [stats]):
        everyone.merge(part)
    hits, total = accelerator.reduce(torch.tensor([hits, total], dtype=torch.float64, device=accelerator.device), "sum").tolist()
    by_position = everyone.acceptance_by_position
    return {
        "mean_accepted_tokens": everyone.mean_accepted_tokens,
        "acceptance_rate": everyone.acceptance_rate,
        "acceptance_by_position": [by_position[i] if i < len(by_position) else 0.0 for i in range(k)],
        "heldout_top1": hits / max(total, 1),
        "num_draft_tokens": k,
        "eval_prompts": n_prompts,
        "eval_max_new_tokens": args.eval_max_new_tokens,
        "target_forwards": everyone.target_forwards,
        "emitted_tokens": everyone.emitted_tokens,
        "drafted_tokens": everyone.drafted_tokens,
        "accepted_tokens": everyone.accepted_tokens,
        "draft_ms_per_token": 1000 * everyone.draft_seconds / max(everyone.drafted_tokens, 1),
        "target_ms_per_forward": 1000 * everyone.target_seconds / max(everyone.target_forwards, 1),
    }
