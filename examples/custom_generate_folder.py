"""A drafter folder used through plain transformers: every drafter hf_specdec saves carries `custom_generate/`, so
`generate(custom_generate=<folder or Hub id>, trust_remote_code=True)` decodes speculatively without hf_specdec."""

import argparse
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_specdec

parser = argparse.ArgumentParser()
parser.add_argument("--max-new-tokens", type=int, default=48)
args = parser.parse_args()

hf_specdec.load_default_target()  # (writes the embedded SmolLM2's safetensors copy on first use)
with tempfile.TemporaryDirectory(prefix="smollm2-drafter-") as folder:  # removed at the end
    # Save the shipped distilled drafter to a folder, as a user would after training or downloading one.
    hf_specdec.AutoDrafter.from_pretrained("distilled").save_pretrained(folder)
    print(f"saved a drafter with its custom_generate/ folder to {folder}")

    # From here on, only transformers: the target and the folder's own decoding code.
    model = AutoModelForCausalLM.from_pretrained(hf_specdec.default_model.default_target_folder()).eval()
    tokenizer = AutoTokenizer.from_pretrained(hf_specdec.default_model.default_target_folder())
    messages = [{"role": "user", "content": "Give me two tips for sleeping well."}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**inputs, custom_generate=folder, trust_remote_code=True, max_new_tokens=args.max_new_tokens,
                         do_sample=False, num_draft_tokens=3, return_dict_in_generate=True)
print(tokenizer.decode(out.sequences[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
print(f"tokens per target forward: {out.speculation_stats.mean_accepted_tokens:.2f}")
assert torch.equal(out.sequences, model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False))
