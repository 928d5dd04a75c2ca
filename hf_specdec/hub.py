"""Sharing drafters on the Hugging Face Hub: the `custom_generate/` bundle, model cards, and uploads.

- `write_custom_generate(folder)`: every saved `SpecDrafterForCausalLM` / `MedusaHeads` folder gets `custom_generate/`
  (called by their `save_pretrained`), so
  `target.generate(**inputs, custom_generate="<folder or repo>", trust_remote_code=True)` decodes speculatively with
  plain transformers. The folder is GENERATED from the installed hf_specdec sources:
  `hf_specdec/custom_generate.py` becomes `generate.py`, and every hf_specdec module it imports is copied next to it,
  so it is the library's own code.
- `render_model_card(folder, config, ...)`: a `ModelCard` from `model_cards/drafter.md` with Hub metadata (library,
  base model = the target, tags with the drafter kind, datasets, license), the measured acceptance, usage, training.
- `push_folder(folder, repo_id)`: one commit with huggingface_hub's `HfApi` (the token it already knows; none written).
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import platform
import re
import shutil
import sys
from pathlib import Path

import torch
from huggingface_hub import HfApi, ModelCard, ModelCardData
from huggingface_hub.utils import HFValidationError, validate_repo_id
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from . import __version__
from .default_model import DEFAULT_TARGET_NAME
from .modeling_drafter import MODEL_TYPE
from .modeling_medusa import MEDUSA_MODEL_TYPE

PACKAGE_DIR = Path(__file__).resolve().parent
TEMPLATES_DIR = PACKAGE_DIR.parent / "model_cards"
DEFAULT_TARGET_HUB_ID = f"HuggingFaceTB/{DEFAULT_TARGET_NAME}"
COMMIT_MESSAGE = "Upload hf_specdec drafter"
CUSTOM_GENERATE_DIR = "custom_generate"
BUNDLE_ENTRY = "custom_generate"  # hf_specdec/custom_generate.py, written as custom_generate/generate.py


# ----------------------------------------------------------------------------------------------------------------------
# custom_generate/: hf_specdec's own modules, flattened into one folder
# ----------------------------------------------------------------------------------------------------------------------
def _module_file(name: str) -> tuple[Path, bool]:
    """(source file, is a package) of the hf_specdec submodule `name` (dotted, relative to the package)."""
    base = PACKAGE_DIR.joinpath(*name.split("."))
    if (base / "__init__.py").exists():
        return base / "__init__.py", True
    return base.with_suffix(".py"), False


def _flat_name(name: str) -> str:
    # transformers copies only modules imported as `from .name import ...` from the folder itself: no sub-packages
    return "generate" if name == BUNDLE_ENTRY else name.replace(".", "_")


def bundle_sources() -> dict[str, str]:
    """`{file name: source}` of the bundle: `hf_specdec.custom_generate` and every hf_specdec module it imports.

    Two rewrites, nothing else: relative imports name the flattened modules (`from ..ragged_cache` in
    `drafters/eagle.py` -> `from .ragged_cache`), and module-level `*.register(...)` calls are left out, so that a
    bundled copy never re-registers the drafter type over an installed hf_specdec's own classes.
    """
    sources, todo = {}, [BUNDLE_ENTRY]
    while todo:
        name = todo.pop()
        flat = _flat_name(name) + ".py"
        if flat in sources:
            continue
        path, is_package = _module_file(name)
        text = path.read_text(encoding="utf-8")
        tree, lines = ast.parse(text), text.splitlines(keepends=True)
        package = name.split(".") if is_package else name.split(".")[:-1]
        where = f"hf_specdec/{path.relative_to(PACKAGE_DIR).as_posix()}"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                if not node.module:
                    raise ValueError(f"{where}:{node.lineno}: `from . import x` cannot be bundled; use `from .x import y`.")
                imported = ".".join(package[: len(package) - node.level + 1] + node.module.split("."))
                todo.append(imported)
                line = node.lineno - 1
                flat_import = rf"\g<1>.{_flat_name(imported)}\g<2>"
                lines[line], n = re.subn(r"^(\s*from\s+)\.+[\w.]+(\s+import\b)", flat_import, lines[line])
                if n != 1:
                    raise ValueError(f"{where}:{node.lineno}: keep `from .module import` on one line to be bundled.")
        for node in tree.body:
            call = node.value if isinstance(node, ast.Expr) else None
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "register":
                lines[node.lineno - 1 : node.end_lineno] = [""] * (node.end_lineno - node.lineno + 1)
        header = f"# Generated from {where} (hf_specdec {__version__}) when the drafter was saved. Do not edit.\n"
        sources[flat] = header + "".join(lines)
    return sources


def bundle_requirements(sources: dict[str, str]) -> str:
    """requirements.txt: hf-specdec's own pins for the third-party packages the bundle imports, one bound per line
    (transformers' requirement check reads a single `name<op>version` per line)."""
    imported = set()
    for text in sources.values():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    try:
        requires = [Requirement(r) for r in importlib.metadata.requires("hf-specdec") or []]
    except importlib.metadata.PackageNotFoundError:  # a source checkout that was never pip-installed: names only
        requires = []
    declared = {canonicalize_name(r.name): r for r in requires if not r.marker}
    lines = []
    for module in sorted(imported - set(sys.stdlib_module_names)):
        requirement = declared.get(canonicalize_name(module))
        specs = sorted(requirement.specifier, key=str) if requirement is not None else []
        lines += [f"{module}{s.operator}{s.version}" for s in specs] or [module]
    return "".join(line + "\n" for line in lines)


def write_custom_generate(folder) -> Path:
    """(Re)write `folder/custom_generate/` from the installed hf_specdec; returns its path."""
    out = Path(folder) / CUSTOM_GENERATE_DIR
    if out.exists():
        shutil.rmtree(out)  # a bundle from another hf_specdec version may hold modules this one no longer has
    out.mkdir(parents=True)
    sources = bundle_sources()
    for name, text in sources.items():
        (out / name).write_text(text, encoding="utf-8")
    (out / "requirements.txt").write_text(bundle_requirements(sources), encoding="utf-8")
    return out


# ----------------------------------------------------------------------------------------------------------------------
# Model cards
# ----------------------------------------------------------------------------------------------------------------------
QUANTIZATION_CODE = {
    "8bit": "BitsAndBytesConfig(load_in_8bit=True)",
    "4bit": 'BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)',
}


def drafter_kind(config) -> str:
    """The Hub tag of a drafter's kind: 'medusa' (heads on the target's hidden state), 'eagle' (a drafter that also
    reads the target's hidden states) or 'draft-model' (tokens only)."""
    if getattr(config, "model_type", None) == MEDUSA_MODEL_TYPE:
        return "medusa"
    return "eagle" if getattr(config, "target_feature_input", False) else "draft-model"


def is_hub_id(name: str | None) -> bool:
    """A Hub repo id ("owner/name") rather than a local folder."""
    if not name or Path(name).exists() or name.count("/") != 1:
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def hardware_description() -> str:
    """This machine, for the results table (the card is written where the evaluation ran)."""
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__})"
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads (torch {torch.__version__})"


