"""`hf-specdec bench` on a tiny random model writes well-formed JSON (and a plot) with every field."""

from __future__ import annotations

import json

import pytest

from hf_specdec.cli.bench import adaptive_vs_best_constant, paired_speed_ratio
from hf_specdec.cli import main
from tests.conftest import perturbed_copy, tiny_char_tokenizer, tiny_llama

FIELDS = {"name", "tokens_per_second", "speedup", "mean_accepted_tokens", "acceptance_by_position", "identical_to_plain"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    target = tiny_llama()
    tokenizer = tiny_char_tokenizer()
    target.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    perturbed_copy(target).save_pretrained(root / "drafter")  # a draft model that mostly agrees
    prompts = root / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": str(i), "prompt": p}) for i, p in enumerate(["abcabc", "hello", "xyz"])))
    return root, prompts


@pytest.mark.parametrize("assistant, builtin", [("ngram", "transformers prompt_lookup_num_tokens"),
                                                ("drafter", "transformers assistant_model")])
def test_bench_writes_json_and_plot(folders, assistant, builtin, capsys):
    root, prompts = folders
    out_json, out_png = root / f"{assistant}.json", root / f"{assistant}.png"
    spec = assistant if assistant == "ngram" else str(root / assistant)
    code = main(["bench", "--target", str(root / "target"), "--assistant", spec, "--prompts", str(prompts),
                 "--num-prompts", "2", "--max-new-tokens", "12", "--num-draft-tokens", "3",
                 "--json", str(out_json), "--plot", str(out_png)])
    assert code == 0
    report = json.loads(out_json.read_text())
    names = [m["name"] for m in report["methods"]]
    assert names == ["plain", builtin, "hf_specdec, no drafts", "hf_specdec"]
    for method in report["methods"]:
        assert FIELDS <= set(method)
        assert method["identical_to_plain"] is True
        assert method["tokens_per_second"] > 0
    assert report["methods"][0]["mean_accepted_tokens"] == 1.0
    assert report["methods"][2]["mean_accepted_tokens"] == 1.0  # the no-drafts baseline: plain steps, our loop
    if assistant == "drafter":  # a draft model that mostly agrees: it speculated (lookup on random text may not)
        assert report["methods"][3]["mean_accepted_tokens"] > 1.0
    assert len(report["methods"][3]["acceptance_by_position"]) == 3
    for m in report["methods"]:  # the speed-up splits into speculation's share and the step's cost
        assert m["speedup"] == pytest.approx(m["mean_accepted_tokens"] / m["step_cost_vs_plain"], rel=0.05) or \
            m["name"].startswith("transformers")
    assert {"num_prompts", "max_new_tokens", "num_draft_tokens", "do_sample"} <= set(report["settings"])
    assert report["costs"]["break_even_mean_accepted_tokens"] > 0
    assert out_png.stat().st_size > 1000
    assert "| hf_specdec |" in capsys.readouterr().out


def test_bench_sampling_mode(folders):
    root, prompts = folders
    out_json = root / "sample.json"
    assert main(["bench", "--target", str(root / "target"), "--assistant", "ngram", "--prompts", str(prompts),
                 "--num-prompts", "1", "--max-new-tokens", "8", "--do-sample", "--temperature", "0.8",
                 "--seed", "3", "--json", str(out_json)]) == 0
    report = json.loads(out_json.read_text())
    assert all(m["identical_to_plain"] is None for m in report["methods"])
    assert report["settings"]["do_sample"] is True


def test_bench_sweeps_draft_lengths_and_adaptive(folders, capsys):
    root, prompts = folders
    out_json = root / "sweep.json"
    assert main(["bench", "--target", str(root / "target"), "--assistant", str(root / "drafter"), "--prompts", str(prompts),
                 "--num-prompts", "2", "--max-new-tokens", "12", "--num-draft-tokens", "1,3", "--adaptive",
                 "--json", str(out_json)]) == 0
    report = json.loads(out_json.read_text())
    assert [m["name"] for m in report["methods"]] == ["plain", "hf_specdec, no drafts", "hf_specdec k=1", "hf_specdec k=3",
                                                      "hf_specdec adaptive k<=3"]
    assert all(m["identical_to_plain"] for m in report["methods"])
    assert all(m["mean_accepted_tokens"] > 1.0 for m in report["methods"][2:4])
    assert len(report["methods"][2]["acceptance_by_position"]) == 1
    assert report["settings"]["draft_lengths"] == [1, 3]
    assert all(len(m["prompt_seconds"]) == len(m["prompt_tokens"]) == 2 for m in report["methods"])
    assert "hf_specdec adaptive k<=3 vs the fastest constant (hf_specdec k=" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["bench", "--prompts", str(prompts), "--num-draft-tokens", "0,2"])


