#!/bin/bash
# Dev-prompt benchmarks of the shipped Medusa heads (tree, chain), run on a quiet machine one after the other.
set -x
P=../shared/data/dev_prompts.jsonl
R=benchmarks/results
mkdir -p $R
hf-specdec bench --target default --assistant medusa --prompts $P --num-prompts 30 --max-new-tokens 128 \
    --num-draft-tokens 3 --json $R/dev_medusa_tree.json --plot $R/dev_medusa_tree.png
hf-specdec bench --target default --assistant medusa:chain --prompts $P --num-prompts 30 --max-new-tokens 128 \
    --num-draft-tokens 3 --json $R/dev_medusa_chain.json --plot $R/dev_medusa_chain.png
