#!/bin/bash
# Adaptive draft length against each constant length, per drafter, on the dev prompts (128 new tokens,
# greedy). Each command interleaves plain, each constant k and adaptive (capped at the largest k) prompt by prompt,
# starting each prompt at a different method, and prints adaptive's speed against the fastest constant with a 95%
# interval over prompts. 60 prompts where adaptive and the best constant are close, 30 for self-speculation (not
# close). Run on a quiet machine (about an hour).
set -x
P=dev
R=benchmarks/results
mkdir -p $R
for spec in "distilled 1,2,3 60" "medusa:chain 1,2,3 60" "ngram 2,4,8 60" "self 1,2 30"; do
    set -- $spec
    hf-specdec bench --target default --assistant $1 --prompts $P --num-prompts $3 --max-new-tokens 128 \
        --num-draft-tokens $2 --adaptive --json "$R/sweep_${1//:/-}.json"
done
