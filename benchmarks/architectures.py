"""Every causal-LM architecture the installed transformers registers, decoded speculatively: identical to plain greedy
`generate()`, or refused before any forward with a reason. transformers' own assisted decoding is the reference column.

    python benchmarks/architectures.py --json benchmarks/results/architectures.json          # every type (~1 h)
    python benchmarks/architectures.py --types llama,gemma3,mamba                          # a few

For each model type in `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`: a tiny random config (its own defaults, widths and layer
counts shrunk; weights large enough that the next token depends on the context; a sliding window, where there is one,
shorter than the generation), a few prompts (random, and one that repeats itself so that n-gram lookup drafts), greedy
decoding of NEW_TOKENS tokens. Then, against plain `generate()`:
- transformers' assisted decoding with a noisy copy of the target (`assistant_model=`): the reference;
- hf_specdec with each drafter: a draft model holding the target's own weights (every draft accepted), a noisy copy
  (drafts rejected, caches rolled back), n-gram lookup and self-speculation (half the layers), both ways in
  (`enable()` and `custom_generate=`), with the CPU matmul path on (the default) and off.
A cell is `ok` (identical), `refused` (an error before the target's first forward), `DIFFERENT` or `CRASH` (an error
after forwards ran). Each type runs in a worker process with a time limit; a type whose config or model cannot be
built here is reported as such.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

NEW_TOKENS = 32
VOCAB = 128
DRAFTERS = ("copy", "noisy", "ngram", "self")
ROUTES = ("enable", "custom_generate")

#: attribute -> tiny value, applied to every config (and sub-config) that has the attribute
SHRINK = {
    "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_layers": 2,
    "n_layer": 2, "n_embd": 64, "n_head": 4, "n_inner": 96, "d_model": 64, "ffn_dim": 96, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_kv_heads": 2, "head_dim": 16, "attention_head_dim": 16, "kv_channels": 16,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "shared_experts_intermediate_size": 32,
    "shared_intermediate_size": 32, "intermediate_size_mlp": 96, "ffn_hidden_size": 96,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4, "num_experts_per_tok": 2,
    "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "qk_head_dim": 16, "o_lora_rank": 16, "index_head_dim": 16, "index_n_heads": 2, "index_topk": 8,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_head_dim": 16, "mamba_d_state": 16, "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_chunk_size": 16,
    "mamba_d_ssm": 64, "state_size": 16, "chunk_size": 16, "block_size": 16, "rotary_dim": 8,
    "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": VOCAB, "laurel_rank": 8,
    "max_position_embeddings": 512, "n_positions": 512, "n_ctx": 512, "max_seq_len": 512,
    "sliding_window": 8, "sliding_window_size": 8, "attention_chunk_size": 8, "swa_head_dim": 16,
    "swa_num_attention_heads": 4, "embedding_size": 64, "attention_hidden_size": 64, "dim_head": 16, "dim_ff": 96,
    "time_step_rank": 8, "conv_kernel": 4, "expand": 2, "num_hidden_groups": 1,
    "decoder_layers": 2, "encoder_layers": 2, "decoder_attention_heads": 4, "encoder_attention_heads": 4,
    "decoder_ffn_dim": 96, "encoder_ffn_dim": 96,
}
#: token ids a config names are kept inside the tiny vocabulary
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
             "image_token_id", "image_token_index", "boi_token_id", "eoi_token_id", "audio_token_id")


def _get(config, name):
    """The attribute, or None where it is absent, derived (a read-only property) or per layer (gemma4 raises)."""
    if isinstance(getattr(type(config), name, None), property) and getattr(type(config), name).fset is None:
        return None
    try:
        return getattr(config, name, None)
    except Exception:
        return None


def shrink(config) -> None:
    """Make `config` (and each sub-config) tiny, in place."""
    for name, value in list(vars(config).items()):
        if hasattr(value, "to_dict") and hasattr(value, "model_type"):
            shrink(value)
    for name, value in SHRINK.items():
        current = _get(config, name)
        if isinstance(current, int) and not isinstance(current, bool):
            try:
                setattr(config, name, value)
            except NotImplementedError:  # xlnet has no length limit to set
                pass
    for name in ("head_dim", "num_key_value_heads"):  # None where the model derives it at build time (some do not)
        if name in vars(config) and vars(config)[name] is None and _get(config, "num_attention_heads"):
            setattr(config, name, SHRINK[name])
    for name in TOKEN_IDS:
        value = _get(config, name)
        if isinstance(value, int) and value >= VOCAB:
            setattr(config, name, VOCAB - 1 - TOKEN_IDS.index(name))
    if _get(config, "qk_rope_head_dim") and _get(config, "head_dim"):  # latent attention: RoPE spans the rope part,
        config.head_dim = config.qk_rope_head_dim  # and every head has its own keys (as in the published configs)
        if _get(config, "num_key_value_heads"):
            config.num_key_value_heads = config.num_attention_heads
    if isinstance(_get(config, "n_routed_experts"), int) and _get(config, "num_experts_per_tok") is None:
        config.num_experts_per_tok = SHRINK["num_experts_per_tok"]  # deepseek_v2 routes to none by default
    if config.model_type == "mamba2":  # its heads span expand x hidden_size
        config.num_heads = config.expand * config.hidden_size // config.head_dim
    if config.model_type == "xlstm":
        config.embedding_dim = SHRINK["hidden_size"]
    if _get(config, "axial_pos_embds_dim"):  # reformer: the axial embeddings add up to the width
        config.axial_pos_embds_dim = (SHRINK["hidden_size"] // 2,) * 2
    if config.model_type in ("lfm2", "lfm2_moe") and "conv" not in (_get(config, "layer_types") or []):
        # their defaults leave the layer kinds to checkpoints (LFM2's from transformers 5.25: every layer attention)
        config.layer_types = ["conv", "full_attention"]
        if _get(config, "full_attn_idxs") is not None:
            config.full_attn_idxs = [1]
    layer_types = _get(config, "layer_types")
    per_layer = [n for n, v in vars(config).items()  # other lists with one entry per layer (inkling's MLP kinds)
                 if n != "layer_types" and isinstance(v, list) and isinstance(layer_types, list) and len(v) == len(layer_types)]
    if isinstance(layer_types, list) and layer_types:
        kinds = list(dict.fromkeys(layer_types))  # keep one layer of each kind the model mixes
        config.layer_types = (kinds + layer_types)[: max(2, len(kinds))]
        for name in per_layer:
            setattr(config, name, getattr(config, name)[: len(config.layer_types)])
        for name in ("num_hidden_layers", "num_layers"):
            if _get(config, name) is not None:
                setattr(config, name, len(config.layer_types))
    if hasattr(config, "initializer_range"):
        config.initializer_range = 0.2  # outputs that depend on the context (0.02 gives near-ties everywhere)
    config.eos_token_id = None  # generate every token
    if hasattr(config, "use_cache"):
        config.use_cache = True


def build(model_type: str):
    import torch
    from transformers import AutoModelForCausalLM, CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type]()
    shrink(config)
    if getattr(config, "is_decoder", None) is False and not config.is_encoder_decoder:
        config.is_decoder = True  # encoder classes with an LM head decode causally only so
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    return model


def noisy_copy(model, scale: float = 0.05):
    import torch

    torch.manual_seed(1)
    drafter = copy.deepcopy(model)
    with torch.no_grad():
        for p in drafter.parameters():
            if p.is_floating_point():
                spread = p.std().clamp_min(1e-3) if p.numel() > 1 else p.abs().clamp_min(1e-3)
                p.add_(torch.randn_like(p) * scale * spread)
    return drafter


def prompts():
    import torch

    g = torch.Generator().manual_seed(0)
    motif = torch.randint(3, VOCAB - 8, (1, 6), generator=g)
    return [torch.randint(3, VOCAB - 8, (1, n), generator=g) for n in (7, 11)] + [motif.repeat(1, 3)]


def run_type(model_type: str, fast_variants=(True, False)) -> dict:
    """Every cell of one model type."""
    import torch

    import hf_specdec
    from hf_specdec.errors import InputError

    row = {"type": model_type}
    try:
        target = build(model_type)
    except Exception as error:  # noqa: BLE001 (a config this script cannot make tiny, or a model that needs more)
        return {**row, "status": "not built", "reason": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"}
    row["class"] = type(target).__name__
    if target.config.is_encoder_decoder:
        row["encoder_decoder"] = True
    forwards = [0]
    target.register_forward_pre_hook(lambda *a: forwards.__setitem__(0, forwards[0] + 1))
    common = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    try:
        plain = [target.generate(p, attention_mask=torch.ones_like(p), **common) for p in prompts()]
    except Exception as error:  # noqa: BLE001
        return {**row, "status": "no plain generate", "reason": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"}
    noisy = noisy_copy(target)
    row["cells"] = cells = {}

    def attempt(name, call):
        forwards[0] = 0
        try:
            outs = [call(p) for p in prompts()]
        except Exception as error:  # noqa: BLE001
            message = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
            refused = forwards[0] == 0 and isinstance(error, (InputError, ValueError, TypeError))
            cells[name] = {"status": "refused" if refused else "CRASH", "reason": f"{type(error).__name__}: {message}"}
            if not refused:
                cells[name]["where"] = traceback.format_exc().strip().splitlines()[-3][:200]
            return
        same = [bool(torch.equal(o, p)) for o, p in zip(outs, plain)]
        cells[name] = {"status": "ok" if all(same) else "DIFFERENT"}
        if not all(same):
            o, p = next((o, p) for o, p, s in zip(outs, plain, same) if not s)
            width = min(o.shape[1], p.shape[1])
            diff = (o[0, :width] != p[0, :width]).nonzero()
            cells[name]["first_difference"] = int(diff[0]) if len(diff) else width

    attempt("transformers assisted (noisy copy)",
            lambda p: target.generate(p, attention_mask=torch.ones_like(p), assistant_model=noisy, **common))
    drafters = {"copy": lambda: copy.deepcopy(target), "noisy": lambda: noisy, "ngram": lambda: "ngram",
                "self": lambda: "self"}
    hf_specdec.enable(target)
    try:
        for drafter in DRAFTERS:
            for route in ROUTES:
                for fast in fast_variants:
                    assistant = drafters[drafter]()
                    kw = dict(assistant=assistant, fast_cpu_verify=fast, num_draft_tokens=4)
                    if route == "enable":
                        call = lambda p, kw=kw: target.generate(p, attention_mask=torch.ones_like(p), **common, **kw)  # noqa: E731
                    else:
                        call = lambda p, kw=kw: type(target).generate(  # noqa: E731
                            target, p, attention_mask=torch.ones_like(p), custom_generate=hf_specdec.speculative_generate,
                            **common, **kw)
                    attempt(f"{drafter}/{route}/{'fast' if fast else 'stock'}", call)
    finally:
        hf_specdec.disable(target)
    ours = [c for name, c in cells.items() if not name.startswith("transformers")]
    statuses = {c["status"] for c in ours}
    row["status"] = ("identical" if statuses == {"ok"} else "identical or refused" if statuses <= {"ok", "refused"}
                     else "FAILS")
    return row


def worker(types: list[str], out: Path, timeout: int) -> None:
    """Run each type, appending a JSON line per type (a "start" line first, so that the parent knows which one died)."""
    import torch

    torch.set_num_threads(1)
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError(f"over {timeout} s")))
    for model_type in types:
        with out.open("a") as f:
            f.write(json.dumps({"start": model_type}) + "\n")
        signal.alarm(timeout)
        t0 = time.perf_counter()
        try:
            row = run_type(model_type)
        except TimeoutError as error:
            row = {"type": model_type, "status": "timeout", "reason": str(error)}
        finally:
            signal.alarm(0)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")


def summary(rows: list[dict]) -> str:
    lines = ["| type | result | transformers assisted | cells not ok (drafter/route/matmul path: result) |", "|---|---|---|---|"]
    for row in sorted(rows, key=lambda r: r["type"]):
        cells = row.get("cells", {})
        reference = cells.get("transformers assisted (noisy copy)", {})
        bad = sorted({f"{name}: {c['status']}" + (f" ({c['reason'][:70]})" if c["status"] != "DIFFERENT" else
                                                  f" (token {c.get('first_difference')})")
                      for name, c in cells.items() if c["status"] != "ok" and not name.startswith("transformers")})
        refusals = {c["reason"] for n, c in cells.items() if c["status"] == "refused" and not n.startswith("transformers")}
        if refusals and len(bad) == len([c for n, c in cells.items() if not n.startswith("transformers")]) and \
                len(refusals) == 1:
            bad = [f"every cell refused: {refusals.pop()[:140]}"]
        result = row["status"] + (f": {row['reason'][:120]}" if "reason" in row else "")
        ref = reference.get("status", "-") + (f" ({reference['reason'][:60]})" if reference.get("reason") else "")
        lines.append(f"| {row['type']} | {result} | {ref} | {'; '.join(bad)[:600]} |")
    counts = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    lines.append("")
    lines.append("types: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", default="", help="comma list of model types (default: every causal-LM type)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per type")
    parser.add_argument("--json", default="benchmarks/results/architectures.json")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.types.split(","), Path(args.worker), args.timeout)
        return 0
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = args.types.split(",") if args.types else sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    lines = Path(args.json).with_suffix(".jsonl")
    lines.parent.mkdir(parents=True, exist_ok=True)
    lines.unlink(missing_ok=True)
    todo = list(types)
    while todo:  # a worker that dies (a crash in C, memory) loses one type, which is reported; the rest go on
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        subprocess.run([sys.executable, __file__, "--worker", str(lines), "--types", ",".join(todo), "--timeout",
                        str(args.timeout)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        done = [json.loads(line) for line in lines.read_text().splitlines()]
        finished = {r["type"] for r in done if "type" in r}
        started = [r["start"] for r in done if "start" in r]
        lost = [t for t in started if t not in finished]
        for model_type in lost:
            with lines.open("a") as f:
                f.write(json.dumps({"type": model_type, "status": "worker died"}) + "\n")
        todo = [t for t in todo if t not in finished and t not in lost]
    rows = [json.loads(line) for line in lines.read_text().splitlines()]
    rows = [r for r in rows if "type" in r]
    Path(args.json).write_text(json.dumps(rows, indent=1))
    print(summary(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
