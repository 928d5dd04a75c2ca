"""A tiny world to distill in, built offline: a random target with a word-level tokenizer and a chat template, and
conversations to train on (for tests/test_distill.py and the distill example's test); and the environment the
trainer's subprocesses run in."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


def build_tiny_world(root: Path) -> dict:
    """A 2-layer random Llama target (all projection widths multiples of 32, as bitsandbytes' 4-bit CPU kernel needs),
    a word-level tokenizer with a chat template, 80 conversations (JSONL) and a 'dev' file excluding one of them."""
    specials = ["<pad>", "<s>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
    words = [f"w{i}" for i in range(90)]
    vocab = {t: i for i, t in enumerate(specials + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="<|end|>")
    tokenizer.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
                               "{% if add_generation_prompt %}<|assistant|> {% endif %}")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0, initializer_range=0.3, tie_word_embeddings=False)
    target = root / "target"
    LlamaForCausalLM(config).save_pretrained(target)
    tokenizer.save_pretrained(target)
    rng = random.Random(0)
    rows = []
    for i in range(80):
        prompt = " ".join(rng.choice(words) for _ in range(rng.randint(3, 10)))
        reply = " ".join(rng.choice(words) for _ in range(rng.randint(5, 20)))
        rows.append({"id": f"c{i}_0", "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]})
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "dev.jsonl").write_text(json.dumps({"id": "c0_0", "prompt": rows[0]["messages"][0]["content"]}) + "\n")
    return {"root": root, "target": target, "data": root / "data.jsonl", "dev": root / "dev.jsonl",
            "excluded_prompt": rows[0]["messages"][0]["content"]}


def subprocess_env():
    """The environment of a trainer run in a subprocess: one thread, unbuffered output, offline."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1", "PYTHONFAULTHANDLER": "1"}


def run_or_show_stacks(command: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run(command, capture_output=True, text=True)`, except that a run still going after `timeout` seconds
    is not just killed: every process it started (the launcher's workers live in sessions of their own) is sent SIGABRT
    first, which PYTHONFAULTHANDLER turns into each thread's Python stack on stderr, and the test fails showing them: a
    hang in CI then says where each process waited."""
    import psutil

    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        family = psutil.Process(process.pid).children(recursive=True) + [psutil.Process(process.pid)]
        for member in family:
            with contextlib.suppress(psutil.Error):
                member.send_signal(signal.SIGABRT)
        time.sleep(3)
        for member in family:
            with contextlib.suppress(psutil.Error):
                member.kill()
        stdout, stderr = process.communicate()
        raise AssertionError(f"{command[:3]}... still ran after {timeout} s; the stacks of its processes:\n"
                             f"{stderr[-12000:]}\n--- stdout ---\n{stdout[-3000:]}") from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
