"""Medusa heads with a tree of candidates: the shipped heads for SmolLM2 propose a tree of their likeliest tokens,
verified in ONE target forward with a tree attention mask; a wider tree accepts more per forward (and costs a wider
forward)."""

import argparse

import torch

import hf_specdec
from hf_specdec.drafters import MedusaDrafter

parser = argparse.ArgumentParser()
parser.add_argument("--max-new-tokens", type=int, default=64)
parser.add_argument("--nodes", type=int, nargs="+", default=[7, 31])
args = parser.parse_args()

model, tokenizer = hf_specdec.load_default_target()
heads = hf_specdec.AutoDrafter.from_pretrained("medusa", target=model)  # shipped with the package
messages = [{"role": "user", "content": "Explain what a hash table is in two sentences."}]
inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
plain = model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)

for nodes in args.nodes:
    drafter = MedusaDrafter(heads, tree=nodes)  # the `nodes` paths likeliest to be accepted, from the heads' accuracy
    stats = hf_specdec.SpeculationStats()
    out = model.generate(**inputs, custom_generate=hf_specdec.speculative_generate, assistant=drafter,
                         max_new_tokens=args.max_new_tokens, do_sample=False, speculation_stats=stats,
                         draft_length="constant")  # the whole tree at every step (adaptive would size it by cost)
    assert torch.equal(out, plain)  # exact
    print(f"{nodes}-node tree: {stats.mean_accepted_tokens:.2f} tokens per target forward, "
          f"acceptance by depth {[round(a, 2) for a in stats.acceptance_by_position]}")
print(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
