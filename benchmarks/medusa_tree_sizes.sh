#!/bin/bash
# The shipped Medusa heads as a chain and as trees of 7 (the default) and 63 nodes built from their
# measured accuracy, in ONE interleaved run against plain decoding (first 12 dev prompts, 128 new tokens, greedy, fp32
# default target). Run on a quiet machine.
set -x
hf-specdec bench --target default --assistant medusa:chain,medusa,medusa:63 \
    --prompts dev --num-prompts 12 --max-new-tokens 128 --num-draft-tokens 4 \
    --json benchmarks/results/medusa_trees.json --plot benchmarks/results/medusa_trees.png
