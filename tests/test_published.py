"""Drafters others published (speculators, SafeAILab's EAGLE, SpecForge, FasterDecoding's Medusa), read from tiny
checkpoints their own code wrote (tests/published/fixtures, by make_fixtures.py in their environment): the logits
each peer computed are hf_specdec's, for every layout and variant flag; they decode exactly through both routes, in
batches and sampled; a fine-tune's save keeps the layout; exports read back; what does not fit is refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import DFlashCache
from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantModel

import hf_specdec
from hf_specdec import AutoDrafter, Eagle3DraftModel, MedusaHeads, SpeculationStats
from hf_specdec.cache.hidden import final_norm
from hf_specdec.errors import InputError
from hf_specdec.kinds.block.model import BlockDrafterModel
from hf_specdec.kinds.draft_model.model import SpecDrafterForCausalLM
from hf_specdec.kinds.eagle3.formats import LLAMA, SPECULATORS
from hf_specdec.kinds.eagle3.model import Eagle3Config
from hf_specdec.registry import kind_of_model, resolved
from tests.conftest import random_prompts, tiny_llama
from tests.distribution import SHORT_SAMPLE, speculative_sample_pvalue
from tests.speculation import (assert_speculated, check_batches_with_an_early_eos, check_greedy_identical,
                               check_greedy_through_enable, fit_lm_head, lie_about_second_q)

FIXTURES = Path(__file__).parent / "published" / "fixtures"
EXPORTS = Path(__file__).parent / "published" / "exports"

# fixture: (the class it reads as, what its config must say)
LAYOUTS = {
    "speculators-eagle3": (Eagle3DraftModel, dict(fc_input_norm="joint", feed_back_normed=True, own_embeddings=True,
                                                  attention_windows=[8], draft_vocab_size=64, target_layer_ids=[1, 2, 4])),
    "speculators-eagle3-qwen3": (Eagle3DraftModel, dict(qk_norm=True, num_hidden_layers=2, fc_input_norm="per_layer",
                                                        norm_before_residual=True, target_layer_ids=[0, 2, 3, 4])),
    "speculators-peagle": (BlockDrafterModel, dict(block_size=4, mask_token_id=95, mask_state_before_fc=True)),
    "specforge-eagle3": (Eagle3DraftModel, dict(fc_input_norm="per_layer", own_embeddings=True, draft_vocab_size=64)),
    "specforge-eagle3-sglang": (Eagle3DraftModel, dict(norm_before_head=False, own_embeddings=False)),
    "safeailab-eagle3": (Eagle3DraftModel, dict(own_embeddings=False, target_layer_ids=[2, 2, 1])),
    "safeailab-eagle1": (SpecDrafterForCausalLM, dict(fuse_bias=True, first_input_norm=False, final_norm=False)),
    "safeailab-eagle1-2layers": (SpecDrafterForCausalLM, dict(fuse_bias=False, num_hidden_layers=2, final_norm=False)),
    "speculators-dflash": (MuseGlimmerAssistantModel, dict(block_size=4, target_layer_ids=[0, 2], mask_token_id=95)),
    "medusa1": (MedusaHeads, dict(num_heads=3, num_layers=1, share_lm_head=False)),
    "medusa2": (MedusaHeads, dict(num_heads=2, num_layers=1, share_lm_head=False)),
}


def target_for(reference: dict):
    """The tests' tiny Llama (4 layers: default EAGLE-3 ids 2, 2, 1), with the embeddings / LM head a fixture's peer
    drafted through where it has none of its own."""
    target = tiny_llama(layers=4)
    with torch.no_grad():
        if "target_embeddings" in reference:
            target.model.embed_tokens.weight.copy_(reference["target_embeddings"])
        if "lm_head" in reference:
            target.lm_head.weight.copy_(reference["lm_head"])
    return target


def drafter_target(drafter):
    return drafter.__dict__["_test_target"]


def first_draft_logits(drafter, ref: dict) -> torch.Tensor:
    """hf_specdec's logits for the inputs the peer was given, laid out as the peer's reference."""
    if isinstance(drafter, MedusaHeads):
        return drafter(ref["hidden"][0]).transpose(0, 1)
    if isinstance(drafter, MuseGlimmerAssistantModel):  # the block after row `anchor`: its slots 1.. draft
        target, anchor, size = drafter_target(drafter), int(ref["anchor"]), drafter.config.block_size
        block = torch.cat([ref["input_ids"][:, anchor : anchor + 1], torch.full((1, size - 1), drafter.config.mask_token_id)], 1)
        out = drafter(noise_embeds=target.get_input_embeddings()(block), context_hidden_states=ref["states"][:, :anchor],
                      position_ids=torch.arange(anchor + size)[None], cache=DFlashCache())
        return target.get_output_embeddings()(out.last_hidden_state[0, 1:])
    if isinstance(drafter, SpecDrafterForCausalLM):
        return drafter(input_ids=ref["input_ids"][:, 1:], target_features=ref["features"]).logits[0]
    if isinstance(drafter, BlockDrafterModel):
        anchors = ref["anchor"].view(1, 1)
        return drafter.forward_blocks(ref["input_ids"], drafter.fuse(ref["states"]), anchors,
                                      full_vocab_logits=False)[0].logits[0]
    # row t: the token input_ids[t] with the states before it (the peers' pairing)
    logits = drafter(input_ids=ref["input_ids"], target_features=drafter.fuse(ref["states"]), full_vocab_logits=False).logits[0]
    return logits


@pytest.mark.parametrize("name", LAYOUTS)
def test_first_draft_logits_are_the_peers(name):
    model_class, expected = LAYOUTS[name]
    ref = load_file(FIXTURES / name / "reference.safetensors")
    target = target_for(ref)
    drafter = AutoDrafter.from_pretrained(FIXTURES / name, target=target)
    drafter.__dict__["_test_target"] = target  # (a DFlash drafter drafts through the target's embeddings and head)
    assert type(drafter) is model_class and drafter.config.published["format"]
    assert {k: getattr(drafter.config, k) for k in expected} == expected
    expected_logits = ref["step_logits"][0] if "step_logits" in ref else ref["logits"]
    if model_class is MuseGlimmerAssistantModel:
        expected_logits = expected_logits[1:]  # (its anchor slot drafts nothing)
    with torch.no_grad():
        got = first_draft_logits(drafter, ref)
    scale = expected_logits.abs().max()
    torch.testing.assert_close(got, expected_logits, atol=1e-5 * scale, rtol=1e-5)


@pytest.mark.parametrize("name, rows", [("speculators-eagle3", range(6)), ("speculators-eagle3-qwen3", range(9))])
def test_drafting_ahead_is_the_peers_training_time_test(name, rows):
    """Step k of speculators' training-time test at row t is the (k + 1)-th draft after (input_ids[t], states[t])
    when the drafts are input_ids[t + 1..]: hf_specdec's drafter fed back its own output there gives the same
    logits. (With a sliding window, speculators' later steps count the window from row t, drafting from its position:
    only rows whose chain stays inside the window are compared.)"""
    ref = load_file(FIXTURES / name / "reference.safetensors")
    drafter = AutoDrafter.from_pretrained(FIXTURES / name, target=target_for(ref))
    states, ids, steps = ref["states"], ref["input_ids"], ref["step_logits"]
    for t in rows:
        cache = DynamicCache()
        with torch.no_grad():
            out = drafter(input_ids=ids[:, : t + 1], target_features=drafter.fuse(states[:, : t + 1]), cache=cache,
                          use_cache=True, full_vocab_logits=False)
            for k in range(1, len(steps)):
                out = drafter(input_ids=ids[:, t + k : t + k + 1], target_features=out.hidden_states[0][:, -1:],
                              cache=cache, use_cache=True, full_vocab_logits=False)
                torch.testing.assert_close(out.logits[0, -1], steps[k, t], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["safeailab-eagle1", "safeailab-eagle1-2layers"])
def test_eagle1_greedy_chain_is_the_peers(name):
    ref = load_file(FIXTURES / name / "reference.safetensors")
    drafter = AutoDrafter.from_pretrained(FIXTURES / name, target=target_for(ref))
    cache = DynamicCache()
    with torch.no_grad():
        out = drafter(input_ids=ref["input_ids"][:, 1:], target_features=ref["features"], cache=cache, use_cache=True)
        for k, token in enumerate(ref["chain_tokens"]):
            assert int(out.logits[0, -1].argmax()) == int(token)
            out = drafter(input_ids=token.view(1, 1), target_features=out.hidden_states[0][:, -1:], cache=cache,
                          use_cache=True)
            expected = ref["chain_logits"][k]
            torch.testing.assert_close(out.logits[0, -1], expected, atol=1e-5 * expected.abs().max(), rtol=1e-5)


# --- decoding: the fixtures refitted to agree with a tiny target, saved in their own layout, loaded by folder ------
PROMPTS = random_prompts(6, seed=11)


@torch.no_grad()
def agreeing(name: str, folder: Path, target):
    """The fixture `name`, its LM head(s) refitted (least squares) or, where the target's head drafts, its layers
    trained a little, to agree with `target`'s greedy continuations of PROMPTS, saved into `folder` by its
    `save_pretrained` (which writes the published layout again)."""
    drafter = AutoDrafter.from_pretrained(FIXTURES / name, target=target, dtype=torch.float32)
    if isinstance(drafter, BlockDrafterModel):
        def readings(seq, shifted):
            out, predicts = drafter.forward_blocks(seq, shifted, torch.arange(seq.shape[1] - 1)[None])
            keep = predicts[0] < seq.shape[1] - 1
            return drafter.head_input(out.hidden_states[0][0, keep]), seq[0, predicts[0, keep] + 1]
        fit_lm_head(drafter, target, PROMPTS, readings, None, 0.5, 1e-3, 8.0, {})
    elif isinstance(drafter, Eagle3DraftModel):
        def readings(seq, shifted):  # fed the target's states, then (as drafting ahead) its own outputs
            first = drafter(input_ids=seq, target_features=shifted, use_cache=False).hidden_states[0]
            own = torch.cat([torch.zeros_like(first[:, :1]), first[:, :-1]], dim=1)
            second = drafter(input_ids=seq, target_features=own, use_cache=False).hidden_states[0]
            out = torch.cat([first[0, :-1], second[0, :-1]])  # (what the LM head reads: the fed-back output is
            return out if drafter.config.feed_back_normed else drafter.head_input(out), seq[0, 1:].repeat(2)  # normed, or not)
        fit_lm_head(drafter, target, PROMPTS, readings, None, 0.5, 1e-3, 8.0, {})
    elif isinstance(drafter, MedusaHeads):
        fit_medusa(drafter, target)
    else:
        with torch.enable_grad():
            train_eagle(drafter, target)
    drafter.save_pretrained(folder)
    return folder


@torch.no_grad()
def continuations(target):
    seqs = [target.generate(p, do_sample=False, max_new_tokens=40) for p in PROMPTS]
    states = []
    for seq in seqs:
        captured = []
        hook = final_norm(target).register_forward_hook(lambda m, a, out: captured.append(out))
        target(seq)
        hook.remove()
        states.append(captured[0])
    return seqs, states


def fit_medusa(heads: MedusaHeads, target, ridge=1e-3, sharpness=8.0):
    xs, ys = [[] for _ in heads.heads], [[] for _ in heads.heads]
    for seq, state in zip(*continuations(target)):
        for i, head in enumerate(heads.heads):  # head i at position j: the token at j + 2 + i
            xs[i].append(head(state[0, : seq.shape[1] - 2 - i]))
            ys[i].append(seq[0, 2 + i :])
    for i, lm_head in enumerate(heads.lm_heads):
        x, y = torch.cat(xs[i]), torch.nn.functional.one_hot(torch.cat(ys[i]), heads.config.vocab_size).float()
        lm_head.weight.copy_(sharpness * torch.linalg.solve(x.T @ x + ridge * torch.eye(x.shape[1]), x.T @ y).T)


def train_eagle(drafter: SpecDrafterForCausalLM, target, steps=150):
    """An EAGLE-1 layout drafts through the target's LM head: its layers learn the target's next tokens."""
    seqs, states = continuations(target)
    torch.manual_seed(0)
    with torch.no_grad():  # (the fixture's loud random weights, unnormed, would explode in its own fed-back states)
        for p in drafter.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)
    optimizer = torch.optim.Adam([p for p in drafter.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        loss = 0
        for seq, state in zip(seqs, states):
            for _ in range(2):  # fed the target's states, then (as drafting ahead does) its own outputs
                shifted = torch.cat([torch.zeros_like(state[:, :1]), state[:, :-1]], dim=1)  # j reads f_{j-1}
                out = drafter(input_ids=seq, target_features=shifted)
                loss = loss + torch.nn.functional.cross_entropy(out.logits[0, 1:-1], seq[0, 2:])
                state = out.hidden_states[0]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    drafter.eval()


@pytest.mark.parametrize("name", ["speculators-eagle3", "speculators-eagle3-qwen3", "speculators-peagle",
                                  "specforge-eagle3-sglang", "safeailab-eagle1", "medusa1"])
def test_published_drafters_decode_exactly_both_ways_in(name, tmp_path, one_thread):
    target = tiny_llama(layers=4)
    folder = agreeing(name, tmp_path / name, target)
    original = json.loads((FIXTURES / name / "config.json").read_text())
    assert set(json.loads((folder / "config.json").read_text())) >= set(original) - {"transformers_version", "dtype",
                                                                                      "_name_or_path", "auto_map"}
    assert not (folder / "custom_generate").exists()  # the peer's layout, nothing of hf_specdec's
    drafter = AutoDrafter.from_pretrained(folder, target=target)
    assert drafter.config.published["format"] == AutoDrafter.from_pretrained(FIXTURES / name, target=target).config.published["format"]
    check_greedy_identical(target, str(folder), PROMPTS, max_new_tokens=16)
    check_greedy_through_enable(target, str(folder), PROMPTS[:3], depth=2, max_new_tokens=16)


def test_a_speculators_dflash_drafter_decodes_exactly_both_ways_in(tmp_path, one_thread):
    """A DFlash drafter trained on the target (the fixture's random one accepts nothing), written in speculators'
    layout and loaded by folder as transformers' DFlash drafter."""
    from hf_specdec.kinds.dflash.formats import SPECULATORS as DFLASH
    from tests.transformers_drafters import trained_dflash

    target = tiny_llama(layers=4)
    DFLASH.write(trained_dflash(target, PROMPTS), target, tmp_path, torch.float32)
    assert json.loads((tmp_path / "config.json").read_text())["aux_hidden_state_layer_ids"] == [1, 2]
    assert type(AutoDrafter.from_pretrained(tmp_path, target=target)) is MuseGlimmerAssistantModel
    check_greedy_identical(target, str(tmp_path), PROMPTS, max_new_tokens=16)
    check_greedy_through_enable(target, str(tmp_path), PROMPTS[:3], depth=2, max_new_tokens=16)


def test_a_published_drafter_decodes_batches_with_uneven_rows(tmp_path, one_thread):
    target = tiny_llama(layers=4)
    folder = agreeing("speculators-eagle3", tmp_path / "spec", target)
    stats = SpeculationStats()
    check_batches_with_an_early_eos(target, str(folder), PROMPTS, (3,), stats)
    assert_speculated(stats, depth=2, rows=2, uneven=True)


def published_sampling_pvalue(folder: Path, transform=lambda drafter: drafter, stats=None) -> float:
    target = tiny_llama(vocab=12, seed=0, layers=4)
    drafter = transform(hf_specdec.as_drafter(AutoDrafter.from_pretrained(folder, target=target), target))
    torch.manual_seed(0)
    return speculative_sample_pvalue(target, torch.tensor([[1, 5, 7, 2]]), drafter, 2, stats)


@pytest.fixture(scope="module")
def sampling_folder(tmp_path_factory):
    """A speculators EAGLE-3 drafter with its variant flags (norm before fc, normed output fed back, sliding window,
    embeddings of its own, reduced vocabulary) for the 12-token target, fitted and written in speculators' layout."""
    target = tiny_llama(vocab=12, seed=0, layers=4)
    prompt = torch.tensor([[1, 5, 7, 2]])
    config = Eagle3Config.from_target(target.config, draft_vocab_size=10, target_layer_ids=[1, 2, 4], initializer_range=0.3,
                                      fc_input_norm="joint", feed_back_normed=True, attention_windows=[3],
                                      own_embeddings=True)
    torch.manual_seed(0)
    drafter = Eagle3DraftModel(config).eval()

    def readings(seq, shifted):
        out = drafter(input_ids=seq, target_features=shifted, use_cache=False).hidden_states[0]
        return out[0, :-1], seq[0, 1:]

    with torch.no_grad():
        fit_lm_head(drafter, target, [prompt] * 24, readings, torch.arange(2, 12), 0.5, 1e-3, 2.0,
                    dict(SHORT_SAMPLE))
    folder = tmp_path_factory.mktemp("sampling") / "speculators"
    SPECULATORS.write(drafter, target, folder, torch.float32)
    return folder


def test_a_published_drafter_samples_the_targets_distribution(sampling_folder, one_thread):
    stats = SpeculationStats()
    assert published_sampling_pvalue(sampling_folder, stats=stats) > 1e-3
    assert_speculated(stats, depth=2, row_groups=1, uneven=True)


def test_the_sampling_test_fails_a_wrong_rule(sampling_folder, one_thread):
    assert published_sampling_pvalue(sampling_folder, lie_about_second_q, SpeculationStats()) < 1e-6


# --- exports, read back -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, fmt, layout", [
    ("specforge-eagle3", "vllm-eagle3", "vllm-eagle3"), ("speculators-eagle3", "speculators", "speculators-eagle3"),
    ("speculators-eagle3-qwen3", "speculators", "speculators-eagle3"),
    ("safeailab-eagle3", "vllm-eagle3", "vllm-eagle3"), ("speculators-peagle", "speculators", "speculators-peagle"),
    ("medusa1", "medusa", "medusa"), ("safeailab-eagle1", "vllm-eagle", "vllm-eagle"),
    ("speculators-dflash", "speculators", "speculators-dflash")])
