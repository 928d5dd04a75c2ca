"""The package as a user installs it: a wheel built from the checkout, installed into a fresh virtual environment with
no checkout on the path, imports every module (so nothing in the library reaches into the checkout's top-level
`training/`), carries its data files and runs its command."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CARDS = REPO / "model_cards"

IMPORT_EVERY_MODULE = """
import importlib, pkgutil, sys
repo, venv = sys.argv[1], sys.argv[2]
sys.path[:] = [p for p in sys.path if not p.startswith(repo)]  # (an editable install's .pth adds the checkout)
import hf_specdec
assert hf_specdec.__file__.startswith(venv), hf_specdec.__file__
names = [m.name for m in pkgutil.walk_packages(hf_specdec.__path__, "hf_specdec.") if not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
from_checkout = [n for n, m in sys.modules.items() if (getattr(m, "__file__", None) or "").startswith(repo)]
assert not from_checkout and "training" not in sys.modules, from_checkout
print(len(names))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheel")
    # from a copy without the checkout's build/ (pip builds in the source tree, and setuptools' build/lib keeps the
    # modules a move left behind, which would then ship); the cards linked into the package are copied as files
    source = tmp_path_factory.mktemp("source") / "hf_specdec"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(folder),
                    str(source)], check=True, capture_output=True, timeout=300)
    return next(folder.glob("hf_specdec-*.whl"))


def test_a_wheel_in_a_fresh_environment_imports_every_module_and_runs_its_command(wheel, tmp_path):
    venv = tmp_path / "venv"
    # the dependencies (torch, transformers...) from this interpreter's site-packages; hf_specdec from the wheel alone
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, capture_output=True, timeout=300)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)}
    result = subprocess.run([str(python), "-c", IMPORT_EVERY_MODULE, str(REPO), str(venv)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout) > 100  # (every module: the kinds' training code and the trainer's library half too)
    command = subprocess.run([str(venv / "bin" / "hf-specdec"), "--help"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=120)
    assert command.returncode == 0 and "calibrate" in command.stdout, command.stderr[-2000:]


def test_a_wheel_built_from_the_checkout_holds_the_template_and_renders_a_card(wheel, tmp_path):
    """The template is model_cards/'s file, linked into the package: a wheel must carry a copy of it."""
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("hf_specdec/hub/templates/drafter.md").decode() == (CARDS / "template.md").read_text()
        archive.extractall(tmp_path / "installed")
    script = ("import sys; from hf_specdec.hub.card import shipped_card, TEMPLATE; "
              "assert str(TEMPLATE).startswith(sys.argv[1]); "
              "print(shipped_card('medusa'))")
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "installed")], cwd=tmp_path,
                            env={"PYTHONPATH": str(tmp_path / "installed"), "PATH": "/usr/bin:/bin",
                                 "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == (CARDS / "medusa.md").read_text().strip()
