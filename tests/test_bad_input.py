"""Bad input: a clear error before any work, and the model still works on the next call."""

from __future__ import annotations

import pytest
import torch
from transformers import (MistralConfig, MistralForCausalLM, T5Config, T5ForConditionalGeneration, xLSTMConfig,
                          xLSTMForCausalLM)

import hf_specdec
from hf_specdec import MedusaConfig, MedusaHeads, speculative_generate
from hf_specdec.cache.keyword import CACHE
from hf_specdec.speed.diagnostics import count_forwards
from hf_specdec.drafters import MedusaDrafter, RecycleDrafter
from tests.conftest import perturbed_copy, random_prompts, tiny_llama
from tests.speculation import assert_speculated

PROMPT = random_prompts(1, seed=5)[0]


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama()
    return target, perturbed_copy(target)


def spec(target, assistant, prompt=PROMPT, **kwargs):
    kwargs.setdefault("max_new_tokens", 10)
    kwargs.setdefault("do_sample", False)
    return target.generate(prompt, custom_generate=speculative_generate, assistant=assistant, **kwargs)


def still_works(target, drafter):
    expected = target.generate(PROMPT, max_new_tokens=10, do_sample=False)
    assert torch.equal(spec(target, drafter, num_draft_tokens=3), expected)



@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(num_beams=2), ValueError, "num_beams=1"),
        (dict(num_return_sequences=2, do_sample=True), ValueError, "num_return_sequences=1"),
        (dict(num_draft_tokens=0), ValueError, "num_draft_tokens must be an integer >= 1"),
        (dict(num_draft_tokens=2.5), ValueError, "num_draft_tokens must be an integer >= 1"),
        (dict(output_attentions=True, return_dict_in_generate=True), ValueError, "output_attentions"),
    ],
)
def test_unsupported_modes(pair, kwargs, error, message):
    target, drafter = pair
    calls = []
    handle = target.register_forward_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(error, match=message):
            spec(target, drafter, **kwargs)
    finally:
        handle.remove()
    assert calls == []  # no forward pass happened
    still_works(target, drafter)


def test_vocab_mismatch(pair):
    target, drafter = pair
    other = tiny_llama(vocab=50)
    with pytest.raises(ValueError, match="vocabulary .*50.* differs .*96"):
        spec(target, other)
    still_works(target, drafter)


def test_unknown_assistant_type_lists_what_is_accepted(pair):
    target, drafter = pair
    for bad in (42, torch.nn.Linear(2, 2)):
        with pytest.raises(TypeError, match="a causal-LM `PreTrainedModel`"):
            spec(target, bad)
    with pytest.raises(ValueError, match="Unknown drafter 'medusa-please'.*Known: 'ngram'"):
        spec(target, "medusa-please")
    hf_specdec.enable(target)
    try:
        with pytest.raises(TypeError, match="Unsupported assistant"):
            target.generate(PROMPT, assistant=3.14, max_new_tokens=5)
    finally:
        hf_specdec.disable(target)
    still_works(target, drafter)


def test_enabled_model_takes_both_routes_at_once_but_no_foreign_loop(pair):
    """README shows enable() + assistant= and custom_generate=speculative_generate: together they are one route."""
    target, drafter = pair
    hf_specdec.enable(target)
    try:
        stats = hf_specdec.SpeculationStats()
        out = target.generate(PROMPT, custom_generate=speculative_generate, assistant=drafter, max_new_tokens=10,
                              do_sample=False, num_draft_tokens=3, speculation_stats=stats, draft_length="constant")
        assert stats.target_forwards < 10 and stats.accepted_tokens > 0  # it speculated
        assert torch.equal(out, target.generate(PROMPT, max_new_tokens=10, do_sample=False))

        def foreign(model, *args, **kwargs):
            raise AssertionError("must be refused before it runs")

        with pytest.raises(ValueError, match="cannot go with custom_generate=.*drop one"):
            target.generate(PROMPT, custom_generate=foreign, assistant=drafter, max_new_tokens=5)
    finally:
        hf_specdec.disable(target)
    still_works(target, drafter)


def test_missing_assistant(pair):
    target, drafter = pair
    with pytest.raises(ValueError, match="pass `assistant=`"):
        spec(target, None)
    still_works(target, drafter)


class OneRowDrafter(hf_specdec.SequenceDrafter):
    """A single-sequence drafter: proposes the target's own greedy continuation of one row (wrong in the last draft,
    so that rejections happen too)."""

    def __init__(self, target):
        self.oracle = target

    def propose(self, input_ids, max_tokens):
        assert input_ids.shape[0] == 1
        tokens = self.oracle.generate(input_ids, max_new_tokens=max_tokens, do_sample=False)[:, input_ids.shape[1] :]
        tokens[:, -1] = (tokens[:, -1] + 1) % self.oracle.config.vocab_size
        return hf_specdec.Draft(tokens)


