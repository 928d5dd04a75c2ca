"""SpecDrafterForCausalLM: borrowed embeddings / LM head, reduced vocabulary, saving, Auto registration, exactness."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, LlamaConfig, LlamaForCausalLM

import hf_specdec
from hf_specdec.kinds.draft_model.model import (
    SpecDrafterConfig,
    SpecDrafterForCausalLM,
    TargetNotBoundError,
    drafter_config_from_target,
)
from tests.speculation import assert_speculated, quiet_last_layer

VOCAB = 96


def tiny_target(hidden=64, vocab=VOCAB, seed=0, tie=False):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=None, pad_token_id=0,
        initializer_range=0.3, tie_word_embeddings=tie,
    )
    return LlamaForCausalLM(config).eval()


def tiny_drafter(target, layers=1, draft_vocab_size=0, seed=1):
    torch.manual_seed(seed)
    drafter = SpecDrafterForCausalLM(drafter_config_from_target(target.config, num_hidden_layers=layers,
                                                                draft_vocab_size=draft_vocab_size))
    with torch.no_grad():  # larger weights than the default init, so that drafts vary
        for p in drafter.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    if draft_vocab_size:
        drafter.set_draft_vocab(torch.randperm(VOCAB)[:draft_vocab_size])
    return drafter.eval()


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only add contention
    yield
    torch.set_num_threads(threads)


def test_auto_classes_know_the_drafter():
    config = AutoConfig.for_model("hf_specdec_drafter", vocab_size=VOCAB, hidden_size=64, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=128, num_hidden_layers=1)
    assert isinstance(config, SpecDrafterConfig)
    model = AutoModelForCausalLM.from_config(config)
    assert isinstance(model, SpecDrafterForCausalLM)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        SpecDrafterConfig(vocab_size=10, draft_vocab_size=11)


def test_using_it_unbound_says_how_to_bind():
    drafter = tiny_drafter(tiny_target())
    with pytest.raises(TargetNotBoundError, match=r"bind_target\(target\).*assistant="):
        drafter(torch.tensor([[1, 2, 3]]))
    assert not drafter.is_bound


def test_bind_shares_the_targets_tensors_and_is_idempotent():
    target = tiny_target()
    drafter = tiny_drafter(target)
    assert drafter.bind_target(target) is drafter
    assert drafter.get_input_embeddings().weight is target.get_input_embeddings().weight
    assert drafter.get_output_embeddings().weight is target.get_output_embeddings().weight
    drafter(torch.tensor([[1, 2, 3]]))
    rows = drafter.lm_head._rows
    assert rows[1].data_ptr() == target.lm_head.weight.data_ptr()  # full vocabulary: no copy at all
    drafter.bind_target(target)
    assert drafter.lm_head._rows is rows  # binding the same target again changes nothing
    names = set(drafter.state_dict())
    assert not any("embed" in n or "lm_head.weight" in n for n in names)
    assert sum(p.numel() for p in drafter.parameters()) < target.get_input_embeddings().weight.numel() + 40_000
    # deepcopy (e.g. to merge LoRA) shares the target instead of copying it
    assert copy.deepcopy(drafter).get_output_embeddings().weight is target.lm_head.weight


def test_bind_rejects_another_targets_shapes():
    drafter = tiny_drafter(tiny_target())
    with pytest.raises(ValueError, match="hidden size is 64"):
        drafter.bind_target(tiny_target(hidden=32))
    with pytest.raises(ValueError, match="vocabulary"):
        drafter.bind_target(tiny_target(vocab=VOCAB + 8))


def test_tied_target_embeddings_work():
    target = tiny_target(tie=True)
    drafter = tiny_drafter(target).bind_target(target)
    assert drafter.get_output_embeddings().weight is target.get_input_embeddings().weight
    assert drafter(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, VOCAB)


def test_reduced_vocabulary_logits():
    target = tiny_target()
    drafter = tiny_drafter(target, draft_vocab_size=40).bind_target(target)
    ids = torch.randint(2, VOCAB, (2, 7))
    full = drafter(ids).logits
    assert full.shape == (2, 7, VOCAB)
    inside = torch.zeros(VOCAB, dtype=torch.bool)
    inside[drafter.draft_vocab] = True
    assert torch.isfinite(full[..., inside]).all() and torch.isneginf(full[..., ~inside]).all()
    hidden, _ = drafter.model(input_ids=ids)
    expected = hidden @ target.lm_head.weight[drafter.draft_vocab].T  # the target's own rows, nothing learned
    torch.testing.assert_close(full[..., drafter.draft_vocab], expected)
    small = drafter(ids, full_vocab_logits=False).logits
    torch.testing.assert_close(small, expected)
    mask = torch.zeros(2, 7, dtype=torch.bool)
    mask[0, 3:], mask[1, 1] = True, True
    torch.testing.assert_close(drafter(ids, logits_to_keep=mask, full_vocab_logits=False).logits, expected[mask])
    torch.testing.assert_close(drafter(ids, logits_to_keep=1).logits, full[:, -1:])


def test_cache_matches_full_forward_and_generate_works():
    target = tiny_target()
    drafter = tiny_drafter(target, layers=2, draft_vocab_size=50).bind_target(target)
    ids = torch.randint(2, VOCAB, (1, 9))
    full = drafter(ids).logits
    cache = DynamicCache(config=drafter.config)
    first = drafter(ids[:, :5], cache=cache, use_cache=True).logits
    rest = [drafter(ids[:, i : i + 1], cache=cache, use_cache=True).logits for i in range(5, 9)]
    torch.testing.assert_close(torch.cat([first, *rest], 1), full, atol=1e-5, rtol=1e-5)
    out = drafter.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 15) and torch.isin(out[0, 9:], drafter.draft_vocab).all()


def test_save_writes_only_the_drafters_weights_and_loads_silently(tmp_path, caplog):
    target = tiny_target()
    drafter = tiny_drafter(target, layers=2, draft_vocab_size=40)
    drafter.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        dtypes = {f.get_tensor(k).dtype for k in keys}
    assert "lm_head.draft_vocab" in keys and not any("embed" in k or "lm_head.weight" in k for k in keys)
    assert dtypes == {torch.float16, torch.int64}  # config.save_dtype
    with caplog.at_level(logging.WARNING):
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert not [r for r in caplog.records if "missing" in r.getMessage().lower() or "newly initialized" in r.getMessage()]
    assert isinstance(loaded, SpecDrafterForCausalLM) and loaded.dtype == torch.float32 and not loaded.is_bound
    assert torch.equal(loaded.draft_vocab, drafter.draft_vocab)
    ids = torch.randint(2, VOCAB, (1, 6))
    drafter.bind_target(target)
    loaded.bind_target(target)
    a, b = drafter(ids).logits, loaded(ids).logits
    torch.testing.assert_close(a[torch.isfinite(a)], b[torch.isfinite(b)], atol=0.05, rtol=0.01)  # fp16 storage


def test_a_smollm2_sized_drafter_fits_the_size_budget(tmp_path):
    smollm2 = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                          rope_parameters={"rope_type": "default", "rope_theta": 100000.0})
    drafter = SpecDrafterForCausalLM(drafter_config_from_target(smollm2, num_hidden_layers=2, draft_vocab_size=8192))
    drafter.save_pretrained(tmp_path)
    size_mb = (tmp_path / "model.safetensors").stat().st_size / 2**20
    assert 10 < size_mb < 25, size_mb


@pytest.mark.parametrize("draft_vocab_size", [0, 60])
def test_speculative_decoding_with_the_drafter_is_exact(draft_vocab_size):
    target = quiet_last_layer(tiny_target())
    drafter = tiny_drafter(target, draft_vocab_size=draft_vocab_size)  # unbound: generate() binds it
    with torch.no_grad():  # the target's first layer and final norm: a drafter that often agrees
        drafter.model.layers[0].load_state_dict(target.model.layers[0].state_dict())
        drafter.model.norm.load_state_dict(target.model.norm.state_dict())
    stats = hf_specdec.SpeculationStats()
    for seed in range(4):
        prompt = torch.randint(2, VOCAB, (1, 5 + seed), generator=torch.Generator().manual_seed(seed))
        plain = target.generate(prompt, max_new_tokens=24, do_sample=False)
        spec = target.generate(prompt, max_new_tokens=24, do_sample=False, custom_generate=hf_specdec.speculative_generate,
                               assistant=drafter, num_draft_tokens=4, speculation_stats=stats, draft_length="constant")
        assert torch.equal(plain, spec)
    assert drafter.is_bound
    assert_speculated(stats, depth=3)
    # sampling runs too (q is zero outside the draft vocabulary; the target still decides every token)
    out = target.generate(prompt, max_new_tokens=8, do_sample=True, custom_generate=hf_specdec.speculative_generate,
                          assistant=drafter, num_draft_tokens=3, draft_length="constant")
    assert out.shape[1] == prompt.shape[1] + 8
