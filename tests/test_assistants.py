"""One vocabulary of assistant names for `generate(assistant=...)`, `AutoDrafter` and the command line; unknown names
fail fast with the names the library knows."""

from __future__ import annotations

import threading

import pytest
import torch

import hf_specdec
from hf_specdec import AutoDrafter, MedusaConfig, MedusaHeads, SpeculationStats, as_drafter, speculative_generate
from hf_specdec.assistants.resolve import resolve
from hf_specdec.generation.draft_length import _LEARNED
from hf_specdec.assistants.grammar import check as check_name
from hf_specdec.assistants.grammar import UnknownDrafterError
from hf_specdec.drafters import (DraftModelDrafter, FallbackDrafter, MedusaDrafter, NgramDrafter, SelfSpeculativeDrafter,
                                 SuffixDrafter)
from tests.conftest import random_prompts, tiny_llama
from hf_specdec.drafters import BlockDrafter
from tests.speculation import assert_speculated, check_greedy_identical, fitted_block


def test_model_free_names_need_no_download():
    target = tiny_llama()
    assert isinstance(as_drafter("ngram"), NgramDrafter)
    assert isinstance(as_drafter("self"), SelfSpeculativeDrafter) and as_drafter("self:1").requested_layers == 1
    layers = as_drafter("layers:1", target=target)
    assert isinstance(layers, DraftModelDrafter) and layers.model.config.num_hidden_layers == 1
    combined = as_drafter("ngram+self:1", target=target)
    assert isinstance(combined, FallbackDrafter) and isinstance(combined.second, SelfSpeculativeDrafter)
    assert isinstance(as_drafter("default", target=target), NgramDrafter)  # for any target but the default one


