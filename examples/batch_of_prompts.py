"""A batch of prompts: left-padded, decoded together, each row accepting its own drafts; the same output as plain
batched generate(), row by row."""

import argparse

import torch

import hf_specdec

parser = argparse.ArgumentParser()
parser.add_argument("--max-new-tokens", type=int, default=64)
parser.add_argument("--assistant", default="default", help="any assistant name (see hf_specdec.assistants.resolve)")
parser.add_argument("--draft-length", default=None, choices=["calibrated", "constant", "adaptive"],
                    help="default: calibrated, which drafts only where that pays (on a CPU, a batch seldom)")
args = parser.parse_args()

model, tokenizer = hf_specdec.load_default_target()
tokenizer.padding_side = "left"  # decoder-only batches pad on the left
questions = ["What is the capital of France?", "Write a haiku about autumn.", "List three prime numbers."]
texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
         for q in questions]
inputs = tokenizer(texts, return_tensors="pt", padding=True)

hf_specdec.enable(model)
stats = hf_specdec.SpeculationStats()
out = model.generate(**inputs, assistant=args.assistant, max_new_tokens=args.max_new_tokens, do_sample=False,
                     pad_token_id=tokenizer.pad_token_id, speculation_stats=stats, draft_length=args.draft_length)
for question, row in zip(questions, out):
    print(f"Q: {question}\nA: {tokenizer.decode(row[inputs['input_ids'].shape[1]:], skip_special_tokens=True)}\n")
print(f"tokens per target forward (per row): {stats.mean_accepted_tokens:.2f}")

hf_specdec.disable(model)
plain = model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
assert torch.equal(out, plain)  # exact: the same rows as plain batched decoding
