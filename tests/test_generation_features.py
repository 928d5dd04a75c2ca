"""Stopping, outputs, caches and streaming behave exactly as plain `generate()`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import DynamicCache, StaticCache, StoppingCriteria, StoppingCriteriaList, StopStringCriteria, TextStreamer

import hf_specdec
from hf_specdec import SpeculationStats, SpeculativeDecoderOnlyOutput, speculative_generate
from hf_specdec.cache.keyword import CACHE
from tests.conftest import perturbed_copy, random_prompts, tiny_char_tokenizer, tiny_llama
from tests.speculation import assert_speculated

PROMPTS = random_prompts(12, seed=7)


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama()
    return target, perturbed_copy(target)


@pytest.fixture
def stats():
    """Every speculative call of a test adds to this; the test then asserts that speculation really happened."""
    return SpeculationStats()


def spec(target, drafter, prompt, k=4, stats=None, **kwargs):
    return target.generate(prompt, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=k,
                           speculation_stats=stats, **kwargs, draft_length="constant")


def test_several_eos_ids_stop_where_plain_stops(pair, stats):
    target, drafter = pair
    stopped_early = 0
    for prompt in PROMPTS:
        free = target.generate(prompt, max_new_tokens=30, do_sample=False)[0, prompt.shape[1] :].tolist()
        eos = [free[6], free[11], 95]  # tokens plain decoding really emits, so generation stops inside a block
        expected = target.generate(prompt, max_new_tokens=30, do_sample=False, eos_token_id=eos)
        for k in (2, 5):
            assert torch.equal(spec(target, drafter, prompt, k=k, stats=stats, max_new_tokens=30, eos_token_id=eos),
                               expected)
        stopped_early += expected.shape[1] < prompt.shape[1] + 30
    assert stopped_early == len(PROMPTS)
    assert_speculated(stats, depth=3)


def test_stop_strings_and_custom_criteria_cut_inside_accepted_block(pair, stats):
    target, drafter = pair
    tokenizer = tiny_char_tokenizer()
    for prompt in PROMPTS:
        text = tokenizer.decode(target.generate(prompt, max_new_tokens=30, do_sample=False)[0, prompt.shape[1] :])
        stop = text[9:11]  # a string plain decoding produces around token 10
        expected = target.generate(prompt, max_new_tokens=30, do_sample=False, stop_strings=[stop], tokenizer=tokenizer)
        assert expected.shape[1] < prompt.shape[1] + 30
        criteria = StoppingCriteriaList([StopStringCriteria(tokenizer=tokenizer, stop_strings=[stop])])
        out = spec(target, drafter, prompt, k=6, stats=stats, max_new_tokens=30, do_sample=False,
                   stopping_criteria=criteria)
        assert torch.equal(out, expected)
        # the enable() route takes stop_strings + tokenizer like plain generate()
        hf_specdec.enable(target)
        try:
            out = target.generate(
                prompt, assistant=drafter, num_draft_tokens=6, max_new_tokens=30, do_sample=False,
                stop_strings=[stop], tokenizer=tokenizer, speculation_stats=stats,
            draft_length="constant")
        finally:
            hf_specdec.disable(target)
        assert torch.equal(out, expected)
    assert_speculated(stats, depth=3)


class StopAfterToken(StoppingCriteria):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_custom_stopping_criterion(pair, stats):
    target, drafter = pair
    for prompt in PROMPTS[:4]:
        token = target.generate(prompt, max_new_tokens=20, do_sample=False)[0, prompt.shape[1] + 8].item()
        criteria = StoppingCriteriaList([StopAfterToken(token)])
        expected = target.generate(prompt, max_new_tokens=20, do_sample=False, stopping_criteria=criteria)
        assert torch.equal(spec(target, drafter, prompt, k=8, stats=stats, max_new_tokens=20, stopping_criteria=criteria),
                           expected)
    assert_speculated(stats, depth=3)


OLD_STATIC = pytest.mark.skipif(CACHE == "past_key_values", reason="a static cache rolls back from transformers 5.24 "
                                "(before, it is refused: tests/test_bad_input.py)")


@OLD_STATIC
def test_static_cache_matches_plain(pair, stats):
    target, drafter = pair
    for prompt in PROMPTS[:6]:
        expected = target.generate(prompt, max_new_tokens=25, do_sample=False)
        out = spec(target, drafter, prompt, k=5, stats=stats, max_new_tokens=25, do_sample=False,
                   cache_implementation="static")
        assert torch.equal(out, expected)
    assert_speculated(stats, depth=3)


@pytest.mark.parametrize("cache_implementation", ["dynamic", pytest.param("static", marks=OLD_STATIC)])
def test_outputs_and_cache_usable_after_the_call(pair, stats, cache_implementation):
    """Later steps run in inference mode: what the call hands back must still be ordinary tensors (updatable in place),
    and its cache must carry on under a plain generate() exactly as plain decoding's own cache does."""
    target, drafter = pair
    prompt = PROMPTS[2]
    kwargs = dict(max_new_tokens=12, do_sample=False, return_dict_in_generate=True, output_scores=True)

    def first_cache():  # a static cache generate() makes is sized by its first call (full after it, from 5.25): the
        # caller makes one with room to carry on, as a chat server does
        return {CACHE: StaticCache(config=target.config, max_cache_len=64)} if cache_implementation == "static" else {}

    plain = target.generate(prompt, **kwargs, **first_cache())
    out = spec(target, drafter, prompt, stats=stats, **kwargs, **first_cache())
    assert torch.equal(out.sequences, plain.sequences)
    assert isinstance(out.past_key_values, StaticCache if cache_implementation == "static" else DynamicCache)
    assert not out.sequences.is_inference() and not any(s.is_inference() for s in out.scores)
    out.sequences[0, -1] += 0  # in place, as a caller may
    # continue both from their own caches with plain greedy decoding: the same tokens
    follow = dict(max_new_tokens=6, do_sample=False, return_dict_in_generate=True)
    again_plain = target.generate(plain.sequences, **{CACHE: plain.past_key_values}, **follow)
    again_spec = target.generate(out.sequences, **{CACHE: out.past_key_values}, **follow)
    assert torch.equal(again_spec.sequences, again_plain.sequences)
    assert_speculated(stats, depth=2)


