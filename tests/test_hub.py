"""Sharing drafters: AutoDrafter, custom_generate/ without hf_specdec, model cards, push, exports (all offline)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from huggingface_hub import ModelCard, ModelCardData
from huggingface_hub.repocard import metadata_load
from huggingface_hub.utils import validate_repo_id
from safetensors import safe_open
from transformers import AutoConfig, LlamaForCausalLM, T5Config
from transformers.dynamic_module_utils import get_imports, get_relative_import_files
from transformers.utils.import_utils import split_package_version

import hf_specdec
from hf_specdec import AutoDrafter, Eagle3Config, Eagle3DraftModel, MedusaConfig, MedusaHeads, SpecDrafterForCausalLM
from hf_specdec.cli import main as cli
from hf_specdec.drafters import DraftModelDrafter, Eagle3Drafter, EagleDrafter, MedusaDrafter
from hf_specdec.formats.export import export_drafter
from hf_specdec.hub import bundle_sources, files_to_upload, render_model_card
from hf_specdec.hub.card import drafter_kind
from hf_specdec.integrations.custom_generate import generate
from hf_specdec.kinds.draft_model.model import drafter_config_from_target

from tests.conftest import VOCAB, random_prompts, tiny_char_tokenizer, tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")

def spec_drafter(target, layers=1, draft_vocab=0, features=False, agreeing=False):
    config = drafter_config_from_target(target.config, num_hidden_layers=layers, draft_vocab_size=draft_vocab,
                                        target_feature_input=features, target_name_or_path="someone/target")
    drafter = SpecDrafterForCausalLM(config)
    if agreeing:  # the target's own layers: every draft accepted
        own = {k[len("model."):]: v for k, v in target.state_dict().items()}
        drafter.model.load_state_dict({k: v for k, v in own.items() if k.startswith(("layers.", "norm."))})
    if draft_vocab:
        drafter.set_draft_vocab(torch.randperm(VOCAB)[:draft_vocab])
    return drafter


def medusa_heads(target, draft_vocab=0, share_lm_head=True):
    config = MedusaConfig.from_target(target.config, num_heads=3, num_layers=2, share_lm_head=share_lm_head,
                                      draft_vocab_size=draft_vocab, target_name_or_path="someone/target")
    heads = MedusaHeads(config)
    with torch.no_grad():
        for p in heads.heads.parameters():
            p.normal_(0, 0.05)  # not the identity, still close enough to the target to be accepted at times
    if draft_vocab:
        heads.set_draft_vocab(torch.randperm(VOCAB)[:draft_vocab])
    return heads


def eagle3_drafter(target):  # random, 48-token draft vocabulary, the target's layers entering 2, 1 and 1
    drafter = Eagle3DraftModel(Eagle3Config.from_target(target.config, draft_vocab_size=48,
                                                        target_name_or_path="someone/target"))
    drafter.set_draft_vocab(torch.randperm(VOCAB)[:48], target)
    return drafter


@dataclass(frozen=True)
class Variant:
    """A drafter this file saves, loads, pushes and exports: how it is built, the kind it is registered as
    (`registry.py`, its Hub tag), the class that decodes it and its serving export."""

    build: Callable
    kind: str
    drafter_class: type
    export_format: str


VARIANTS = {
    "agreeing": Variant(lambda t: spec_drafter(t, layers=2, agreeing=True), "draft-model", DraftModelDrafter, "vllm-draft"),
    "reduced": Variant(lambda t: spec_drafter(t, draft_vocab=48), "draft-model", DraftModelDrafter, "vllm-draft"),
    "eagle": Variant(lambda t: spec_drafter(t, features=True), "eagle", EagleDrafter, "vllm-eagle"),
    "plain": Variant(lambda t: tiny_llama(layers=1, seed=2), "draft-model", DraftModelDrafter, "vllm-draft"),
    "medusa": Variant(medusa_heads, "medusa", MedusaDrafter, "vllm-medusa"),
    "medusa-reduced": Variant(lambda t: medusa_heads(t, draft_vocab=48), "medusa", MedusaDrafter, "vllm-medusa"),
    "medusa-own": Variant(lambda t: medusa_heads(t, share_lm_head=False), "medusa", MedusaDrafter, "vllm-medusa"),
    "eagle3": Variant(eagle3_drafter, "eagle3", Eagle3Drafter, "vllm-eagle3"),
}
SPEC_VARIANTS = ("agreeing", "reduced", "eagle")
MEDUSA_VARIANTS = tuple(name for name, v in VARIANTS.items() if v.kind == "medusa")


def make_drafter(target, variant: str):
    torch.manual_seed(3)
    return VARIANTS[variant].build(target)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    target = tiny_llama()
    target.save_pretrained(root / "target")
    tiny_char_tokenizer().save_pretrained(root / "target")  # `--target FOLDER` loads a tokenizer too
    folders = {}
    for variant in VARIANTS:
        folders[variant] = root / variant
        make_drafter(target, variant).save_pretrained(folders[variant])
    tiny_char_tokenizer().save_pretrained(folders["agreeing"])  # the export copies a drafter folder's tokenizer
    return {"root": root, "target": target, "target_folder": root / "target", **folders}


def greedy_pairs(target, assistant, n=3, max_new_tokens=12, **kwargs):
    for prompt in random_prompts(n, seed=7):
        plain = target.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False)
        spec = target.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False, assistant=assistant,
                               custom_generate=hf_specdec.speculative_generate, **kwargs, draft_length="constant")
        yield plain, spec


# --- AutoDrafter -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_auto_drafter_loads_each_kind_as_it_was_saved(world, variant):
    target, original = world["target"], make_drafter(world["target"], variant)
    drafter = AutoDrafter.from_pretrained(world[variant], target=target)
    assert type(drafter) is type(original) and not drafter.training
    saved = original.state_dict()
    if variant != "plain":  # hf_specdec drafters are stored in config.save_dtype (float16) and cast back on load
        assert drafter.config.target_name_or_path == "someone/target"
        assert drafter.config.draft_vocab_size == original.config.draft_vocab_size
        saved = {k: v.half().float() if v.is_floating_point() else v for k, v in saved.items()}
    if variant in SPEC_VARIANTS:
        assert drafter.is_bound and drafter.config.target_feature_input == (variant == "eagle")
    if variant in MEDUSA_VARIANTS:  # bound: the borrowed LM head is the target's
        assert drafter.config.share_lm_head == (variant != "medusa-own")
        assert not drafter.config.share_lm_head or drafter.lm_head.link.target is target
    assert drafter.state_dict().keys() == saved.keys()
    assert all(torch.equal(drafter.state_dict()[k], v) for k, v in saved.items())
    if variant == "eagle3":
        assert drafter.is_bound and torch.equal(drafter.draft_vocab, original.draft_vocab)
    assert drafter_kind(drafter.config) == VARIANTS[variant].kind  # the registered kind, by its Hub tag
    assert isinstance(hf_specdec.as_drafter(drafter), VARIANTS[variant].drafter_class)
    # Medusa heads: the default tree (as_drafter) and the top-1 chain
    for assistant in [drafter, *([MedusaDrafter(drafter, tree="chain")] if variant in MEDUSA_VARIANTS else [])]:
        for plain, spec in greedy_pairs(target, assistant, n=2):
            assert torch.equal(plain, spec)


def test_auto_drafter_names_what_it_supports(world, tmp_path):
    T5Config().save_pretrained(tmp_path / "t5")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    for folder in (tmp_path / "t5", tmp_path / "odd"):
        with pytest.raises(ValueError, match="hf_specdec_drafter.*AutoModelForCausalLM"):
            AutoDrafter.from_pretrained(folder)
    with pytest.raises(OSError, match="from_pretrained"):
        AutoDrafter()


# --- custom_generate/ ------------------------------------------------------------------------------------------------
def test_custom_generate_folder_is_the_installed_library(world):
    folder = world["agreeing"] / "custom_generate"
    files = {p.name: p.read_text() for p in folder.iterdir()}
    assert {name: text for name, text in files.items() if name.endswith(".py")} == bundle_sources()
    assert "def generate(model" in files["generate.py"]
    assert "from .generation_loop import speculative_generate" in files["generate.py"]
    # every module transformers will copy next to generate.py is there, and nothing imports hf_specdec
    needed = get_relative_import_files(folder / "generate.py")
    assert {Path(f).name for f in needed} == set(files) - {"generate.py", "requirements.txt"}
    assert not any("hf_specdec" in get_imports(folder / name) for name in files if name.endswith(".py"))
    # ... and apart from those import lines and registrations, each file IS the library module (named in its header)
    package = Path(hf_specdec.__file__).parent
    code = lambda text: [l for l in text.splitlines() if l.strip() and not re.match(r"\s*from \.", l)]  # noqa: E731
    for name in (n for n in files if n.endswith(".py")):
        origin = re.match(r"# Generated from hf_specdec/(\S+) ", files[name]).group(1)
        source = (package / origin).read_text()
        stripped = [l for l in code(source) if not (".register(" in l and not l.startswith(" "))]  # module level
        assert code(files[name])[1:] == stripped, name  # [1:]: the header
    # loaded next to an installed hf_specdec, the copy registers nothing over it with transformers' Auto classes
    world["target"].load_custom_generate(str(world["agreeing"]), trust_remote_code=True)
    assert AutoConfig.for_model("hf_specdec_drafter").__class__ is hf_specdec.SpecDrafterConfig
    requirements = files["requirements.txt"].split()
    assert {split_package_version(r)[0] for r in requirements} == {"huggingface_hub", "torch", "transformers"}
    assert not (world["plain"] / "custom_generate").exists()  # plain causal LMs: transformers' own assisted decoding
    for variant in MEDUSA_VARIANTS:  # MedusaHeads.save_pretrained writes the same bundle, and push uploads it
        assert {p.name: p.read_text() for p in (world[variant] / "custom_generate").iterdir()} == files
        assert "custom_generate/generate.py" in files_to_upload(world[variant])


HIDDEN_HF_SPECDEC = """
import json, sys
import torch