def test_exports_read_back_as_the_same_drafter(name, fmt, layout, tmp_path):
    ref = load_file(FIXTURES / name / "reference.safetensors")
    target = target_for(ref)
    drafter = AutoDrafter.from_pretrained(FIXTURES / name, target=target)
    resolved(kind_of_model(drafter).exporters[fmt])(drafter, target, tmp_path, torch.float32)
    back = AutoDrafter.from_pretrained(tmp_path, target=target)
    drafter.__dict__["_test_target"] = back.__dict__["_test_target"] = target
    assert type(back) is type(drafter) and back.config.published["format"] == layout
    with torch.no_grad():
        torch.testing.assert_close(first_draft_logits(back, ref), first_draft_logits(drafter, ref))


@pytest.mark.parametrize("fmt", ["speculators-eagle3", "vllm-eagle3"])
def test_the_peers_read_hf_specdecs_exports(fmt):
    """tests/published/exports/: hf_specdec's exports of a drafter of its own (written by `export_inputs` below, then
    read by the peers' code in make_fixtures.py: speculators' Eagle3DraftModel, SpecForge's LlamaForCausalLMEagle3),
    and the logits the peers computed with them: hf_specdec's, for the same inputs."""
    inputs = load_file(EXPORTS / "inputs.safetensors")
    target = LlamaForCausalLM.from_pretrained(EXPORTS / "verifier")
    drafter = AutoDrafter.from_pretrained(EXPORTS / fmt, target=target)
    peer = load_file(EXPORTS / fmt / "peer_logits.safetensors")["logits"]
    with torch.no_grad():
        ours = drafter(input_ids=inputs["input_ids"], target_features=drafter.fuse(inputs["states"]),
                       full_vocab_logits=False).logits[0]
    torch.testing.assert_close(ours, peer, atol=1e-5, rtol=1e-5)


