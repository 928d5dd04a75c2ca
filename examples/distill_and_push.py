"""Distil a drafter for your target and share it: train against the target as deployed (here the embedded SmolLM2,
4-bit optional), then push the folder (weights, model card, custom_generate/) to the Hub in one commit.

    python examples/distill_and_push.py --max-steps 400 --repo-id you/smollm2-drafter

Small settings (what the test runs): --target <tiny folder> --data <jsonl> --max-steps 4 ... The training command is
`accelerate launch training/distill.py ...` (`--cpu --num_processes 2` for two CPU processes), run from the checkout.
"""

import argparse
import subprocess
import sys
from pathlib import Path

import hf_specdec

REPO = Path(__file__).resolve().parents[1]

parser = argparse.ArgumentParser()
parser.add_argument("--target", default="default")
parser.add_argument("--output-dir", default="runs/example-drafter")
parser.add_argument("--repo-id", default=None, help="push to this Hub repo when given (the token of `hf auth login`)")
args, training_args = parser.parse_known_args()  # anything else goes to the trainer (e.g. --max-steps 400)

# 1. Distil: the trainer prepares teacher data from the target, trains, evaluates through the real decoding loop,
#    and writes a drafter folder with its model card and custom_generate/.
command = [sys.executable, "-m", "accelerate.commands.launch", "training/distill.py", "--target", args.target,
           "--output-dir", args.output_dir, *training_args]  # `accelerate launch training/distill.py ...`
print("$", " ".join(command[1:]), flush=True)
subprocess.run(command, cwd=REPO, check=True)

# 2. Use it: any drafter folder is an assistant.
folder = REPO / args.output_dir
drafter = hf_specdec.AutoDrafter.from_pretrained(folder)
print(f"trained {type(drafter).__name__}: {drafter.config.measured['mean_accepted_tokens']:.2f} tokens per target "
      "forward in its evaluation")

# 3. Share it.
if args.repo_id:
    print("uploaded to", hf_specdec.hub.push_folder(folder, args.repo_id))