def test_bench_compares_several_drafters_in_one_run(folders):
    root, prompts = folders
    out_json = root / "several.json"
    assert main(["bench", "--target", str(root / "target"), "--assistant", f"ngram,{root / 'drafter'}", "--prompts",
                 str(prompts), "--num-prompts", "2", "--max-new-tokens", "10", "--num-draft-tokens", "2",
                 "--json", str(out_json)]) == 0
    report = json.loads(out_json.read_text())
    # transformers' own equivalent of each kind: prompt lookup for n-gram lookup, assisted decoding for the draft model
    assert [m["name"] for m in report["methods"]] == ["plain", "transformers prompt_lookup_num_tokens",
                                                      "transformers assistant_model", "hf_specdec, no drafts",
                                                      "hf_specdec ngram", f"hf_specdec {root / 'drafter'}"]
    assert all(m["identical_to_plain"] for m in report["methods"])
    assert report["methods"][5]["mean_accepted_tokens"] > 1.0


def test_paired_comparison_picks_the_fastest_constant_and_brackets_the_ratio():
    def method(name, seconds, tokens_per_second):
        return {"name": name, "tokens_per_second": tokens_per_second, "prompt_seconds": seconds,
                "prompt_tokens": [10] * len(seconds)}

    slow = method("hf_specdec k=1", [2.0, 4.0, 2.0, 4.0], 10 * 4 / 12)
    fast = method("hf_specdec k=2", [1.0, 2.0, 1.0, 2.0], 10 * 4 / 6)
    adaptive = method("hf_specdec adaptive k<=2", [1.0, 2.2, 1.1, 1.9], 10 * 4 / 6.2)
    ratio, lo, hi = paired_speed_ratio(adaptive, fast)
    assert ratio == pytest.approx(6.0 / 6.2)
    assert lo <= ratio <= hi and hi - lo < 0.2
    assert paired_speed_ratio(fast, slow)[0] == pytest.approx(2.0)
    (line,) = adaptive_vs_best_constant({"methods": [method("plain", [3.0] * 4, 1.0), slow, fast, adaptive]})
    assert "(hf_specdec k=2): 0.968x" in line


def test_bench_takes_a_published_drafters_folder(folders, tmp_path):
    """`--assistant FOLDER` in another project's layout (speculators' EAGLE-3 here) benchmarks it as any drafter."""
    import torch
    from transformers import AutoModelForCausalLM

    from hf_specdec import Eagle3Config, Eagle3DraftModel
    from hf_specdec.kinds.eagle3.formats import SPECULATORS

    root, prompts = folders
    target = AutoModelForCausalLM.from_pretrained(root / "target")
    drafter = Eagle3DraftModel(Eagle3Config.from_target(target.config, draft_vocab_size=0, fc_input_norm="joint",
                                                        target_layer_ids=[1, 2]))
    SPECULATORS.write(drafter.bind_target(target), target, tmp_path / "spec", torch.float32)
    out = tmp_path / "report.json"
    assert main(["bench", "--target", str(root / "target"), "--assistant", str(tmp_path / "spec"), "--prompts",
                 str(prompts), "--num-prompts", "1", "--max-new-tokens", "8", "--num-draft-tokens", "2",
                 "--json", str(out)]) == 0
    methods = {m["name"]: m for m in json.loads(out.read_text())["methods"]}
    assert methods["hf_specdec"]["identical_to_plain"] is True and len(methods["hf_specdec"]["acceptance_by_position"]) == 2
