"""`model_cards/`: the card template every drafter's card is rendered from, and one card per shipped drafter, kept
true by rendering them again from the shipped drafters' saved measurements (a wheel's copy: tests/test_wheel.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_specdec.hub.card import TEMPLATE, shipped_card
from hf_specdec.assistants.shipped import SHIPPED_DIR, shipped_drafter_names

REPO = Path(__file__).resolve().parents[1]
CARDS = REPO / "model_cards"


def test_the_package_renders_from_the_template_in_model_cards():
    assert TEMPLATE.resolve() == (CARDS / "template.md").resolve()


@pytest.mark.parametrize("name", shipped_drafter_names())
def test_each_shipped_drafters_card_is_its_saved_measurements_rendered(name):
    card = (CARDS / f"{name}.md").read_text()
    assert card == shipped_card(name), (
        f"model_cards/{name}.md is out of date with the shipped drafter's config.json: run "
        "`python -c 'from hf_specdec.hub.card import write_shipped_cards; write_shipped_cards()'`")
    assert (SHIPPED_DIR / name / "README.md").read_text() == card  # the card inside the drafter's folder
    assert f"# {name}: a speculative-decoding drafter" in card and f'from_pretrained("{name}", target=target)' in card
    assert "## Limitations" in card and "accelerate launch training/distill.py" in card or "training/distill.py" in card
    assert "x |" in card, "the card shows a measured speed-up (config.json's `benchmarks`)"