def export_inputs(out: Path = EXPORTS) -> None:
    """Write tests/published/exports/ (run once, then make_fixtures.py adds the peers' logits): one hf_specdec
    EAGLE-3 drafter (its own flags, reduced vocabulary) for the tests' tiny Llama, exported in both layouts."""
    target = tiny_llama(layers=4)
    torch.manual_seed(3)
    config = Eagle3Config.from_target(target.config, draft_vocab_size=64, initializer_range=0.3,
                                      target_layer_ids=[1, 2, 4])  # (speculators wants them distinct)
    drafter = Eagle3DraftModel(config).eval()
    drafter.set_draft_vocab(torch.arange(10, 74))
    drafter.bind_target(target)
    drafter.config.target_name_or_path = "exports/verifier"  # (speculators' from_pretrained reads its verifier:
    shutil.rmtree(out, ignore_errors=True)                   #  make_fixtures.py runs in tests/published)
    target.save_pretrained(out / "verifier")
    LLAMA.write(drafter, target, out / "vllm-eagle3", torch.float32)
    SPECULATORS.write(drafter, target, out / "speculators-eagle3", torch.float32)
    g = torch.Generator().manual_seed(4)
    save_file({"states": torch.randn(1, 12, 3 * 48, generator=g), "input_ids": torch.randint(0, 96, (1, 12), generator=g),
               "target_embeddings": target.model.embed_tokens.weight.detach().clone()}, str(out / "inputs.safetensors"))


