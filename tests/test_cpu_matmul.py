"""The CPU matmul path of verification forwards (`cpu_matmul.py`): only the target's own layers take it, only in the
thread that verifies, and its choices are measured once per machine and kept for the next process."""

from __future__ import annotations

import threading

import pytest
import torch

from hf_specdec import speculative_generate
from hf_specdec.speed import cpu_matmul
from tests.conftest import random_prompts, tiny_llama


@pytest.fixture(autouse=True)
def route_every_layer(monkeypatch):
    """The tiny test models' layers are all below the size that is routed; here every layer is."""
    monkeypatch.setattr(cpu_matmul, "MIN_WEIGHTS", 0)


@pytest.fixture
def runs(monkeypatch):
    """(thread id, layer) of every product that took the fast path (a routed layer's, inside `verifying`)."""
    seen = []
    forward = cpu_matmul._fast_forward

    def recording(layer, x):
        if cpu_matmul._ACTIVE.get():
            seen.append((threading.get_ident(), layer))
        return forward(layer, x)

    monkeypatch.setattr(cpu_matmul, "_fast_forward", recording)  # (layers are routed through it at each call)
    return seen


def test_only_the_targets_layers_take_the_fast_path_and_only_in_the_verifying_thread(runs):
    """In the middle of a verification forward (a hook on the target's last layer), another model's forward in the same
    thread, and the target's and the other model's plain forwards in another thread, all run the stock path."""
    target, other = tiny_llama(), tiny_llama(seed=1)
    prompt, other_prompt = random_prompts(1)[0], torch.randint(2, 90, (1, 5))
    expected = {"other": other(other_prompt).logits, "target": target(prompt).logits}
    results, busy = {}, []

    def meanwhile(module, args):
        if busy or not cpu_matmul._ACTIVE.get():  # once, and inside a verification forward
            return
        busy.append(True)
        results["other"] = other(other_prompt).logits
        thread = threading.Thread(target=lambda: results.update(target=target(prompt).logits,
                                                                thread_other=other(other_prompt).logits))
        thread.start()
        thread.join()
        results["thread"] = thread.ident

    plain = target.generate(prompt, max_new_tokens=10, do_sample=False)
    hook = target.model.layers[-1].register_forward_pre_hook(meanwhile)
    try:
        out = target.generate(prompt, max_new_tokens=10, do_sample=False, custom_generate=speculative_generate,
                              assistant="ngram", draft_length="constant")
    finally:
        hook.remove()
    assert torch.equal(out, plain) and busy
    target_layers = {id(m) for m in target.modules() if type(m) is torch.nn.Linear}
    assert runs and all(id(layer) in target_layers for _, layer in runs)  # only the target's verification took it
    assert not [1 for ident, _ in runs if ident == results["thread"]]  # nothing in the other thread did
    assert torch.equal(results["other"], expected["other"]) and torch.equal(results["thread_other"], expected["other"])
    assert torch.equal(results["target"], expected["target"])
    assert not any("forward" in m.__dict__ for m in target.modules())  # nothing left on the target after the call


def test_choices_are_kept_for_the_next_process(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_matmul, "CHOICES", {})
    monkeypatch.setattr(cpu_matmul, "_STORE", {"loaded": None, "dirty": False})
    target = tiny_llama()
    target.generate(random_prompts(1)[0], max_new_tokens=8, do_sample=False, custom_generate=speculative_generate,
                    assistant="ngram", draft_length="constant")
    measured = dict(cpu_matmul.CHOICES)
    assert measured and cpu_matmul.choices_file().is_file()
    # a new process: nothing measured yet; routing a model reads the file, and nothing is timed again
    monkeypatch.setattr(cpu_matmul, "CHOICES", {})
    monkeypatch.setattr(cpu_matmul, "_STORE", {"loaded": None, "dirty": False})
    with cpu_matmul.routed(target):
        assert cpu_matmul.CHOICES == measured


def test_the_weight_first_path_hands_back_a_contiguous_result():
    """Some models view a projection's output as complex numbers (llama4, deepseek_v2), which needs contiguity."""
    layer, x = torch.nn.Linear(16, 8), torch.randn(3, 16)
    out = cpu_matmul._run("weight_first", layer, x)
    assert out.is_contiguous() and torch.allclose(out, layer(x), atol=1e-6)


def test_a_greedy_call_leaves_the_global_random_generator_alone(tmp_path, monkeypatch):
    """Measuring the CPU paths (their trial copies of a layer) must not draw from torch's global generator: a caller's
    seeded sampling after a speculative call would otherwise depend on what this machine had measured before."""
    monkeypatch.setenv("HF_SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_matmul, "CHOICES", {})  # nothing measured yet: every path is timed in this call
    monkeypatch.setattr(cpu_matmul, "_STORE", {"loaded": None, "dirty": False})
    target = tiny_llama(vocab=cpu_matmul.PROBE_ROWS + 8)  # an LM head timed on a slice of its rows
    torch.manual_seed(0)
    before = torch.get_rng_state()
    target.generate(torch.randint(2, 90, (1, 6), generator=torch.Generator().manual_seed(0)), max_new_tokens=12,
                    do_sample=False, custom_generate=speculative_generate, assistant="ngram", draft_length="adaptive")
    assert cpu_matmul.CHOICES and torch.equal(torch.get_rng_state(), before)


def test_layers_too_small_to_gain_keep_their_own_forward(monkeypatch):
    monkeypatch.setattr(cpu_matmul, "MIN_WEIGHTS", 48 * 96)  # the tiny Llama's MLP projections are routed, no more
    target = tiny_llama()
    with cpu_matmul.routed(target):
        routed = {name for name, m in target.named_modules() if "forward" in m.__dict__}
    assert routed and all(name.split(".")[-1] in ("gate_proj", "up_proj", "down_proj", "lm_head") for name in routed)
    assert not any("forward" in m.__dict__ for m in target.modules())


def test_a_forward_someone_else_set_on_a_layer_is_left_alone(runs):
    """A layer whose instance already has a forward of its own (a user's wrapper, another library's hook) keeps it
    during and after the call: it is not routed, and not removed afterwards."""
    target = tiny_llama()
    layer = target.model.layers[0].mlp.down_proj
    calls = []
    layer.forward = lambda x: calls.append(1) or torch.nn.functional.linear(x, layer.weight, layer.bias)
    theirs = layer.forward
    prompt = random_prompts(1)[0]
    expected = target.generate(prompt, max_new_tokens=8, do_sample=False)
    before = len(calls)
    out = target.generate(prompt, max_new_tokens=8, do_sample=False, custom_generate=speculative_generate,
                          assistant="ngram", fast_cpu_verify=True)
    assert torch.equal(out, expected) and len(calls) > before  # theirs ran in the call
    assert layer.__dict__["forward"] is theirs and not any(seen is layer for _, seen in runs)
    assert runs  # the other layers were routed
