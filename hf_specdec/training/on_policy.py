"""On-policy batches (DistillSpec): the drafter continues the batch's prompts, the target scores the continuations."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .adapters import unwrap_drafter
from .arguments import Args
from .data import Source
from .prepare import score_sequences
from .target import cut_after_eos, eos_ids


@torch.no_grad()
def drafter_sample(model, prompts: list[torch.Tensor], max_new: int, temperature: float, eos: list[int], pad: int):
    """On-policy continuations: the drafter samples (left padding, its own KV cache). Returns new tokens per prompt."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :], mask[row, width - len(p) :] = p.long(), 1
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    cache = DynamicCache(config=model.config)
    out_tokens, done = [], torch.zeros(len(prompts), dtype=torch.bool, device=device)
    step_ids = ids
    for _ in range(max_new):
        logits = model(input_ids=step_ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1].float()
        if temperature > 0:
            token = torch.multinomial((logits / temperature).softmax(-1), 1)[:, 0]
        else:
            token = logits.argmax(-1)
        token = token.masked_fill(done, pad)
        out_tokens.append(token)
        done |= torch.isin(token, torch.tensor(eos, device=device))
        if done.all():
            break
        step_ids, positions = token[:, None], positions[:, -1:] + 1
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    new = torch.stack(out_tokens, 1).cpu()
    return [new[row, : cut_after_eos(new[row].tolist(), 0, eos)] for row in range(len(prompts))]


def on_policy_records(model, target, records, args: Args, tokenizer) -> list[dict]:
    """DistillSpec: the drafter continues the batch's prompts, the target scores those continuations."""
    prompts = [r["tokens"][: r["start"]] for r in records]
    was_training = model.training
    inner = unwrap_drafter(model).eval()
    samples = drafter_sample(inner, prompts, args.on_policy_max_new_tokens, args.on_policy_temperature,
                             eos_ids(target, tokenizer), tokenizer.pad_token_id)
    inner.train(was_training)
    sequences = [(p.tolist() + s.tolist(), len(p)) for p, s in zip(prompts, samples) if len(s) >= 1]
    scored, _ = score_sequences(target, sequences, args.top_k, tokenizer.pad_token_id, len(sequences), Source.ON_POLICY)
    return scored
