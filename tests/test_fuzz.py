"""The fuzz of `generate()` options against plain greedy decoding (`benchmarks/fuzz.py`), short: every case identical
or refused with a refusal the README lists; and a wrong acceptance rule is caught (the fuzz can fail)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from benchmarks import fuzz

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


@pytest.fixture(scope="module")
def targets():
    return fuzz.load_targets()


def test_every_refusal_the_fuzz_accepts_is_one_the_readme_lists():
    flat = " ".join(README.split())
    assert all(" ".join(why.split()) in flat for why in fuzz.REFUSALS.values())


def test_random_generate_options_decode_exactly_or_are_refused_as_listed(targets, one_thread):
    warnings.filterwarnings("ignore")
    results = [fuzz.run_case(i, 0, targets) for i in range(300)]
    failures = [r for r in results if r["status"] not in ("identical", "refused", "invalid")]
    assert not failures, failures
    summary = fuzz.summary(results)
    assert summary["counts"].get("identical", 0) >= 200, summary
    assert summary["identical_with_drafts_accepted"] >= 60, summary  # speculation really ran in many of them
    assert len({r["architecture"] for r in results if r["status"] == "identical"}) == len(fuzz.ARCHITECTURES)


def test_the_fuzz_catches_a_wrong_acceptance_rule(targets, monkeypatch, one_thread):
    """Negative control: a rule off by one (it keeps the first rejected draft of a chain too) gives other tokens, and
    the fuzz says so."""
    from hf_specdec.generation import verification
    from hf_specdec.generation.verification import Accepted

    def one_too_many(self, draft, tree, scores, valid):
        right = verification.greedy(draft.tokens, tree, scores, valid)
        if not tree.is_chain or valid is not None:
            return right
        n = (right.num_accepted + 1).clamp_max(draft.num_tokens)
        rows = torch.arange(len(n), device=n.device)
        path = torch.where(torch.arange(draft.num_tokens, device=n.device)[None] < n[:, None],
                           torch.arange(draft.num_tokens, device=n.device)[None], -1)
        return Accepted(path, n, scores[rows, n].argmax(-1), n - 1)

    monkeypatch.setattr(verification.GreedyRule, "accept", one_too_many)
    warnings.filterwarnings("ignore")
    results = [fuzz.run_case(i, 0, targets) for i in range(20)]
    assert sum(r["status"].startswith("DIFFERENT") for r in results) >= 3, [r["status"] for r in results]