@pytest.mark.parametrize("name", ["nonsense", "default-drafter", "medusa-please", "ngram+nonsense", "self:", "distilled:"])
def test_an_unknown_name_fails_fast_and_lists_the_known_names(name, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target = tiny_llama()
    with pytest.raises(UnknownDrafterError, match="Known: 'ngram', 'suffix', 'recycle', 'none', 'self'.*'layers:N'.*distilled.*'NAME:chain'"):
        as_drafter(name, target=target)
    hf_specdec.enable(target)
    try:  # through enable(): the same error, before generate() prepares anything
        with pytest.raises(UnknownDrafterError, match="Known"):
            target.generate(random_prompts(1)[0], assistant=name, max_new_tokens=3, draft_length="constant")
    finally:
        hf_specdec.disable(target)


def test_a_hub_id_that_cannot_be_read_says_why_and_lists_the_names(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UnknownDrafterError, match=r"Could not read the drafter 'someone/missing' \(.+\)\. Known names"):
        AutoDrafter.from_pretrained("someone/missing")


def test_a_saved_medusa_folder_takes_a_suffix(tmp_path):
    """`runs/x/heads:chain` (a trained run, any depth of folders) passes the command line's check and loads as a chain."""
    target = tiny_llama()
    folder = tmp_path / "runs" / "medusa-run"
    MedusaHeads(MedusaConfig.from_target(target.config, num_heads=3)).save_pretrained(folder)
    check_name(f"{folder}:chain")
    assert as_drafter(f"{folder}:chain", target=target).tree is None
    with pytest.raises(UnknownDrafterError, match="Unknown drafter"):
        check_name(f"{tmp_path}/runs/missing:chain")


def test_built_in_names_win_over_folders_of_the_same_name(tmp_path, monkeypatch):
    """A folder called `ngram` or `medusa` in the working directory does not replace the built-in drafter of that name;
    it is named by a path."""
    target = tiny_llama()
    monkeypatch.chdir(tmp_path)
    for name in ("ngram", "medusa"):
        MedusaHeads(MedusaConfig.from_target(target.config, num_heads=2)).save_pretrained(tmp_path / name)
    assert isinstance(as_drafter("ngram", target=target), NgramDrafter)
    assert isinstance(as_drafter("./ngram", target=target), MedusaDrafter)
    shipped = AutoDrafter.from_pretrained("medusa")  # the heads shipped for SmolLM2, not the tiny ones here
    assert shipped.config.hidden_size != target.config.hidden_size
    assert AutoDrafter.from_pretrained("./medusa").config.hidden_size == target.config.hidden_size


def test_tree_suffixes_are_for_drafters_that_draft_trees():
    with pytest.raises(UnknownDrafterError, match="distilled:chain: a draft-model drafter takes nothing after ':' .*"
                                                  "draft trees: medusa, block, dflash"):
        as_drafter("distilled:chain")


def test_a_saved_block_drafter_takes_a_tree_suffix_too(tmp_path, one_thread):
    """The suffix is the tree option of any kind whose drafter drafts trees, not Medusa's alone: a block drafter's
    folder loads as a chain (':chain') or an N-node tree (':N', from its measured accuracy), and decodes exactly."""
    target = tiny_llama(vocab=16, seed=0, layers=4)
    prompts = random_prompts(4, vocab=16, seed=5)
    model = fitted_block(target, prompts, block_size=3, layer_ids=[1, 2, 4])
    model.config.position_accuracy = [[0.9, 0.05, 0.02], [0.8, 0.1, 0.05], [0.7, 0.1, 0.05]]
    model.save_pretrained(tmp_path / "block")
    chain = as_drafter(f"{tmp_path / 'block'}:chain", target=target)
    tree = as_drafter(f"{tmp_path / 'block'}:5", target=target)
    assert isinstance(chain, BlockDrafter) and chain.tree is None and tree.tree[0].size == 5
    check_greedy_identical(target, f"{tmp_path / 'block'}:5", prompts)


@pytest.fixture(scope="module")
def smollm():
    return hf_specdec.load_default_target()


@pytest.mark.slow
def test_shipped_names_work_everywhere(smollm):
    """`generate(assistant="distilled")` (enable), `custom_generate=` with a name, `AutoDrafter("distilled")` and the
    Medusa variants all resolve to the shipped drafters, and the default name picks the fastest measured one."""
    model, tokenizer = smollm
    assert isinstance(AutoDrafter.from_pretrained("distilled", target=model), hf_specdec.SpecDrafterForCausalLM)
    assert isinstance(as_drafter("medusa", target=model), MedusaDrafter)
    assert as_drafter("medusa:chain", target=model).tree is None
    assert as_drafter("medusa:12", target=model).tree[0].size == 12
    default = as_drafter("default", target=model)
    assert isinstance(default, FallbackDrafter) and isinstance(default.first, NgramDrafter)
    enc = tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours."}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    plain = model.generate(**enc, max_new_tokens=24, do_sample=False)
    hf_specdec.enable(model)
    try:
        for name in ("distilled", "medusa:chain", "ngram+distilled"):
            stats = SpeculationStats()
            out = model.generate(**enc, assistant=name, max_new_tokens=24, do_sample=False, speculation_stats=stats,
                                 draft_length="constant")  # (adaptive, the default, may choose plain steps)
            assert torch.equal(out, plain), name
            assert_speculated(stats, what=name)
    finally:
        hf_specdec.disable(model)
    out = model.generate(**enc, custom_generate=speculative_generate, assistant="distilled", max_new_tokens=24,
                         do_sample=False, draft_length="constant")
    assert torch.equal(out, plain)


# --- names are resolved once per target -------------------------------------------------------------------------------
def test_a_name_is_built_once_per_target_and_kept_with_it(tmp_path, monkeypatch):
    """`assistant="<saved Medusa folder>:chain"` loads the heads at the first call only, on both routes; `recycle`'s
    table and the adaptive policy of a name carry over from one call to the next, on both routes."""
    target = tiny_llama()
    folder = tmp_path / "heads"
    MedusaHeads(MedusaConfig.from_target(target.config, num_heads=2)).save_pretrained(folder)
    loads = []
    original = AutoDrafter.from_pretrained.__func__
    monkeypatch.setattr(AutoDrafter, "from_pretrained",
                        classmethod(lambda cls, *a, **k: loads.append(a[0]) or original(cls, *a, **k)))
    prompt = random_prompts(1)[0]
    plain = target.generate(prompt, max_new_tokens=12, do_sample=False)
    hf_specdec.enable(target)
    routes = {"enable": lambda **kw: target.generate(prompt, max_new_tokens=12, do_sample=False, **kw),
              "custom_generate": lambda **kw: type(target).generate(  # (the class's generate: not the enabled one)
                  target, prompt, max_new_tokens=12, do_sample=False, custom_generate=speculative_generate, **kw)}
    try:
        for route in [*routes.values()] * 2:
            assert torch.equal(route(assistant=f"{folder}:chain"), plain)
        assert loads == [str(folder)]  # one load, for four calls on two routes

        recycle = hf_specdec.get_assistant(target, "recycle")
        tables = []
        start = type(recycle).start
        monkeypatch.setattr(type(recycle), "start", lambda self, *a: tables.append(
            None if self.table is None else self.table.clone()) or start(self, *a))
        for route in routes.values():
            assert torch.equal(route(assistant="recycle"), plain)
        assert tables[0] is None  # the first call starts an empty table...
        untouched = torch.arange(recycle.top_k).expand(len(tables[1]), -1)
        assert not torch.equal(tables[1], untouched)  # ...the second starts from the one the first built

        steps = []
        for route in (routes["enable"], routes["custom_generate"], routes["enable"]):
            route(assistant="ngram", draft_length="adaptive")
            steps.append(_LEARNED[hf_specdec.get_assistant(target, "ngram")][target][1].steps)
        assert 0 < steps[0] < steps[1] < steps[2]  # one policy, learning across calls and routes
    finally:
        hf_specdec.disable(target)


def test_what_adaptive_learned_for_a_target_goes_with_it():
    """A policy is kept per drafter and target while the target lives; a model made after another was collected (and
    which may reuse its id) starts afresh."""
    import gc

    from hf_specdec.generation.draft_length import policy_for_call

    drafter = NgramDrafter()
    first = tiny_llama()
    with policy_for_call("adaptive", drafter, first, 1) as policy:
        policy.steps = 7  # what it learned
    with policy_for_call("adaptive", drafter, first, 1) as again:
        assert again is policy
    with policy_for_call("adaptive", drafter, first, 2) as other:
        assert other is not policy  # (per batch size too)
    del first
    gc.collect()
    assert len(_LEARNED[drafter]) == 0  # nothing kept for a model that is gone
    models = [tiny_llama() for _ in range(20)]  # (CPython often gives a new object a collected one's address)
    for m in models:
        with policy_for_call("adaptive", drafter, m, 1) as new:
            assert new is not policy and new.steps == 0


def test_concurrent_calls_decide_with_their_own_copy_of_what_adaptive_learned():
    """A call that finds the kept policy in use decides with a copy of it (nothing mutated by two calls at once); the
    call that ends last leaves its policy as the one the next call starts from."""
    from hf_specdec.generation.draft_length import policy_for_call

    drafter, target = NgramDrafter(), tiny_llama()
    with policy_for_call("adaptive", drafter, target, 1) as first:
        first.steps = 3
        with policy_for_call("adaptive", drafter, target, 1) as second:
            assert second is not first and second.steps == 3  # a copy of what was learned so far
            second.steps = 5
        first.steps = 4
    with policy_for_call("adaptive", drafter, target, 1) as after:
        assert after is first and after.steps == 4  # the last call to end left its policy


def test_one_drafter_serves_concurrent_calls_with_a_fork_that_shares_what_it_knows():
    """A drafter taken by a call is lent to a concurrent call as a fork (no refusal): the fork shares the drafter's
    knowledge (a suffix index, recycling's table) and has its own per-call state; a combined drafter forks its parts;
    the drafter is the original again once it is free."""
    target = tiny_llama()
    name = resolve("ngram", target)
    with name.claimed() as first:
        assert first is name.learner is hf_specdec.get_assistant(target, "ngram")
        results = {}
        thread = threading.Thread(target=lambda: results.update(lent=resolve("ngram", target)))
        thread.start()
        thread.join()
        with results["lent"].claimed() as drafter:
            # learns for the name
            assert isinstance(drafter, NgramDrafter) and drafter is not first and results["lent"].learner is first
        with resolve(first, target).claimed() as again:  # an object in use: a fork too
            assert again is not first
    with resolve(first, target).claimed() as again:  # free again once the first call ended
        assert again is first
    suffix = SuffixDrafter()
    fork = suffix.fork()
    assert fork.index is suffix.index and fork.acceptance is suffix.acceptance
    both = as_drafter("suffix+recycle", target=target)
    fork = both.fork()
    assert fork.first is not both.first and fork.second is not both.second
    assert fork.first.index is both.first.index and fork.second_measured is both.second_measured


@pytest.mark.parametrize("assistant", ["ngram", "recycle", "suffix+ngram", "self:1", "object:ngram",
                                       "object:draft model", "object:medusa"])
def test_threads_sharing_one_target_and_one_drafter_decode_exactly(assistant):
    """Four threads, one target, one drafter (a name, or one object passed by every call): no call refused, every
    output identical to plain greedy, drafts accepted. (Self-speculation ran the target with its layer list swapped,
    which other threads' forwards saw; feature drafters' hooks recorded other threads' forwards.)"""
    from tests.speculation import PAD, left_pad

    target = tiny_llama(vocab=64)
    # per thread, one prompt alone and a left-padded batch of two, in turn (rows of several widths in flight at once)
    calls = [left_pad([p]) for p in random_prompts(4, vocab=64, seed=11)]
    calls += [left_pad(random_prompts(2, vocab=64, seed=20 + t)) for t in range(4)]
    kwargs = dict(max_new_tokens=32, do_sample=False, pad_token_id=PAD)
    plain = [target.generate(ids, attention_mask=mask, **kwargs) for ids, mask in calls]
    if assistant == "object:ngram":
        assistant = NgramDrafter()
    elif assistant == "object:draft model":
        assistant = tiny_llama(vocab=64)  # the target's twin: it drafts what the target says
    elif assistant == "object:medusa":
        assistant = MedusaDrafter(MedusaHeads(MedusaConfig.from_target(target.config, num_heads=2)).bind_target(target))
    errors, outputs, stats = [], {}, [SpeculationStats() for _ in range(4)]

    def work(t):
        try:
            for _ in range(2):
                for i in (t, t + 4):
                    ids, mask = calls[i]
                    outputs[i] = target.generate(ids, attention_mask=mask, custom_generate=speculative_generate,
                                                 assistant=assistant, speculation_stats=stats[t], **kwargs)
                    assert torch.equal(outputs[i], plain[i]), i
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(outputs) == 8
    assert sum(s.drafted_tokens for s in stats) > 0
    if not isinstance(assistant, MedusaDrafter):  # (untrained heads propose; the target rejects them)
        assert sum(s.accepted_tokens for s in stats) > 0