def test_a_hub_id_loads_from_the_hubs_cache(tmp_path):
    """A Hub id goes through huggingface_hub (here its cache, offline: the Hub is unreachable from CI): the config,
    then the weight files a layout names, each fetched as loading fetches it."""
    snapshot = tmp_path / "models--someone--tiny-speculator.eagle3" / "snapshots" / ("0" * 40)
    shutil.copytree(FIXTURES / "speculators-eagle3", snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    ref = load_file(FIXTURES / "speculators-eagle3" / "reference.safetensors")
    drafter = AutoDrafter.from_pretrained("someone/tiny-speculator.eagle3", target=target_for(ref), cache_dir=tmp_path,
                                          local_files_only=True)
    assert drafter.config.published["format"] == "speculators-eagle3"
    with torch.no_grad():
        torch.testing.assert_close(first_draft_logits(drafter, ref), ref["step_logits"][0], atol=1e-5, rtol=1e-5)


# --- refusals -----------------------------------------------------------------------------------------------------
def copied(name: str, tmp_path: Path, **config_changes) -> Path:
    folder = tmp_path / name
    shutil.copytree(FIXTURES / name, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(config_changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_drafter_for_another_target_is_refused_before_any_forward(tmp_path):
    wider = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                                         num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(ValueError, match="96-token vocabulary and hidden size 48.*has 96 and 64"):
        AutoDrafter.from_pretrained(FIXTURES / "speculators-eagle3", target=wider)
    with pytest.raises(ValueError, match=r"reads target layers \[1, 2, 4\]; the target has only 2"):
        AutoDrafter.from_pretrained(FIXTURES / "speculators-eagle3", target=tiny_llama(layers=2))
    with pytest.raises(ValueError, match="96 tokens .* not 48 / 50"):
        AutoDrafter.from_pretrained(FIXTURES / "medusa1", target=tiny_llama(vocab=50, layers=4))
    with pytest.raises(ValueError, match="96-token vocabulary but the target has 50"):
        AutoDrafter.from_pretrained(FIXTURES / "safeailab-eagle1", target=tiny_llama(vocab=50, layers=4))


def test_a_different_verifier_name_with_agreeing_shapes_only_warns():
    target = tiny_llama(layers=4)
    target.config._name_or_path = "someone/llama-4-layers-AWQ"
    with pytest.warns(UserWarning, match="published for 'tiny/llama-4-layers'.*someone/llama-4-layers-AWQ"):
        AutoDrafter.from_pretrained(FIXTURES / "speculators-eagle3", target=target)


def test_flags_hf_specdec_does_not_implement_are_refused_by_name(tmp_path):
    target = tiny_llama(layers=4)
    with pytest.raises(InputError, match="speculators flags hf_specdec does not implement: norm_everything"):
        AutoDrafter.from_pretrained(copied("speculators-eagle3", tmp_path, norm_everything=True), target=target)
    with pytest.raises(InputError, match="EAGLE-3 flags hf_specdec does not implement: shiny_new_norm"):
        AutoDrafter.from_pretrained(copied("specforge-eagle3", tmp_path, shiny_new_norm=True), target=target)
    with pytest.raises(InputError, match="qkv_bias"):
        AutoDrafter.from_pretrained(copied("safeailab-eagle1", tmp_path, qkv_bias=True), target=target)
    with pytest.raises(InputError, match="speculators 'dspark' checkpoint; hf_specdec reads speculators' dflash, eagle3, peagle drafters, not this one: "
                             "DFlash plus a Markov logit bias"):
        AutoDrafter.from_pretrained(copied("speculators-eagle3", tmp_path / "x", speculators_model_type="dspark"),
                                    target=target)
    with pytest.raises(InputError, match="layers are 'mistral'"):
        layers = json.loads((FIXTURES / "speculators-eagle3" / "config.json").read_text())["transformer_layer_config"]
        AutoDrafter.from_pretrained(copied("speculators-eagle3", tmp_path / "y", transformer_layer_config={
            **layers, "model_type": "mistral"}), target=target)


def test_an_export_the_layout_cannot_hold_is_refused(tmp_path):
    ref = load_file(FIXTURES / "safeailab-eagle3" / "reference.safetensors")
    target = target_for(ref)
    drafter = AutoDrafter.from_pretrained(FIXTURES / "safeailab-eagle3", target=target)  # (ids 2, 2, 1: not distinct)
    with pytest.raises(InputError, match=r"distinct target layers; this one reads \[2, 2, 1\]"):
        SPECULATORS.write(drafter, target, tmp_path / "a", torch.float32)
    sglang = AutoDrafter.from_pretrained(FIXTURES / "specforge-eagle3-sglang", target=target)
    with pytest.raises(InputError, match="always norms before its LM head"):
        SPECULATORS.write(sglang, target, tmp_path / "b", torch.float32)
    qwen3 = AutoDrafter.from_pretrained(FIXTURES / "speculators-eagle3-qwen3", target=target)
    with pytest.raises(InputError, match="cannot hold .*Qwen3 q/k norms, more than one layer"):
        LLAMA.write(qwen3, target, tmp_path / "c", torch.float32)
    assert not any((tmp_path / name).exists() for name in "abc")


def test_pickled_weights_load_without_running_code(tmp_path):
    folder = copied("safeailab-eagle1", tmp_path)

    class Payload:
        def __reduce__(self):
            return (print, ("this must never run",))

    torch.save({"fc.weight": Payload()}, folder / "pytorch_model.bin")
    with pytest.raises(Exception, match="[Ww]eights only load failed|Unsupported global"):
        AutoDrafter.from_pretrained(folder, target=tiny_llama(layers=4))


def test_a_plain_llama_draft_model_is_still_a_draft_model(tmp_path):
    """Telling an EAGLE-1 folder from a Llama by its tensor names leaves real draft models alone."""
    draft = tiny_llama(layers=1, seed=3)
    draft.save_pretrained(tmp_path)
    assert type(AutoDrafter.from_pretrained(tmp_path)).__name__ == "LlamaForCausalLM"


# --- the trainer comparison's data, in speculators' offline layout ---------------------------------------------------
def test_prepared_data_is_written_in_speculators_offline_layout(tmp_path):
    """benchmarks/to_speculators_data.py: per row the token ids, the states entering the drafter's layers and the
    target's last state before its norm (from the last layers run on the stored state: as a full forward's), the loss
    on the answer only, the training rows first; what speculators' trainer reads (benchmarks/trainer_vs_field.sh)."""
    import datasets
    from safetensors.torch import load_file as read

    from benchmarks.to_speculators_data import main as convert
    from hf_specdec.cache.hidden import entering_layers
    from hf_specdec.training.data import TeacherData
    from hf_specdec.training.states import attach_target_features

    target = tiny_llama(vocab=32, layers=4)
    target.save_pretrained(tmp_path / "target")
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    gen = torch.Generator().manual_seed(0)
    for name, count in (("train", 3), ("heldout", 1)):
        records = [{"tokens": torch.randint(2, 32, (9 + i,), generator=gen, dtype=torch.int32), "start": 4,
                    "ids": torch.zeros(5 + i, 1, dtype=torch.int32), "lps": torch.zeros(5 + i, 1, dtype=torch.float16),
                    "source": 0} for i in range(count)]
        data = TeacherData.from_records(records, {})
        data.save(prepared / f"{name}.safetensors")
        attach_target_features(target, data, prepared / f"features-{name}-layers-1-2-3.npy",
                               entering_layers(target, [1, 2, 3]), show=False)
    out = tmp_path / "speculators"
    convert(["--prepared", str(prepared), "--layers", "1-2-3", "--target", str(tmp_path / "target"), "--out", str(out)])
    rows = datasets.load_from_disk(str(out / "dataset"))
    assert json.loads((out / "split.json").read_text())["train_rows"] == 3 and len(rows) == 4
    for row in range(4):
        ids = rows[row]["input_ids"]  # (read as torch tensors, as speculators reads them)
        saved = read(out / "hidden_states" / f"hs_{row}.safetensors")
        assert torch.equal(saved["token_ids"], ids) and saved["hidden_states"].shape == (len(ids), 4, 48)
        assert rows[row]["loss_mask"].tolist() == [0] * 4 + [1] * (len(ids) - 4) and rows[row]["seq_len"] == len(ids)
        with torch.no_grad():
            states = target(input_ids=ids[None], output_hidden_states=True).hidden_states
        before_norm = torch.stack([states[1], states[2], states[3]], 2)[0]
        torch.testing.assert_close(saved["hidden_states"][:, :3].float(), before_norm, atol=1e-3 * float(
            before_norm.abs().max()), rtol=0)
        last = {}
        hook = target.model.norm.register_forward_pre_hook(lambda module, args: last.update(x=args[0][0]) or None)
        with torch.no_grad():
            target(input_ids=ids[None])
        hook.remove()
        scale = float(last["x"].abs().max())  # (stored in fp16, as distill.py stores them)
        torch.testing.assert_close(saved["hidden_states"][:, 3].float(), last["x"], atol=2e-3 * scale, rtol=0)
    assert sum(torch.load(out / "token_freq.pt").values()) == sum(len(rows[r]["input_ids"]) - 4 for r in range(3))