def test_return_dict_scores_and_logits_one_per_token(pair):
    target, drafter = pair
    prompt = PROMPTS[1]
    kwargs = dict(max_new_tokens=15, do_sample=False, return_dict_in_generate=True, output_scores=True,
                  output_logits=True, repetition_penalty=1.2)
    plain = target.generate(prompt, **kwargs)
    out = spec(target, drafter, prompt, **kwargs)
    assert isinstance(out, SpeculativeDecoderOnlyOutput)
    assert torch.equal(out.sequences, plain.sequences)
    assert len(out.scores) == len(out.logits) == len(plain.scores) == 15
    for a, b in zip(out.scores, plain.scores):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    for a, b in zip(out.logits, plain.logits):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    stats = out.speculation_stats
    assert stats.emitted_tokens == 15 and stats.target_forwards < 15
    assert len(stats.acceptance_by_position) == 4
    assert_speculated(stats, depth=2)


class CollectingStreamer(TextStreamer):
    def __init__(self, tokenizer):
        super().__init__(tokenizer, skip_prompt=True)
        self.text = ""

    def on_finalized_text(self, text, stream_end=False):
        self.text += text


def test_streamer_output_equals_returned_text(pair, stats):
    target, drafter = pair
    tokenizer = tiny_char_tokenizer()
    prompt = PROMPTS[2]
    hf_specdec.enable(target)
    try:
        streamer = CollectingStreamer(tokenizer)
        out = target.generate(prompt, assistant=drafter, num_draft_tokens=4, max_new_tokens=25, do_sample=False,
                              streamer=streamer, speculation_stats=stats, draft_length="constant")
    finally:
        hf_specdec.disable(target)
    assert torch.equal(out, target.generate(prompt, max_new_tokens=25, do_sample=False))
    assert streamer.text == tokenizer.decode(out[0, prompt.shape[1] :])
    assert len(streamer.text) > 0
    assert_speculated(stats, depth=2)


def test_bf16_drafter_with_fp32_target_is_exact(pair, stats):
    target, drafter = pair
    low = perturbed_copy(target).to(torch.bfloat16)
    for prompt in PROMPTS[:4]:
        assert torch.equal(spec(target, low, prompt, stats=stats, max_new_tokens=20, do_sample=False),
                           target.generate(prompt, max_new_tokens=20, do_sample=False))
    assert_speculated(stats, depth=2)


def test_stats_accumulate_across_calls(pair, stats):
    target, drafter = pair
    for prompt in PROMPTS[:3]:
        spec(target, drafter, prompt, max_new_tokens=10, do_sample=False, stats=stats)
    assert stats.emitted_tokens == 30
    assert_speculated(stats, depth=2)
    assert 1.0 < stats.mean_accepted_tokens <= 5.0
    assert set(stats.as_dict()) >= {"target_forwards", "mean_accepted_tokens", "acceptance_by_position"}


def test_nothing_outside_the_target_is_patched(tmp_path):
    """Importing and using hf_specdec (both ways in, enable() and disable()) leaves transformers' classes as they were,
    and disable() gives the model back its own generate; checked in a fresh process."""
    import subprocess
    import sys

    script = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel
from transformers.generation.utils import GenerationMixin
def snapshot():
    return {(cls.__name__, name): value for cls in (GenerationMixin, PreTrainedModel, torch.nn.Module, torch.nn.Linear)
            for name, value in vars(cls).items()}
target = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)).eval()
prompt = torch.tensor([[3, 5, 7, 9, 3, 5, 7]])
target.generate(prompt, max_new_tokens=6)  # (what transformers itself installs on first use happens before)
before = snapshot()
import hf_specdec
target.generate(prompt, max_new_tokens=6, custom_generate=hf_specdec.speculative_generate, assistant="ngram")
hf_specdec.enable(target)
target.generate(prompt, max_new_tokens=6, assistant=hf_specdec.NgramDrafter())
hf_specdec.disable(target)
changed = [key for key, value in snapshot().items() if before.get(key) is not value]
assert not changed, changed
assert "generate" not in target.__dict__ and not any("forward" in m.__dict__ for m in target.modules())
print("untouched")
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1],
                            capture_output=True, text=True, timeout=300)
    assert "untouched" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