def test_a_drafter_that_cannot_batch_drafts_row_by_row(pair):
    target, drafter = pair
    prompts = random_prompts(2, seed=8)
    width = max(p.shape[1] for p in prompts)
    batch = torch.cat([torch.nn.functional.pad(p, (width - p.shape[1], 0)) for p in prompts])
    mask = torch.cat([torch.nn.functional.pad(torch.ones_like(p), (width - p.shape[1], 0)) for p in prompts])
    stats = hf_specdec.SpeculationStats()
    out = spec(target, OneRowDrafter(target), prompt=batch, attention_mask=mask, pad_token_id=0, num_draft_tokens=3,
               max_new_tokens=16, speculation_stats=stats, draft_length="constant")  # (adaptive may shorten drafts)
    assert torch.equal(out, target.generate(batch, attention_mask=mask, pad_token_id=0, max_new_tokens=16,
                                            do_sample=False))
    assert_speculated(stats, depth=2, rows=2)
    still_works(target, drafter)


def test_drafter_on_another_device(pair):
    target, drafter = pair
    elsewhere = tiny_llama(seed=3).to("meta")
    with pytest.raises(ValueError, match=r"move it first: `drafter.to\('cpu'\)`"):
        spec(target, elsewhere)
    still_works(target, drafter)


def test_encoder_decoder_target():
    config = T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4, decoder_start_token_id=0)
    t5 = T5ForConditionalGeneration(config).eval()
    with pytest.raises(ValueError, match="decoder-only"):
        t5.generate(PROMPT, custom_generate=speculative_generate, assistant="ngram", max_new_tokens=5)
    hf_specdec.enable(t5)
    try:
        with pytest.raises(ValueError, match="decoder-only"):
            t5.generate(PROMPT, assistant="ngram", max_new_tokens=5)
        assert t5.generate(PROMPT, max_new_tokens=5).shape[1] <= 6  # plain generate still works
    finally:
        hf_specdec.disable(t5)


def test_a_cache_class_of_the_models_own_is_refused_before_any_forward():
    """xLSTM keeps its recurrent state in an xLSTMCache, which is no transformers Cache: every drafter crashed in its
    first step (no attribute 'rnn_state') instead of being refused like the other recurrent models."""
    config = xLSTMConfig(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_heads=4, qk_dim_factor=1.0,
                         v_dim_factor=1.0)
    xlstm = xLSTMForCausalLM(config).eval()
    calls = []
    handle = xlstm.register_forward_hook(lambda *a: calls.append(1))
    try:
        for assistant in ("ngram", "recycle", perturbed_copy(xlstm)):
            # (transformers < 5.25 marks xLSTM stateful: refused as a recurrent state, the same words)
            with pytest.raises(ValueError, match="xLSTMForCausalLM keeps .*, which cannot be rolled back"):
                xlstm.generate(PROMPT, custom_generate=speculative_generate, assistant=assistant, max_new_tokens=5)
    finally:
        handle.remove()
    assert calls == [] and xlstm.generate(PROMPT, max_new_tokens=5, do_sample=False).shape[1] == PROMPT.shape[1] + 5


@pytest.mark.parametrize("kind", ["medusa tree", "token recycling"])
def test_trees_refuse_flash_attention_before_any_forward(kind):
    """Tree verification needs a 4-D attention mask, which flash attention does not take: refused before any work."""
    target = tiny_llama()
    drafter = (MedusaDrafter(MedusaHeads(MedusaConfig.from_target(target.config, num_heads=2)).bind_target(target),
                             tree=[[0], [1], [0, 0]]) if kind == "medusa tree" else RecycleDrafter())
    target.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(ValueError, match="needs a 4-D attention mask; attn_implementation='flash_attention_2' takes "
                                             "none. Load the target with attn_implementation='sdpa'"):
            count_forwards(target, lambda: spec(target, drafter))
        assert count_forwards(target, lambda: pytest.raises(ValueError, spec, target, drafter)) == 0
    finally:
        target.config._attn_implementation = "sdpa"
    still_works(target, drafter)


def test_compile_drafter_without_a_draft_model_is_refused(pair):
    """`compile_drafter=True` compiles a draft model's forward: a drafter without one says so before any forward."""
    target, _ = pair
    with pytest.raises(ValueError, match="compile_drafter=True compiles a draft model's forward, and NgramDrafter "
                                         "drafts without one: drop compile_drafter"):
        count_forwards(target, lambda: spec(target, "ngram", compile_drafter=True))
    assert count_forwards(target, lambda: pytest.raises(ValueError, spec, target, "ngram", compile_drafter=True)) == 0
    still_works(target, "ngram")


@pytest.mark.skipif(CACHE == "cache", reason="transformers >= 5.24 rolls these caches back (tests/test_sliding_window.py, "
                    "tests/test_generation_features.py)")
def test_before_transformers_5_24_sliding_windows_and_static_caches_are_refused_naming_the_upgrade(pair):
    target, drafter = pair
    with pytest.raises(ValueError, match="a static cache rolls back from transformers 5.24"):
        spec(target, drafter, cache_implementation="static")
    torch.manual_seed(0)
    sliding = MistralForCausalLM(MistralConfig(vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, sliding_window=8)).eval()
    for assistant in ("ngram", perturbed_copy(sliding)):
        with pytest.raises(ValueError, match="transformers>=5.24"):
            spec(sliding, assistant)
    still_works(target, drafter)