class Blocked:  # hf_specdec is pip-installed (editable): refuse it, as on a machine without it
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "hf_specdec":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Blocked())
try:
    import hf_specdec
    raise SystemExit("hf_specdec is importable")
except ModuleNotFoundError:
    pass
from transformers import AutoModelForCausalLM

target_folder, drafters, prompts = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
target = AutoModelForCausalLM.from_pretrained(target_folder).eval()
report = {}
for name, folder in drafters.items():
    report[name] = {"identical": [], "accepted": 0, "drafted": 0}
    for prompt in prompts:
        x = torch.tensor([prompt])
        plain = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False)
        out = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False,
                              custom_generate=folder, trust_remote_code=True, num_draft_tokens=4,
                              return_dict_in_generate=True, draft_length="constant")
        report[name]["identical"].append(plain[0].tolist() == out.sequences[0].tolist())
        report[name]["accepted"] += out.speculation_stats.accepted_tokens
        report[name]["drafted"] += out.speculation_stats.drafted_tokens
report["hf_specdec_modules"] = [m for m in sys.modules if m.split(".")[0] == "hf_specdec"]
print(json.dumps(report))
"""


def test_custom_generate_decodes_exactly_without_hf_specdec(world, tmp_path):
    """A user with plain transformers: `generate(custom_generate=<drafter folder or Hub id>, trust_remote_code=True)`.
    The Hub id is served offline from a pre-filled Hub cache (the layout huggingface_hub downloads into)."""
    snapshot = tmp_path / "hf" / "hub" / "models--someone--tiny-drafter" / "snapshots" / ("a" * 40)
    shutil.copytree(world["agreeing"], snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("a" * 40)
    drafters = {**{variant: str(world[variant]) for variant in (*SPEC_VARIANTS, *MEDUSA_VARIANTS, "eagle3")}, "hub": "someone/tiny-drafter"}
    prompts = [p[0].tolist() for p in random_prompts(3, seed=11)]
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run([sys.executable, "-I", "-c", HIDDEN_HF_SPECDEC, str(world["target_folder"]),
                             json.dumps(drafters), json.dumps(prompts)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report.pop("hf_specdec_modules") == []
    for name, r in report.items():
        assert r["identical"] == [True] * len(prompts), name
    assert report["agreeing"]["accepted"] > 0 and report["hub"]["accepted"] == report["agreeing"]["accepted"]
    assert all(report[variant]["drafted"] > 0 for variant in (*MEDUSA_VARIANTS, "eagle3")) and report["medusa"]["accepted"] > 0
    assert any((tmp_path / "hf" / "modules" / "transformers_modules").rglob("generate.py"))  # transformers' copy ran


def test_custom_generate_takes_an_explicit_drafter(world):
    target = world["target"]
    prompt = random_prompts(1, seed=5)[0]
    plain = target.generate(prompt, max_new_tokens=10, do_sample=False)
    stats = hf_specdec.SpeculationStats()
    out = generate(target, drafter=str(world["agreeing"]), inputs=prompt, max_new_tokens=10, do_sample=False,
                   speculation_stats=stats, draft_length="constant")  # (adaptive may choose plain steps)
    assert torch.equal(out, plain)
    assert stats.accepted_tokens > 0 and stats.target_forwards < stats.emitted_tokens
    with pytest.raises(ValueError, match="drafter="):
        generate(target, inputs=prompt, max_new_tokens=10)
    with pytest.raises(ValueError, match="drop `assistant=`"):
        generate(target, drafter=str(world["agreeing"]), assistant="ngram", inputs=prompt)


def test_a_custom_generate_drafter_is_kept_with_each_target(world):
    """Two targets calling through one drafter folder each get a drafter of their own, loaded once and bound to that
    target (one drafter cached per process was rebound to whichever target called last)."""
    from transformers import AutoModelForCausalLM

    first, second = world["target"], AutoModelForCausalLM.from_pretrained(world["target_folder"]).eval()
    prompt = random_prompts(1, seed=5)[0]
    plain = first.generate(prompt, max_new_tokens=10, do_sample=False)
    for target in (first, second, first):
        out = generate(target, drafter=str(world["agreeing"]), inputs=prompt, max_new_tokens=10, do_sample=False)
        assert torch.equal(out, plain)
    (mine,), (theirs,) = (t.__dict__["_hf_specdec_folder_drafters"].values() for t in (first, second))
    assert mine is not theirs
    bound = lambda drafter: {id(m.link.target) for m in drafter.modules() if getattr(m, "link", None)}  # noqa: E731
    assert bound(mine) == {id(first)} and bound(theirs) == {id(second)}


# --- model cards ---------------------------------------------------------------------------------------------------------
MEASURED = {"mean_accepted_tokens": 2.3456, "acceptance_rate": 0.61, "acceptance_by_position": [0.8, 0.6, 0.4],
            "heldout_top1": 0.7, "num_draft_tokens": 3, "eval_prompts": 16, "eval_max_new_tokens": 64,
            "draft_ms_per_token": 1.5}
TRAINING = {"data": "ShareGPT", "loss": "fkl", "steps": 100, "batch_size": 16, "learning_rate": 1e-3,
            "command": "python training/distill.py --target default --max-steps 100"}


@pytest.mark.parametrize("variant", ["reduced", "eagle", "plain", "medusa", "medusa-reduced"])
def test_model_card_metadata_is_what_the_hub_reads(world, tmp_path, variant):
    """`ModelCard.validate()` posts to the Hub (/api/validate-yaml), so the metadata is checked with
    huggingface_hub's own offline parser (metadata_load, ModelCardData) and repo-id validator."""
    config = AutoDrafter.from_pretrained(world[variant]).config
    if variant != "plain":
        config.target_name_or_path, config.target_quantization = "HuggingFaceTB/SmolLM2-135M-Instruct", "8bit"
        config.measured, config.training = MEASURED, TRAINING
    card = render_model_card(world[variant], config, repo_id="someone/tiny-drafter", datasets=["someone/chats"],
                             hardware="Test CPU, 2 cores", target=None if variant != "plain" else "someone/target")
    card.save(tmp_path / "README.md")

    metadata = metadata_load(tmp_path / "README.md")
    assert ModelCardData(**metadata).to_dict() == metadata  # nothing huggingface_hub cannot represent
    assert ModelCard.load(tmp_path / "README.md").data.library_name == "hf-specdec"
    assert set(metadata) == {"library_name", "base_model", "license", "datasets", "tags", "pipeline_tag"}
    assert metadata["license"] == "apache-2.0" and metadata["pipeline_tag"] == "text-generation"
    for repo_id in [metadata["base_model"], *metadata["datasets"]]:
        validate_repo_id(repo_id)
    registered = VARIANTS[variant].kind
    assert {"speculative-decoding", registered, "hf-specdec"} <= set(metadata["tags"])
    assert ("custom_generate" in metadata["tags"]) == (variant != "plain")

    text = card.text
    if variant == "plain":
        assert metadata["base_model"] == "someone/target" and "No acceptance figures" in text
        return
    assert metadata["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    row = "| HuggingFaceTB/SmolLM2-135M-Instruct | 8bit | Test CPU, 2 cores | 3 | 2.346 | 0.80, 0.60, 0.40 |"
    assert row in text and TRAINING["command"] in text
    assert 'AutoDrafter.from_pretrained("someone/tiny-drafter", target=target)' in text
    assert 'custom_generate="someone/tiny-drafter", trust_remote_code=True' in text
    assert "num_draft_tokens=3," in text  # what was measured
    assert f"--format {VARIANTS[variant].export_format} --target TARGET" in text
    if registered == "medusa":
        assert "3 Medusa heads" in text and "2 residual block(s)" in text and 'tree="chain"' in text
        assert ("only the 48 target tokens" in text) == (variant == "medusa-reduced")


# --- push ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["agreeing", "eagle", "plain", "medusa"])
def test_push_uploads_the_folder_in_one_commit_and_writes_no_token(world, tmp_path, variant):
    folder = tmp_path / variant
    AutoDrafter.from_pretrained(world[variant]).save_pretrained(folder)
    (folder / ".cache").mkdir()
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "model.safetensors").write_text("never uploaded")
    (folder / "notes.txt").write_text("a stray file: never uploaded")
    (folder / "linked.safetensors").symlink_to(folder / "model.safetensors")  # symlinks: never uploaded
    with mock.patch.dict(os.environ, {"HF_TOKEN": "hf_not_a_real_token"}), mock.patch("hf_specdec.hub.push.HfApi") as api:
        assert cli(["push", str(folder), "--repo-id", "someone/tiny-drafter", "--private"]) == 0
    api = api.return_value
    api.create_repo.assert_called_once_with(repo_id="someone/tiny-drafter", repo_type="model", private=True, exist_ok=True)
    (call,) = api.upload_folder.call_args_list
    bundle = [] if variant == "plain" else sorted(f"custom_generate/{name}" for name in [*bundle_sources(), "requirements.txt"])
    generation_config = [] if variant == "medusa" else ["generation_config.json"]  # heads are not a generative model
    expected = sorted(["README.md", "config.json", *generation_config, "model.safetensors", *bundle])
    assert call.kwargs == {"repo_id": "someone/tiny-drafter", "repo_type": "model", "folder_path": str(folder),
                           "allow_patterns": expected, "delete_patterns": ["*"],
                           "commit_message": "Upload hf_specdec drafter"}
    assert not any("hf_not_a_real_token" in p.read_text(errors="ignore") for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("variant", ["eagle", "medusa"])
def test_transformers_push_to_hub_carries_custom_generate(world, variant):
    """`drafter.push_to_hub()` (transformers' own) saves through our save_pretrained, so the Hub repo gets the bundle."""
    drafter = AutoDrafter.from_pretrained(world[variant])
    with mock.patch("transformers.utils.hub.hf_api") as api, \
         mock.patch("transformers.utils.hub.create_and_tag_model_card", return_value=ModelCard("---\n---\n")):
        api.return_value.create_repo.return_value.repo_id = "someone/tiny-drafter"
        drafter.push_to_hub("someone/tiny-drafter")
    paths = {op.path_in_repo for op in api.return_value.create_commit.call_args.kwargs["operations"]}
    assert {"config.json", "model.safetensors", "custom_generate/generate.py", "custom_generate/requirements.txt"} <= paths


# --- exports for serving engines ---------------------------------------------------------------------------------------
def tensor_shapes(path: Path) -> dict[str, tuple]:
    with safe_open(str(path), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def llama_layer_shapes(prefix: str, layers, hidden=48, inter=96, kv=24) -> dict[str, tuple]:
    shapes = {}
    for i in layers:
        p = f"{prefix}layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (kv, hidden),
                       p + "self_attn.v_proj.weight": (kv, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
                       p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                       p + "mlp.down_proj.weight": (hidden, inter), p + "input_layernorm.weight": (hidden,),
                       p + "post_attention_layernorm.weight": (hidden,)})
    return shapes


@pytest.mark.parametrize("variant", ["agreeing", "reduced"])
def test_export_vllm_draft_is_a_standalone_llama(world, tmp_path, variant):
    out = tmp_path / "vllm-draft"
    assert cli(["export", str(world[variant]), "--format", "vllm-draft", "--target", str(world["target_folder"]),
                "--out", str(out)]) == 0
    # What vLLM's draft-model path loads (vllm/model_executor/models/llama.py, LlamaForCausalLM.load_weights, read at
    # vllm-project/vllm 0035bdf): a transformers LlamaForCausalLM checkpoint, `architectures: [LlamaForCausalLM]`,
    # model.embed_tokens / model.layers.N.* / model.norm / lm_head, the target's full vocabulary.
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert (config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]) == (VOCAB, 48, 2 if variant == "agreeing" else 1)
    assert config["rope_theta"] == 10000.0 and config["tie_word_embeddings"] is False
    layers = range(config["num_hidden_layers"])
    expected = {"model.embed_tokens.weight": (VOCAB, 48), "lm_head.weight": (VOCAB, 48), "model.norm.weight": (48,),
                **llama_layer_shapes("model.", layers)}
    assert tensor_shapes(out / "model.safetensors") == expected
    assert (variant == "agreeing") == (out / "tokenizer.json").exists()

    # Same drafter: the export's logits equal the SpecDrafter's wherever the SpecDrafter may propose.
    drafter = AutoDrafter.from_pretrained(world[variant], target=world["target"])
    export = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    x = random_prompts(1, seed=3)[0]
    with torch.no_grad():
        ours, theirs = drafter(x).logits, export(x).logits
    allowed = torch.isfinite(ours)  # the export stores the target's embeddings / head in float16, too
    torch.testing.assert_close(theirs[allowed], ours[allowed], rtol=1e-2, atol=1e-2 * float(ours[allowed].abs().max()))
    for plain, spec in greedy_pairs(world["target"], export, n=2):
        assert torch.equal(plain, spec)


