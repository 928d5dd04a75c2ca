"""Self-speculation (the target's first L layers draft): exact greedy and sampled output; L = all accepts everything."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM, OPTConfig, OPTForCausalLM, Qwen3Config, Qwen3ForCausalLM

from hf_specdec import SpeculationStats, load_default_target, speculative_generate
from hf_specdec import as_drafter
from hf_specdec.drafters import SelfSpeculativeDrafter
from tests.conftest import random_prompts, tiny_gpt2, tiny_llama, tiny_qwen2
from tests.distribution import captured_processors, chi_square_pvalue, exact_joint_distribution, sample_sequences
from tests.speculation import assert_speculated

LAYERS = 3
NEW_TOKENS = 20
PROMPTS = random_prompts(10, seed=5)


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_mistral(layers=LAYERS, seed=0):
    torch.manual_seed(seed)
    config = MistralConfig(
        vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=None, pad_token_id=0,
        initializer_range=0.3, sliding_window=None,
    )
    return MistralForCausalLM(config).eval()


def tiny_qwen3(layers=LAYERS, seed=0):
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=12, max_position_embeddings=256, bos_token_id=1, eos_token_id=None,
        pad_token_id=0, initializer_range=0.3,
    )
    return Qwen3ForCausalLM(config).eval()


BUILDERS = {
    "llama": lambda: tiny_llama(layers=LAYERS),
    "qwen2": lambda: tiny_qwen2(layers=LAYERS),
    "gpt2": lambda: tiny_gpt2(layers=LAYERS),
    "mistral": tiny_mistral,
    "qwen3": tiny_qwen3,
}


def _speculative(target, prompt, drafter, k, stats, **kwargs):
    return target.generate(
        prompt, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=k, speculation_stats=stats,
        **kwargs,
    draft_length="constant")


@pytest.mark.parametrize("arch_name", sorted(BUILDERS))
def test_greedy_identical_to_plain(arch_name):
    target = BUILDERS[arch_name]()
    plain = [target.generate(p, max_new_tokens=NEW_TOKENS, do_sample=False) for p in PROMPTS]
    for num_layers in (1, 2):
        drafter = SelfSpeculativeDrafter(num_layers=num_layers)  # one object across calls: start() resets it
        stats = SpeculationStats()
        for k in (1, 4):
            for prompt, expected in zip(PROMPTS, plain):
                out = _speculative(target, prompt, drafter, k, stats, max_new_tokens=NEW_TOKENS, do_sample=False)
                assert torch.equal(out, expected), f"{arch_name}/L={num_layers}/k={k}: output differs from plain"
        assert_speculated(stats, depth=2, what=f"{arch_name}/L={num_layers}")


@pytest.mark.parametrize("arch_name", sorted(BUILDERS))
def test_all_layers_accepts_every_draft(arch_name):
    target = BUILDERS[arch_name]()
    for k in (2, 5):
        stats = SpeculationStats()
        for prompt in PROMPTS[:5]:
            before = stats.target_forwards
            expected = target.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
            out = _speculative(target, prompt, SelfSpeculativeDrafter(LAYERS), k, stats, max_new_tokens=NEW_TOKENS, do_sample=False)
            assert torch.equal(out, expected)
            assert stats.target_forwards - before == math.ceil(NEW_TOKENS / (k + 1))  # k+1 tokens per target forward
        assert stats.accepted_tokens == stats.drafted_tokens
        assert_speculated(stats, depth=k, rejected=False)


@pytest.mark.parametrize("arch_name", ["llama", "qwen2", "gpt2"])
def test_kv_reuse_runs_each_early_layer_once_per_token(arch_name):
    """At batch 1 on RoPE architectures the drafter's layers 0..L-1 ARE the verification's: layer 0 sees every fed
    token once (prompt, kept tokens and rejected drafts), not twice. GPT-2 keeps its own draft cache (twice)."""
    target = BUILDERS[arch_name]()
    layers = target.transformer.h if arch_name == "gpt2" else target.model.layers
    seen = {"first": 0, "last": 0}
    hooks = [layers[0].register_forward_pre_hook(lambda m, args, kwargs: seen.__setitem__("first", seen["first"] + args[0].shape[1]), with_kwargs=True),
             layers[-1].register_forward_pre_hook(lambda m, args, kwargs: seen.__setitem__("last", seen["last"] + args[0].shape[1]), with_kwargs=True)]
    try:
        for prompt in PROMPTS[:4]:
            expected = target.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
            seen.update(first=0, last=0)
            stats = SpeculationStats()
            out = _speculative(target, prompt, SelfSpeculativeDrafter(1), 3, stats, max_new_tokens=NEW_TOKENS, do_sample=False)
            assert torch.equal(out, expected)
            # the last layer runs in verification only: every token the target verified (pending tokens plus drafts)
            verified = seen["last"]
            assert verified == prompt.shape[1] + stats.target_forwards - 1 + stats.drafted_tokens
            # the first layer: the same tokens once with reuse; with a separate draft cache, drafted ones again
            if arch_name != "gpt2":
                assert seen["first"] == verified
            else:
                assert seen["first"] > verified
            assert_speculated(stats)
    finally:
        for hook in hooks:
            hook.remove()


def test_behind_ngram_lookup_it_verifies_the_steps_it_drafts_in_the_shared_cache():
    """`ngram+self`: where n-gram lookup finds nothing, self-speculation drafts in the target's own cache, and the
    step must be verified by it (its early layers already hold the drafts); the fuzz of issue 44 crashed here with the
    ordinary verification forward."""
    target = tiny_llama(layers=LAYERS)
    stats = SpeculationStats()
    for prompt in PROMPTS[:4]:
        kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False)
        out = target.generate(prompt, custom_generate=speculative_generate, assistant=f"ngram+self:{LAYERS}",
                              num_draft_tokens=2, draft_length="constant", speculation_stats=stats, **kwargs)
        assert torch.equal(out, target.generate(prompt, **kwargs))
    assert_speculated(stats, depth=2, rejected=False)  # (all layers: the drafts are the target's own)


def test_greedy_with_processors_and_default_layer_count():
    target = tiny_llama(layers=4)
    drafter = SelfSpeculativeDrafter()  # half the layers
    stats = SpeculationStats()
    for prompt in PROMPTS[:5]:
        kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False, repetition_penalty=1.4, no_repeat_ngram_size=3)
        expected = target.generate(prompt, **kwargs)
        assert torch.equal(_speculative(target, prompt, drafter, 3, stats, **kwargs), expected)
    assert drafter.num_layers == 2
    assert_speculated(stats, depth=2)


def test_unsupported_architecture_and_bad_layer_counts_are_refused_before_any_forward():
    torch.manual_seed(0)
    opt = OPTForCausalLM(
        OPTConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
                  word_embed_proj_dim=32, max_position_embeddings=64)
    ).eval()
    with pytest.raises(ValueError, match="gpt2, llama, mistral, qwen2, qwen3"):
        opt.generate(PROMPTS[0], custom_generate=speculative_generate, assistant=SelfSpeculativeDrafter(1), max_new_tokens=3, draft_length="constant")
    target = tiny_llama(layers=2)
    with pytest.raises(ValueError, match="exceeds"):
        _speculative(target, PROMPTS[0], SelfSpeculativeDrafter(3), 2, SpeculationStats(), max_new_tokens=3)
    with pytest.raises(ValueError, match="num_layers"):
        SelfSpeculativeDrafter(0)
    assert isinstance(as_drafter("self"), SelfSpeculativeDrafter)


# --- sampling: the early-exit draft is sampled and its q reported; the output must have the target's distribution ---
SAMPLE_VOCAB = 12
SAMPLE_TOKENS = 3
SAMPLE_PROMPT = torch.tensor([[1, 5, 7, 2]])


@pytest.fixture(scope="module")
def sampling_target():
    return tiny_llama(vocab=SAMPLE_VOCAB, seed=0, layers=3)


def _sampled(target, num_layers, num_samples, config, stats):
    kwargs = dict(do_sample=True, max_new_tokens=SAMPLE_TOKENS, **config)
    exact = exact_joint_distribution(target, SAMPLE_PROMPT, captured_processors(target, SAMPLE_PROMPT, **kwargs), SAMPLE_TOKENS)
    drafter = SelfSpeculativeDrafter(num_layers)
    samples = sample_sequences(
        lambda: _speculative(target, SAMPLE_PROMPT, drafter, 2, stats, **kwargs), SAMPLE_PROMPT.shape[1], num_samples
    )
    return chi_square_pvalue(samples, exact)


def test_sampling_matches_target(sampling_target):
    stats = SpeculationStats()
    pvalue = _sampled(sampling_target, 1, 6_000, dict(temperature=0.8, top_k=6), stats)
    assert pvalue > 1e-3
    assert_speculated(stats, depth=2)
    assert 0.05 < stats.acceptance_rate < 0.95  # a real mix of acceptances and rejections


def test_sampling_with_all_layers_accepts_nearly_everything(sampling_target):
    stats = SpeculationStats()
    pvalue = _sampled(sampling_target, 3, 1_000, dict(top_p=0.9), stats)
    assert pvalue > 1e-3
    assert_speculated(stats, depth=2, rejected=False)
    assert stats.acceptance_rate > 0.99  # q equals p up to rounding


@pytest.mark.slow
def test_real_smollm2_all_layers_and_early_exit():
    model, tokenizer = load_default_target()
    enc = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Give me three tips for writing clear emails."}], add_generation_prompt=True,
        return_tensors="pt", return_dict=True,
    )
    plain = model.generate(**enc, max_new_tokens=24, do_sample=False)
    for num_layers in (24, model.config.num_hidden_layers):
        stats = SpeculationStats()
        out = model.generate(
            **enc, max_new_tokens=24, do_sample=False, custom_generate=speculative_generate,
            assistant=SelfSpeculativeDrafter(num_layers), num_draft_tokens=3, speculation_stats=stats,
        draft_length="constant")
        assert torch.equal(out, plain)
        if num_layers == model.config.num_hidden_layers:
            assert stats.accepted_tokens == stats.drafted_tokens and stats.target_forwards == 6
