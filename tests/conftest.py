"""Tiny randomly initialised models of several architectures, and tiny tokenizers, built in the tests (nothing is
downloaded)."""

from __future__ import annotations

import copy
import os
import random
import string
from pathlib import Path

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from hf_specdec.default_model import DEFAULT_TARGET_NAME
from hf_specdec.speed.machine import cache_dir


def _own_cache_folder() -> None:
    """The tests time CPU paths and step costs under their own load (two workers at once): written to the cache folder
    they would replace the machine's quiet measurements, which every later call then takes (a run of the suite left a
    one-token step at 53 ms instead of 35 here). Each test process gets a folder of its own, sharing only the converted
    default target, which does not depend on load (made in the usual folder on first use, as before)."""
    import atexit
    import shutil
    import tempfile

    kept = cache_dir() / DEFAULT_TARGET_NAME
    kept.mkdir(parents=True, exist_ok=True)
    own = Path(tempfile.mkdtemp(prefix="hf_specdec_tests_"))
    (own / DEFAULT_TARGET_NAME).symlink_to(kept, target_is_directory=True)
    os.environ["HF_SPECDEC_CACHE"] = str(own)
    atexit.register(shutil.rmtree, own, ignore_errors=True)  # (the link inside is removed, not what it points to)


_own_cache_folder()

import hf_specdec.generation.step as step  # noqa: E402

# Under pytest-xdist each worker gets one core; oversubscribed OpenMP threads would make everything crawl.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)

VOCAB = 96

#: where the device-aware tests (tests/test_sampling_exact.py) put their models: the CPU, or a GPU when a run sets
#: HF_SPECDEC_TEST_DEVICE=cuda (benchmarks/gpu/figures.sh runs the distribution tests there)
DEVICE = torch.device(os.environ.get("HF_SPECDEC_TEST_DEVICE", "cpu"))


def _tiny_llama_like(config_class, model_class, vocab, seed, layers, tie_word_embeddings, overrides):
    torch.manual_seed(seed)
    config = config_class(
        vocab_size=vocab, hidden_size=48, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=None, pad_token_id=0,
        initializer_range=0.3, tie_word_embeddings=tie_word_embeddings, **overrides,
    )
    return model_class(config).eval()


def tiny_llama(vocab=VOCAB, seed=0, layers=2, **overrides):
    return _tiny_llama_like(LlamaConfig, LlamaForCausalLM, vocab, seed, layers, False, overrides)


def tiny_gpt2(vocab=VOCAB, seed=0, layers=2, **overrides):
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab, n_embd=48, n_layer=layers, n_head=4, n_positions=256, bos_token_id=1, eos_token_id=None,
        pad_token_id=0, initializer_range=0.3, **overrides,
    )
    return GPT2LMHeadModel(config).eval()


def tiny_qwen2(vocab=VOCAB, seed=0, layers=2, **overrides):
    return _tiny_llama_like(Qwen2Config, Qwen2ForCausalLM, vocab, seed, layers, True, overrides)


ARCHITECTURES = {"llama": tiny_llama, "gpt2": tiny_gpt2, "qwen2": tiny_qwen2}


def perturbed_copy(model, scale=0.05, seed=1):
    """A drafter that mostly agrees with `model`: the same weights plus a little noise."""
    torch.manual_seed(seed)
    drafter = copy.deepcopy(model)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn_like(p) * scale * p.std().clamp_min(1e-3))
    return drafter


def random_prompts(n, vocab=VOCAB, min_len=3, max_len=12, seed=123):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g)
    return [torch.randint(2, vocab, (1, int(length)), generator=g) for length in lengths]


@pytest.fixture(params=sorted(ARCHITECTURES))
def arch(request):
    return request.param


def tiny_char_tokenizer():
    """A character-level fast tokenizer over VOCAB symbols, built offline (for stop strings and streamers)."""
    chars = [c for c in string.printable if c not in "\t\n\r\x0b\x0c"][: VOCAB - 2]
    vocab = {"<pad>": 0, "<s>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>")


# Two offline tokenizers over a small alphabet (for cross-tokenizer drafting): a character-level one and a BPE one
# trained on a few hundred random "sentences".
ALPHABET = "abcdef"


def sentences(n, seed=0):
    rng = random.Random(seed)
    words = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 5))) for _ in range(40)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + "." for _ in range(n)]


def bpe_tokenizer(vocab_size=60):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="_", prepend_scheme="never")
    tok.decoder = decoders.Metaspace(replacement="_", prepend_scheme="never")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<eos>"], initial_alphabet=list(ALPHABET + "._"), show_progress=False
    )
    tok.train_from_iterator(sentences(400), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def char_tokenizer():
    vocab = {"<eos>": 0, **{c: i + 1 for i, c in enumerate(ALPHABET + " .")}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: one token per character
    tok.add_special_tokens(["<eos>"])
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread, and far more steadily when other processes share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_addoption(parser):
    parser.addoption(
        "--no-drafts", action="store_true",
        help="every drafter proposes nothing inside generate(): the exactness tests that claim speculation must then "
             "fail (a check that they cannot pass vacuously)")


@pytest.fixture(autouse=True)
def _no_drafts(request, monkeypatch):
    if request.config.getoption("--no-drafts"):
        monkeypatch.setattr(step, "propose", lambda drafter, seqs, max_draft: step.Draft.empty(seqs.size, "cpu"))
