#!/usr/bin/env bash
# n-gram lookup against transformers' prompt lookup on prompts whose answers copy their input (BENCHMARKS.md,
# "What speed-up on my kind of prompts"): examples/input_grounded_prompts.jsonl, 128 new tokens, greedy, both capped
# at 10 drafts.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p benchmarks/results
hf-specdec bench --target default --assistant ngram --prompts examples/input_grounded_prompts.jsonl \
  --max-new-tokens 128 --num-draft-tokens 10 --adaptive --json benchmarks/results/grounded_ngram_k10.json