def render_model_card(folder, config, *, repo_id: str | None = None, target: str | None = None,
                      datasets: list[str] | None = None, license: str = "apache-2.0", hardware: str | None = None,
                      template_path=None) -> ModelCard:
    """The model card of the drafter saved in `folder` (save it as `folder/README.md`).

    target: the target's Hub id or folder (default: `config.target_name_or_path`); a Hub id becomes `base_model`.
    hardware: where the figures in `config.measured` were measured (default: `measured["hardware"]`, else
    "not recorded").
    """
    folder = Path(folder)
    template_path = Path(template_path or TEMPLATES_DIR / "drafter.md")
    if not template_path.exists():
        raise FileNotFoundError(f"No model card template at {template_path}: pass template_path= (the templates live "
                                "in model_cards/ of the hf_specdec repository).")
    target_id = target or getattr(config, "target_name_or_path", None) or "TARGET"
    kind = drafter_kind(config)
    training = getattr(config, "training", None) or {}
    measured = getattr(config, "measured", None) or {}
    has_custom_generate = (folder / CUSTOM_GENERATE_DIR / "generate.py").exists()
    tags = ["speculative-decoding", kind, *(["distillation"] if training else []), "hf-specdec",
            *(["custom_generate"] if has_custom_generate else [])]
    quantization = getattr(config, "target_quantization", None) or "none"
    card_data = ModelCardData(library_name="hf-specdec", base_model=target_id if is_hub_id(target_id) else None,
                              license=license, datasets=datasets or None, tags=tags, pipeline_tag="text-generation")
    return ModelCard.from_template(
        card_data,
        template_path=str(template_path),
        repo_id=repo_id or folder.name,
        target_id=target_id,
        target_is_default=target_id == DEFAULT_TARGET_HUB_ID,
        kind=kind,
        borrows_target=getattr(config, "model_type", None) == MODEL_TYPE,
        has_custom_generate=has_custom_generate,
        quantization=quantization,
        quantization_code=QUANTIZATION_CODE.get(quantization, "None"),
        hardware=hardware or measured.get("hardware") or "not recorded",
        config=config,
        measured=measured,
        # Medusa heads propose at most one token per head
        num_draft_tokens=measured.get("num_draft_tokens") or getattr(config, "num_heads", None) or 5,
        training=training,
        size_mb=round(sum(p.stat().st_size for p in folder.glob("*.safetensors")) / 2**20, 2),
    )


# ----------------------------------------------------------------------------------------------------------------------
# Upload
# ----------------------------------------------------------------------------------------------------------------------
def files_to_upload(folder) -> list[str]:
    """What a push uploads: the folder's files and its custom_generate/ (never checkpoints/, hidden files, caches)."""
    folder = Path(folder)
    files = [p for p in folder.iterdir() if p.is_file()]
    if (folder / CUSTOM_GENERATE_DIR).is_dir():
        files += [p for p in (folder / CUSTOM_GENERATE_DIR).iterdir() if p.is_file() and p.suffix != ".pyc"]
    return sorted(p.relative_to(folder).as_posix() for p in files if not p.name.startswith("."))


def push_folder(folder, repo_id: str, *, private: bool = False, api: HfApi | None = None,
                commit_message: str = COMMIT_MESSAGE) -> str:
    """Upload a drafter folder in one commit; returns the repo URL.

    Uses the token huggingface_hub already knows (HF_TOKEN or `hf auth login`) and never writes one.
    """
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} holds no config.json: pass a folder written by `save_pretrained` or distill.py.")
    validate_repo_id(repo_id)  # a clear error before any request
    api = api or HfApi()
    url = api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=True)
    api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=str(folder),
                      allow_patterns=files_to_upload(folder), commit_message=commit_message)
    return str(url)


__all__ = [
    "write_custom_generate",
    "bundle_sources",
    "render_model_card",
    "drafter_kind",
    "hardware_description",
    "files_to_upload",
    "push_folder",
]