def test_export_vllm_eagle_matches_vllms_eagle_loader(world, tmp_path):
    out = tmp_path / "vllm-eagle"
    with pytest.warns(UserWarning, match="layers.0.input_layernorm.weight.*norm.weight"):
        assert cli(["export", str(world["eagle"]), "--format", "vllm-eagle", "--target", str(world["target_folder"]),
                    "--out", str(out)]) == 0
    # vLLM's EAGLE-1 Llama drafter (vllm/model_executor/models/llama_eagle.py, EagleLlamaForCausalLM, vllm-project/vllm
    # at e1c4a55; configs/eagle.py renames LlamaForCausalLM -> EagleLlamaForCausalLM): its load_weights prefixes
    # "model." itself, so tensors are named fc.weight [hidden, 2*hidden] (no bias) and layers.{i}.*; layer 0 has no
    # input_layernorm, there is no final norm and no lm_head (shared with the target); embed_tokens is read only
    # under pipeline parallelism. An unexpected name is a KeyError there, so the set must match exactly.
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["EagleLlamaForCausalLM"] and config["model_type"] == "llama"
    assert (config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]) == (VOCAB, 48, 1)
    assert {"num_attention_heads", "num_key_value_heads", "intermediate_size", "rms_norm_eps", "rope_theta"} <= set(config)
    expected = {"fc.weight": (48, 96), "embed_tokens.weight": (VOCAB, 48), **llama_layer_shapes("", [0])}
    del expected["layers.0.input_layernorm.weight"]
    assert tensor_shapes(out / "model.safetensors") == expected
    drafter = AutoDrafter.from_pretrained(world["eagle"])
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("fc.weight").float(), drafter.model.fuse.weight)


