"""The timings hf_specdec keeps on disk (the CPU matmul path per shape and row count, the verification cost per width)
survive a burst of load while they are measured, are stamped with what they were measured under, are re-checked when
a later process first uses them, and are measured again on demand (`hf-specdec calibrate`)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from hf_specdec.generation import step_costs
from hf_specdec.speed import cpu_matmul
from hf_specdec.cli import main
from tests.conftest import tiny_char_tokenizer, tiny_llama


@pytest.fixture(autouse=True)
def own_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_matmul, "CHOICES", {})
    monkeypatch.setattr(cpu_matmul, "STAMPS", {})
    monkeypatch.setattr(cpu_matmul, "_UNCHECKED", set())
    monkeypatch.setattr(cpu_matmul, "_STORE", {"loaded": None, "dirty": False})
    step_costs.forget()
    yield
    step_costs.forget()


class Burst:
    """A load burst: the calls numbered `start` .. `start + length - 1` of the wrapped function take `extra` seconds
    more (another job taking the CPU for a while)."""

    def __init__(self, function, start: int, length: int, extra: float):
        self.function, self.start, self.length, self.extra, self.calls = function, start, length, extra, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.start <= self.calls < self.start + self.length:
            time.sleep(self.extra)
        return self.function(*args, **kwargs)


def test_a_load_burst_while_calibrating_leaves_the_verification_costs_unharmed(monkeypatch):
    """Six widths, five interleaved rounds: a burst over eight consecutive forwards (a round and a half) inflates
    some samples of several widths, never all of one width's, so no kept figure carries it."""
    target = tiny_llama(layers=1)
    quiet = step_costs._measure(target, 1, list(range(1, 7)), False)
    burst = Burst(target.forward, start=9, length=8, extra=0.05)
    monkeypatch.setattr(target, "forward", burst)
    loaded = step_costs.verify_seconds(target, 1, 6, fast_cpu_verify=False)
    assert burst.calls > 8 + 6  # (it ran through the burst)
    assert all(loaded[n] < 0.02 for n in loaded), loaded  # none took the burst's 50 ms
    assert max(loaded[n] / quiet[n] for n in loaded) < 5


def test_without_interleaving_the_same_burst_would_have_been_kept(monkeypatch):
    """The negative control: timing each width's repeats one after the other (as calibrations did before), the same
    burst lands on every sample of one width."""
    target = tiny_llama(layers=1)
    monkeypatch.setattr(target, "forward", Burst(target.forward, start=9, length=8, extra=0.05))
    one_by_one = {}
    for n in range(1, 7):
        one_by_one.update(step_costs._measure(target, 1, [n], False))
    assert max(one_by_one.values()) > 0.04


def test_kept_costs_are_stamped_and_rechecked_by_the_next_process(monkeypatch):
    target = tiny_llama(layers=1)
    first = step_costs.verify_seconds(target, 1, 4, fast_cpu_verify=False)
    saved = json.loads(step_costs.costs_file().read_text())
    (entry,) = saved.values()
    assert entry["seconds"] == {str(n): s for n, s in first.items()}
    assert {"at", "load_average", "cpus", "threads", "rounds"} <= set(entry["measured"])
    # a next process whose forwards really take this long: widths 2..4 four times one token's, the file says ~1x
    monkeypatch.setattr(step_costs, "RECHECK_ABOVE", 0.0)
    step_costs.forget()
    slow = Burst(target.forward, start=1, length=10**9, extra=0.0)

    def wider_costs_more(*args, input_ids=None, **kwargs):
        time.sleep(0.004 * input_ids.shape[1])
        return slow(*args, input_ids=input_ids, **kwargs)

    monkeypatch.setattr(target, "forward", wider_costs_more)
    again = step_costs.verify_seconds(target, 1, 4, fast_cpu_verify=False)
    assert again[4] / again[1] > 2.5 > first[4] / first[1]  # measured again: the kept shape no longer held
    step_costs.forget()
    monkeypatch.setattr(step_costs, "_measure", lambda *a, **k: {1: again[1] * 3, 4: again[4] * 3})  # a slower
    assert step_costs.verify_seconds(target, 1, 4, fast_cpu_verify=False) == again  # machine now, same shape: kept


class Clock:
    """A fake clock for the CPU path timings: each product costs its path's `costs` (seconds), plus `extra` while a
    burst is on (the calls numbered `burst`), so that what the choice sees is set exactly."""

    def __init__(self, costs: dict, burst=range(0), extra: float = 0.0):
        self.now, self.calls, self.costs, self.burst, self.extra = 0.0, 0, costs, burst, extra

    def perf_counter(self) -> float:
        return self.now

    def run(self, real):
        def run(path, layer, x2d):
            self.calls += 1
            self.now += self.costs[path] + (self.extra if self.calls in self.burst else 0.0)
            return real(path, layer, x2d)
        return run


