"""The target exactly as it is deployed (fp32 or bf16, or bitsandbytes 8/4-bit), and what the trainer reads from it."""

from __future__ import annotations

import copy

import torch

import hf_specdec
from hf_specdec.default_model import DEFAULT_TARGET_NAME, default_target_folder

from .arguments import Args

DEFAULT_TARGET_HUB_ID = f"HuggingFaceTB/{DEFAULT_TARGET_NAME}"


def target_folder(args: Args) -> str:
    return str(default_target_folder()) if args.target in ("", "default") else args.target


def load_target(args: Args, device: torch.device):
    """The target exactly as it will be deployed: fp32, or bitsandbytes 8/4-bit (embeddings and LM head stay fp32)."""
    dtype = getattr(torch, args.dtype)
    model, tokenizer = hf_specdec.default_model.load_target(args.target, args.target_quantization, dtype=dtype, device=device)
    return model.requires_grad_(False), tokenizer


def teacher_dtype(args: Args) -> str:
    return args.dtype if args.teacher_dtype in ("", "same") else args.teacher_dtype


def load_teacher(args: Args, target, device: torch.device):
    """The model the teacher data is computed with: the target itself, or (--teacher-dtype) a second copy in that dtype,
    loaded from the files rather than cast, so the deployed target keeps its own weights."""
    if teacher_dtype(args) == args.dtype:
        return target
    model, _ = hf_specdec.default_model.load_target(args.target, args.target_quantization,
                                                    dtype=getattr(torch, teacher_dtype(args)), device=device)
    return model.requires_grad_(False)


def target_id(args: Args) -> str:
    return DEFAULT_TARGET_HUB_ID if args.target in ("", "default") else args.target


def eos_ids(target, tokenizer) -> list[int]:
    eos = target.generation_config.eos_token_id
    eos = tokenizer.eos_token_id if eos is None else eos
    return [eos] if isinstance(eos, int) else list(eos or [])


def greedy_generation_config(target, max_new_tokens: int, pad_id: int):
    config = copy.deepcopy(target.generation_config)
    config.do_sample, config.temperature, config.top_p, config.top_k = False, None, None, None
    config.max_new_tokens, config.max_length, config.pad_token_id = max_new_tokens, None, pad_id
    config.output_logits = config.return_dict_in_generate = False
    return config


def topk_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-K ids and log-probs, taken where the logits are (the device), then moved to the host: K per token cross,
    not the vocabulary."""
    values, ids = logits.float().log_softmax(-1).topk(k, dim=-1)
    return ids.to(torch.int32).cpu(), values.to(torch.float16).cpu()


def cut_after_eos(tokens: list[int], start: int, eos: list[int]) -> int:
    """Length of `tokens` up to and including the first EOS at or after `start`."""
    for i in range(start, len(tokens)):
        if tokens[i] in eos:
            return i + 1
    return len(tokens)