def test_export_vllm_eagle3_matches_vllms_eagle3_loader(world, tmp_path):
    out = tmp_path / "vllm-eagle3"
    assert cli(["export", str(world["eagle3"]), "--format", "vllm-eagle3", "--target", str(world["target_folder"]),
                "--out", str(out)]) == 0
    # vLLM's EAGLE-3 Llama drafter (vllm/model_executor/models/llama_eagle3.py, Eagle3LlamaForCausalLM; the registry
    # maps LlamaForCausalLMEagle3 to it): config draft_vocab_size, target_hidden_size (fc reads 3x it) and
    # eagle_aux_hidden_state_layer_ids; load_weights skips t2d, renames d2t (int64, target = row + d2t[row]), keeps
    # lm_head [draft vocab, hidden], prefixes the rest with "model." and renames midlayer. to layers.0. (q/k/v read
    # 2 x hidden there); embed_tokens may be absent (shared with the target). Draft logits go into a -inf full-vocab
    # row at arange + d2t.
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    assert (config["vocab_size"], config["draft_vocab_size"], config["hidden_size"]) == (VOCAB, 48, 48)
    assert config["num_hidden_layers"] == 1 and config["target_hidden_size"] == 48
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 1, 1]  # vLLM's: the state entering layer i
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 0, 0]  # SGLang's: the output of layer i
    expected = {"fc.weight": (48, 144), "norm.weight": (48,), "lm_head.weight": (48, 48), "d2t": (48,), "t2d": (VOCAB,),
                **{k.replace("layers.0.", "midlayer."): v for k, v in llama_layer_shapes("", [0]).items()},
                "midlayer.hidden_norm.weight": (48,)}
    for name, rows in (("q_proj", 48), ("k_proj", 24), ("v_proj", 24)):
        expected[f"midlayer.self_attn.{name}.weight"] = (rows, 96)
    assert tensor_shapes(out / "model.safetensors") == expected
    drafter = AutoDrafter.from_pretrained(world["eagle3"])
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
        assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
        assert torch.equal(torch.arange(48) + d2t, drafter.draft_vocab) and torch.equal(t2d.nonzero()[:, 0], drafter.draft_vocab)
        assert torch.equal(f.get_tensor("lm_head.weight").float(), drafter.lm_head.weight)