def clocked(monkeypatch, clock: Clock) -> None:
    monkeypatch.setattr(cpu_matmul, "time", clock)
    monkeypatch.setattr(cpu_matmul, "_run", clock.run(cpu_matmul._run))
    monkeypatch.setattr(cpu_matmul, "MAX_COPIES", 1)  # (one product a sample: the burst is counted in products)


COSTS = {"linear": 1e-3, "weight_first": 0.5e-3, "onednn": 0.8e-3}  # at one row: W @ x.T twice as fast as F.linear


def test_a_load_burst_while_choosing_a_cpu_path_leaves_the_choice_unharmed(monkeypatch):
    """The paths of one product timed in pairs against the prior path (F.linear at one row) over five rounds of four
    products: a burst over five products, wherever it starts (it spoils two rounds at most, whichever paths it lands
    on), leaves the median ratio, and so the choice, as a quiet machine makes it; one round (the negative control)
    would have kept the burst's choice."""
    layer, x = torch.nn.Linear(64, 1024), torch.randn(1, 64)
    clocked(monkeypatch, Clock(COSTS))
    assert cpu_matmul._choose(layer, x) == "weight_first"
    for first in range(1, 28):  # (the first 7 products are trials and warm-ups, then the 20 timed)
        cpu_matmul.CHOICES.clear()
        clocked(monkeypatch, Clock(COSTS, burst=range(first, first + 5), extra=5e-3))
        assert cpu_matmul._choose(layer, x) == "weight_first", first
    stamp = cpu_matmul.STAMPS[cpu_matmul._key(layer, x)]
    assert stamp["ratio_to_prior"] == 0.5 and {"at", "load_average"} <= set(stamp)
    clocked(monkeypatch, Clock(COSTS, burst=range(5, 6), extra=5e-3))  # (product 5: W @ x.T's one sample)
    ratios = cpu_matmul.paired_ratios(layer, x, ["linear", "weight_first", "onednn"], "linear", rounds=1)
    assert ratios["weight_first"] > 0.9  # one round, its W @ x.T sample under the burst: it no longer looks faster


def test_a_kept_cpu_choice_found_slower_than_the_prior_path_is_timed_again(monkeypatch):
    layer, x = torch.nn.Linear(64, 1024), torch.randn(1, 64)
    key = cpu_matmul._key(layer, x)
    cpu_matmul.CHOICES[key] = "weight_first"  # kept from a calibration a busy machine spoilt
    cpu_matmul._UNCHECKED.add(key)
    clocked(monkeypatch, Clock({**COSTS, "weight_first": 2e-3}))  # this machine: W @ x.T half as fast as F.linear
    with cpu_matmul.fast_linear(torch.nn.Sequential(layer)), torch.no_grad():
        out = layer(x)
    assert cpu_matmul.CHOICES[key] == "onednn" and key not in cpu_matmul._UNCHECKED
    torch.testing.assert_close(out, torch.nn.functional.linear(x, layer.weight, layer.bias))
    kept = cpu_matmul._key(layer, torch.randn(3, 64))
    cpu_matmul.CHOICES[kept] = "linear"  # a kept choice that is still right is kept
    cpu_matmul._UNCHECKED.add(kept)
    clocked(monkeypatch, Clock({**COSTS, "weight_first": 2e-3}))
    with cpu_matmul.fast_linear(torch.nn.Sequential(layer)), torch.no_grad():
        layer(torch.randn(3, 64))
    assert cpu_matmul.CHOICES[kept] == "linear"


def test_calibrate_measures_again_and_says_where_it_keeps_what(tmp_path, capsys):
    target = tiny_llama()
    target.save_pretrained(tmp_path / "target")
    tiny_char_tokenizer().save_pretrained(tmp_path / "target")
    assert main(["calibrate", "--target", str(tmp_path / "target"), "--batch-sizes", "1,2", "--widths", "3"]) == 0
    out = capsys.readouterr().out
    assert str(step_costs.costs_file()) in out and str(cpu_matmul.choices_file()) in out
    saved = json.loads(step_costs.costs_file().read_text())
    assert len(saved) == 2 and all(sorted(entry["seconds"]) == ["1", "2", "3"] for entry in saved.values())
    assert main(["calibrate", "--target", str(tmp_path / "target"), "--batch-sizes", "1", "--widths", "3"]) == 0
    assert "dropped 2 verification calibrations" in capsys.readouterr().out
