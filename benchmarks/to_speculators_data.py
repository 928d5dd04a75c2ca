"""hf_specdec's prepared teacher data written as speculators' offline training set, so that both trainers read the same
sequences and the same target states (benchmarks/trainer_vs_field.sh).

speculators reads a `datasets` folder (input_ids, loss_mask, seq_len; its first rows train, the rest validate) beside
`hidden_states/hs_{row}.safetensors`: per token the states entering the drafter's target layers and, last, the target's
final state before its norm (from which it computes the target's distribution). The prepared set already holds the
states entering the three layers; the final one is the last target layers run on the state entering the first of them
(checked against a full forward on the first record). The training rows are the seeded subset `--max-train-tokens`
picks in `training/distill.py` (the same records, in the same order); the validation rows are the prepared held-out set.

    python benchmarks/to_speculators_data.py --prepared DIR --max-train-tokens 20000 --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections import Counter
from pathlib import Path

import numpy
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from hf_specdec.default_model import default_target_files
from hf_specdec.training.data import TeacherData


def load_set(folder: Path, name: str, layers: str) -> TeacherData:
    data = TeacherData.load(folder / f"{name}.safetensors")
    data.features = numpy.load(folder / f"features-{name}-layers-{layers}.npy", mmap_mode="r")
    return data


@torch.no_grad()
def final_states(target, entering: torch.Tensor, first_layer: int) -> torch.Tensor:
    """The target's last layer output (before the final norm) at every position of one sequence, from the state
    entering `first_layer`: [L, H]."""
    inner = target.model
    hidden = entering[None].float()
    positions = torch.arange(hidden.shape[1])[None]
    rotary = inner.rotary_emb(hidden, positions)
    for layer in inner.layers[first_layer:]:  # no mask: one unpadded sequence, causal attention
        out = layer(hidden, attention_mask=None, position_ids=positions, position_embeddings=rotary)
        hidden = out[0] if isinstance(out, tuple) else out
    return hidden[0]


@torch.no_grad()
def check_final_states(target, tokens: torch.Tensor, computed: torch.Tensor) -> float:
    """The largest difference, relative to the states' scale, between `final_states` and a full forward's."""
    seen = {}

    def keep(module, args):
        seen["x"] = args[0][0]  # (returns None: the forward goes on with its own input)

    hook = target.model.norm.register_forward_pre_hook(keep)
    try:
        target(input_ids=tokens[None].long(), use_cache=False, logits_to_keep=1)
    finally:
        hook.remove()
    return float((seen["x"] - computed).abs().max() / seen["x"].abs().max())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepared", required=True, help="a teacher-data folder training/distill.py prepared")
    parser.add_argument("--layers", default="2-15-27", help="the target layers whose entering states it holds")
    parser.add_argument("--max-train-tokens", type=int, default=0, help="distill.py's --max-train-tokens (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="distill.py's --seed")
    parser.add_argument("--target", default="", help="the target's folder (default: the embedded default target's)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    folder, out = Path(args.prepared), Path(args.out)
    train = load_set(folder, "train", args.layers)
    if args.max_train_tokens:
        train = train.subset(args.max_train_tokens, args.seed)
    held = load_set(folder, "heldout", args.layers)
    target = AutoModelForCausalLM.from_pretrained(args.target or default_target_files(), dtype=torch.float32).eval()
    first_layer = int(args.layers.split("-")[-1])
    hidden = target.config.hidden_size

    rows, freq, states = {"input_ids": [], "loss_mask": [], "seq_len": []}, Counter(), out / "hidden_states"
    states.mkdir(parents=True, exist_ok=True)
    # (one record's states at a time, read from the memory maps: a large set's do not fit in memory)
    records = itertools.chain((train.record(i) for i in range(len(train))), (held.record(i) for i in range(len(held))))
    for row, record in enumerate(records):
        tokens, start, entering = record["tokens"].long(), record["start"], record["features"]
        final = final_states(target, entering[:, -hidden:], first_layer)
        if row == 0:
            gap = check_final_states(target, tokens, final)
            assert gap < 5e-3, f"the final states computed from layer {first_layer} differ from a full forward's ({gap:.2e})"
            print(f"final states from layer {first_layer} against a full forward: largest relative difference {gap:.1e}")
        per_layer = entering.view(len(tokens), -1, hidden)
        save_file({"token_ids": tokens, "hidden_states": torch.cat([per_layer, final[:, None].half()], 1).contiguous()},
                  str(states / f"hs_{row}.safetensors"))
        mask = [0] * start + [1] * (len(tokens) - start)
        rows["input_ids"].append(tokens.tolist())
        rows["loss_mask"].append(mask)
        rows["seq_len"].append(len(tokens))
        if row < len(train):
            freq.update(tokens[start:].tolist())

    import datasets  # (imported late: its import is slow)

    datasets.Dataset.from_dict(rows).with_format("torch").save_to_disk(str(out / "dataset"))
    torch.save(dict(freq), out / "token_freq.pt")
    summary = {"train_rows": len(train), "rows": len(train) + len(held), "train_ratio": (len(train) + 0.5) / (len(train) + len(held)),
               "train_target_tokens": int(train.t["tgt_off"][-1]), "train_tokens": int(train.lengths().sum())}
    (out / "split.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