def test_export_refuses_the_wrong_format(world, tmp_path):
    target = world["target"]
    with pytest.raises(ValueError, match="--format vllm-draft"):
        export_drafter(world["agreeing"], target, tmp_path / "x", "vllm-eagle")
    with pytest.raises(ValueError, match="--format vllm-eagle"):
        export_drafter(world["eagle"], target, tmp_path / "x", "vllm-draft")
    with pytest.raises(ValueError, match="already a standalone model"):
        export_drafter(world["plain"], target, tmp_path / "x", "vllm-draft")
    with pytest.raises(ValueError, match="Medusa heads .*: export it with --format vllm-medusa"):
        export_drafter(world["medusa"], target, tmp_path / "x", "vllm-eagle")
    with pytest.raises(ValueError, match="token-only drafter .*: export it with --format vllm-draft"):
        export_drafter(world["agreeing"], target, tmp_path / "x", "vllm-medusa")
    assert not (tmp_path / "x").exists()


def vllm_medusa_logits(tensors: dict, config: dict, hidden: torch.Tensor) -> torch.Tensor:
    """[N, heads, vocab]: what vLLM's Medusa computes from the exported checkpoint. Per head, `x = x + SiLU(layer(x))`
    for each of its layers, then its LM head (the one at lm_heads.0 when original_lm_head); with a token_map, row r
    of the truncated logits is target token token_map[r], -inf elsewhere."""
    t = {k: v.float() for k, v in tensors.items()}
    logits = []
    for i in range(config["num_heads"]):
        x = hidden
        for j in range(config["num_hidden_layers"]):
            x = x + F.silu(x @ t[f"blocks.{i}.layers.{j}.weight"].T + t[f"blocks.{i}.layers.{j}.bias"])
        head = x @ t["lm_heads.0.weight" if config["original_lm_head"] else f"lm_heads.{i}.weight"].T
        if config["truncated_vocab_size"] < config["vocab_size"]:
            full = head.new_full((*head.shape[:-1], config["vocab_size"]), float("-inf"))
            head = full.index_copy(-1, tensors["token_map"], head)
        logits.append(head)
    return torch.stack(logits, dim=-2)


