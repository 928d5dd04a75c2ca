"""The `custom_generate/` folder of every saved drafter: hf_specdec's own decoding modules, flattened into one folder.

`write_custom_generate(folder)` (run by every drafter's `save_pretrained`, through the save hook this package
registers) lets `target.generate(**inputs, custom_generate="<folder or repo>", trust_remote_code=True)` decode
speculatively with plain transformers. The folder is GENERATED from the installed hf_specdec sources:
`hf_specdec/integrations/custom_generate.py` becomes `generate.py`, and every hf_specdec module it imports is copied next
to it (`generation/loop.py` -> `generation_loop.py`), so it is the library's own code.

Rules for modules that the bundle copies (every module `integrations/custom_generate.py` imports, transitively):
- import other hf_specdec modules relatively, one `from .module import name` (or `from ..pkg.module import name`) per
  line: `from . import module` and imports spread over several lines cannot be rewritten;
- never import `hf_specdec.hub` (or anything outside the bundle): the copy runs without hf_specdec installed;
- module-level `*.register(...)` calls are left out of the copy, so that it never registers its classes with
  transformers' Auto classes over an installed hf_specdec's.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import sys
import warnings
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .. import __version__

PACKAGE_DIR = Path(__file__).resolve().parents[1]
CUSTOM_GENERATE_DIR = "custom_generate"
BUNDLE_ENTRY = "integrations.custom_generate"  # written as custom_generate/generate.py


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
    """`{file name: source}` of the bundle: `hf_specdec.integrations.custom_generate` and every hf_specdec module it
    imports.

    Two rewrites, nothing else: relative imports name the flattened modules (`from ..cache.ragged` in
    `kinds/eagle/drafter.py` -> `from .cache_ragged`), and module-level `*.register(...)` calls are left out, so that a
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


def is_bundle(folder) -> bool:
    """Whether a custom_generate/ folder is one hf_specdec wrote (its generate.py starts with the bundle's header)."""
    entry = Path(folder) / "generate.py"
    try:
        first = entry.read_text(encoding="utf-8").split("\n", 1)[0]
    except OSError:
        return not any(Path(folder).iterdir())  # an empty folder is nobody's work
    return first.startswith("# Generated from ") and "(hf_specdec " in first


def write_custom_generate(folder) -> Path:
    """(Re)write `folder/custom_generate/` from the installed hf_specdec; returns its path."""
    out = Path(folder) / CUSTOM_GENERATE_DIR
    if out.exists():
        if not is_bundle(out):  # the user's own custom_generate/: never deleted
            warnings.warn(f"{out} was not written by hf_specdec; left as it is (delete it to get hf_specdec's).")
            return out
        shutil.rmtree(out)  # a bundle from another hf_specdec version may hold modules this one no longer has
    out.mkdir(parents=True)
    sources = bundle_sources()
    for name, text in sources.items():
        (out / name).write_text(text, encoding="utf-8")
    (out / "requirements.txt").write_text(bundle_requirements(sources), encoding="utf-8")
    return out


__all__ = ["write_custom_generate", "is_bundle", "bundle_sources", "bundle_requirements", "CUSTOM_GENERATE_DIR"]