@pytest.mark.parametrize("variant", MEDUSA_VARIANTS)
def test_export_vllm_medusa_matches_vllms_medusa_loader(world, tmp_path, variant):
    out = tmp_path / "vllm-medusa"
    assert cli(["export", str(world[variant]), "--format", "vllm-medusa", "--target", str(world["target_folder"]),
                "--out", str(out)]) == 0
    # vLLM's Medusa (vllm-project/vllm: vllm/model_executor/models/medusa.py at 01dbb08, Medusa / ResidualBlock /
    # load_weights; vllm/transformers_utils/configs/medusa.py at 0531c22, MedusaConfig): config keys model_type
    # "medusa", hidden_size, vocab_size, num_heads, num_hidden_layers (blocks per head), truncated_vocab_size,
    # medusa_fc_bias (block bias; default False), original_lm_head (one LM head, read from lm_heads.0.weight).
    # Tensors blocks.{i}.layers.{j}.weight/bias and lm_heads.{i}.weight [truncated_vocab_size, hidden]; token_map
    # (int ids) when truncated_vocab_size < vocab_size. Unknown tensor names are skipped silently there, so the set
    # must match exactly. MedusaConfig.from_pretrained renames every key holding "num" and "heads" / "layers".
    reduced, shared = variant == "medusa-reduced", variant != "medusa-own"
    config = json.loads((out / "config.json").read_text())
    assert config == {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": 48, "vocab_size": VOCAB,
                      "num_heads": 3, "num_hidden_layers": 2, "truncated_vocab_size": 48 if reduced else VOCAB,
                      "medusa_fc_bias": True, "original_lm_head": shared, "torch_dtype": "float16"}
    rows = 48 if reduced else VOCAB
    expected = {f"blocks.{i}.layers.{j}.{name}": (48, 48) if name == "weight" else (48,)
                for i in range(3) for j in range(2) for name in ("weight", "bias")}
    expected.update({f"lm_heads.{i}.weight": (rows, 48) for i in range(3)}, **({"token_map": (48,)} if reduced else {}))
    assert tensor_shapes(out / "model.safetensors") == expected
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}

    # Same heads: vLLM's forward over the export gives MedusaHeads' logits on the target's real hidden states.
    target, heads = world["target"], AutoDrafter.from_pretrained(world[variant], target=world["target"])
    if reduced:
        assert tensors["token_map"].dtype == torch.int64 and torch.equal(tensors["token_map"], heads.draft_vocab)
    with torch.no_grad():
        hidden = target(random_prompts(1, seed=3)[0], output_hidden_states=True).hidden_states[-1][0]  # post-norm
        ours, theirs = heads(hidden), vllm_medusa_logits(tensors, config, hidden)
    assert torch.equal(torch.isfinite(theirs), torch.isfinite(ours))  # the same draft vocabulary
    allowed = torch.isfinite(ours)  # the export stores the target's LM head in float16
    torch.testing.assert_close(theirs[allowed], ours[allowed], rtol=1e-2, atol=1e-2 * float(ours[allowed].abs().max()))
    assert torch.equal(theirs.argmax(-1), ours.argmax(-1))


def test_saving_never_deletes_a_custom_generate_folder_the_user_wrote(world, tmp_path):
    folder = tmp_path / "mine"
    (folder / "custom_generate").mkdir(parents=True)
    (folder / "custom_generate" / "generate.py").write_text("def generate(model, **kwargs):  # my own loop\n    ...\n")
    with pytest.warns(UserWarning, match="was not written by hf_specdec; left as it is"):
        AutoDrafter.from_pretrained(world["agreeing"]).save_pretrained(folder)
    assert (folder / "custom_generate" / "generate.py").read_text().startswith("def generate(model, **kwargs):  # my own")
    AutoDrafter.from_pretrained(world["agreeing"]).save_pretrained(tmp_path / "ours")
    AutoDrafter.from_pretrained(world["agreeing"]).save_pretrained(tmp_path / "ours")  # hf_specdec's own: rewritten
    assert (tmp_path / "ours" / "custom_generate" / "generate.py").read_text().startswith("# Generated from ")
